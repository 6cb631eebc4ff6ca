"""Sessions: safe-until from the send time, keepalives, loss, close."""

from __future__ import annotations

import time

import fence

from .support import NodeTest, wait_for


class SessionTest(NodeTest):
    def test_safe_until_counts_from_before_the_call(self) -> None:
        before = time.monotonic()
        s = self.session(ttl=5, drift=0.02, margin=0.2)
        after = time.monotonic()
        self.assertGreaterEqual(s.safe_until, before + 5 * 0.98 - 0.2)
        self.assertLessEqual(s.safe_until, after + 5 * 0.98 - 0.2)
        self.assertEqual(s.ttl, 5)

    def test_keepalives_move_safe_until_on(self) -> None:
        s = self.session(ttl=1.5)
        first = s.safe_until
        wait_for(lambda: s.safe_until > first, 3, "a renewal")
        self.assertIsNone(s.error)
        self.assertFalse(s.lost.is_set())

    def test_keepalive_takes_no_session_past_its_safe_until(self) -> None:
        # An answer to a keepalive sent at or after the safe-until renews
        # nothing: the service may have expired the session meanwhile.
        s = self.session()
        safe = s.safe_until
        s._renewed(safe, 1 << 30, None)
        s._renewed(safe + 1, 1 << 30, None)
        self.assertEqual(s.safe_until, safe)
        s._renewed(safe - 1, 1 << 30, None)
        self.assertGreater(s.safe_until, safe)

    def test_a_lapsed_session_is_lost_and_abandoned(self) -> None:
        s = self.session()
        g = s.lock("lapse").acquire()
        with s._mu:  # as if the process had been paused past its safe-until
            s._safe_until = time.monotonic() - 0.001
        self.assertTrue(g.lost.is_set())
        self.assertIsInstance(g.error, fence.SessionLostError)
        self.assertIsInstance(s.error, fence.SessionLostError)
        with self.assertRaises(fence.SessionLostError):
            s.lock("lapse").acquire()
        # Abandoned on the service: the lock is free again at once.
        other = self.session()
        other.lock("lapse").acquire(timeout=2)

    def test_close_releases_everything(self) -> None:
        with self.client.session(5) as s:
            g = s.lock("closed").acquire()
        self.assertTrue(g.lost.is_set())
        self.assertIsInstance(s.error, fence.Released)
        self.assertEqual(self.client.locks("closed"), [])
        s.close()  # a second close does nothing

    def test_a_revoked_session_ends(self) -> None:
        s = self.session(ttl=1.5)
        g = s.lock("revoked").acquire()
        self.client._transport.unary("fence.v1.ClusterService/RevokeSession", {"sessionId": str(s.id)})
        self.assertTrue(g.lost.wait(3))
        self.assertIsInstance(s.error, fence.NotFound)

    def test_a_grant_released_by_someone_else_is_revoked(self) -> None:
        s = self.session(ttl=1.5)
        g = s.lock("revoked-grant").acquire()
        # Released with the session's own id and secret, behind its back
        # (an operator's tool, another process of the holder's): the next
        # keepalive's answer no longer lists the token.
        self.client._transport.unary("fence.v1.LockService/Release", s._me(lock="revoked-grant", token=str(g.token)))
        self.assertTrue(g.lost.wait(3))
        self.assertIsInstance(g.error, fence.Revoked)
        self.assertIsNone(s.error)
