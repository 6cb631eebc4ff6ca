"""What the tests share: the control service's groups of real nodes.

The Go test TestPythonClient (clients/python_test.go) serves the control
at FENCE_TEST_CONTROL (clients/control_test.go): it starts groups of
`fence serve` processes on free ports, with TLS and auth when asked, and
kills, pauses, resumes and restarts their nodes with real signals.
"""

from __future__ import annotations

import json
import os
import threading
import time
import unittest
import urllib.request
from typing import Any, Callable, Dict, List, Optional

import fence

CONTROL = os.environ.get("FENCE_TEST_CONTROL", "")


def _control(method: str, path: str, body: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(CONTROL + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raise AssertionError(f"control {method} {path}: {e.code} {e.read().decode()}") from None


class Group:
    """A raft group of fence nodes that the control started."""

    def __init__(self, nodes: int = 1, tls: bool = False, auth: bool = False) -> None:
        g = _control("POST", "/groups", {"nodes": nodes, "tls": tls, "auth": auth})
        self.id: str = g["id"]
        self.endpoints: List[str] = g["endpoints"]
        self.nodes: List[str] = g["nodes"]
        self.ca_file: str = g.get("ca_file", "")
        self.token: str = g.get("token", "")

    def client(self, **kw: Any) -> fence.Client:
        """A client of every node, with the group's CA and token."""
        if self.ca_file:
            kw.setdefault("cafile", self.ca_file)
        if self.token:
            kw.setdefault("token", self.token)
        return fence.Client(endpoints=self.endpoints, **kw)

    def leader(self) -> Dict[str, str]:
        return _control("GET", f"/groups/{self.id}/leader")

    def act(self, verb: str, node: str) -> List[str]:
        """kill, pause, resume or restart node ("leader", "all" or an id)."""
        return _control("POST", f"/groups/{self.id}/{verb}", {"node": node})["nodes"]


_shared: Optional[Group] = None
_shared_mu = threading.Lock()


def shared_group() -> Group:
    """One node that tests which fault nothing share; each uses names of
    its own."""
    global _shared
    with _shared_mu:
        if _shared is None:
            _shared = Group(1)
        return _shared


def wait_for(cond: Callable[[], Any], timeout: float = 10.0, what: str = "the condition") -> Any:
    """Poll cond until it returns something true, and return that; fail
    after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout}s")
        time.sleep(0.02)


class NodeTest(unittest.TestCase):
    """A test against the shared node, with a client closed at the end and
    sessions made by session() closed too."""

    def setUp(self) -> None:
        if not CONTROL:
            self.skipTest("FENCE_TEST_CONTROL is not set: run through go test ./clients/ -run TestPythonClient")
        self.group = shared_group()
        self.client = self.group.client()
        self.addCleanup(self.client.close)

    def session(self, ttl: float = 10.0, client: Optional[fence.Client] = None, **kw: Any) -> fence.Session:
        s = (client or self.client).session(ttl, **kw)
        self.addCleanup(s.close)
        return s
