"""The resource side: refuse writes whose fencing token is stale.

A resource keeps, per protected key, the highest token it has accepted,
and accepts a write with token t only if t >= highest (then highest := t),
in one atomic step with the write (docs/design.md, "The fenced write
rule"). This module has it three ways, the same as Go's package fencing:

- :class:`Guard`, in memory, for one process;
- :class:`TokenTable`, in the caller's SQL transaction: one conditional
  statement on the table ``fence_tokens(key, token)``, the table and
  statement of Go's ``fencing/sqlitefence`` and ``fencing/pgfence``, for
  DB-API connections (sqlite3, psycopg) and SQLAlchemy connections;
- :class:`WSGIMiddleware` and :class:`ASGIMiddleware`, which read the
  ``Fence-Token`` (and ``Fence-Lock``) headers and answer a stale write 409
  with the JSON body Go's ``fencing.Middleware`` sends.

This module needs nothing of the lock service's client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading
from typing import Any, Awaitable, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, TypeVar

from ._errors import FenceError, InvalidArgument, NotHolder, StaleTokenError

T = TypeVar("T")

HEADER_TOKEN = "Fence-Token"
HEADER_LOCK = "Fence-Lock"


def check_token(key: str, token: int, highest: int) -> None:
    """The fenced write rule for one write: raise StaleTokenError if token
    is below highest, InvalidArgument for token 0, which no grant carries."""
    if token <= 0:
        raise InvalidArgument("fence: invalid argument: a fenced write needs a fencing token (tokens start at 1)")
    if token < highest:
        raise StaleTokenError(highest, token, key)


def parse_token(value: Optional[str]) -> int:
    """A Fence-Token header's token: a decimal number from 1 up."""
    if not value:
        raise InvalidArgument(f"fence: invalid argument: the {HEADER_TOKEN} header is missing")
    if not value.isdigit() or int(value) == 0 or int(value) >= 1 << 64:
        raise InvalidArgument(f"fence: invalid argument: {HEADER_TOKEN} {json.dumps(value)} "
                              "is not a fencing token (a decimal number from 1 up)")
    return int(value)


def headers(grant: Any) -> Dict[str, str]:
    """The headers that carry a grant's lock and token to a resource."""
    return {HEADER_TOKEN: str(grant.token), HEADER_LOCK: grant.lock}


def response_error(status: int, content_type: str, body: bytes) -> Optional[FenceError]:
    """The fence error of a response a fencing middleware refused (a
    StaleTokenError for 409 stale_token), or None for any other."""
    if status < 400 or content_type != "application/json":
        return None
    try:
        b = json.loads(body)
    except ValueError:
        return None
    code = b.get("code") if isinstance(b, dict) else None
    if code == "stale_token":
        return StaleTokenError(int(b.get("highest", 0)), int(b.get("token", 0)), b.get("key", ""))
    if code == "not_holder":
        return NotHolder(b.get("message", ""))
    if code == "invalid_token":
        return InvalidArgument(b.get("message", ""))
    return None


