"""The client: endpoints, TLS, a bearer token, and what hangs off it."""

from __future__ import annotations

import ssl
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence

from . import _wire
from ._transport import Transport
from .election import LeaderState, leader, observe
from .kv import KV
from .lease import Lease, take
from .session import Grant, Session

DEFAULT_ENDPOINT = "127.0.0.1:7420"


@dataclass(frozen=True)
class TokenStatus:
    """What the service says of a token: whether it is a current grant of
    its lock, whether the lock is held, and the newest grant's token."""

    current: bool
    held: bool
    current_token: int


class Client:
    """A client of one fence group. Safe for use by several threads; one
    per process is enough.

    Calls that fail because a node is not the leader or cannot be reached
    move on to the leader the node names, or the next endpoint, and are
    retried with backoff; only calls safe to repeat are retried (writes
    carry idempotency keys, acquires request ids). Until a call has
    succeeded, a call that no node answers at all fails with Unreachable
    after ``dial_timeout`` (there is most likely no node there); once the
    group has answered, calls retry through elections and restarts for
    ``retry_budget``. Each attempt on one node is bounded by
    ``attempt_timeout``, so a node that hangs is left for the next.

    ``tls`` is an ssl.SSLContext (or give ``cafile``, the CA that signed
    the nodes' certificates); ``token`` a bearer token for a group with
    auth on.
    """

    def __init__(self, endpoints: Sequence[str] = (DEFAULT_ENDPOINT,), *, tls: Optional[ssl.SSLContext] = None,
                 cafile: Optional[str] = None, token: Optional[str] = None, attempt_timeout: float = 1.0,
                 dial_timeout: float = 1.0, retry_budget: float = 15.0) -> None:
        if cafile is not None and tls is None:
            tls = ssl.create_default_context(cafile=cafile)
        self._transport = Transport(list(endpoints), tls=tls, token=token, attempt_timeout=attempt_timeout,
                                    dial_timeout=dial_timeout, retry_budget=retry_budget)
        # The live grants of the client's sessions by token (tokens are
        # unique across the group), so that a write given a token alone
        # names its lock, as the service requires.
        self._grants: "weakref.WeakValueDictionary[int, Grant]" = weakref.WeakValueDictionary()
        self.kv = KV(self._transport, self._lock_of)

    def _lock_of(self, token: int) -> str:
        g = self._grants.get(token)
        return g.lock if g is not None else ""

    def session(self, ttl: float = 10.0, *, owner: str = "", drift: float = 0.01, margin: float = 0.1) -> Session:
        """Create a session of ttl seconds (1 to 3600), kept alive in the
        background; see Session for what its safe_until promises."""
        return Session(self, ttl, owner, drift, margin)

    def lease(self, lock: str, ttl: float, *, lock_delay: float = 0.0, owner: str = "") -> Lease:
        """Take lock for ttl seconds in one call (see Lease), or raise
        LockedError at once."""
        return take(self, lock, ttl, lock_delay=lock_delay, owner=owner)

    def resume_lease(self, lease_id: int, secret: str) -> Lease:
        """The lease a previous run took, by its id and secret."""
        return Lease(self, lease_id, secret)

    def check(self, lock: str, token: int, *, stale: bool = False) -> TokenStatus:
        """Whether token is the lock's current grant: the strongest fence,
        for a resource that can ask the service."""
        r = self._transport.unary("fence.v1.LockService/Check", {"lock": lock, "token": str(token), "stale": stale})
        return TokenStatus(bool(r.get("current")), bool(r.get("held")), _wire.u64(r, "currentToken"))

    def locks(self, prefix: str = "", *, stale: bool = False) -> List[Dict[str, Any]]:
        """The locks whose names start with prefix, with their holders and
        waiters, as the API's LockInfo in JSON (every page)."""
        out: List[Dict[str, Any]] = []
        page = ""
        while True:
            r = self._transport.unary("fence.v1.LockService/ListLocks",
                                      {"prefix": prefix, "stale": stale, "pageToken": page})
            out.extend(r.get("locks", []))
            page = r.get("nextPageToken", "")
            if not page:
                return out

    def status(self) -> Dict[str, Any]:
        """The status of the first node that answers, as the API's JSON."""
        return self._transport.unary("fence.v1.ClusterService/Status", {})

    def leader(self, election: str) -> LeaderState:
        """The leader of the election, linearizably."""
        return leader(self, election)

    def observe(self, election: str) -> Iterator[LeaderState]:
        """The leader of the election as it changes; see election.observe."""
        return observe(self, election)

    @property
    def endpoints(self) -> List[str]:
        """The nodes the client knows: those given, then leaders named."""
        return self._transport.endpoints()

    def close(self) -> None:
        """Close idle connections. Close sessions first."""
        self._transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
