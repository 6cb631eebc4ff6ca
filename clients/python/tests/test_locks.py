"""Mutex, RWMutex, Semaphore and leases against a node."""

from __future__ import annotations

import http.client
import http.server
import threading
import time
import urllib.parse
from typing import Callable, Dict

import fence

from .support import Group, NodeTest, wait_for


class MutexTest(NodeTest):
    def waiters(self, name: str) -> "set[str]":
        return {w["sessionId"] for lock in self.client.locks(name) if lock["name"] == name
                for w in lock.get("waiters", [])}

    def test_exclusive_and_handed_on(self) -> None:
        a, b = self.session(), self.session()
        ma = a.lock("m/handoff")
        g1 = ma.acquire()
        self.assertIs(ma.acquire(), g1)  # held: the same grant
        with self.assertRaises(fence.LockedError) as caught:
            b.lock("m/handoff").try_acquire()
        self.assertEqual((caught.exception.holder, caught.exception.holder_token), (a.id, g1.token))
        got = []
        t = threading.Thread(target=lambda: got.append(b.lock("m/handoff").acquire(timeout=10)))
        t.start()
        wait_for(lambda: str(b.id) in self.waiters("m/handoff"), what="b waits")
        ma.release()
        self.assertTrue(g1.lost.is_set())
        self.assertIsInstance(g1.error, fence.Released)
        t.join()
        self.assertGreater(got[0].token, g1.token)
        with self.assertRaises(fence.NotHolder):
            ma.release()

    def test_a_timed_out_acquire_leaves_nothing(self) -> None:
        a, b = self.session(), self.session()
        ma = a.lock("m/timeout")
        ma.acquire()
        start = time.monotonic()
        with self.assertRaises(fence.WaitTimeout):
            b.lock("m/timeout").acquire(timeout=0.2)
        self.assertLess(time.monotonic() - start, 2)
        self.assertEqual(self.waiters("m/timeout"), set())

    def test_a_cancelled_acquire_leaves_nothing(self) -> None:
        a, b = self.session(), self.session()
        a.lock("m/cancel").acquire()
        request = fence.AcquireRequest(b)
        errors = []

        def wait() -> None:
            try:
                b.lock("m/cancel").acquire(request=request)
            except fence.FenceError as e:
                errors.append(e)
        t = threading.Thread(target=wait)
        t.start()
        wait_for(lambda: str(b.id) in self.waiters("m/cancel"), what="b waits")
        request.cancelled.set()
        b.lock("m/cancel")._abandon(request.id)
        t.join(5)
        self.assertFalse(t.is_alive())
        self.assertIsInstance(errors[0], fence.Cancelled)
        self.assertEqual(self.waiters("m/cancel"), set())

    def test_rwmutex(self) -> None:
        r1, r2, w = self.session(), self.session(), self.session()
        g1 = r1.rwlock("m/rw").rlock()
        g2 = r2.rwlock("m/rw").rlock()
        self.assertNotEqual(g1.token, g2.token)
        with self.assertRaises(fence.LockedError):
            w.rwlock("m/rw").writer.try_acquire()
        r1.rwlock("m/rw")  # a new handle holds nothing
        for s in (r1, r2):
            s.close()
        wl = w.rwlock("m/rw")
        self.assertGreater(wl.lock(timeout=2).token, g2.token)
        wl.unlock()

    def test_semaphore(self) -> None:
        a, b, c = self.session(), self.session(), self.session()
        a.semaphore("m/sem", 2).acquire()
        b.semaphore("m/sem", 2).acquire()
        with self.assertRaises(fence.LockedError):
            c.semaphore("m/sem", 2).try_acquire()
        with self.assertRaises(fence.InvalidArgument):
            c.semaphore("m/sem", 0).acquire()

    def test_lease(self) -> None:
        before = time.monotonic()
        with self.client.lease("m/lease", 5) as lease:
            self.assertGreater(lease.token, 0)
            self.assertGreater(lease.safe_until, before)
            self.assertLessEqual(lease.safe_until, time.monotonic() + 5 * 0.99 - 0.1)
            with self.assertRaises(fence.LockedError):
                self.client.lease("m/lease", 5)
            lease.renew()
            again = self.client.resume_lease(lease.id, lease.secret)
            again.renew()
            self.assertEqual(again.token, lease.token)
        self.assertEqual(self.client.locks("m/lease"), [])

    def test_a_wait_through_an_outage_leaves_nothing(self) -> None:
        # The node stops answering during the wait: the acquire ends with
        # its timeout, not the retry budget, and since its request cannot
        # be given up on the service, the session is given up instead.
        g = Group(1)
        c = g.client()
        self.addCleanup(c.close)
        s = c.session(2)
        g.act("pause", "all")
        self.addCleanup(g.act, "resume", "all")
        start = time.monotonic()
        with self.assertRaises(fence.SessionLostError):
            s.lock("m/outage").acquire(timeout=0.5)
        self.assertLess(time.monotonic() - start, 0.5 + 1.0 + 2 + 1.0)  # the wait, an attempt, the TTL, slack
        g.act("resume", "all")
        wait_for(lambda: c.locks("m/outage") == [], what="the lock left by nobody")

    def test_a_release_through_an_outage_gives_the_session_up(self) -> None:
        # The node stops answering as the lock is released: once the
        # retry budget is spent, the session is given up, so that its end
        # releases the lock, rather than the lock staying held for as long
        # as the session lives (its keepalives resume with the node).
        g = Group(1)
        c = g.client(retry_budget=1.0)
        self.addCleanup(c.close)
        s = c.session(5)
        m = s.lock("m/release-outage")
        m.acquire()
        g.act("pause", "all")
        self.addCleanup(g.act, "resume", "all")
        with self.assertRaises(fence.FenceError):
            m.release()
        g.act("resume", "all")
        self.assertIsInstance(s.error, fence.SessionLostError)
        wait_for(lambda: c.locks("m/release-outage") == [], timeout=10, what="the lock released by the session's end")

    def test_an_acquire_during_a_release_is_not_handed_the_grant_being_released(self) -> None:
        # As in the Go and TypeScript clients: an acquire of the name
        # through the session while a release of it is on its way (here:
        # about to be sent, as when it is being retried) waits for it,
        # rather than be handed the grant being released, to see it
        # released under it. (Found in review.)
        s = self.session()
        a, b = s.lock("m/release-race"), s.lock("m/release-race")
        g1 = a.acquire()
        tr = s.client._transport
        real = tr.call
        got = []
        t = threading.Thread(target=lambda: got.append(b.acquire(timeout=10)), daemon=True)

        def call(fn, *args, **kw):  # type: ignore[no-untyped-def]
            if getattr(fn, "__name__", "") == "release" and not t.is_alive() and not got:
                t.start()
                t.join(1.0)  # an acquire that does not wait for the release is answered meanwhile
            return real(fn, *args, **kw)
        tr.call = call  # type: ignore[method-assign]
        try:
            a.release()
        finally:
            tr.call = real  # type: ignore[method-assign]
        t.join(10)
        g2 = got[0]
        self.assertFalse(g2.lost.is_set())
        held = [h["token"] for lock in self.client.locks("m/release-race") for h in lock.get("holders", [])]
        self.assertIn(str(g2.token), held,
                      f"b believes it holds token {g2.token} (g1's was {g1.token}); the service holds {held}")

    def test_a_release_answered_with_garbage_gives_the_session_up(self) -> None:
        # A gateway in front of the node answers the release 200 with a page
        # of its own. The client cannot tell whether the node released the
        # lock: it raises a FenceError (not the JSON parser's ValueError)
        # and gives the session up, so that its end releases the lock,
        # rather than dropping the grant while the session keeps it.
        g = Group(1)

        def page(path: str, n: int) -> "tuple[int, bytes] | None":
            return (200, b"<html>upstream busy</html>") if path.endswith(".LockService/Release") else None
        c = fence.Client(endpoints=[self.gateway(g, page)], retry_budget=1.0)
        self.addCleanup(c.close)
        s = c.session(5)
        m = s.lock("m/release-garbage")
        m.acquire()
        with self.assertRaises(fence.FenceError):
            m.release()
        self.assertIsInstance(s.error, fence.SessionLostError)
        direct = g.client()
        self.addCleanup(direct.close)
        wait_for(lambda: direct.locks("m/release-garbage") == [], timeout=10, what="the lock released by the session's end")

    def test_a_lease_whose_answer_was_lost_is_retried(self) -> None:
        # The gateway loses the first Lease answer (502). The client drew
        # the lease's secret and sends it again: the retry is answered the
        # lease the lost attempt took, not refused as held by it.
        g = Group(1)

        def lose_first(path: str, n: int) -> "tuple[int, bytes] | None":
            return (502, b"") if path.endswith(".LockService/Lease") and n == 1 else None
        c = fence.Client(endpoints=[self.gateway(g, lose_first)])
        self.addCleanup(c.close)
        lease = c.lease("m/lease-lost-answer", 30)
        held = c.locks("m/lease-lost-answer")
        self.assertEqual([(h["sessionId"], h["token"]) for h in held[0]["holders"]], [(str(lease.id), str(lease.token))])
        self.assertTrue(lease.release())

    def test_a_lease_from_a_node_that_knows_no_lease_secret(self) -> None:
        # A node from before caller-drawn secrets refuses the field in JSON,
        # as the gateway answers here for it: the client asks again without
        # it, and the node draws the secret.
        g = Group(1)
        refusal = (b'{"code":"invalid_argument","message":"unmarshal message: the body is not a valid JSON '
                   b'fence.v1.LeaseRequest: proto: (line 1:60): unknown field \\"leaseSecret\\""}')

        def old_node(path: str, n: int) -> "tuple[int, bytes] | None":
            return (400, refusal) if path.endswith(".LockService/Lease") and n == 1 else None
        c = fence.Client(endpoints=[self.gateway(g, old_node)])
        self.addCleanup(c.close)
        lease = c.lease("m/lease-old-node", 30)
        self.assertGreater(lease.token, 0)
        self.assertTrue(lease.release())

    def gateway(self, g: Group, answer: "Callable[[str, int], tuple[int, bytes] | None]") -> str:
        """An HTTP gateway on loopback in front of g's first node: it
        forwards each call, but answers the n-th call of a path as
        answer(path, n) says, when that is not None (the node is then not
        asked, or its answer is dropped for 502)."""
        ep = g.endpoints[0]
        node = urllib.parse.urlsplit(ep if "://" in ep else "http://" + ep)
        counts: Dict[str, int] = {}
        mu = threading.Lock()

        class Gateway(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with mu:
                    counts[self.path] = counts.get(self.path, 0) + 1
                    n = counts[self.path]
                canned = answer(self.path, n)
                if canned is None or canned[0] == 502:
                    conn = http.client.HTTPConnection(node.hostname, node.port, timeout=10)
                    conn.request("POST", self.path, body=body,
                                 headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
                    resp = conn.getresponse()
                    status, headers, data = resp.status, resp.getheaders(), resp.read()
                    conn.close()
                if canned is not None:
                    status, headers, data = canned[0], [], canned[1]
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in ("content-length", "connection", "transfer-encoding", "date", "server"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        gw = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
        threading.Thread(target=gw.serve_forever, daemon=True).start()
        self.addCleanup(gw.server_close)
        self.addCleanup(gw.shutdown)
        return f"127.0.0.1:{gw.server_address[1]}"

    def test_lock_delay_holds_the_lock_after_an_expiry(self) -> None:
        a = self.session()
        a.lock("m/delay", lock_delay=30).acquire()
        self.client._transport.unary("fence.v1.ClusterService/RevokeSession", {"sessionId": str(a.id)})
        info = wait_for(lambda: self.client.locks("m/delay"), what="the lock under its delay")
        self.assertTrue(info[0].get("delayed"))
        self.assertEqual(info[0].get("holders", []), [])
        with self.assertRaises(fence.LockedError):  # held back, though nobody holds it
            self.session().lock("m/delay").try_acquire()
