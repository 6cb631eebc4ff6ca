"""Connect's JSON protocol over http.client, and the retry loop.

Every call is ``POST /fence.v1.<Service>/<Method>`` with a JSON body. An
attempt on one node is bounded by a timeout; :meth:`Transport.call` moves
from node to node as the Go client's ``Client.call`` does (client/client.go):
it follows the leader an Unavailable error names, tries every endpoint
before it backs off, gives up after the dial timeout while no node has
ever answered, and after the retry budget once one has.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import struct
import threading
import time
from typing import Any, Callable, Dict, List, Optional, TypeVar

from ._errors import FenceError, InvalidArgument, Unauthenticated, Unavailable, Unreachable, WrongCluster, from_connect

T = TypeVar("T")

#: How long a node that did not answer in time is passed over.
SILENT_FOR = 3.0

_UNREACHABLE_HINT = ("is a node running? Start one with `fence serve`, "
                     "or check the endpoints given to fence.Client")


class NoAnswer(Unavailable):
    """An attempt that no node answered: the connection failed, or nothing
    came back in time."""


class _OneWrite:
    """Sends a request's head and body in one write. http.client writes
    them apart, so each call took two TCP segments and two wake-ups of the
    node (the Go client's inMemoryBodies fixes the same in net/http):
    lock+unlock cycles ran a third slower. It joins what http.client's
    _send_output would send, for bodies in memory; others go as before."""

    def _send_output(self, message_body: Any = None, encode_chunked: bool = False) -> None:
        if not isinstance(message_body, bytes):
            super()._send_output(message_body, encode_chunked)  # type: ignore[misc]
            return
        buf = self._buffer  # type: ignore[attr-defined]
        buf.extend((b"", message_body))
        msg = b"\r\n".join(buf)
        del buf[:]
        self.send(msg)  # type: ignore[attr-defined]


class _HTTP(_OneWrite, http.client.HTTPConnection):
    pass


class _HTTPS(_OneWrite, http.client.HTTPSConnection):
    pass


class Endpoint:
    """One node's address and a pool of idle connections to it."""

    def __init__(self, hostport: str, tls: Optional[ssl.SSLContext]) -> None:
        self.hostport = hostport
        self.tls = tls
        self.silent_until = 0.0
        # Set once the node turned out to be of another group: never used again.
        self.foreign = False
        self._idle: List[http.client.HTTPConnection] = []
        self._mu = threading.Lock()

    @property
    def url(self) -> str:
        return ("https://" if self.tls else "http://") + self.hostport

    def silent(self) -> bool:
        return self.foreign or time.monotonic() < self.silent_until

    def connection(self, timeout: float, fresh: bool = False) -> http.client.HTTPConnection:
        """An idle connection to the node, or a new one (always, if fresh)."""
        with self._mu:
            conn = self._idle.pop() if self._idle and not fresh else None
        if conn is None:
            return self.dial(timeout)
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def dial(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        """A new connection to the node (made on its first request);
        timeout bounds the connect and each read, None not at all."""
        host, _, port = self.hostport.rpartition(":")
        if self.tls is not None:
            return _HTTPS(host.strip("[]"), int(port), context=self.tls, timeout=timeout)
        return _HTTP(host.strip("[]"), int(port), timeout=timeout)

    def put_back(self, conn: http.client.HTTPConnection) -> None:
        with self._mu:
            if len(self._idle) < 64:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._mu:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class Transport:
    """Calls to a group of nodes. Safe for concurrent use by threads."""

    def __init__(self, endpoints: List[str], *, tls: Optional[ssl.SSLContext],
                 token: Optional[str], attempt_timeout: float, dial_timeout: float,
                 retry_budget: float) -> None:
        if not endpoints:
            raise InvalidArgument("no endpoints")
        if attempt_timeout <= 0:
            raise InvalidArgument(f"attempt timeout {attempt_timeout} must be positive")
        if tls is None and any(e.strip().startswith("https://") for e in endpoints):
            tls = ssl.create_default_context()  # an https:// endpoint: the system's CAs
        self.tls = tls
        self.token = token
        self.attempt_timeout = attempt_timeout
        self.dial_timeout = dial_timeout
        self.retry_budget = retry_budget
        self._mu = threading.Lock()
        self._endpoints = [Endpoint(_hostport(e), tls) for e in endpoints]
        self._current = 0
        self._answered = False
        self._cluster = ""

    # -- one attempt -----------------------------------------------------

    def _headers(self, extra: Optional[Dict[str, str]]) -> Dict[str, str]:
        h = {"Content-Type": "application/json", "Fence-Follow-Leader": "1"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        if self._cluster:
            h["Fence-Cluster-Id"] = self._cluster
        if extra:
            h.update(extra)
        return h

    def attempt(self, ep: Endpoint, method: str, body: Dict[str, Any], timeout: float,
                headers: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        """POST one call to one node and return its JSON answer, or raise
        the error it answered (NoAnswer when it did not answer in time)."""
        data = json.dumps(body, separators=(",", ":")).encode()
        status, cluster, raw = self._post(ep, "/" + method, data, self._headers(headers), max(timeout, 0.001))
        self._learn_cluster(cluster, ep)
        if status == 200:
            try:
                answer = json.loads(raw) if raw else {}
            except ValueError:
                answer = None
            if not isinstance(answer, dict):
                # Something in front of the node (a gateway's page, say):
                # whether the call was applied is unknown, as when no answer
                # came, and a retry may reach the node.
                raise Unavailable(f"{ep.url} answered {method} with a body that is not fence's: {raw[:80]!r}")
            return answer
        try:
            err = json.loads(raw)
        except ValueError:
            err = {}
        if not isinstance(err, dict):
            err = {}
        if status == 400 and raw.startswith(b"Client sent an HTTP request to an HTTPS server"):
            raise Unauthenticated(f"{ep.url} serves TLS and the call was plain HTTP: pass tls= or cafile=")
        raise from_connect(err, status)

    def _post(self, ep: Endpoint, path: str, data: bytes, headers: Dict[str, str],
              timeout: float) -> "tuple[int, str, bytes]":
        """One HTTP exchange: the status, the group id header and the body.
        A pooled connection the node closed while idle (it is found out
        only by using it) is replaced by a new one at once, as net/http
        does; every call is safe to repeat."""
        fresh = False
        while True:
            conn = ep.connection(timeout, fresh)
            reused = conn.sock is not None
            try:
                conn.request("POST", path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (socket.timeout, TimeoutError) as e:
                conn.close()
                ep.silent_until = time.monotonic() + SILENT_FOR
                raise NoAnswer(f"{ep.url} did not answer within {timeout:.3g}s") from e
            except ssl.SSLError as e:
                conn.close()
                raise Unauthenticated(f"TLS with the node {ep.url} failed: {e}") from e
            except (ConnectionRefusedError, socket.gaierror) as e:
                conn.close()
                raise NoAnswer(f"{ep.url}: {e}") from e
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                conn.close()
                if reused:
                    fresh = True
                    continue
                raise Unavailable(f"{ep.url}: the connection failed: {e!r}") from e
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise Unavailable(f"{ep.url}: the connection failed: {e!r}") from e
            if resp.will_close:
                conn.close()
            else:
                ep.put_back(conn)
            return resp.status, resp.getheader("Fence-Cluster-Id", ""), raw

    def _learn_cluster(self, cluster: str, ep: Endpoint) -> None:
        """Pin the group id the first answer names; a node that names
        another group is of another deployment (client/cluster.go)."""
        if not cluster:
            return
        with self._mu:
            if not self._cluster:
                self._cluster = cluster
                return
            mine = self._cluster
        if cluster != mine:
            raise WrongCluster(f"{ep.url} is a node of group {cluster}, not of this client's group {mine}")

    # -- the retry loop --------------------------------------------------

    def call(self, fn: Callable[[Endpoint, float], T], deadline: Optional[float] = None,
             attempt: Optional[float] = None) -> T:
        """Run fn(endpoint, attempt_timeout) until it succeeds, following
        the leader and failing over while it raises Unavailable. fn must be
        safe to repeat. deadline (time.monotonic) bounds the whole call."""
        attempt = attempt or self.attempt_timeout
        backoff = 0.02
        start = time.monotonic()
        failing_since: Optional[float] = None
        i = self._current_index()
        tried = hints = refused = attempts = 0
        reached = self._answered
        heard = False
        last: Optional[FenceError] = None
        while True:
            i = self._skip_silent(i)
            ep = self._endpoint_at(i)
            t = attempt
            if deadline is not None:
                t = min(t, deadline - time.monotonic())
                if t <= 0:
                    raise last or Unavailable("the call's deadline passed before a node answered")
            try:
                out = fn(ep, t)
            except FenceError as err:
                last = err
                attempts += 1
                unanswered = isinstance(err, NoAnswer)
                if not unanswered:
                    reached = heard = True
                now = time.monotonic()
                if not reached and self.dial_timeout > 0 and attempts >= self._n() and now - start >= self.dial_timeout:
                    raise self._unreachable(now - start, err) from err
                if isinstance(err, WrongCluster):
                    ep.foreign = True  # never act on it again; fail once every node is
                    if all(e.foreign for e in self._snapshot()):
                        raise
                    i += 1
                    continue
                if isinstance(err, Unauthenticated) and refused + 1 < self._n() and err.reason == "":
                    refused += 1  # a TLS handshake one node refused: another may not
                    i += 1
                    continue
                if not isinstance(err, Unavailable):
                    raise
                if deadline is not None and now >= deadline:
                    raise
                if failing_since is None:
                    failing_since = now
                leader = err.detail.get("leader_address", "")
                if leader and hints < 3:
                    hints += 1
                    j = self._endpoint_for(leader)
                    if j != i % self._n():
                        self._endpoint_at(j).silent_until = 0.0
                        i = j
                        continue
                i += 1
                tried += 1
                if tried < self._n():
                    continue
                if now - failing_since + backoff > self.retry_budget:
                    raise (self._unreachable(now - start, err) if not heard and unanswered else err)
                pause = backoff if deadline is None else min(backoff, max(deadline - now, 0))
                time.sleep(pause)
                tried = hints = 0
                heard = False
                backoff = min(2 * backoff, 0.25)
                continue
            ep.silent_until = 0.0
            self._set_current(ep)
            self._answered = True
            return out

    def unary(self, method: str, body: Dict[str, Any], *, headers: Optional[Dict[str, str]] = None,
              deadline: Optional[float] = None) -> Dict[str, Any]:
        """A call answered at once, each attempt bounded by the attempt
        timeout, retried as call retries."""
        return self.call(lambda ep, t: self.attempt(ep, method, body, t, headers), deadline)

    def _unreachable(self, took: float, last: FenceError) -> Unreachable:
        eps = ", ".join(e.url for e in self._snapshot())
        return Unreachable(f"no fence node could be reached: tried {eps} for {took:.2f}s ({last}); {_UNREACHABLE_HINT}")

    # -- endpoints -------------------------------------------------------

    def _snapshot(self) -> List[Endpoint]:
        with self._mu:
            return list(self._endpoints)

    def _n(self) -> int:
        with self._mu:
            return len(self._endpoints)

    def _endpoint_at(self, i: int) -> Endpoint:
        with self._mu:
            return self._endpoints[i % len(self._endpoints)]

    def _current_index(self) -> int:
        with self._mu:
            return self._current

    def _set_current(self, ep: Endpoint) -> None:
        with self._mu:
            self._current = self._endpoints.index(ep)

    def _skip_silent(self, i: int) -> int:
        n = self._n()
        for k in range(n):
            if not self._endpoint_at(i + k).silent():
                return i + k
        return i

    def _endpoint_for(self, addr: str) -> int:
        """The index of the endpoint at addr, added when the client did not
        know it: the leader may be a node the client was not given."""
        hp = _hostport(addr)
        with self._mu:
            for k, e in enumerate(self._endpoints):
                if e.hostport == hp:
                    return k
            self._endpoints.append(Endpoint(hp, self.tls))
            return len(self._endpoints) - 1

    def endpoints(self) -> List[str]:
        return [e.url for e in self._snapshot()]

    def close(self) -> None:
        for e in self._snapshot():
            e.close()

    # -- server streams --------------------------------------------------

    def open_stream(self, ep: Endpoint, method: str, body: Dict[str, Any],
                    timeout: Optional[float]) -> "ServerStream":
        """Open a Connect server stream (JSON codec) on ep. timeout bounds
        the connection and each read (None: no bound)."""
        conn = ep.dial(timeout)
        data = json.dumps(body).encode()
        headers = self._headers({"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"})
        try:
            conn.request("POST", "/" + method, body=struct.pack(">BI", 0, len(data)) + data, headers=headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise NoAnswer(f"{ep.url}: {e!r}") from e
        if resp.status != 200:
            raw = resp.read()
            conn.close()
            try:
                err = json.loads(raw)
            except ValueError:
                err = {}
            raise from_connect(err if isinstance(err, dict) else {}, resp.status)
        return ServerStream(ep, conn, resp)


class ServerStream:
    """The messages of a Connect server stream. close may be called from
    another thread to end a read in progress."""

    def __init__(self, ep: Endpoint, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._ep, self._conn, self._resp = ep, conn, resp
        self.closed = False

    def next(self) -> Optional[Dict[str, Any]]:
        """The next message; None once the stream ended well. Raises the
        error its end message carries, or Unavailable if it broke."""
        try:
            head = self._resp.read(5)
            if len(head) < 5:
                raise Unavailable(f"{self._ep.url}: the stream ended without its end message")
            flags, n = struct.unpack(">BI", head)
            msg: Dict[str, Any] = json.loads(self._resp.read(n)) if n else {}
        except (OSError, http.client.HTTPException, ValueError, AttributeError) as e:
            raise Unavailable(f"{self._ep.url}: the stream broke: {e!r}") from e
        if flags & 2:
            if msg.get("error"):
                raise from_connect(msg["error"])
            return None
        return msg

    def close(self) -> None:
        self.closed = True
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._conn.close()


def _hostport(endpoint: str) -> str:
    """host:port of an endpoint given as host:port or a URL."""
    e = endpoint.strip()
    if "://" in e:
        e = e.split("://", 1)[1]
    e = e.rstrip("/")
    if ":" not in e:
        raise InvalidArgument(f"endpoint {endpoint!r}: want host:port or a URL")
    return e
