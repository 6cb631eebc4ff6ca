"""Mutex, RWMutex and Semaphore: locks held through a session.

As the Go client's (client/mutex.go): every acquire carries a request id;
a blocked acquire polls, so each call on a node is bounded and a node that
stops answering is left for the next while the wait keeps its place; an
acquire that fails in a way that may have left something behind (a lost
answer, a retry, a timeout, a cancel) is given up with ``CancelAcquire``,
and when the service cannot be told within the TTL the session itself is
given up. So a failed or cancelled acquire leaves nothing held or queued.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Dict, Optional

from . import _wire
from ._errors import (AuthFailed, Cancelled, FenceError, InvalidArgument, LimitError, LockedError,
                      NotFound, NotHolder, PermissionDenied, Released, WaitTimeout)
from .session import Grant

if TYPE_CHECKING:
    from .session import Session

_EXCLUSIVE, _SHARED, _SEMAPHORE = "MODE_EXCLUSIVE", "MODE_SHARED", "MODE_SEMAPHORE"


class AcquireRequest:
    """One acquire, named by its request id within the session. Setting
    ``cancelled`` (from another thread) makes the acquire give up: it ends
    with Cancelled and leaves nothing held or queued."""

    def __init__(self, session: "Session") -> None:
        self.id = session._next_request()
        self.cancelled = threading.Event()


class Mutex:
    """An exclusive lock held through a session; waiters are granted in
    FIFO order. The session is the holder: every Mutex of one session and
    name shares its grant, as the service does (to contend for a lock, use
    one session per contender). Use as ``with session.lock(name) as
    grant:``, or acquire and release."""

    _mode = _EXCLUSIVE

    def __init__(self, session: "Session", name: str, *, timeout: Optional[float] = None,
                 lock_delay: float = 0.0, permits: int = 0) -> None:
        self.session = session
        self.name = name
        self.timeout = timeout
        self.lock_delay = lock_delay
        self._permits = permits

    @property
    def grant(self) -> Optional[Grant]:
        """The session's current grant of the lock, or None."""
        return self.session._held_grant(self.name)

    def acquire(self, timeout: Optional[float] = None, *, request: Optional[AcquireRequest] = None) -> Grant:
        """Wait until the lock is granted and return the grant. timeout (in
        seconds; default the Mutex's) bounds the wait, which then fails
        with WaitTimeout, a TimeoutError (or, if no leader could be
        reached meanwhile, Unavailable), leaving nothing held or queued. Acquiring a held mutex returns the
        same grant. A grant is returned only while the session's safe-until
        has not passed; after it, SessionLostError."""
        return self._acquire(False, self.timeout if timeout is None else timeout, request)

    def try_acquire(self) -> Grant:
        """Take the lock if it is free and nobody waits, or raise
        LockedError (naming the holder) without waiting."""
        return self._acquire(True, None, None)

    def release(self) -> None:
        """Release the lock. The grant's ``lost`` is set first, so that work
        under it stops before the lock is handed on. Raises NotHolder when
        the mutex is not held. If no node can be told within the client's
        retry budget, the session is given up, so that its end releases the
        lock, and the error is raised: the lock is not left held for as
        long as the session lives. A refusal that a retry would not pass
        (PermissionDenied, say) gives the session up too, and with it every
        lock it holds. Meanwhile an acquire of the name through the session
        waits for the release."""
        g = self.session._drop_grant(self.name, releasing=True)
        if g is None:
            raise NotHolder(f"{self._kind()} {self.name!r} is not held")
        try:
            self._release(g)
        finally:
            self.session._end_release(self.name)

    def _release(self, g: Grant) -> None:
        g._end(Released(f"{self._kind()} {self.name!r} released"))
        s = self.session
        token = str(g.token)
        attempts = [0]

        def release(ep: Any, t: float) -> Dict[str, Any]:
            attempts[0] += 1
            try:
                return s.client._transport.attempt(ep, "fence.v1.LockService/Release",
                                                   s._me(lock=self.name, token=token), t)
            except NotHolder:
                if attempts[0] > 1:
                    return {}  # an earlier attempt, whose answer was lost, released it
                raise
        try:
            s.client._transport.call(release)
        except (NotHolder, NotFound):
            raise  # nothing is held: the grant, or the session, had ended
        except BaseException as err:  # an interrupt too: whether the release landed is unknown
            s._give_up(f"the release of {self.name!r}", err)
            raise

    def __enter__(self) -> Grant:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        if self.grant is not None:
            self.release()

    # -- the acquire -------------------------------------------------------

    def _request(self, try_: bool, rid: int) -> Dict[str, Any]:
        if (self._mode == _SEMAPHORE) != (self._permits > 0) or self._permits < 0:
            raise InvalidArgument(f"semaphore {self.name!r}: permits {self._permits} must be at least 1")
        req = self.session._me(lock=self.name, mode=self._mode, requestId=str(rid))
        if self._permits:
            req["permits"] = self._permits
        if self.lock_delay > 0:
            req["lockDelay"] = _wire.duration(self.lock_delay)
        if try_:
            req["try"] = True
        return req

    def _acquire(self, try_: bool, timeout: Optional[float], request: Optional[AcquireRequest]) -> Grant:
        s = self.session
        s.check()
        held = self.grant
        if held is not None and not held.lost.is_set():
            return held
        wait_until = None if timeout is None else time.monotonic() + timeout
        if not s._wait_released(self.name, wait_until):
            raise WaitTimeout(f"{self._kind()} {self.name!r}: a release of it by this session was still on its way")
        s.check()
        acq: AcquireRequest = request or AcquireRequest(s)
        req = self._request(try_, acq.id)
        tr = s.client._transport
        attempt = tr.attempt_timeout
        attempts = [0]

        def polls(ep: Any, _t: float) -> Dict[str, Any]:
            # Each attempt is bounded: a wait answers "waiting" after the
            # poll and is taken up again where it stands. After a failed
            # attempt the next one retries the request (a takeover).
            body = dict(req)
            limit = attempt
            if not try_:
                body["poll"] = _wire.duration(attempt / 2)
            while True:
                attempts[0] += 1
                if acq.cancelled.is_set():
                    raise Cancelled(f"the acquire of {self.name!r} was cancelled")
                s.check()
                if wait_until is not None:
                    body["waitTimeout"] = _wire.duration(max(wait_until - time.monotonic(), 0.001))
                r = tr.attempt(ep, "fence.v1.LockService/Acquire", body, limit)
                if not r.get("waiting"):
                    return r
                body["resumeAttempt"] = r.get("attempt", "0")
                body["poll"], limit = _wire.duration(attempt), attempt * 1.5

        try:
            # With a timeout, retrying (no leader, no node answering) ends
            # with the wait too, an attempt's length later.
            resp = tr.call(polls, deadline=None if wait_until is None else wait_until + attempt)
        except FenceError as err:
            if not _left_nothing(err, attempts[0]):
                self._abandon(acq.id)
            if s.error is not None and not isinstance(err, (InvalidArgument, LockedError)):
                raise s.error from err
            raise
        if acq.cancelled.is_set():
            # Granted as the caller gave up: give it up, never return it.
            self._abandon(acq.id)
            raise Cancelled(f"{self._kind()} {self.name!r} was granted as the acquire was cancelled, and given up again")
        # A grant answered after the safe-until (the process was paused)
        # is no grant: losing the session gives it up.
        s.check()
        token = _wire.u64(resp, "token")
        return s._hold(self.name, token)

    def _forget(self, g: Grant, cause: FenceError) -> None:
        """End grant g here, given up on the service already."""
        self.session._drop_grant(self.name, g)
        g._end(cause)

    def _abandon(self, rid: int) -> None:
        """Give up request rid (CancelAcquire), so that it leaves nothing
        held or queued; if the service cannot be told within the TTL, give
        up the session, whose end releases everything."""
        s = self.session
        if s.error is not None:
            return
        try:
            s.client._transport.unary("fence.v1.LockService/CancelAcquire",
                                      s._me(lock=self.name, requestId=str(rid)),
                                      deadline=time.monotonic() + s.ttl)
        except FenceError as err:
            s._give_up(f"a failed acquire of {self.name!r}", err)

    def _kind(self) -> str:
        return {_SHARED: "read lock", _SEMAPHORE: "semaphore"}.get(self._mode, "mutex")


