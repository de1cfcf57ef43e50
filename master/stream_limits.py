"""Bounds on the gRPC streams one peer may hold open.

A peer is the address a connection comes from (its IP, without the port, so
many connections from one host count together) or, with authentication on, its
principal. Each may hold at most `per_peer` streams at once, of which at most
`unsubscribed_per_peer` have not yet sent their first message (SUBSCRIBE or
REGISTER); that first message must come within `first_message_timeout`. So an
idle client can hold neither file descriptors nor memory for long, and one
client cannot use up what every other client needs.

Plain bookkeeping, no I/O: the servicers ask it at the start of each stream
and release what they were given when it ends.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StreamLimitsConfig:
    per_peer: int = 256
    unsubscribed_per_peer: int = 16
    first_message_timeout: float = 10.0


class StreamLimits:
    def __init__(self, config: StreamLimitsConfig = StreamLimitsConfig()) -> None:
        self.config = config
        self._open: Counter[str] = Counter()
        self._unsubscribed: Counter[str] = Counter()

    def open(self, peer: str) -> str | None:
        """Admit a new stream from `peer` (not yet subscribed); why not, if refused."""
        if self._open[peer] >= self.config.per_peer:
            return f"{self.config.per_peer} streams from one client are open, its maximum"
        if self._unsubscribed[peer] >= self.config.unsubscribed_per_peer:
            return (
                f"{self.config.unsubscribed_per_peer} streams from one client have not "
                "sent their first message yet, its maximum"
            )
        self._open[peer] += 1
        self._unsubscribed[peer] += 1
        return None

    def subscribed(self, peer: str) -> None:
        """The stream's first message came (whatever the master made of it)."""
        self._decrement(self._unsubscribed, peer)

    def close(self, peer: str, subscribed: bool) -> None:
        """The stream admitted by `open` ended; `subscribed`: `subscribed` was called."""
        self._decrement(self._open, peer)
        if not subscribed:
            self._decrement(self._unsubscribed, peer)

    def streams(self, peer: str) -> int:
        return self._open[peer]

    @staticmethod
    def _decrement(counter: Counter[str], peer: str) -> None:
        counter[peer] -= 1
        if counter[peer] <= 0:
            del counter[peer]
