"""Domain errors. Cores raise these; the one error interceptor maps each to a
gRPC status code, so no core imports grpc."""
from __future__ import annotations


class SpeckvError(Exception):
    """Base of every error that is the caller's business rather than a bug."""


class InvalidArgument(SpeckvError):
    """The request is malformed: the message says which field and why."""


class NotFound(SpeckvError):
    """An id (node, handle, order, block) is unknown."""


class AlreadyExists(SpeckvError):
    """An id that must be new is taken."""


class ResourceExhausted(SpeckvError):
    """No room: pages, budget or queue capacity."""


class FailedPrecondition(SpeckvError):
    """The request is well formed but the system is in a state that forbids it
    (e.g. committing a reservation whose bytes have not all arrived)."""


class Aborted(SpeckvError):
    """The operation was abandoned (checksum mismatch, lapsed lease)."""


class PermissionDenied(SpeckvError):
    """The caller's certificate proves an identity that may not make this
    call (authz.py): the message names the identity and who may."""


class Unauthenticated(SpeckvError):
    """The call must come from a proven identity and its caller proves none."""


class Unavailable(SpeckvError):
    """A peer needed for the operation cannot be reached; retrying may help."""


def require(condition: bool, message: str) -> None:
    """Raise InvalidArgument(message) unless condition holds."""
    if not condition:
        raise InvalidArgument(message)


# The words a scheduler replica that does not lead puts in its FAILED_PRECONDITION (replica_role.py), so a
# caller (a kvstore's agent) tells "ask another replica" from "this report is wrong" without parsing more.
NOT_LEADING = "this scheduler replica does not lead"
