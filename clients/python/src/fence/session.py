"""Sessions: a client's lease on the service, kept alive by a thread.

The rule is the Go client's (client/session.go, docs/design.md "The
client's 'safe until'"): the client notes ``time.monotonic()`` *before*
it sends each keepalive; on success the session is safe until
``sent + ttl * (1 - drift) - margin``. When that instant passes without a
renewal the session ends as lost: :attr:`Session.lost` and every grant's
``lost`` are set, so that a running holder learns it may have lost its
locks before the service can give them away. A keepalive sent at or after
the safe-until extends nothing, whatever its answer.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from . import _wire
from ._errors import FenceError, InvalidArgument, NotFound, Released, Revoked, SessionLostError

if TYPE_CHECKING:
    from .client import Client
    from .election import Election
    from .locks import Mutex, RWMutex, Semaphore


class LossEvent(threading.Event):
    """A threading.Event that is set when what it guards may be lost.

    Besides being set by the session's keepalive thread, ``is_set`` and
    ``wait`` look at the session's safe-until themselves: a process that
    was paused past it (SIGSTOP, a long GC pause) sees the event set as
    soon as it runs again, before the keepalive thread has run.
    """

    def __init__(self, session: "Session") -> None:
        super().__init__()
        self._session = session

    def is_set(self) -> bool:
        if not super().is_set():
            self._session._check_lapse()
        return super().is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        if self.is_set():
            return True
        return super().wait(timeout)


class Grant:
    """A held lock: its name, its fencing token, and ``lost``, a
    threading.Event set when the grant ends: released, released by someone
    else, or its session ended or passed its safe-until. Send ``token``
    with every write to a fenced resource."""

    def __init__(self, session: "Session", lock: str, token: int) -> None:
        self.lock = lock
        self.token = token
        self.lost = LossEvent(session)
        self._session = session
        self._error: Optional[FenceError] = None

    @property
    def error(self) -> Optional[FenceError]:
        """None while the grant holds, then why it ended (Released,
        Revoked, SessionLostError, NotFound)."""
        self.lost.is_set()
        return self._error if self._error is not None else self._session.error

    def _end(self, cause: FenceError) -> None:
        if self._error is None:
            self._error = cause
        self.lost.set()

    def __repr__(self) -> str:
        return f"Grant(lock={self.lock!r}, token={self.token})"


class Session:
    """A lease on the service, renewed every third of its TTL by a daemon
    thread, as long as it is safe.

    ``safe_until`` is on ``time.monotonic()``'s clock. It does not count
    time the machine spent suspended (Linux's CLOCK_MONOTONIC stops then),
    so, as the Go client on systems other than Linux, a suspend extends the
    session's belief by its length; fencing tokens still refuse the stale
    writes. Use as a context manager to close it on exit. Safe for use by
    several threads.

    ``lost`` is a threading.Event set when the session ends: closed, its
    safe-until passed unrenewed, or gone on the service; ``error`` says
    which. Every grant of the session ends with it.
    """

    def __init__(self, client: "Client", ttl: float = 10.0, owner: str = "",
                 drift: float = 0.01, margin: float = 0.1) -> None:
        """Create a session on the service and start keeping it alive.
        Raises InvalidArgument for a TTL out of the service's bounds
        (1 s to 1 h) or a drift outside [0, 1)."""
        if not 0 <= drift < 1 or margin < 0:
            raise InvalidArgument("drift must be in [0, 1) and margin not negative")
        self.client = client
        self._drift, self._margin = drift, margin
        sent = [0.0]

        def create(ep: Any, t: float) -> Dict[str, Any]:
            sent[0] = time.monotonic()
            return client._transport.attempt(ep, "fence.v1.SessionService/CreateSession",
                                             {"ttl": _wire.duration(ttl), "owner": owner}, t)
        # No idempotency key: the secret is answered once, so a retry makes
        # a session of its own, and one whose answer was lost expires.
        resp = client._transport.call(create)
        self.id: int = _wire.u64(resp, "sessionId")
        self._secret: str = resp.get("sessionSecret", "")
        self.ttl: float = _wire.seconds(resp.get("ttl"), ttl)
        self._interval = self.ttl / 3
        self._mu = threading.Lock()
        self._wake = threading.Condition(self._mu)
        # The releases of each lock name on their way (Mutex.release): the
        # service's grant is the session's, whichever Mutex took it, so an
        # acquire of the name waits for them (_wait_released).
        self._releasing: Dict[str, int] = {}
        self._safe_until = self._deadline_from(sent[0])
        self._due = sent[0] + self._interval
        self._lapsed = False
        self._stopped = False
        self._error: Optional[FenceError] = None
        self._rounds = 0
        # The live grants by lock name (a session holds a lock once), and
        # each with the keepalive round it came in (see _renewed).
        self._held: Dict[str, Grant] = {}
        self._grants: Dict[Grant, int] = {}
        self._requests = 0
        self.lost = LossEvent(self)
        self._thread = threading.Thread(target=self._keep_alive, name=f"fence-session-{self.id}", daemon=True)
        self._thread.start()

    # -- what a holder relies on -----------------------------------------

    @property
    def safe_until(self) -> float:
        """The instant (time.monotonic()) until which the session is known
        to be alive on the service."""
        with self._mu:
            return self._safe_until

    @property
    def error(self) -> Optional[FenceError]:
        """None while the session lives, then why it ended: Released
        (closed), SessionLostError, or NotFound (expired on the service)."""
        self._check_lapse()
        with self._mu:
            return self._error

    def check(self) -> None:
        """Raise why the session ended, if it did, or if its safe-until has
        passed (the process was paused), which ends it as lost here."""
        err = self.error
        if err is not None:
            raise err

    def close(self) -> None:
        """End the session and release everything it holds. A session that
        ended already (lost, expired) is not closed again. After a failed
        close the session still ends here and expires on the service after
        its TTL. A renewal in flight is waited for, at most its attempt (a
        quarter of the TTL). Calls after the first do nothing."""
        with self._mu:
            if self._stopped:
                return
            self._stopped = True
            self._wake.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()  # a renewal in flight ends within its attempt
        if not self._end(Released(f"session {self.id} closed")):
            return  # lost or expired already: abandoned, or gone, on the service
        self.client._transport.unary("fence.v1.SessionService/CloseSession", self._me())

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- primitives on this session --------------------------------------

    def lock(self, name: str, *, timeout: Optional[float] = None, lock_delay: float = 0.0) -> "Mutex":
        """An exclusive lock on name, held through this session; use it as
        ``with session.lock("orders") as grant:``."""
        from .locks import Mutex
        return Mutex(self, name, timeout=timeout, lock_delay=lock_delay)

    def rwlock(self, name: str, *, timeout: Optional[float] = None, lock_delay: float = 0.0) -> "RWMutex":
        """A read-write lock on name, held through this session."""
        from .locks import RWMutex
        return RWMutex(self, name, timeout=timeout, lock_delay=lock_delay)

    def semaphore(self, name: str, permits: int, *, timeout: Optional[float] = None,
                  lock_delay: float = 0.0) -> "Semaphore":
        """A semaphore of permits on name, one permit held through this session."""
        from .locks import Semaphore
        return Semaphore(self, name, permits, timeout=timeout, lock_delay=lock_delay)

    def election(self, name: str) -> "Election":
        """The election name, campaigned through this session."""
        from .election import Election
        return Election(self, name)

    # -- internals the primitives use --------------------------------------

    def _me(self, **extra: Any) -> Dict[str, Any]:
        """The fields that act as this session in a request."""
        return {"sessionId": str(self.id), "sessionSecret": self._secret, **extra}

    def _next_request(self) -> int:
        with self._mu:
            self._requests += 1
            return self._requests

    def _held_grant(self, lock: str) -> Optional[Grant]:
        with self._mu:
            return self._held.get(lock)

    def _hold(self, lock: str, token: int) -> Grant:
        """The grant of lock with token: the one held already, or a new
        one, counted among the grants that keepalives check."""
        with self._mu:
            g = self._held.get(lock)
            if g is not None and g.token == token and not g.lost.is_set():
                return g
            g = self._held[lock] = Grant(self, lock, token)
            self._grants[g] = self._rounds
            ended = self._error
        self.client._grants[token] = g
        if ended is not None:
            g._end(ended)
        return g

    def _drop_grant(self, lock: str, g: Optional[Grant] = None, releasing: bool = False) -> Optional[Grant]:
        """Forget the grant of lock (only if it is g, when given). With
        releasing, a release of it is on its way from now until
        _end_release."""
        with self._mu:
            held = self._held.get(lock)
            if held is None or (g is not None and held is not g):
                return None
            del self._held[lock]
            self._grants.pop(held, None)
            if releasing:
                self._releasing[lock] = self._releasing.get(lock, 0) + 1
            return held

    def _end_release(self, lock: str) -> None:
        """A release of lock, begun with _drop_grant, is over."""
        with self._mu:
            n = self._releasing.get(lock, 0) - 1
            if n > 0:
                self._releasing[lock] = n
            else:
                self._releasing.pop(lock, None)
            self._wake.notify_all()

    def _wait_released(self, lock: str, deadline: Optional[float]) -> bool:
        """Wait until no release of lock is on its way, the session ends or
        deadline (time.monotonic) passes; False for the last."""
        with self._mu:
            while self._releasing.get(lock) and self._error is None:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    return False
                self._wake.wait(wait)
            return True

    def _deadline_from(self, sent: float) -> float:
        return sent + self.ttl * (1 - self._drift) - self._margin

    def _check_lapse(self) -> None:
        """End the session as lost if its safe-until passed unnoticed."""
        if self._lapse(time.monotonic()):
            self._lose(SessionLostError(
                f"session {self.id} passed its safe-until unrenewed (the process was paused?); "
                "its locks may be held by others"))

    def _lapse(self, now: float) -> bool:
        """Whether the safe-until is not after now; then no renewal
        answered later extends it."""
        with self._mu:
            if self._error is not None or now < self._safe_until:
                return False
            self._lapsed = True
            return True

    def _end(self, cause: FenceError) -> bool:
        """End the session with cause; False if it had ended already."""
        with self._mu:
            if self._error is not None:
                return False
            self._error = cause
            grants = list(self._grants)
            self._grants.clear()
            self._held.clear()
            self._wake.notify_all()
        self.lost.set()
        for g in grants:
            g._end(cause)
        return True

    def _lose(self, cause: FenceError) -> None:
        """End the session as lost, then abandon it on the service, best
        effort, on every node at once for a second, so that its locks are
        released now rather than at expiry (with their lock-delays)."""
        if not self._end(cause):
            return
        threads = [threading.Thread(target=self._abandon_at, args=(ep,), daemon=True)
                   for ep in self.client._transport._snapshot()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _abandon_at(self, ep: Any) -> None:
        """Ask one node to abandon the session, and the leader it names if
        it is not the leader. A node of another group is not asked: the
        request carries the session's secret."""
        tr = self.client._transport
        body = self._me(abandon=True)
        for _ in range(2):
            if ep.foreign:
                return
            try:
                tr.attempt(ep, "fence.v1.SessionService/CloseSession", body, 1.0)
                return
            except FenceError as e:
                leader = e.detail.get("leader_address")
                if not leader:
                    return
                ep = tr._endpoint_at(tr._endpoint_for(leader))

    def _give_up(self, what: str, err: BaseException) -> None:
        """End the session because what could not be given back (err):
        its end on the service releases it."""
        if isinstance(err, NotFound):
            self._end(err)
        else:
            self._lose(SessionLostError(f"could not give up {what} ({err}), so the session is given up instead"))

    # -- the keepalive thread ----------------------------------------------

    def _keep_alive(self) -> None:
        while True:
            with self._mu:
                if self._stopped or self._error is not None:
                    return
                now = time.monotonic()
                wait = min(self._due, self._safe_until) - now
                if wait > 0:
                    self._wake.wait(wait)
                    continue
            if self._lapse(time.monotonic()):
                self._lose(SessionLostError(
                    f"no renewal of session {self.id} reached the service in time; its locks may be held by others"))
                return
            self._renew()

    def _renew(self) -> None:
        """Send one keepalive, bounded by the safe-until; each node gets a
        quarter of the TTL so that the others are tried well before it."""
        with self._mu:
            self._rounds += 1
            round_, safe = self._rounds, self._safe_until
        sent = [0.0]
        tr = self.client._transport

        def keepalive(ep: Any, t: float) -> Dict[str, Any]:
            sent[0] = time.monotonic()
            return tr.attempt(ep, "fence.v1.SessionService/KeepAlive", self._me(), t)
        try:
            resp = tr.call(keepalive, deadline=safe, attempt=self.ttl / 4)
            held = resp.get("held")
            tokens = None if held is None else [int(t) for t in held.get("tokens", [])]
        except NotFound as e:
            self._end(e)
            return
        except Exception:  # whatever failed, this thread must live on: it ends the session at its safe-until
            with self._mu:
                self._due = time.monotonic() + min(self._interval, 0.25)
            return
        self._renewed(sent[0], round_, tokens)

    def _renewed(self, sent: float, round_: int, held: Optional[List[int]]) -> None:
        """Take in a keepalive's success, sent at sent. One sent at or
        after the safe-until renews nothing: the service may have expired
        the session meanwhile."""
        with self._mu:
            if sent >= self._safe_until or self._lapsed or self._error is not None:
                return
            self._safe_until = max(self._safe_until, self._deadline_from(sent))
            self._due = max(self._due, sent + self._interval)
            revoked = []
            if held is not None:
                for g, since in list(self._grants.items()):
                    if since < round_ and g.token not in held:
                        revoked.append(g)
                        del self._grants[g]
                        if self._held.get(g.lock) is g:
                            del self._held[g.lock]
        for g in revoked:
            g._end(Revoked(f"the session no longer holds {g.lock!r} (token {g.token})"))