def _left_nothing(err: FenceError, attempts: int) -> bool:
    """Whether a failed acquire certainly left nothing: its only attempt was
    refused."""
    refused = (InvalidArgument, LockedError, LimitError, NotFound, WaitTimeout, Cancelled,
               PermissionDenied, AuthFailed)
    return attempts == 1 and isinstance(err, refused)


class _SharedMutex(Mutex):
    _mode = _SHARED


class RWMutex:
    """A lock held either by one writer or by any number of readers, each
    grant with its own token. Waiters are granted in FIFO order, so a
    waiting writer holds back readers that come after it."""

    def __init__(self, session: "Session", name: str, *, timeout: Optional[float] = None,
                 lock_delay: float = 0.0) -> None:
        self.writer = Mutex(session, name, timeout=timeout, lock_delay=lock_delay)
        self.reader = _SharedMutex(session, name, timeout=timeout, lock_delay=lock_delay)

    def lock(self, timeout: Optional[float] = None) -> Grant:
        """Wait for the lock in exclusive mode; see Mutex.acquire."""
        return self.writer.acquire(timeout)

    def unlock(self) -> None:
        """Release the exclusive grant."""
        self.writer.release()

    def rlock(self, timeout: Optional[float] = None) -> Grant:
        """Wait for the lock in shared mode."""
        return self.reader.acquire(timeout)

    def runlock(self) -> None:
        """Release the shared grant."""
        self.reader.release()


class Semaphore(Mutex):
    """Up to ``permits`` holders at once, one permit per session, granted in
    FIFO order. Every holder must name the same number. Each permit has a
    token of its own: permit holders run at once, so fence each holder's
    own keys, not one key for all."""

    _mode = _SEMAPHORE

    def __init__(self, session: "Session", name: str, permits: int, *, timeout: Optional[float] = None,
                 lock_delay: float = 0.0) -> None:
        super().__init__(session, name, timeout=timeout, lock_delay=lock_delay, permits=permits)
