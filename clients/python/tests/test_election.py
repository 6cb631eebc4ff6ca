"""Elections: campaign, proclaim, resign, leader, observe, cleanup."""

from __future__ import annotations

import threading

import fence

from .support import NodeTest, wait_for


class ElectionTest(NodeTest):
    def test_campaign_proclaim_resign(self) -> None:
        a, b = self.session(), self.session()
        ea, eb = a.election("e1"), b.election("e1")
        g = ea.campaign("a")
        self.assertEqual(self.client.leader("e1"), fence.LeaderState(True, "a", g.token))
        ea.proclaim("a2")
        self.assertEqual(self.client.leader("e1").value, "a2")
        won = []
        t = threading.Thread(target=lambda: won.append(eb.campaign("b", timeout=10)))
        t.start()
        ea.resign()
        t.join(10)
        self.assertGreater(won[0].token, g.token)
        self.assertEqual(self.client.leader("e1").value, "b")
        with self.assertRaises(fence.NotHolder):
            ea.proclaim("not any more")

    def test_observe(self) -> None:
        a = self.session()
        states = []
        done = threading.Event()

        def watch() -> None:
            it = self.client.observe("e2")
            for st in it:
                states.append(st)
                if len(states) == 3:
                    it.close()  # type: ignore[attr-defined]
                    done.set()
                    return
        t = threading.Thread(target=watch, daemon=True)
        t.start()
        wait_for(lambda: states, what="the first state")
        # A write to the election's key that no leader made elects nobody.
        self.client.kv.put("election/e2", b"impostor")
        self.assertFalse(self.client.leader("e2").elected)
        e = a.election("e2")
        g = e.campaign("x")
        e.resign()
        self.assertTrue(done.wait(10))
        self.assertEqual(states, [fence.LeaderState(), fence.LeaderState(True, "x", g.token), fence.LeaderState()])

    def test_a_failed_campaign_gives_leadership_up(self) -> None:
        a, b = self.session(), self.session()
        with self.assertRaises(fence.InvalidArgument):
            a.election("e3").campaign("x" * (300 << 10))  # above the store's value limit
        self.assertEqual(self.client.locks("election/e3"), [])
        b.election("e3").campaign("b", timeout=2)
