// The smallest program: a session, the lock "orders", and writes fenced by
// the grant's token. Run it against a node:
//   node build/examples/orders.js [endpoint]   (default 127.0.0.1:7420)
import { Client, StaleTokenError } from "@fencelock/client";

const c = new Client({ endpoints: [process.argv[2] ?? "127.0.0.1:7420"] });
const s = await c.session({ ttlMs: 10_000 });
const g = await s.lock("orders"); // g.token: bigint; g.signal: AbortSignal
try {
  await c.kv.put("orders/17", "paid", { grant: g });
  await c.kv.put("orders/17", "late", { lock: "orders", token: g.token - 1n });
} catch (err) {
  if (!(err instanceof StaleTokenError)) throw err;
  console.log(`refused: token ${err.got} < ${err.have}`); // a holder that woke up late
} finally {
  await g.release();
  await s.close();
}
