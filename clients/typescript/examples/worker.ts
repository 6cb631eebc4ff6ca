// A worker that appends to a shared ledger, COUNT times, each time under
// the lock "ledger" and with its token: a Node worker and a Python worker
// (clients/python/examples/worker.py) share one lock and one fenced
// resource, and the resource admits their writes in token order.
//   node build/examples/worker.js ENDPOINT LEDGER_URL NAME COUNT
import { Client } from "@fencelock/client";

const [endpoint, url, name, count] = process.argv.slice(2);
const c = new Client({ endpoints: [endpoint ?? "127.0.0.1:7420"] });
const s = await c.session({ ttlMs: 10_000 });
try {
  for (let i = 0; i < Number(count); i++) {
    const g = await s.lock("ledger");
    try {
      const res = await fetch(url ?? "", {
        method: "POST",
        body: `${name} ${i}`,
        headers: { "Fence-Lock": "ledger", "Fence-Token": String(g.token) },
        signal: g.signal, // stops the write if the lock may be lost
      });
      if (!res.ok) throw new Error(`${name} ${i}: ${res.status} ${await res.text()}`);
      console.log(name, i, "token", g.token, res.status);
    } finally {
      await g.release();
    }
  }
} finally {
  await s.close();
  await c.close();
}
