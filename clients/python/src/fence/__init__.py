"""fence: the Python client of the fence lock service.

Locks with fencing tokens, from the standard library alone::

    import fence
    c = fence.Client(endpoints=["127.0.0.1:7420"])
    with c.session(ttl=10) as s:                 # kept alive in the background
        with s.lock("orders") as g:              # g.token: int; g.lost: threading.Event
            c.kv.put("orders/17", b"paid", grant=g)  # a stale token raises StaleTokenError

The semantics are the Go client's: a session is safe until the send time
of its last answered keepalive plus TTL * (1 - drift) - margin; a failed or
cancelled acquire leaves nothing held or queued; writes carry idempotency
keys. ``fence.fencing`` is the resource side, ``fence.aio`` asyncio.
"""

from ._errors import (AuthFailed, Cancelled, Compacted, DiskFull, FenceError, InvalidArgument, LimitError,
                      LockedError, MembershipError, NotFound, NotHolder, PermissionDenied, Released,
                      RevisionMismatch, Revoked, SessionLostError, SessionNotFound, SessionSecretError,
                      StaleTokenError, Unauthenticated, Unavailable, Unreachable, Unsupported, WaitTimeout,
                      WrongCluster)
from .client import DEFAULT_ENDPOINT, Client, TokenStatus
from .election import Election, LeaderState
from .kv import KV, Compare, Event, KeyValue, Op, TxnResult, Watch
from .lease import Lease
from .locks import AcquireRequest, Mutex, RWMutex, Semaphore
from .session import Grant, Session

__version__ = "0.1.0"

__all__ = [
    "AcquireRequest", "AuthFailed", "Cancelled", "Client", "Compacted", "Compare", "DEFAULT_ENDPOINT",
    "DiskFull", "Election", "Event", "FenceError", "Grant", "InvalidArgument", "KV", "KeyValue",
    "LeaderState", "Lease", "LimitError", "LockedError", "MembershipError", "Mutex", "NotFound",
    "NotHolder", "Op", "PermissionDenied", "RWMutex", "Released", "RevisionMismatch", "Revoked",
    "Semaphore", "Session", "SessionLostError", "SessionNotFound", "SessionSecretError",
    "StaleTokenError", "TokenStatus", "TxnResult", "Unauthenticated", "Unavailable", "Unreachable",
    "Unsupported", "WaitTimeout", "Watch", "WrongCluster",
]
