"""Errors from the wire to exception classes, offline and from a node."""

from __future__ import annotations

import base64
import unittest

import fence
from fence._errors import decode_detail, from_connect

from .support import NodeTest


def _detail(*fields: "tuple[int, object]") -> str:
    """An ErrorDetail's protobuf encoding, unpadded base64, as Connect sends it."""
    out = b""
    for num, v in fields:
        if isinstance(v, int):
            out += bytes([num << 3]) + _varint(v)
        else:
            data = str(v).encode()
            out += bytes([num << 3 | 2]) + _varint(len(data)) + data
    return base64.b64encode(out).decode().rstrip("=")


def _varint(v: int) -> bytes:
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


class MappingTest(unittest.TestCase):
    def test_stale_token_carries_both_tokens(self) -> None:
        err = from_connect({"code": "failed_precondition", "message": "stale fencing token 300 < 70000 for key k",
                            "details": [{"type": "fence.v1.ErrorDetail", "value": _detail((1, 5), (2, "k"), (4, 300), (5, 70000))}]})
        self.assertIsInstance(err, fence.StaleTokenError)
        assert isinstance(err, fence.StaleTokenError)
        self.assertEqual((err.have, err.got, err.key), (70000, 300, "k"))
        self.assertEqual(str(err), "stale fencing token 300 < 70000 for key k")

    def test_locked_names_the_holder(self) -> None:
        err = from_connect({"code": "failed_precondition", "message": "fence: lock is held",
                            "details": [{"type": "fence.v1.ErrorDetail", "value": _detail((1, 3), (2, "orders"), (7, 4), (8, 9))}]})
        assert isinstance(err, fence.LockedError)
        self.assertEqual((err.lock, err.holder, err.holder_token), ("orders", 4, 9))

    def test_reason_wins_over_code(self) -> None:
        cases = {6: fence.WaitTimeout, 7: fence.Unavailable, 9: fence.RevisionMismatch, 11: fence.Cancelled,
                 12: fence.DiskFull, 14: fence.SessionSecretError, 16: fence.PermissionDenied, 17: fence.AuthFailed,
                 2: fence.NotFound, 4: fence.NotHolder}
        for reason, cls in cases.items():
            err = from_connect({"code": "failed_precondition", "message": "m",
                                "details": [{"type": "fence.v1.ErrorDetail", "value": _detail((1, reason))}]})
            self.assertIs(type(err), cls, reason)

    def test_code_without_detail(self) -> None:
        self.assertIs(type(from_connect({"code": "unavailable", "message": "m"})), fence.Unavailable)
        self.assertIs(type(from_connect({"code": "unauthenticated", "message": "m"})), fence.Unauthenticated)
        self.assertIs(type(from_connect({}, 503)), fence.Unavailable)
        self.assertIs(type(from_connect({"code": "internal", "message": "m"})), fence.FenceError)

    def test_hierarchy(self) -> None:
        self.assertTrue(issubclass(fence.WaitTimeout, TimeoutError))
        self.assertTrue(issubclass(fence.SessionSecretError, fence.Unauthenticated))
        self.assertTrue(issubclass(fence.Unreachable, fence.Unavailable))
        self.assertTrue(issubclass(fence.LockedError, fence.FenceError))

    def test_leader_address(self) -> None:
        self.assertEqual(decode_detail(_detail((1, 7), (6, "127.0.0.1:7421")))["leader_address"], "127.0.0.1:7421")


class FromNodeTest(NodeTest):
    def test_wrong_secret_is_refused(self) -> None:
        s = self.session()
        with self.assertRaises(fence.SessionSecretError):
            self.client._transport.unary("fence.v1.SessionService/KeepAlive", {"sessionId": str(s.id), "sessionSecret": "x"})

    def test_invalid_lock_name(self) -> None:
        with self.assertRaises(fence.InvalidArgument):
            self.session().lock("").acquire()

    def test_no_node_is_unreachable_after_the_dial_timeout(self) -> None:
        c = fence.Client(endpoints=["127.0.0.1:1"], dial_timeout=0.2)
        with self.assertRaises(fence.Unreachable) as caught:
            c.status()
        self.assertIn("127.0.0.1:1", str(caught.exception))
