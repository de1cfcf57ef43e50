"""Bounds on the gRPC streams one client may hold open.

A client is its principal when authentication is on, else the IP address its
connections come from (without the port: many connections from one host count
together). Each may hold at most `per_client` streams at once, of which at most
`waiting_per_client` have not yet sent their first message (SUBSCRIBE or
REGISTER); that first message must come within `first_message_timeout`. So an
idle client can hold neither file descriptors nor memory for long, and one
client cannot use up what every other client needs. (The /events streams of
the HTTP side have their own bounds: `master/ui_routes.py`.)

Plain bookkeeping, no I/O: the servicers ask it as each stream opens, say when
its first message came, and release the stream when it ends.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GrpcStreamLimitsConfig:
    per_client: int = 256
    waiting_per_client: int = 16
    first_message_timeout: float = 10.0


class GrpcStreamLimits:
    def __init__(self, config: GrpcStreamLimitsConfig = GrpcStreamLimitsConfig()) -> None:
        self.config = config
        self._open: Counter[str] = Counter()
        self._waiting: Counter[str] = Counter()

    def open(self, client: str) -> str | None:
        """Admit a new stream from `client`, waiting for its first message; why
        not, if refused."""
        if self._open[client] >= self.config.per_client:
            return f"{self.config.per_client} streams from one client are open, its maximum"
        if self._waiting[client] >= self.config.waiting_per_client:
            return (
                f"{self.config.waiting_per_client} streams from one client have not "
                "sent their first message yet, its maximum"
            )
        self._open[client] += 1
        self._waiting[client] += 1
        return None

    def first_message_done(self, client: str) -> None:
        """The stream's first message came, or will not (the wait ended)."""
        _decrement(self._waiting, client)

    def close(self, client: str) -> None:
        """A stream admitted by `open` ended."""
        _decrement(self._open, client)

    def streams(self, client: str) -> int:
        return self._open[client]

    def clients(self) -> int:
        """Clients with a stream open (gone clients leave nothing behind)."""
        return len(self._open) + len(self._waiting.keys() - self._open.keys())


def _decrement(counter: Counter[str], client: str) -> None:
    counter[client] -= 1
    if counter[client] <= 0:
        del counter[client]
