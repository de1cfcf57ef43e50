"""The SDK's exceptions: one root, so callers can catch everything the SDK raises."""

from __future__ import annotations

from mesolite.errors import MesoliteError

__all__ = ["FrameworkRejected", "InvalidCall", "MesoliteError", "NotConnected", "RpcError"]


class InvalidCall(MesoliteError, ValueError):
    """A call the SDK can tell is wrong before sending it (say, tasks bigger than the offer)."""


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
    failover timeout has passed), an invalid FrameworkInfo (INVALID_ARGUMENT), or a caller
    it does not know (UNAUTHENTICATED) or does not allow (PERMISSION_DENIED)."""
