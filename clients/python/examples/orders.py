"""The smallest program: a lock, and a write fenced by its token.

    FENCE_ENDPOINTS=127.0.0.1:7420 python3 examples/orders.py
"""

import os

import fence

c = fence.Client(endpoints=os.environ.get("FENCE_ENDPOINTS", "127.0.0.1:7420").split(","))
with c.session(ttl=10) as s:                          # kept alive in the background
    with s.lock("orders") as g:                       # g.token: int; g.lost: threading.Event
        c.kv.put("orders/17", b"paid", token=g.token)  # a stale token raises fence.StaleTokenError
        print("orders/17 is paid, written with token", g.token)
