"""The fenced KV store: puts fenced by a grant's token, CAS, txns, watch.

The store applies the fenced write rule itself: per key it keeps the
highest token it accepted and refuses a lower one (StaleTokenError, with
both tokens). Every write carries an idempotency key, the same across the
retries of one call, so a write retried after its answer was lost applies
once.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Union

from . import _wire
from ._errors import FenceError, InvalidArgument, Unavailable

if TYPE_CHECKING:
    from ._transport import ServerStream, Transport
    from .session import Grant, Session

Value = Union[bytes, str]


@dataclass(frozen=True)
class KeyValue:
    """A key as the store has it. ``token`` and ``lock`` are those of the
    write that set the value (0 if unfenced); ``highest_token`` the highest
    the key ever accepted."""

    key: str
    value: bytes
    token: int = 0
    lock: str = ""
    highest_token: int = 0
    create_revision: int = 0
    mod_revision: int = 0
    version: int = 0
    session_id: int = 0

    @classmethod
    def from_json(cls, m: Dict[str, Any]) -> "KeyValue":
        return cls(key=m.get("key", ""), value=_wire.unb64(m.get("value")), token=_wire.u64(m, "token"),
                   lock=m.get("lock", ""), highest_token=_wire.u64(m, "highestToken"),
                   create_revision=_wire.u64(m, "createRevision"), mod_revision=_wire.u64(m, "modRevision"),
                   version=_wire.u64(m, "version"), session_id=_wire.u64(m, "sessionId"))


@dataclass(frozen=True)
class Event:
    """A change a watch delivers: ``type`` is "put" or "delete"; for a
    delete, ``kv`` has the key, its new mod_revision and the delete's token."""

    type: str
    kv: KeyValue


@dataclass(frozen=True)
class TxnResult:
    """A txn's outcome: whether the compares held (then ran), the store's
    revision after it, and one answer per operation of the branch that ran."""

    succeeded: bool
    revision: int
    results: List[Dict[str, Any]]


class Compare:
    """Compares of a txn, key OP operand: ``Compare.mod_revision(k, 3)``,
    ``Compare.value(k, b"x", "!=")``, ``Compare.absent(k)``."""

    _OPS = {"==": "COMPARE_OP_EQUAL", "!=": "COMPARE_OP_NOT_EQUAL", "<": "COMPARE_OP_LESS", ">": "COMPARE_OP_GREATER"}

    @classmethod
    def _of(cls, key: str, op: str, **target: Any) -> Dict[str, Any]:
        if op not in cls._OPS:
            raise InvalidArgument(f"compare op {op!r}: want one of {', '.join(cls._OPS)}")
        return {"key": key, "op": cls._OPS[op], **target}

    @classmethod
    def value(cls, key: str, value: Value, op: str = "==") -> Dict[str, Any]:
        return cls._of(key, op, value=_wire.b64(value))

    @classmethod
    def version(cls, key: str, version: int, op: str = "==") -> Dict[str, Any]:
        return cls._of(key, op, version=str(version))

    @classmethod
    def mod_revision(cls, key: str, revision: int, op: str = "==") -> Dict[str, Any]:
        return cls._of(key, op, modRevision=str(revision))

    @classmethod
    def absent(cls, key: str, absent: bool = True) -> Dict[str, Any]:
        return {"key": key, "absent": absent}


class Op:
    """Operations of a txn: ``Op.put(k, v)``, ``Op.delete(k)``, ``Op.get(k)``."""

    @staticmethod
    def put(key: str, value: Value, session: Optional["Session"] = None) -> Dict[str, Any]:
        put: Dict[str, Any] = {"key": key, "value": _wire.b64(value)}
        if session is not None:
            put.update(session._me())
        return {"put": put}

    @staticmethod
    def delete(key: str) -> Dict[str, Any]:
        return {"delete": {"key": key}}

    @staticmethod
    def get(key: str) -> Dict[str, Any]:
        return {"get": {"key": key}}


def _fence(grant: Optional["Grant"], token: Optional[int], lock: str, strict: bool,
           expect_revision: Optional[int]) -> Dict[str, Any]:
    f: Dict[str, Any] = {}
    if grant is not None:
        token, lock = grant.token, lock or grant.lock
    if token:
        f["token"] = str(token)
    if lock:
        f["lock"] = lock
    if strict:
        f["strict"] = True
    if expect_revision is not None:
        f["expectRevision"] = str(expect_revision)
    return f


