"""The SDK's exceptions: one root, `MesoliteError`, so callers can catch everything the
SDK raises with one clause.

    MesoliteError                  (mesolite.errors: every mesolite error)
    ├── InvalidCall                also a ValueError: refused before anything was sent
    ├── NotConnected               a call while not subscribed
    ├── RpcError                   the master ended the stream for good
    │   └── FrameworkRejected      ... refusing the subscription
    │       └── FrameworkGone      ... because it no longer knows the framework id
    ├── InvalidResources           (mesolite.resources) also a ValueError
    └── TlsError                   (mesolite.tls) unusable TLS files
"""

from __future__ import annotations

from pathlib import Path

from mesolite.errors import MesoliteError

__all__ = [
    "FrameworkGone",
    "FrameworkRejected",
    "InvalidCall",
    "MesoliteError",
    "NotConnected",
    "RpcError",
]


class InvalidCall(MesoliteError, ValueError):
    """A call the SDK can tell is wrong before sending it (say, tasks bigger than the
    offer, or an `id_file` with `failover_timeout=0`); nothing was sent."""


class NotConnected(MesoliteError):
    """A call was made while the framework is not subscribed to a master (before
    SUBSCRIBED, between a lost connection and the next subscription, after `stop()`)."""


class RpcError(MesoliteError):
    """The master ended the stream with a gRPC status that retrying will not fix."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}" if details else code)
        self.code = code
        """The gRPC status code's name, e.g. ``"NOT_FOUND"``."""
        self.details = details
        """The master's explanation."""


class FrameworkRejected(RpcError):
    """The master refused the subscription: an invalid FrameworkInfo (INVALID_ARGUMENT:
    a bad name or role, a role other than the framework's, a failover timeout out of
    range), a caller it does not know (UNAUTHENTICATED) or does not allow
    (PERMISSION_DENIED), an unknown framework id (NOT_FOUND, raised as the subclass
    `FrameworkGone`), or a limit reached (FAILED_PRECONDITION)."""


class FrameworkGone(FrameworkRejected):
    """The master no longer knows the framework id this process subscribed with: no
    scheduler came back within the framework's failover timeout, or it was torn down.
    Either way the master has killed its tasks (their ends are not reported).

    The id file, if any, was renamed (`stale_id_file`), so starting again registers a
    new framework; so does another `run()` of the same object (its `framework_id` is
    cleared). To survive longer absences, give a longer `failover_timeout`.
    """

    def __init__(
        self,
        framework_id: str,
        details: str,
        failover_timeout: float,
        stale_id_file: Path | None = None,
    ) -> None:
        then = (
            f"its id file was renamed to {stale_id_file}: start again to register as a "
            "new framework"
            if stale_id_file is not None
            else "start again without this framework id to register as a new framework"
        )
        super().__init__("NOT_FOUND", details)
        self._message = (
            f"NOT_FOUND: framework {framework_id} is not known to the master ({details}): "
            f"no scheduler came back within its failover timeout ({failover_timeout:g} s), "
            f"or it was torn down, and its tasks were killed; {then}"
        )
        self.framework_id = framework_id
        """The id the master no longer knows."""
        self.stale_id_file = stale_id_file
        """Where the id file went (`<id_file>.stale`); None without one."""

    def __str__(self) -> str:
        return self._message
