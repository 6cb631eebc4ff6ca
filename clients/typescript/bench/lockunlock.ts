// Lock+unlock cycles per second of one client, one session and one lock,
// against a running node: the client's own cost per cycle, to set beside
// the Go client's (`fence bench --clients 1 --workload own`).
//
//   npm run bench -- [endpoint] [seconds]   (default 127.0.0.1:7420, 5)

import { Client } from "@fencelock/client";

const endpoint = process.argv[2] ?? "127.0.0.1:7420";
const seconds = Number(process.argv[3] ?? 5);
const c = new Client({ endpoints: [endpoint] });
const s = await c.session({ owner: "npm run bench" });
const m = s.mutex(`bench/${process.pid}`);
const latencies: number[] = [];
await m.lock(); // warm: the connection is made, the code compiled
await m.unlock();
const start = performance.now();
while (performance.now() - start < seconds * 1_000) {
  const t = performance.now();
  await m.lock();
  await m.unlock();
  latencies.push(performance.now() - t);
}
const elapsed = (performance.now() - start) / 1_000;
latencies.sort((a, b) => a - b);
const at = (q: number) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))]!.toFixed(2);
console.log(`${(latencies.length / elapsed).toFixed(0)} lock+unlock cycles/s over ${elapsed.toFixed(1)} s (p50 ${at(0.5)} ms, p99 ${at(0.99)} ms), Node ${process.version}, ${endpoint}`);
await s.close();
