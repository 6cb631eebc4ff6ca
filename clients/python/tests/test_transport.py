"""Failover: leader redirection, endpoints learned, nodes that hang."""

from __future__ import annotations

import threading
import time

import fence

from .support import Group, NodeTest, wait_for


class TransportTest(NodeTest):
    def test_a_follower_names_the_leader(self) -> None:
        g = Group(3)
        leader = g.leader()["endpoint"]
        follower = next(e for e in g.endpoints if e != leader)
        c = fence.Client(endpoints=[follower])
        self.addCleanup(c.close)
        s = c.session(5)
        self.addCleanup(s.close)
        s.lock("redirected").acquire()
        # The client followed the leader the follower named, and knows it now.
        self.assertEqual(c.endpoints, ["http://" + follower, "http://" + leader])

    def test_a_paused_node_is_left_for_the_next(self) -> None:
        g = Group(3)
        c = g.client(attempt_timeout=0.3)
        self.addCleanup(c.close)
        c.kv.put("paused/k", "v")
        first = c._transport._endpoint_at(c._transport._current_index()).hostport
        node = next(n for n, e in zip(g.nodes, g.endpoints) if e == first)
        g.act("pause", node)
        self.addCleanup(g.act, "resume", node)
        start = time.monotonic()
        c.kv.put("paused/k", "w")  # on the new leader, once the others elect one
        self.assertLess(time.monotonic() - start, 10)
        kv = c.kv.get("paused/k")
        assert kv is not None
        self.assertEqual(kv.value, b"w")

    def test_a_node_of_another_group_is_never_acted_on(self) -> None:
        mine = Group(1)
        c = fence.Client(endpoints=mine.endpoints + self.group.endpoints, retry_budget=1)
        self.addCleanup(c.close)
        c.kv.put("foreign/k", "mine")  # pins the group of the node that answered
        mine.act("kill", "all")
        with self.assertRaises(fence.Unavailable):  # its own node is gone, the other is not of its group
            c.kv.put("foreign/k", "astray")
        self.assertIsNone(self.client.kv.get("foreign/k"))

    def test_a_watch_resumes_on_another_node(self) -> None:
        g = Group(3)
        c = g.client()
        self.addCleanup(c.close)
        _, revision = c.kv.list("resume/")
        w = c.kv.watch("resume/", start_revision=revision + 1)
        self.addCleanup(w.close)
        seen: "list[str]" = []
        reader = threading.Thread(target=lambda: [seen.append(ev.kv.key) for ev in w], daemon=True)
        reader.start()
        c.kv.put("resume/a", "1")
        c.kv.put("resume/b", "2")
        wait_for(lambda: len(seen) == 2, what="the events before the kill")
        g.act("kill", "leader")
        c.kv.put("resume/c", "3")
        c.kv.put("resume/d", "4")
        wait_for(lambda: len(seen) >= 4, what="the events after the kill")
        w.close()
        reader.join(5)
        self.assertEqual(seen, ["resume/a", "resume/b", "resume/c", "resume/d"])  # nothing missed, nothing twice
