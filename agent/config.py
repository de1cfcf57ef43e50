"""The agent's settings: one object, whose defaults the CLI reads."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mesolite.agent.gc_policy import GcConfig
from mesolite.agent.isolation import IsolationConfig
from mesolite.backoff import Backoff
from mesolite.resources import Resources
from mesolite.tls import TlsConfig

RECONNECT_BACKOFF = Backoff(initial=0.5, maximum=10.0)
STATUS_RETRY = Backoff(initial=1.0, maximum=10.0)


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """What an agent needs to run.

    `reconnect_backoff` paces reconnection to the master; `status_retry` paces
    re-sending unacknowledged status updates. On `stop()` the agent kills its
    tasks (SIGTERM, then SIGKILL after `kill_grace_period`) and waits up to
    `stop_timeout` seconds for their final updates to be acknowledged.
    `isolation` says how tasks are contained (`agent/isolation.py`); `gc` when the
    sandboxes of ended tasks are removed (`agent/gc_policy.py`).

    With `tls` the agent verifies the master against `tls.ca` and authenticates with its
    certificate (its principal is the certificate's CN), or with `token` when it has no
    certificate (sent only over TLS, to the master's token port).
    """

    master: str  # HOST:PORT
    resources: Resources
    work_dir: Path
    hostname: str = field(default_factory=socket.gethostname)
    address: str = ""  # the sandbox server's HOST:PORT, for the master's web UI
    attributes: Mapping[str, str] = field(default_factory=dict)
    kill_grace_period: float = 3.0
    reconnect_backoff: Backoff = RECONNECT_BACKOFF
    status_retry: Backoff = STATUS_RETRY
    registration_timeout: float = 10.0
    stop_timeout: float = 5.0
    isolation: IsolationConfig = field(default_factory=IsolationConfig)
    gc: GcConfig = field(default_factory=GcConfig)
    tls: TlsConfig | None = None
    token: str | None = field(default=None, repr=False)
