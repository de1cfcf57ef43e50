"""The SDK's exceptions: one root, so callers can catch everything the SDK raises."""

from __future__ import annotations


class MesoliteError(Exception):
    """Root of every error the framework SDK raises."""


class NotConnected(MesoliteError):
    """A call was made while the framework is not subscribed to a master."""


class RpcError(MesoliteError):
    """The master ended the stream with a gRPC status that retrying will not fix."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}" if details else code)
        self.code = code  # the gRPC status code's name, e.g. "NOT_FOUND"
        self.details = details


class FrameworkRejected(RpcError):
    """The master refused the subscription: an unknown framework id (NOT_FOUND, e.g. its
    failover timeout has passed) or an invalid FrameworkInfo (INVALID_ARGUMENT)."""
