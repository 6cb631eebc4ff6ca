"""The cross-language scenarios of clients/scenarios.json, one test each,
named test_scenario_ID (the Go runner checks that each passed)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import unittest
import urllib.request
from typing import Any, Dict, List, Tuple
from wsgiref.simple_server import WSGIRequestHandler, make_server

import fence
import fence.aio
from fence import fencing

from .support import CONTROL, Group, shared_group

HERE = os.path.dirname(os.path.abspath(__file__))


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


class Resource:
    """An HTTP resource behind fence.fencing.WSGIMiddleware that keeps the
    writes it accepted."""

    def __init__(self) -> None:
        self.guard = fencing.Guard()
        self.writes: List[Tuple[str, bytes]] = []

        def app(environ: Dict[str, Any], start_response: Any) -> List[bytes]:
            n = int(environ.get("CONTENT_LENGTH") or 0)
            self.writes.append((environ["HTTP_FENCE_TOKEN"], environ["wsgi.input"].read(n)))
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok\n"]
        self.server = make_server("127.0.0.1", 0, fencing.WSGIMiddleware(app, self.guard), handler_class=_Quiet)
        self.url = f"http://127.0.0.1:{self.server.server_port}/paused"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def put(self, body: bytes, grant: fence.Grant) -> int:
        req = urllib.request.Request(self.url, data=body, method="PUT", headers=fencing.headers(grant))
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ScenarioTest(unittest.TestCase):
    def setUp(self) -> None:
        if not CONTROL:
            self.skipTest("FENCE_TEST_CONTROL is not set: run through go test ./clients/ -run TestPythonClient")

    def test_scenario_smallest_program(self) -> None:
        g = Group(1)
        c = fence.Client(endpoints=g.endpoints)
        self.addCleanup(c.close)
        s = c.session(ttl=10)
        self.addCleanup(s.close)
        m = s.lock("orders")
        with m as first:
            c.kv.put("orders/17", b"paid", token=first.token)
        with m as again:
            c.kv.put("orders/17", b"shipped", token=again.token)
            with self.assertRaises(fence.StaleTokenError) as caught:
                c.kv.put("orders/17", b"late", token=first.token)
        self.assertEqual((caught.exception.got, caught.exception.have), (first.token, again.token))
        kv = c.kv.get("orders/17")
        assert kv is not None
        self.assertEqual(kv.value, b"shipped")

    def test_scenario_paused_holder(self) -> None:
        g = shared_group()
        ttl = 2.0
        resource = Resource()
        self.addCleanup(resource.close)
        env = dict(os.environ)
        holder = subprocess.Popen([sys.executable, "-S", os.path.join(HERE, "holder.py"), g.endpoints[0], "paused",
                                   str(ttl), resource.url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  env=env, text=True)
        self.addCleanup(holder.stdout.close)
        self.addCleanup(holder.stdin.close)
        self.addCleanup(holder.wait, 10)
        self.addCleanup(holder.kill)
        first = holder.stdout.readline().split()
        self.assertEqual(first[0], "token", first)
        token1 = int(first[1])

        os.kill(holder.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        c = g.client()
        self.addCleanup(c.close)
        s = c.session(10)
        self.addCleanup(s.close)
        second = s.lock("paused").acquire(timeout=30)
        self.assertGreater(second.token, token1)
        self.assertEqual(resource.put(b"from the second holder", second), 200)
        time.sleep(max(0.0, stopped + 3 * ttl - time.monotonic()))  # the scenario's pause: 3x the ttl
        os.kill(holder.pid, signal.SIGCONT)

        holder.stdin.write("write\n")
        holder.stdin.flush()
        self.assertEqual(holder.stdout.readline().split(), ["lost", "True", "SessionLostError"])
        status = holder.stdout.readline().rstrip("\n").split(" ", 2)
        self.assertEqual(status[:2], ["status", "409"], status)
        want = {"code": "stale_token", "message": f"stale fencing token {token1} < {second.token} for key paused",
                "key": "paused", "token": str(token1), "highest": str(second.token)}
        self.assertEqual(json.loads(status[2]), want)
        # The body is Go's fencing.Middleware's, byte for byte (its JSON
        # encoder's compact form, fields in ErrorBody's order).
        self.assertEqual(status[2], json.dumps(want, separators=(",", ":")))
        self.assertEqual(resource.writes, [(str(second.token), b"from the second holder")])
        self.assertEqual(resource.guard.highest("paused"), second.token)

    def test_scenario_stalled_keepalives(self) -> None:
        g = Group(1)
        c = g.client()
        self.addCleanup(c.close)
        s = c.session(ttl=2)
        grant = s.lock("stalled").acquire()
        g.act("pause", "all")
        self.addCleanup(g.act, "resume", "all")
        safe_until = s.safe_until
        self.assertTrue(grant.lost.wait(5), "the grant was not signalled lost")
        lost_at = time.monotonic()
        self.assertTrue(s.lost.is_set())
        self.assertIsInstance(s.error, fence.SessionLostError)
        self.assertIsInstance(grant.error, fence.SessionLostError)
        # Not before the TTL's safe share, and no later than safe-until + 250 ms.
        self.assertGreaterEqual(lost_at, safe_until)
        self.assertLessEqual(lost_at, safe_until + 0.25)
        g.act("resume", "all")
        s.close()

    def test_scenario_cancelled_acquire(self) -> None:
        g = shared_group()
        c = g.client()
        self.addCleanup(c.close)
        a, b, d = (c.session(10) for _ in range(3))
        for s in (a, b, d):
            self.addCleanup(s.close)
        held = a.lock("busy")
        held.acquire()
        with self.assertRaises(TimeoutError):
            b.lock("busy").acquire(timeout=0.3)

        async def cancelled() -> int:
            ac = fence.aio.AsyncClient(endpoints=g.endpoints)
            sc = await ac.session(10)
            try:
                with self.assertRaises(asyncio.TimeoutError):
                    await asyncio.wait_for(sc.lock("busy").acquire(), 0.3)
                return sc.sync.id
            finally:
                await sc.close()
                await ac.close()
        c_id = asyncio.run(cancelled())

        info = c.locks("busy")
        waiters = {w["sessionId"] for lock in info if lock["name"] == "busy" for w in lock.get("waiters", [])}
        self.assertNotIn(str(b.id), waiters)
        self.assertNotIn(str(c_id), waiters)
        held.release()
        start = time.monotonic()
        d.lock("busy").acquire(timeout=1.0)
        self.assertLess(time.monotonic() - start, 1.0)

    def test_scenario_leader_killed(self) -> None:
        g = Group(3)
        c = g.client()
        self.addCleanup(c.close)
        s = c.session(5)
        self.addCleanup(s.close)
        m = s.lock("loop")
        tokens: List[int] = []
        written: Dict[str, bytes] = {}
        killed: List[float] = []
        after = 0
        i = 0
        while after < 20:
            if i == 20:
                threading.Thread(target=lambda: (g.act("kill", "leader"), killed.append(time.monotonic()))).start()
            grant = m.acquire()
            if tokens:
                self.assertGreater(grant.token, tokens[-1])
            tokens.append(grant.token)
            key, value = f"loop/{i}", str(grant.token).encode()
            c.kv.put(key, value, grant=grant)
            written[key] = value
            m.release()
            if killed:
                after += 1
            i += 1
            self.assertLess(i, 2000, "the loop did not get past the failover")
        for key, value in written.items():
            kv = c.kv.get(key)
            self.assertIsNotNone(kv, key)
            self.assertEqual(kv.value, value, key)

    def test_scenario_tls_token_failover(self) -> None:
        g = Group(3, tls=True, auth=True)
        c = fence.Client(endpoints=g.endpoints, cafile=g.ca_file, token=g.token)
        self.addCleanup(c.close)
        s = c.session(10)
        self.addCleanup(s.close)
        m = s.lock("tls")
        first = m.acquire()
        c.kv.put("tls/k", b"one", grant=first)
        m.release()
        leader = g.leader()
        self.assertEqual(c._transport._endpoint_at(c._transport._current_index()).hostport, leader["endpoint"])
        g.act("kill", leader["node"])
        second = m.acquire()
        self.assertGreater(second.token, first.token)
        self.assertNotEqual(c._transport._endpoint_at(c._transport._current_index()).hostport, leader["endpoint"])
        c.kv.put("tls/k", b"two", grant=second)
        m.release()
        anonymous = fence.Client(endpoints=g.endpoints, cafile=g.ca_file)
        self.addCleanup(anonymous.close)
        with self.assertRaises(fence.Unauthenticated):
            anonymous.session(10)


if __name__ == "__main__":
    unittest.main()
