"""asyncio flavour of the client, on the same core.

Each call runs the blocking core (the same Session, Mutex and KV, with the
same keepalive thread and safe-until) in the event loop's default thread
executor, so the guarantees are the threaded client's, word for word. A
lock acquire whose task is cancelled (``asyncio.wait_for`` timing out,
``task.cancel()``) gives its request up on the service (``CancelAcquire``)
before the CancelledError propagates, and the blocked core call ends with
it: nothing is left held or queued. ``grant.lost`` is a threading.Event;
await it with ``await fence.aio.wait_lost(grant)``.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable, Optional, Sequence, TypeVar

from . import client as _client
from .client import DEFAULT_ENDPOINT
from ._errors import Cancelled, FenceError
from .kv import KV, Event, Watch
from .locks import AcquireRequest, Mutex
from .session import Grant, Session

T = TypeVar("T")


async def _run(fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args, **kw))


async def wait_lost(grant: Grant) -> None:
    """Return once the grant's ``lost`` is set."""
    while not await _run(grant.lost.wait, 1.0):
        pass


class AsyncKV:
    """The fenced KV store: each method is KV's, with its arguments and
    promises, awaited."""

    def __init__(self, kv: KV) -> None:
        self.sync = kv

    async def put(self, key: str, value: Any, **kw: Any) -> int:
        return await _run(self.sync.put, key, value, **kw)

    async def get(self, key: str, **kw: Any) -> Any:
        return await _run(self.sync.get, key, **kw)

    async def delete(self, key: str, **kw: Any) -> bool:
        return await _run(self.sync.delete, key, **kw)

    async def list(self, prefix: str = "", **kw: Any) -> Any:
        return await _run(self.sync.list, prefix, **kw)

    async def txn(self, *args: Any, **kw: Any) -> Any:
        return await _run(self.sync.txn, *args, **kw)

    def watch(self, prefix: str, *, start_revision: int = 0) -> "AsyncWatch":
        """KV.watch as an async iterator: ``async for event in kv.watch(p)``."""
        return AsyncWatch(self.sync.watch(prefix, start_revision=start_revision))


class AsyncWatch:
    """A Watch for asyncio: each event is read in the executor; close()
    ends the iteration, as Watch.close does."""

    def __init__(self, watch: Watch) -> None:
        self.sync = watch
        self._events = iter(watch)

    def __aiter__(self) -> "AsyncWatch":
        return self

    def _next(self) -> Optional[Event]:
        return next(self._events, None)

    async def __anext__(self) -> Event:
        event = await _run(self._next)
        if event is None:
            raise StopAsyncIteration
        return event

    def close(self) -> None:
        self.sync.close()


class AsyncClient:
    """fence.Client for asyncio; the same arguments."""

    def __init__(self, endpoints: Sequence[str] = (DEFAULT_ENDPOINT,), **kw: Any) -> None:
        self.sync = _client.Client(endpoints, **kw)
        self.kv = AsyncKV(self.sync.kv)

    async def session(self, ttl: float = 10.0, **kw: Any) -> "AsyncSession":
        """Create a session (see Client.session)."""
        return AsyncSession(await _run(self.sync.session, ttl, **kw))

    async def check(self, lock: str, token: int, **kw: Any) -> Any:
        return await _run(self.sync.check, lock, token, **kw)

    async def locks(self, prefix: str = "", **kw: Any) -> Any:
        return await _run(self.sync.locks, prefix, **kw)

    async def close(self) -> None:
        self.sync.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncSession:
    """A Session for asyncio; ``async with`` closes it."""

    def __init__(self, session: Session) -> None:
        self.sync = session

    @property
    def lost(self) -> Any:
        return self.sync.lost

    @property
    def safe_until(self) -> float:
        return self.sync.safe_until

    def lock(self, name: str, **kw: Any) -> "AsyncMutex":
        """An exclusive lock; ``async with session.lock(name) as grant:``."""
        return AsyncMutex(self.sync.lock(name, **kw))

    def semaphore(self, name: str, permits: int, **kw: Any) -> "AsyncMutex":
        return AsyncMutex(self.sync.semaphore(name, permits, **kw))

    async def close(self) -> None:
        await _run(self.sync.close)

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncMutex:
    """A Mutex (or Semaphore) for asyncio."""

    def __init__(self, mutex: Mutex) -> None:
        self.sync = mutex

    async def acquire(self, timeout: Optional[float] = None) -> Grant:
        """Wait for the lock (see Mutex.acquire). Cancelling the task gives
        the request up on the service before CancelledError propagates."""
        request = AcquireRequest(self.sync.session)
        fut = asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self.sync.acquire, timeout, request=request))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            request.cancelled.set()
            # Tell the service now: the blocked poll ends at once, and a
            # grant that raced the cancel is released.
            await asyncio.shield(_run(self.sync._abandon, request.id))
            try:
                granted = await asyncio.shield(fut)
            except FenceError:
                raise asyncio.CancelledError() from None
            self.sync._forget(granted, Cancelled("the acquire was cancelled as it was granted, and given up"))
            raise

    async def try_acquire(self) -> Grant:
        return await _run(self.sync.try_acquire)

    async def release(self) -> None:
        await _run(self.sync.release)

    async def __aenter__(self) -> Grant:
        return await self.acquire()

    async def __aexit__(self, *exc: Any) -> None:
        if self.sync.grant is not None:
            await self.release()
