"""The programs of examples/, which docs/python.md quotes, run as a user
runs them."""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys
from typing import Any, Dict

from .support import Group, NodeTest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


class ExamplesTest(NodeTest):
    def test_orders(self) -> None:
        g = Group(1)
        env = dict(os.environ, FENCE_ENDPOINTS=",".join(g.endpoints))
        out = subprocess.run([sys.executable, "-S", os.path.join(EXAMPLES, "orders.py")], env=env,
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertRegex(out.stdout, r"^orders/17 is paid, written with token \d+\n$")
        c = g.client()
        self.addCleanup(c.close)
        kv = c.kv.get("orders/17")
        assert kv is not None
        self.assertEqual(kv.value, b"paid")

    def test_resource(self) -> None:
        spec = importlib.util.spec_from_file_location("resource_example", os.path.join(EXAMPLES, "resource.py"))
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)

        def put(token: str, body: bytes) -> str:
            environ: Dict[str, Any] = {"REQUEST_METHOD": "PUT", "PATH_INFO": "/orders/17", "CONTENT_LENGTH": str(len(body)),
                                       "wsgi.input": io.BytesIO(body), "HTTP_FENCE_TOKEN": token}
            status = []
            b"".join(mod.guarded(environ, lambda s, h, e=None: status.append(s)))
            return status[0]
        self.assertEqual(put("7", b"paid"), "204 No Content")
        self.assertEqual(put("6", b"late"), "409 Conflict")
        self.assertEqual(mod.orders, {"/orders/17": b"paid"})
