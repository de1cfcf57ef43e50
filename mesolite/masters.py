"""Which master to dial: a comma-separated list (`--master h1:5050,h2:5050`), and the
leader a standby names.

    masters = MasterList(parse_masters("h1:5050,h2:5050,h3:5050"))
    channel = create_channel(masters.current, ...)
    ...the stream ends...
    quick = not masters.failed(leader_hint(trailing_metadata))  # where to go next

A standby master refuses every call with UNAVAILABLE and names the leader's gRPC address
in the trailing metadata (`LEADER_METADATA`); a client goes there next. Without a hint
(the master died, or no leader is known yet) it tries the next address of its list.
`failed` says when to back off: after each whole round of the list that failed (as with
one master, the backoff growing round by round), and before following the same hint
again; otherwise the caller retries at once (QUICK_RETRY).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mesolite.errors import MesoliteError

# The trailing metadata key of an UNAVAILABLE from a standby: the leader's gRPC address.
LEADER_METADATA = "mesolite-leader"
QUICK_RETRY = 0.05  # seconds before trying the next master of the list
MAX_MASTERS = 16


class MasterListError(MesoliteError, ValueError):
    """A `--master` value that is not HOST:PORT[,HOST:PORT...]."""


def _valid(address: str) -> bool:
    host, colon, port = address.rpartition(":")
    return bool(colon and host and port.isdigit() and 0 < int(port) < 65536)


def parse_masters(text: str) -> tuple[str, ...]:
    """`h1:5050,h2:5050` -> ("h1:5050", "h2:5050"): each HOST:PORT, at most MAX_MASTERS."""
    addresses = tuple(a.strip() for a in text.split(",") if a.strip())
    if not addresses:
        raise MasterListError(f"no master address in {text!r} (HOST:PORT[,HOST:PORT...])")
    if len(addresses) > MAX_MASTERS:
        raise MasterListError(f"at most {MAX_MASTERS} masters, got {len(addresses)}")
    for address in addresses:
        if not _valid(address):
            raise MasterListError(f"a master address is HOST:PORT, got {address!r} in {text!r}")
    return addresses


def leader_hint(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The leader a standby named in its trailing metadata, if it named a valid one."""
    for key, value in metadata or ():
        if key == LEADER_METADATA:
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            return text if _valid(text) and len(text) <= 300 else None
    return None


class MasterList:
    def __init__(self, addresses: Sequence[str]) -> None:
        if not addresses:
            raise MasterListError("no master address")
        self.addresses = tuple(addresses)
        self._index = 0
        self._hinted: str | None = None
        self._misses = 0  # attempts failed since the last success
        self._last_hint: str | None = None  # the leader a standby named last

    @property
    def current(self) -> str:
        """The address to dial now."""
        return self._hinted or self.addresses[self._index]

    def connected(self) -> None:
        """The current master answered (SUBSCRIBED, REGISTERED): stay with it."""
        self._misses = 0
        self._last_hint = None

    def failed(self, hint: str | None = None) -> bool:
        """Move on: to `hint` (the leader a standby named), else to the next address.
        True when the caller should back off first: after each whole round of the list
        that failed, and before following a hint it already followed (a standby that
        still names a leader that has just died); a new hint is followed at once."""
        self._misses += 1
        if hint is not None and hint != self.current:
            fresh = hint != self._last_hint
            self._hinted = self._last_hint = hint
            return not fresh
        if self._hinted in self.addresses:  # the named leader failed: on from its place
            self._index = self.addresses.index(self._hinted)
        self._hinted = None
        self._index = (self._index + 1) % len(self.addresses)
        return self._misses % len(self.addresses) == 0
