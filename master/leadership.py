"""Whether this master leads, and where the leader is: what every edge checks.

    leadership.is_leading()      # False: refuse (gRPC UNAVAILABLE, HTTP 307 to the leader)
    leadership.leader()          # the leading master's addresses, if one is known
    leadership.standbys()        # the other masters waiting to take over

A single master (the SQLite registry) always leads (`SoleLeadership`). Masters that share
an etcd registry elect one (`master/election.py`, `Election`); a standby answers every
gRPC call with UNAVAILABLE naming the leader (`LEADER_METADATA`) and every HTTP request
with 307 to it. The Mesos HTTP API (master/mesos_api/) and anything else exposed by the
master asks the same interface.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol

from mesolite.masters import LEADER_METADATA

__all__ = ["LEADER_METADATA", "Leadership", "MasterAddress", "SoleLeadership"]


@dataclass(frozen=True, slots=True)
class MasterAddress:
    """One master as the others and its clients reach it."""

    master_id: str
    grpc: str  # HOST:PORT
    http: str  # the HTTP(S) base URL: http://HOST:PORT

    def to_json(self) -> bytes:
        return json.dumps(
            {"master_id": self.master_id, "grpc": self.grpc, "http": self.http}
        ).encode()

    @staticmethod
    def from_json(raw: bytes) -> MasterAddress | None:
        """None for a value that is not one (never trust what is in etcd blindly)."""
        try:
            value = json.loads(raw)
            address = MasterAddress(str(value["master_id"]), str(value["grpc"]), str(value["http"]))
        except (ValueError, KeyError, TypeError):
            return None
        return address


class Leadership(Protocol):
    def is_leading(self) -> bool:
        """True only while this master may act: its term is current (checked on the
        monotonic clock, so a master frozen past its lease knows it on waking)."""

    def leader(self) -> MasterAddress | None:
        """The leading master (this one when leading), None while none is known."""

    def standbys(self) -> list[MasterAddress]:
        """The masters waiting to take over (as last seen)."""


class SoleLeadership:
    """One master, no election: it always leads."""

    def __init__(self, me: MasterAddress | None = None) -> None:
        self._me = me

    def is_leading(self) -> bool:
        return True

    def leader(self) -> MasterAddress | None:
        return self._me

    def standbys(self) -> list[MasterAddress]:
        return []
