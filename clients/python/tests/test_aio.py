"""fence.aio: the same core behind async with, and cancelled acquires."""

from __future__ import annotations

import asyncio

import fence
import fence.aio

from .support import NodeTest, wait_for


class AioTest(NodeTest):
    def test_async_with(self) -> None:
        async def main() -> "tuple[int, bytes]":
            async with fence.aio.AsyncClient(endpoints=self.group.endpoints) as c:
                async with await c.session(5) as s:
                    async with s.lock("aio/a") as g:
                        await c.kv.put("aio/a/k", b"v", grant=g)
                        kv = await c.kv.get("aio/a/k")
                    self.assertTrue(g.lost.is_set())
                    return g.token, kv.value
        token, value = asyncio.run(main())
        self.assertGreater(token, 0)
        self.assertEqual(value, b"v")

    def test_a_cancelled_task_leaves_nothing(self) -> None:
        holder = self.session()
        m = holder.lock("aio/busy")
        m.acquire()

        async def main() -> int:
            c = fence.aio.AsyncClient(endpoints=self.group.endpoints)
            s = await c.session(10)
            task = asyncio.ensure_future(s.lock("aio/busy").acquire())
            await asyncio.sleep(0)
            await asyncio.get_running_loop().run_in_executor(None, wait_for, lambda: self.waiters("aio/busy"))
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            self.assertEqual(self.waiters("aio/busy"), set())
            await s.close()
            await c.close()
            return s.sync.id
        asyncio.run(main())
        m.release()
        self.assertEqual(self.client.locks("aio/busy"), [])

    def waiters(self, name: str) -> "set[str]":
        return {w["sessionId"] for lock in self.client.locks(name) for w in lock.get("waiters", [])}

    def test_lost_is_awaitable(self) -> None:
        s = self.session()
        g = s.lock("aio/lost").acquire()

        async def main() -> None:
            waiter = asyncio.ensure_future(fence.aio.wait_lost(g))
            await asyncio.sleep(0)
            self.assertFalse(waiter.done())
            await asyncio.get_running_loop().run_in_executor(None, s.lock("aio/lost").release)
            await asyncio.wait_for(waiter, 5)
        asyncio.run(main())

    def test_watch(self) -> None:
        async def main() -> "list[tuple[str, str]]":
            c = fence.aio.AsyncClient(endpoints=self.group.endpoints)
            _, revision = await c.kv.list("aio/w/")
            w = c.kv.watch("aio/w/", start_revision=revision + 1)
            await c.kv.put("aio/w/a", b"1")
            await c.kv.delete("aio/w/a")
            seen = []
            async for ev in w:
                seen.append((ev.type, ev.kv.key))
                if len(seen) == 2:
                    w.close()
            await c.close()
            return seen
        self.assertEqual(asyncio.run(main()), [("put", "aio/w/a"), ("delete", "aio/w/a")])
