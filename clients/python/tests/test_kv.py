"""The fenced KV store: put, get, strict, CAS, txn, idempotency, watch."""

from __future__ import annotations

import threading

import fence
from fence import Compare, Op

from .support import NodeTest


class KVTest(NodeTest):
    def test_put_get_delete_list(self) -> None:
        kv = self.client.kv
        rev = kv.put("kv/l/a", "one")
        got = kv.get("kv/l/a")
        assert got is not None
        self.assertEqual((got.value, got.mod_revision, got.version), (b"one", rev, 1))
        kv.put("kv/l/b", b"two")
        keys, revision = kv.list("kv/l/")
        self.assertEqual([k.key for k in keys], ["kv/l/a", "kv/l/b"])
        self.assertGreaterEqual(revision, rev)
        self.assertTrue(kv.delete("kv/l/a"))
        self.assertIsNone(kv.get("kv/l/a"))
        self.assertFalse(kv.delete("kv/l/a"))

    def test_fenced_and_strict(self) -> None:
        s1, s2 = self.session(), self.session()
        g1 = s1.lock("kv/fenced").acquire()
        self.client.kv.put("kv/fenced/x", "1", grant=g1, strict=True)
        s1.close()
        g2 = s2.lock("kv/fenced").acquire(timeout=2)
        with self.assertRaises(fence.NotHolder):
            self.client.kv.put("kv/fenced/x", "stale", grant=g1, strict=True)
        self.client.kv.put("kv/fenced/x", "2", grant=g2)
        with self.assertRaises(fence.StaleTokenError) as caught:
            self.client.kv.put("kv/fenced/x", "stale", grant=g1)
        self.assertEqual((caught.exception.have, caught.exception.got), (g2.token, g1.token))
        with self.assertRaises(fence.InvalidArgument):
            self.client.kv.put("kv/fenced/x", "no token")
        with self.assertRaises(fence.InvalidArgument):  # not a grant of this client, and no lock named
            self.client.kv.put("kv/fenced/x", "?", token=g2.token + 1000)

    def test_compare_and_swap(self) -> None:
        kv = self.client.kv
        rev = kv.put("kv/cas", "v1", expect_revision=0)
        with self.assertRaises(fence.RevisionMismatch):
            kv.put("kv/cas", "v1 again", expect_revision=0)
        kv.put("kv/cas", "v2", expect_revision=rev)
        with self.assertRaises(fence.RevisionMismatch):
            kv.put("kv/cas", "v3", expect_revision=rev)
        r = kv.txn([Compare.value("kv/cas", "v2")], [Op.put("kv/cas", "v3"), Op.get("kv/cas")], [Op.get("kv/cas")])
        self.assertTrue(r.succeeded)
        r = kv.txn([Compare.version("kv/cas", 1, "==")], [Op.delete("kv/cas")], [Op.get("kv/cas")])
        self.assertFalse(r.succeeded)
        self.assertEqual(fence.KeyValue.from_json(r.results[0]["get"]["kv"]).value, b"v3")

    def test_idempotency_key_applies_once(self) -> None:
        kv = self.client.kv
        r1 = kv.put("kv/idem", "x", idempotency_key="kv-idem-1")
        kv.put("kv/idem-other", "y")
        r2 = kv.put("kv/idem", "x", idempotency_key="kv-idem-1")
        self.assertEqual(r1, r2)
        got = kv.get("kv/idem")
        assert got is not None
        self.assertEqual(got.version, 1)

    def test_bound_to_a_session(self) -> None:
        s = self.session()
        self.client.kv.put("kv/bound", "here", session=s)
        got = self.client.kv.get("kv/bound")
        assert got is not None
        self.assertEqual(got.session_id, s.id)
        s.close()
        self.assertIsNone(self.client.kv.get("kv/bound"))

    def test_watch(self) -> None:
        kv = self.client.kv
        _, revision = kv.list("kv/watch/")
        w = kv.watch("kv/watch/", start_revision=revision + 1)
        seen = []

        def read() -> None:
            for ev in w:
                seen.append((ev.type, ev.kv.key, ev.kv.value))
                if len(seen) == 3:
                    w.close()
        t = threading.Thread(target=read)
        t.start()
        kv.put("kv/watch/a", "1")
        kv.put("kv/watch/b", "2")
        kv.delete("kv/watch/a")
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertEqual(seen, [("put", "kv/watch/a", b"1"), ("put", "kv/watch/b", b"2"), ("delete", "kv/watch/a", b"")])
