"""The master's settings: one object, whose defaults the CLI reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mesolite.http_serving import ConnectionLimits
from mesolite.master.stream_limits import GrpcStreamLimitsConfig
from mesolite.tls import TlsConfig


@dataclass(frozen=True, slots=True)
class MasterConfig:
    allocation_interval: float = 1.0
    offer_timeout: float = 30.0
    # How often agents heartbeat (told in Registered), and how long one may be silent
    # before it is removed: Mesos' pings, every 15 s, 5 missed. A heartbeat costs the
    # master a message; 10,000 agents at 1 s kept a core a third busy doing nothing.
    agent_heartbeat_interval: float = 15.0
    agent_timeout: float = 75.0
    framework_heartbeat_interval: float = 5.0
    # After a restart, agents the registry lists have this long to come back
    # before they are marked removed and their tasks reported lost.
    agent_reregister_timeout: float = 60.0
    # History, in memory only (as Mesos): ended tasks kept per framework, live or
    # completed, and frameworks kept after they ended (torn down, failed over for
    # good), each with its ended tasks (Mesos' --max_completed_tasks_per_framework
    # and --max_completed_frameworks).
    max_completed_tasks_per_framework: int = 1000
    max_completed_frameworks: int = 50
    weights: dict[str, float] = field(default_factory=dict)
    # Check the bookkeeping after every step (tests): see master/invariants.py.
    check_invariants: bool = False
    roles_file: Path | None = None
    work_dir: Path | None = None  # holds the registry; None keeps it in memory (tests)
    policy: str = "drf"
    seed: int = 0
    # Preemption toward guarantees and fair shares (master/preemptions.py): on unless
    # --no-preemption. A victim's framework is told `preemption_grace` seconds before
    # its task is killed; it is then offered nothing on that agent for
    # `preemption_hold` seconds (what was freed is for the role that was starved).
    preemption: bool = True
    preemption_grace: float = 5.0
    preemption_hold: float = 30.0
    # Place tasks of frameworks that declared a demand where they fit best
    # (master/allocator.py, "Packing"); off unless --packing.
    packing: bool = False
    # With packing: reserve an agent for a large shape that fits nowhere yet
    # (master/reservations.py); on unless --no-reservations.
    reservations: bool = True
    # Authorization (master/acl.py); None: every principal may do everything.
    acls_file: Path | None = None
    # Bounds on what clients create (each refusal says which was reached).
    max_frameworks: int = 1000
    max_agents: int = 10_000
    max_removed_agents: int = 10_000  # remembered to refuse their return, newest kept
    max_frameworks_per_principal: int = 100  # with authentication: one team's share
    max_roles: int = 1000  # roles frameworks may create by subscribing
    # Host names (or addresses) the HTTP server answers besides its listen address,
    # localhost and this machine's name (mesolite/http_hosts.py); "*" for any.
    http_allowed_hosts: tuple[str, ...] = ()
    # /events streams the web UI may hold open: in all, and per client (principal or IP).
    event_streams: int = 64
    event_streams_per_client: int = 4
    # gRPC streams per client (principal on a host, else host), and how long a new
    # stream may wait before its first message (master/stream_limits.py).
    grpc_streams: GrpcStreamLimitsConfig = field(default_factory=GrpcStreamLimitsConfig)
    # HTTP connections: header deadline and caps (mesolite.http_serving), fitted at
    # start to the process's descriptor limit.
    http_connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    # TLS on both ports, and with it authentication of every call (master/authn.py).
    tls: TlsConfig | None = None
    credentials_file: Path | None = None  # bearer tokens (mesolite/credentials.py)
    # Listen on a non-loopback address without TLS (refused otherwise).
    insecure: bool = False

    def __post_init__(self) -> None:
        if problem := heartbeat_problem(self.agent_heartbeat_interval, self.agent_timeout):
            raise ValueError(problem)


def heartbeat_problem(interval: float, timeout: float) -> str | None:
    """Why agents could not heartbeat at `interval` under an agent timeout of `timeout`."""
    if not 0 < interval < timeout:
        return (
            f"the agent timeout ({timeout:g} s) must be longer than the agent heartbeat "
            f"interval ({interval:g} s), which must be positive: else every agent is "
            "removed between two heartbeats"
        )
    return None