class Guard:
    """The highest token per key, in memory. Writers of one key run one at
    a time (threads, or tasks on one event loop); a write is admitted if
    its token is at least the key's highest, and its token recorded only
    when the write succeeds."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._highest: Dict[str, int] = {}
        self._keys: Dict[str, threading.Lock] = {}
        self._akeys: Dict[str, asyncio.Lock] = {}

    def highest(self, key: str) -> int:
        """The highest token admitted for key, 0 if none."""
        with self._mu:
            return self._highest.get(key, 0)

    def _check(self, key: str, token: int) -> None:
        check_token(key, token, self.highest(key))

    def _record(self, key: str, token: int) -> None:
        with self._mu:
            self._highest[key] = max(self._highest.get(key, 0), token)

    def admit(self, key: str, token: int, write: Callable[[], T]) -> T:
        """Run write if token is not stale for key, and record token when
        write returns; raise StaleTokenError (and do not run write)
        otherwise. An exception from write records nothing."""
        with self._mu:
            lock = self._keys.setdefault(key, threading.Lock())
        with lock:
            self._check(key, token)
            out = write()
            self._record(key, token)
            return out

    async def admit_async(self, key: str, token: int, write: Callable[[], Awaitable[T]]) -> T:
        """admit for coroutines, on one event loop."""
        with self._mu:
            lock = self._akeys.setdefault(key, asyncio.Lock())
        async with lock:
            self._check(key, token)
            out = await write()
            self._record(key, token)
            return out


class TokenTable:
    """The highest token per key in the SQL table ``fence_tokens``, checked
    and raised by one statement inside the caller's transaction, so that
    the token and the caller's write commit together, or neither; the
    statement holds the key's row (Postgres) or the database's write lock
    (SQLite) until the transaction ends, so admits of a key run one at a
    time, in any process. ``dialect`` is "sqlite" (qmark parameters, as
    sqlite3) or "postgres" (format parameters, as psycopg)."""

    _SQL = {
        "sqlite": ('CREATE TABLE IF NOT EXISTS fence_tokens ("key" TEXT PRIMARY KEY, "token" INTEGER NOT NULL)',
                   'INSERT INTO fence_tokens ("key", "token") VALUES (?, ?) '
                   'ON CONFLICT ("key") DO UPDATE SET "token" = excluded."token" '
                   'WHERE fence_tokens."token" <= excluded."token" RETURNING "token"',
                   'SELECT "token" FROM fence_tokens WHERE "key" = ?'),
        "postgres": ("CREATE TABLE IF NOT EXISTS fence_tokens (key text PRIMARY KEY, token bigint NOT NULL)",
                     "INSERT INTO fence_tokens AS f (key, token) VALUES (%s, %s) "
                     "ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token "
                     "RETURNING f.token",
                     "SELECT token FROM fence_tokens WHERE key = %s"),
    }

    def __init__(self, dialect: str = "sqlite") -> None:
        if dialect not in self._SQL:
            raise InvalidArgument(f"dialect {dialect!r}: want sqlite or postgres")
        self._schema, self._admit, self._highest = self._SQL[dialect]

    def ensure_schema(self, db: Any) -> None:
        """Create fence_tokens unless it exists (idempotent)."""
        _run(db, self._schema, ())

    def admit(self, db: Any, key: str, token: int) -> None:
        """Raise key's highest token to token in db's current transaction,
        or raise StaleTokenError, writing nothing. db is a DB-API connection
        or cursor, or a SQLAlchemy Connection; the caller commits (or rolls
        back) the transaction, with its own write in it. Tokens above
        2**63 - 1 are refused (the column is a signed 64-bit integer)."""
        check_token(key, token, 0)
        if token > (1 << 63) - 1:
            raise InvalidArgument(f"token {token} is above the column's range")
        if _run(db, self._admit, (key, token)) is not None:
            return
        row = _run(db, self._highest, (key,))
        highest = int(row[0]) if row else 0
        check_token(key, token, highest)
        raise FenceError(f"admitting {key}: the upsert refused token {token} though the highest is {highest}")

    def highest(self, db: Any, key: str) -> int:
        """The highest token admitted for key, 0 if none."""
        row = _run(db, self._highest, (key,))
        return int(row[0]) if row else 0


def _run(db: Any, sql: str, params: Tuple[Any, ...]) -> Optional[Any]:
    """Execute sql on a DB-API connection or cursor, or a SQLAlchemy
    Connection, and return its first row (None if it has none)."""
    if hasattr(db, "exec_driver_sql"):
        result = db.exec_driver_sql(sql, params)
    else:
        result = db.execute(sql, params)
        if result is None:  # psycopg2's cursor.execute returns None
            result = db
    if getattr(result, "returns_rows", True) is False or getattr(result, "description", ()) is None:
        return None  # a statement without rows (DDL): SQLAlchemy's and DB-API's ways of saying so
    return result.fetchone()


@contextlib.contextmanager
def sqlite_admit(conn: sqlite3.Connection, key: str, token: int,
                 table: Optional[TokenTable] = None) -> Iterator[sqlite3.Cursor]:
    """A write transaction on an sqlite3 connection with key's token
    admitted in it: BEGIN IMMEDIATE (SQLite's write lock, so concurrent
    admits wait for each other for the connection's timeout), the admit,
    then the body's statements on the cursor yielded, then COMMIT; any
    exception (StaleTokenError included, raised before the body runs)
    rolls both back. The connection must not be in a transaction."""
    table = table or TokenTable("sqlite")
    cur = conn.cursor()
    cur.execute("BEGIN IMMEDIATE")
    try:
        table.admit(cur, key, token)
        yield cur
    except BaseException:
        cur.execute("ROLLBACK")
        raise
    cur.execute("COMMIT")


def error_body(key: str, err: FenceError) -> Tuple[int, bytes]:
    """The status and JSON body of a refused write, as Go's
    fencing.Middleware writes them."""
    body: Dict[str, str] = {}
    if isinstance(err, StaleTokenError):
        status, code = 409, "stale_token"
    elif isinstance(err, NotHolder):
        status, code = 409, "not_holder"
    elif isinstance(err, InvalidArgument):
        status, code = 400, "invalid_token"
    else:
        status, code = 503, "unavailable"
    body["code"] = code
    body["message"] = str(err)
    if key:
        body["key"] = key
    if isinstance(err, StaleTokenError):
        body["token"], body["highest"] = str(err.got), str(err.have)
    return status, (json.dumps(body, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class _HandlerFailed(Exception):
    """A guarded handler answered an error: its token is not recorded."""


class WSGIMiddleware:
    """Guards a WSGI app with the fenced write rule. A guarded request
    (every method but GET, HEAD and OPTIONS) must carry Fence-Token; the key
    is Fence-Lock, or the path. It runs inside guard.admit, so writers of
    one key run one at a time, and an app that answers below 400 records
    the token. A stale token gets 409 and the app is not called; a missing
    or malformed one 400. A guarded request's answer is buffered until the
    app has returned, since whether its token is recorded depends on it."""

    def __init__(self, app: Callable[..., Iterable[bytes]], guard: Guard,
                 key: Optional[Callable[[Dict[str, Any]], str]] = None) -> None:
        self.app, self.guard = app, guard
        self.key = key or (lambda env: str(env.get("HTTP_FENCE_LOCK") or env.get("PATH_INFO") or "/"))

    def __call__(self, environ: Dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD", "GET") in _SAFE_METHODS:
            return self.app(environ, start_response)
        key = ""
        try:
            token = parse_token(environ.get("HTTP_FENCE_TOKEN"))
            key = self.key(environ)
            answer: List[Any] = []

            def write() -> None:
                def start(status: str, hdrs: List[Tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
                    answer[:] = [status, hdrs, exc_info]
                    return lambda data: None  # the legacy write callable; bodies are returned
                body = b"".join(self.app(environ, start))
                answer.append(body)
                if int(answer[0].split()[0]) >= 400:
                    raise _HandlerFailed()
            try:
                self.guard.admit(key, token, write)
            except _HandlerFailed:
                pass
            start_response(answer[0], answer[1], answer[2])
            return [answer[3]]
        except FenceError as err:
            status, body = error_body(key, err)
            start_response(f"{status} {_REASONS[status]}",
                           [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]


class ASGIMiddleware:
    """Guards an ASGI (HTTP) app as WSGIMiddleware guards a WSGI one."""

    def __init__(self, app: Callable[..., Awaitable[None]], guard: Guard,
                 key: Optional[Callable[[Dict[str, Any]], str]] = None) -> None:
        self.app, self.guard = app, guard
        self.key = key or (lambda scope: _asgi_header(scope, b"fence-lock") or scope.get("path", "/"))

    async def __call__(self, scope: Dict[str, Any], receive: Callable[..., Awaitable[Any]],
                       send: Callable[[Dict[str, Any]], Awaitable[None]]) -> None:
        if scope.get("type") != "http" or scope.get("method", "GET") in _SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        key = ""
        try:
            token = parse_token(_asgi_header(scope, b"fence-token"))
            key = self.key(scope)
            sent: List[Dict[str, Any]] = []

            async def write() -> None:
                async def hold(message: Dict[str, Any]) -> None:
                    sent.append(message)
                await self.app(scope, receive, hold)
                if sent and sent[0].get("status", 200) >= 400:
                    raise _HandlerFailed()
            try:
                await self.guard.admit_async(key, token, write)
            except _HandlerFailed:
                pass
            for message in sent:
                await send(message)
        except FenceError as err:
            status, body = error_body(key, err)
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})


def _asgi_header(scope: Dict[str, Any], name: bytes) -> str:
    for k, v in scope.get("headers", []):
        if k.lower() == name:
            return bytes(v).decode("latin-1")
    return ""


_REASONS = {400: "Bad Request", 409: "Conflict", 503: "Service Unavailable"}
