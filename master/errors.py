"""What the master's core raises when it turns a request down.

Both are raised *before* anything changes. The servicers map them to the
wire (a gRPC status, an ERROR event); the core never names gRPC.
"""

from __future__ import annotations

import enum

from mesolite.errors import MesoliteError


class MasterError(MesoliteError):
    """Root of the errors the master raises."""


class Refusal(enum.Enum):
    """Why a subscription or registration is refused (the servicers pick the status)."""

    INVALID = "invalid"  # the request itself is wrong
    NOT_FOUND = "not found"  # it names something this master does not know
    PRECONDITION = "precondition"  # valid, but not now (say, an agent that was removed)
    FORBIDDEN = "forbidden"  # not for this principal (the ACLs, or another's id)


class CallRejected(MasterError):
    """A request that is invalid in the current state; nothing was changed."""


class OperatorCallRefused(MasterError):
    """An operator's call (an operator teardown or kill) that is refused; nothing was
    changed. The HTTP edge picks the status from `refusal`."""

    def __init__(self, refusal: Refusal, message: str) -> None:
        super().__init__(message)
        self.refusal = refusal


class RegistrationRefused(MasterError):
    """A subscription or agent registration that is refused; the stream ends."""

    def __init__(self, refusal: Refusal, message: str) -> None:
        super().__init__(message)
        self.refusal = refusal


class RegistryFenced(MasterError):
    """This master may not write its registry any more: it no longer leads (etcd refused
    a guarded write, or its lease lapsed). Nothing that depends on the write is sent."""
