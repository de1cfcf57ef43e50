"""A framework's connection settings: one frozen object, `Framework(..., connection=...)`,
as the agent has its `AgentConfig` and the master its `MasterConfig`."""

from __future__ import annotations

from dataclasses import dataclass

from mesolite.backoff import Backoff

__all__ = ["ConnectionConfig"]


@dataclass(frozen=True, slots=True)
class ConnectionConfig:
    """How a framework keeps its subscription to the master alive.

    Reconnection delays double, with jitter, from `reconnect_initial` to `reconnect_max`
    seconds. An attempt that gets no SUBSCRIBED within `subscribe_timeout` seconds has
    failed. `stop()` gives queued calls `stop_grace` seconds to reach the master before
    it cancels the stream.
    """

    reconnect_initial: float = 0.5
    reconnect_max: float = 30.0
    subscribe_timeout: float = 10.0
    stop_grace: float = 2.0

    @property
    def reconnect_backoff(self) -> Backoff:
        return Backoff(self.reconnect_initial, self.reconnect_max)
