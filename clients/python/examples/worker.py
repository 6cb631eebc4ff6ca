"""A worker that appends to a shared ledger, COUNT times, each time under
the lock "ledger" and with its token: a Python worker and a Node worker
(clients/typescript/examples/worker.ts) share one lock and one fenced
resource, and the resource admits their writes in token order.

    python3 examples/worker.py ENDPOINT LEDGER_URL NAME COUNT
"""

import sys
import urllib.request

import fence

endpoint, url, name, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
c = fence.Client(endpoints=[endpoint])
with c.session(ttl=10) as s:
    for i in range(count):
        with s.lock("ledger") as g:
            headers = {"Fence-Lock": "ledger", "Fence-Token": str(g.token)}
            req = urllib.request.Request(url, data=f"{name} {i}".encode(), headers=headers, method="POST")
            with urllib.request.urlopen(req) as resp:  # a 409 (stale token) raises
                print(name, i, "token", g.token, resp.status)