class KV:
    """The fenced KV store of a client. Safe for use by several threads."""

    def __init__(self, transport: "Transport", lock_of: Callable[[int], str]) -> None:
        self._tr = transport
        self._lock_of = lock_of

    def _fence(self, grant: Optional["Grant"], token: Optional[int], lock: str, strict: bool,
               expect_revision: Optional[int]) -> Dict[str, Any]:
        if grant is None and token and not lock:
            lock = self._lock_of(token)
            if not lock:
                raise InvalidArgument(f"token {token} is not a live grant of this client's sessions: "
                                      "name its lock (lock=) or pass the grant (grant=)")
        return _fence(grant, token, lock, strict, expect_revision)

    def _write(self, method: str, body: Dict[str, Any], idempotency_key: Optional[str]) -> Dict[str, Any]:
        key = idempotency_key or secrets.token_urlsafe(18)
        return self._tr.unary("fence.v1.KVService/" + method, body, headers={"Idempotency-Key": key})

    def put(self, key: str, value: Value, *, grant: Optional["Grant"] = None, token: Optional[int] = None,
            lock: str = "", strict: bool = False, expect_revision: Optional[int] = None,
            session: Optional["Session"] = None, idempotency_key: Optional[str] = None) -> int:
        """Write value (str is UTF-8) under key and return the store's
        revision after it. Fenced by grant (its token and lock) or token
        (and lock): a token lower than the key's highest raises
        StaleTokenError and writes nothing; strict also requires the
        lock's current grant (NotHolder). expect_revision makes it a
        compare-and-swap (0: only if absent; RevisionMismatch otherwise).
        session binds the key to it: the key is deleted when it ends."""
        body: Dict[str, Any] = {"key": key, "value": _wire.b64(value)}
        fence = self._fence(grant, token, lock, strict, expect_revision)
        if fence:
            body["fence"] = fence
        if session is not None:
            body.update(session._me())
        return _wire.u64(self._write("Put", body, idempotency_key), "revision")

    def get(self, key: str, *, stale: bool = False) -> Optional[KeyValue]:
        """The key, or None when it does not exist. Linearizable unless stale."""
        resp = self._tr.unary("fence.v1.KVService/Get", {"key": key, "stale": stale})
        return KeyValue.from_json(resp["kv"]) if resp.get("found") else None

    def delete(self, key: str, *, grant: Optional["Grant"] = None, token: Optional[int] = None, lock: str = "",
               strict: bool = False, expect_revision: Optional[int] = None,
               idempotency_key: Optional[str] = None) -> bool:
        """Delete key, fenced as put is; whether it existed. A key written
        with a token keeps its highest token after a delete."""
        body: Dict[str, Any] = {"key": key}
        fence = self._fence(grant, token, lock, strict, expect_revision)
        if fence:
            body["fence"] = fence
        return bool(self._write("Delete", body, idempotency_key).get("deleted"))

    def list(self, prefix: str = "", *, limit: int = 0, stale: bool = False) -> "tuple[List[KeyValue], int]":
        """The keys under prefix in key order (at most limit, 0: the
        server's maximum) and the store's revision when read: watch from
        that revision + 1 to miss nothing."""
        resp = self._tr.unary("fence.v1.KVService/List", {"prefix": prefix, "limit": limit, "stale": stale})
        return [KeyValue.from_json(m) for m in resp.get("kvs", [])], _wire.u64(resp, "revision")

    def txn(self, compares: List[Dict[str, Any]], then: List[Dict[str, Any]],
            otherwise: Optional[List[Dict[str, Any]]] = None, *, grant: Optional["Grant"] = None,
            token: Optional[int] = None, lock: str = "", strict: bool = False,
            idempotency_key: Optional[str] = None) -> TxnResult:
        """Compare, then run then if every compare holds, else otherwise,
        in one commit, every write fenced by one token (see Compare, Op)."""
        body: Dict[str, Any] = {"compares": compares, "then": then, "else": otherwise or []}
        fence = self._fence(grant, token, lock, strict, None)
        if fence:
            body["fence"] = fence
        resp = self._write("Txn", body, idempotency_key)
        return TxnResult(bool(resp.get("succeeded")), _wire.u64(resp, "revision"), resp.get("results", []))

    def watch(self, prefix: str, *, start_revision: int = 0) -> "Watch":
        """Watch the keys under prefix from start_revision (0: the next
        change); iterate over the result for Events, close it to stop."""
        return Watch(self._tr, prefix, start_revision)


class Watch:
    """The changes under a prefix, as an iterator of Events. A broken
    stream is resumed on any node from the last revision seen + 1, so
    nothing is missed or seen twice; close() (from any thread) ends the
    iteration. Raises Compacted when the history no longer reaches back."""

    def __init__(self, transport: "Transport", prefix: str, start_revision: int) -> None:
        self._tr = transport
        self._prefix = prefix
        self._next = start_revision
        self._mu = threading.Lock()
        self._stream: Optional["ServerStream"] = None
        self._closed = False

    def _open(self) -> "ServerStream":
        body: Dict[str, Any] = {"prefix": self._prefix, "startRevision": str(self._next), "progressInterval": "1s"}

        def open_(ep: Any, t: float) -> "ServerStream":
            st = self._tr.open_stream(ep, "fence.v1.KVService/Watch", body, max(t, 3.0))
            try:
                first = st.next()  # the watch is in place: its revision
                if first is None:
                    raise Unavailable("the watch ended before it began")
            except FenceError:
                st.close()
                raise
            if not self._next:
                self._next = _wire.u64(first, "revision") + 1
            return st
        return self._tr.call(open_)

    def __iter__(self) -> Iterator[Event]:
        while True:
            with self._mu:
                if self._closed:
                    return
            try:
                st = self._open()
            except FenceError:
                if self._closed:
                    return
                raise
            with self._mu:
                if self._closed:
                    st.close()
                    return
                self._stream = st
            try:
                while True:
                    msg = st.next()
                    if msg is None:
                        break
                    if msg.get("progress"):
                        self._next = max(self._next, _wire.u64(msg, "revision") + 1)
                    for e in msg.get("events", []):
                        kv = KeyValue.from_json(e.get("kv", {}))
                        self._next = kv.mod_revision + 1
                        yield Event("delete" if e.get("type") == "EVENT_TYPE_DELETE" else "put", kv)
            except Unavailable:
                if self._closed:
                    return
                time.sleep(0.05)
            finally:
                st.close()

    def close(self) -> None:
        """Stop watching; an iteration in progress ends."""
        with self._mu:
            self._closed = True
            st = self._stream
        if st is not None:
            st.close()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
