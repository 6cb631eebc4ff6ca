"""fence's errors as exception classes, and their mapping from the wire.

The service answers an error as a Connect JSON error: a ``code``, a
``message`` for people and a ``fence.v1.ErrorDetail`` whose ``reason`` a
program tests. :func:`from_connect` turns that into the class the reason
names (or, for peers that send none, the code), as the Go client's
``internal/rpcerr`` turns it into the sentinel it wraps. Catch a class,
never match a message.
"""

from __future__ import annotations

import base64
from typing import Any, Dict, Optional, Type


class FenceError(Exception):
    """Base class of every error this package raises.

    ``code`` is the Connect code ("failed_precondition", ...) when the
    service answered, ``reason`` the ``fence.v1.Reason`` name
    ("REASON_LOCKED", ...) when it said one, ``detail`` the decoded
    ``ErrorDetail`` fields (snake_case, uint64 as int).
    """

    def __init__(self, message: str, *, code: str = "", reason: str = "",
                 detail: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason
        self.detail = detail or {}


class InvalidArgument(FenceError):
    """A malformed request (bad name, TTL out of bounds, oversized value).
    Retrying the same request fails again."""


class NotFound(FenceError):
    """The session does not exist or has expired; everything it held has
    been released."""


SessionNotFound = NotFound


class LockedError(FenceError):
    """A lock that could not be taken without waiting (try, or a lease).

    ``lock`` is its name; ``holder`` and ``holder_token`` are the newest
    holder's session id and token, 0 when the lock is under lock-delay or
    free with waiters ahead.
    """

    def __init__(self, message: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.lock: str = self.detail.get("lock", "")
        self.holder: int = self.detail.get("holder_session_id", 0)
        self.holder_token: int = self.detail.get("holder_token", 0)


class NotHolder(FenceError):
    """A release, check or strict write by a session, or with a token, that
    does not hold the lock."""


class StaleTokenError(FenceError):
    """A fenced write whose token is lower than one the resource accepted.
    Nothing of the write was applied.

    ``have`` is the highest token the key (or resource) had accepted,
    ``got`` the token the write carried, ``key`` the key, when known.
    """

    def __init__(self, have: int, got: int, key: str = "", **kw: Any) -> None:
        msg = kw.pop("message", "") or _stale_message(have, got, key)
        kw.setdefault("reason", "REASON_STALE_TOKEN")
        super().__init__(msg, **kw)
        self.have, self.got, self.key = have, got, key


def _stale_message(have: int, got: int, key: str) -> str:
    msg = f"stale fencing token {got} < {have}"
    return f"{msg} for key {key}" if key else msg


class RevisionMismatch(FenceError):
    """A compare-and-swap whose expected revision was not the key's."""


class WaitTimeout(FenceError, TimeoutError):
    """A lock not granted within the wait timeout. The wait was given up:
    nothing is left held or queued. It is also a built-in TimeoutError."""


class Cancelled(FenceError):
    """An acquire whose request was given up (CancelAcquire): not granted,
    and it will not be."""


class Unavailable(FenceError):
    """No leader right now, a node shutting down or unreachable: the client
    retries these itself, for its retry budget, before raising one."""


class DiskFull(Unavailable):
    """A write failed because a node's data dir is out of space."""


class Unreachable(Unavailable):
    """No node answered at all, within the dial timeout (a client that has
    not yet talked to its group) or the retry budget. The message names the
    endpoints tried."""


class LimitError(FenceError):
    """A configured limit or quota was reached."""


class Compacted(FenceError):
    """A watch from a revision older than the node keeps: list again, and
    watch from the list's revision + 1."""


class WrongCluster(FenceError):
    """A node of another group than the client's."""


class Unauthenticated(FenceError):
    """Credentials refused: a TLS certificate, a bearer token, or a
    session's secret. Retrying does not help."""


class SessionSecretError(Unauthenticated):
    """A call acting as a session without its secret, or with another."""


class AuthFailed(Unauthenticated):
    """With auth on: no credential, or one the service does not accept."""


class PermissionDenied(FenceError):
    """With auth on: the caller's roles lack the permission; the message
    names it."""


class MembershipError(FenceError):
    """A membership change the leader refused."""


class Unsupported(FenceError):
    """A call the group cannot serve yet (a rolling upgrade in progress)."""


class SessionLostError(FenceError):
    """The session's safe-until passed without a renewal, or the service
    reported it gone: its locks may be held by others."""


class Released(FenceError):
    """Why a grant or session ended by its holder's own release or close."""


class Revoked(FenceError):
    """Why a grant ended when someone else released it while its session
    lived on."""


_BY_REASON: Dict[str, Type[FenceError]] = {
    "REASON_INVALID_ARGUMENT": InvalidArgument,
    "REASON_SESSION_NOT_FOUND": NotFound,
    "REASON_LOCKED": LockedError,
    "REASON_NOT_HOLDER": NotHolder,
    "REASON_STALE_TOKEN": StaleTokenError,
    "REASON_WAIT_TIMEOUT": WaitTimeout,
    "REASON_NOT_LEADER": Unavailable,
    "REASON_LIMIT": LimitError,
    "REASON_REVISION_MISMATCH": RevisionMismatch,
    "REASON_COMPACTED": Compacted,
    "REASON_CANCELLED": Cancelled,
    "REASON_DISK_FULL": DiskFull,
    "REASON_WRONG_CLUSTER": WrongCluster,
    "REASON_SESSION_SECRET": SessionSecretError,
    "REASON_MEMBERSHIP": MembershipError,
    "REASON_PERMISSION_DENIED": PermissionDenied,
    "REASON_AUTH": AuthFailed,
    "REASON_UNSUPPORTED": Unsupported,
}

_BY_CODE: Dict[str, Type[FenceError]] = {
    "unavailable": Unavailable,
    "invalid_argument": InvalidArgument,
    "not_found": NotFound,
    "resource_exhausted": LimitError,
    "unauthenticated": Unauthenticated,
    "permission_denied": PermissionDenied,
    "unimplemented": Unsupported,
}

# The fence.v1.Reason enum by number, and the ErrorDetail fields by
# number, for the detail's binary form (api/fence/v1/fence.proto).
_REASONS = [
    "REASON_UNSPECIFIED", "REASON_INVALID_ARGUMENT", "REASON_SESSION_NOT_FOUND",
    "REASON_LOCKED", "REASON_NOT_HOLDER", "REASON_STALE_TOKEN",
    "REASON_WAIT_TIMEOUT", "REASON_NOT_LEADER", "REASON_LIMIT",
    "REASON_REVISION_MISMATCH", "REASON_COMPACTED", "REASON_CANCELLED",
    "REASON_DISK_FULL", "REASON_WRONG_CLUSTER", "REASON_SESSION_SECRET",
    "REASON_MEMBERSHIP", "REASON_PERMISSION_DENIED", "REASON_AUTH",
    "REASON_UNSUPPORTED",
]
_DETAIL_FIELDS = {1: "reason", 2: "lock", 3: "session_id", 4: "token",
                  5: "current_token", 6: "leader_address",
                  7: "holder_session_id", 8: "holder_token"}


def decode_detail(value: str) -> Dict[str, Any]:
    """Decode a ``fence.v1.ErrorDetail`` from a Connect error's ``value``
    (unpadded base64 of its protobuf encoding)."""
    data = base64.b64decode(value + "=" * (-len(value) % 4))
    out: Dict[str, Any] = {}
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(data, i)
            field: Any = v
        elif wire == 2:
            n, i = _varint(data, i)
            field, i = data[i:i + n].decode("utf-8"), i + n
        else:
            raise ValueError(f"unexpected wire type {wire} in ErrorDetail")
        name = _DETAIL_FIELDS.get(num)
        if name == "reason":
            field = _REASONS[field] if field < len(_REASONS) else str(field)
        if name:
            out[name] = field
    return out


def _varint(data: bytes, i: int) -> "tuple[int, int]":
    shift = result = 0
    while True:
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def from_connect(body: Dict[str, Any], status: int = 0) -> FenceError:
    """Return the exception a Connect JSON error body stands for."""
    code = body.get("code") or _code_of_status(status)
    message = body.get("message") or f"HTTP {status}: {code}"
    detail: Dict[str, Any] = {}
    for d in body.get("details") or []:
        if d.get("type") == "fence.v1.ErrorDetail" and d.get("value") is not None:
            detail = decode_detail(d["value"])
    reason = detail.get("reason", "")
    cls = _BY_REASON.get(reason) or _BY_CODE.get(code) or FenceError
    if cls is StaleTokenError:
        return StaleTokenError(detail.get("current_token", 0), detail.get("token", 0),
                               detail.get("lock", ""), message=message, code=code,
                               detail=detail)
    return cls(message, code=code, reason=reason, detail=detail)


def _code_of_status(status: int) -> str:
    """The Connect code of an HTTP status, for an answer without a body."""
    return {400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied",
            404: "unimplemented", 408: "deadline_exceeded", 409: "aborted",
            412: "failed_precondition", 429: "unavailable", 502: "unavailable",
            503: "unavailable", 504: "unavailable"}.get(status, "unknown")
