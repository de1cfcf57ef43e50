"""A framework's connection settings: one frozen object, `Framework(..., connection=...)`,
as the agent has its `AgentConfig` and the master its `MasterConfig`."""

from __future__ import annotations

from dataclasses import dataclass

from mesolite.backoff import Backoff

__all__ = ["DEFAULT_FAILOVER_TIMEOUT", "ConnectionConfig"]

DEFAULT_FAILOVER_TIMEOUT = 7 * 24 * 3600.0
"""The failover timeout of a framework given an `id_file` and no `failover_timeout`: a
week, Marathon's and Chronos' default. Long enough for a crashed scheduler to be noticed
and restarted; a framework that will not come back is ended sooner with `teardown()`."""


@dataclass(frozen=True, slots=True)
class ConnectionConfig:
    """How a framework keeps its subscription to the master alive.

    Reconnection delays double, with jitter, from `reconnect_initial` to `reconnect_max`
    seconds. An attempt that gets no SUBSCRIBED within `subscribe_timeout` seconds has
    failed. After a re-subscription, offers are held until the master has answered the
    SDK's reconciliation, for at most `reconcile_timeout` seconds (keep it above the
    master's agent re-registration window, `--agent-reregister-timeout`, 60 s by
    default: after a master restart the answer waits for the agents). `stop()` gives
    queued calls `stop_grace` seconds to reach the master before it cancels the stream.
    """

    reconnect_initial: float = 0.5
    """Seconds before the first reconnection attempt (jittered)."""
    reconnect_max: float = 30.0
    """The longest delay between two attempts."""
    subscribe_timeout: float = 10.0
    """Seconds an attempt may wait for SUBSCRIBED."""
    stop_grace: float = 2.0
    """Seconds `stop()` lets queued calls (a teardown, acknowledgements) reach the master."""
    reconcile_timeout: float = 120.0
    """Seconds offers are held, at most, for the master's answer to the reconciliation."""

    @property
    def reconnect_backoff(self) -> Backoff:
        """The delays between attempts, as a `Backoff`."""
        return Backoff(self.reconnect_initial, self.reconnect_max)
