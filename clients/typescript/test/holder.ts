// The holder process of the paused-holder scenario: it takes the lock
// "paused" through a session of a 2 s TTL, prints "granted TOKEN", and on
// each line "write" on stdin reports whether its grant is lost, then writes
// through the resource's middleware anyway, and prints the answer as JSON.
//
//   node build/test/holder.js ENDPOINT RESOURCE_URL

import { createInterface } from "node:readline";
import { Client } from "@fencelock/client";
import { fencedWrite } from "./resource.js";

const [endpoint, resource] = process.argv.slice(2) as [string, string];
const c = new Client({ endpoints: [endpoint] });
const s = await c.session({ ttlMs: 2_000, owner: `holder pid ${process.pid}` });
const g = await s.lock("paused");
console.log(`granted ${g.token}`);
for await (const line of createInterface({ input: process.stdin })) {
  if (line !== "write") {
    continue;
  }
  // What the holder knows before it writes: read first, at once. lost
  // reads the clock: the signal's timer may not have run yet in a process
  // that just woke.
  const lost = g.lost;
  const reason = lost ? (g.signal.reason as Error).name : "";
  const answer = await fencedWrite(`${resource}/paused`, "paused", g.token, "from the paused holder");
  console.log(JSON.stringify({ lost, reason, ...answer }));
}
