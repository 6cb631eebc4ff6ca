// The smallest program: a session, the lock "orders", and writes fenced by
// grants' tokens. Run it against a node:
//   node build/examples/orders.js [endpoint]   (default 127.0.0.1:7420)
import { Client, StaleTokenError } from "@fencelock/client";

const c = new Client({ endpoints: [process.argv[2] ?? "127.0.0.1:7420"] });
const s = await c.session({ ttlMs: 10_000 });
const old = await s.lock("orders"); // old.token: bigint; old.signal: AbortSignal
await old.release();
const g = await s.lock("orders"); // the next holder: a higher token
try {
  await c.kv.put("orders/17", "paid", { grant: g });
  await c.kv.put("orders/17", "late", { grant: old }); // a holder that woke up late
} catch (err) {
  if (!(err instanceof StaleTokenError)) throw err;
  console.log(`refused: token ${err.got} < ${err.have}`);
} finally {
  await g.release();
  await s.close();
}
