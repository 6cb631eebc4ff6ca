"""The resource side: Guard, the SQL token table, WSGI and ASGI middleware."""

from __future__ import annotations

import asyncio
import io
import os
import sqlite3
import tempfile
import threading
import unittest
from typing import Any, Dict, List

import fence
from fence import fencing

# What Go's fencing.Middleware answers a stale write of key "orders" with
# token 3 when 5 was accepted (fencing/http.go, writeError).
GO_STALE_BODY = b'{"code":"stale_token","message":"stale fencing token 3 < 5 for key orders","key":"orders","token":"3","highest":"5"}\n'


class GuardTest(unittest.TestCase):
    def test_the_fenced_write_rule(self) -> None:
        g = fencing.Guard()
        self.assertEqual(g.admit("k", 5, lambda: "w5"), "w5")
        g.admit("k", 5, lambda: None)  # a holder writes many times
        with self.assertRaises(fence.StaleTokenError) as caught:
            g.admit("k", 4, lambda: self.fail("a stale write ran"))
        self.assertEqual((caught.exception.have, caught.exception.got, caught.exception.key), (5, 4, "k"))
        with self.assertRaises(fence.InvalidArgument):
            g.admit("k", 0, lambda: None)

        def fails() -> None:
            raise RuntimeError("the write failed")
        with self.assertRaises(RuntimeError):
            g.admit("k", 9, fails)
        self.assertEqual(g.highest("k"), 5)  # a failed write records nothing

    def test_error_body_is_gos(self) -> None:
        status, body = fencing.error_body("orders", fence.StaleTokenError(5, 3, "orders"))
        self.assertEqual((status, body), (409, GO_STALE_BODY))
        err = fencing.response_error(409, "application/json", body)
        assert isinstance(err, fence.StaleTokenError)
        self.assertEqual((err.have, err.got), (5, 3))


def _wsgi_call(app: Any, method: str, headers: Dict[str, str], path: str = "/orders") -> "tuple[str, bytes]":
    environ: Dict[str, Any] = {"REQUEST_METHOD": method, "PATH_INFO": path, "wsgi.input": io.BytesIO(b"")}
    for k, v in headers.items():
        environ["HTTP_" + k.upper().replace("-", "_")] = v
    got: List[str] = []
    body = b"".join(app(environ, lambda status, hdrs, exc=None: got.append(status)))
    return got[0], body


class MiddlewareTest(unittest.TestCase):
    def test_wsgi(self) -> None:
        writes: List[str] = []

        def app(environ: Dict[str, Any], start_response: Any) -> List[bytes]:
            writes.append(environ.get("HTTP_FENCE_TOKEN", ""))
            start_response("200 OK", [])
            return [b"done"]
        guard = fencing.Guard()
        mw = fencing.WSGIMiddleware(app, guard)
        self.assertEqual(_wsgi_call(mw, "PUT", {"Fence-Token": "5", "Fence-Lock": "orders"}), ("200 OK", b"done"))
        self.assertEqual(_wsgi_call(mw, "PUT", {"Fence-Token": "3", "Fence-Lock": "orders"}), ("409 Conflict", GO_STALE_BODY))
        status, body = _wsgi_call(mw, "POST", {})
        self.assertEqual(status, "400 Bad Request")
        self.assertIn(b'"code":"invalid_token"', body)
        self.assertEqual(_wsgi_call(mw, "GET", {}), ("200 OK", b"done"))  # reads are not guarded
        self.assertEqual(writes, ["5", ""])
        self.assertEqual(guard.highest("orders"), 5)

    def test_asgi(self) -> None:
        async def app(scope: Dict[str, Any], receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        async def call(mw: Any, token: str) -> "tuple[int, bytes]":
            sent: List[Dict[str, Any]] = []

            async def send(m: Dict[str, Any]) -> None:
                sent.append(m)
            scope = {"type": "http", "method": "PUT", "path": "/x",
                     "headers": [(b"fence-token", token.encode()), (b"fence-lock", b"orders")]}
            await mw(scope, None, send)
            return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])
        guard = fencing.Guard()
        mw = fencing.ASGIMiddleware(app, guard)
        self.assertEqual(asyncio.run(call(mw, "5")), (204, b""))
        self.assertEqual(asyncio.run(call(mw, "3")), (409, GO_STALE_BODY))


class TokenTableTest(unittest.TestCase):
    def setUp(self) -> None:
        fd, self.path = tempfile.mkstemp(suffix=".db")
        os.close(fd)
        self.addCleanup(os.remove, self.path)
        self.conn = sqlite3.connect(self.path, isolation_level=None, timeout=5)
        self.addCleanup(self.conn.close)
        self.table = fencing.TokenTable("sqlite")
        self.table.ensure_schema(self.conn)
        self.conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT)")
        self.conn.execute("INSERT INTO orders VALUES (17, 'new')")

    def status(self) -> str:
        return self.conn.execute("SELECT status FROM orders WHERE id = 17").fetchone()[0]

    def test_token_and_write_commit_together(self) -> None:
        with fencing.sqlite_admit(self.conn, "orders/17", 7) as cur:
            cur.execute("UPDATE orders SET status = 'paid' WHERE id = 17")
        self.assertEqual(self.table.highest(self.conn, "orders/17"), 7)
        with self.assertRaises(fence.StaleTokenError) as caught:
            with fencing.sqlite_admit(self.conn, "orders/17", 6) as cur:
                cur.execute("UPDATE orders SET status = 'stale' WHERE id = 17")
        self.assertEqual((caught.exception.have, caught.exception.got), (7, 6))
        self.assertEqual(self.status(), "paid")
        with self.assertRaises(RuntimeError):
            with fencing.sqlite_admit(self.conn, "orders/17", 8) as cur:
                cur.execute("UPDATE orders SET status = 'half' WHERE id = 17")
                raise RuntimeError("the caller's write failed")
        self.assertEqual((self.status(), self.table.highest(self.conn, "orders/17")), ("paid", 7))

    def test_in_the_callers_transaction(self) -> None:
        # Python's default sqlite3 mode opens the transaction itself; the
        # admit is one statement in it, committed by the caller.
        conn = sqlite3.connect(self.path, timeout=5)
        self.addCleanup(conn.close)
        conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 17")
        self.table.admit(conn, "orders/17", 9)
        conn.commit()
        self.assertEqual((self.status(), self.table.highest(self.conn, "orders/17")), ("shipped", 9))

    def test_concurrent_admits_serialize(self) -> None:
        errors: List[Exception] = []

        def admit(token: int) -> None:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=5)
            try:
                with fencing.sqlite_admit(conn, "k", token):
                    pass
            except fence.StaleTokenError as e:
                errors.append(e)
            finally:
                conn.close()
        threads = [threading.Thread(target=admit, args=(t,)) for t in range(1, 21)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(self.table.highest(self.conn, "k"), 20)
        self.assertTrue(all(e.got < e.have for e in errors))
