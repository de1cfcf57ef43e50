"""The SDK's reconciliation after a (re)subscription, and the offers it holds meanwhile.

After every subscription with a framework id the SDK asks the master for the state of
every task it knows (an implicit reconciliation). The master answers with one update per
task and then RECONCILED with the call's id. Until then, offers are held here rather than
handed to `on_offers`: a framework that launches on offers until it has N tasks must
first hear of the tasks it already has. No I/O here: `_framework.py` feeds it events and
the clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mesolite.model import Offer


@dataclass(slots=True)
class OfferGate:
    """Open (offers pass) unless a reconciliation is under way."""

    call_id: str | None = None  # the reconciliation awaited; None when open
    started: float = 0.0
    deadline: float = 0.0  # in the clock `start` was given
    updates: int = 0  # updates seen since it started
    _held: dict[str, Offer] = field(default_factory=dict)

    @property
    def closed(self) -> bool:
        return self.call_id is not None

    @property
    def held(self) -> int:
        return len(self._held)

    def start(self, call_id: str, now: float, timeout: float) -> None:
        self.call_id = call_id
        self.started = now
        self.deadline = now + timeout
        self.updates = 0
        self._held.clear()

    def hold(self, offers: list[Offer]) -> bool:
        """Keep `offers` back if closed; False if they may go to the framework now."""
        if not self.closed:
            return False
        self._held.update((o.offer_id, o) for o in offers)
        return True

    def rescind(self, offer_id: str) -> bool:
        """Drop a held offer the master took back; False if it was not held."""
        return self._held.pop(offer_id, None) is not None

    def saw_update(self) -> None:
        if self.closed:
            self.updates += 1

    def finish(self, call_id: str) -> list[Offer] | None:
        """The master's RECONCILED for `call_id`: the held offers, to deliver now; None
        if it is not the reconciliation awaited (one the framework asked for itself)."""
        if call_id != self.call_id:
            return None
        return self._open()

    def expire(self, now: float) -> list[Offer] | None:
        """Past the deadline: give up waiting and release the held offers."""
        if not self.closed or now < self.deadline:
            return None
        return self._open()

    def clear(self) -> None:
        """The stream is gone, and with it the offers and the answer awaited."""
        self.call_id = None
        self._held.clear()

    def _open(self) -> list[Offer]:
        offers = list(self._held.values())
        self.clear()
        return offers
