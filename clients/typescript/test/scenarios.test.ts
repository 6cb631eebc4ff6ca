// The cross-language scenarios of clients/scenarios.json, each a test named
// "scenario ID" as the table says; the Go runner fails unless each passes.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { setTimeout as delay } from "node:timers/promises";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import {
  type Grant,
  SessionLostError,
  StaleTokenError,
  UnauthenticatedError,
  WaitTimeoutError,
  Client,
} from "@fencelock/client";
import { Group, aborted, closeAfter, waitFor } from "./control.js";
import { fencedWrite, startResource } from "./resource.js";

const decoder = new TextDecoder();

test("the table of scenarios is the one these tests play", () => {
  const path = process.env["FENCE_TEST_SCENARIOS"] ?? fileURLToPath(new URL("../../../scenarios.json", import.meta.url));
  const ids = (JSON.parse(readFileSync(path, "utf8")) as { scenarios: { id: string }[] }).scenarios.map((s) => s.id);
  assert.deepEqual(ids.sort(), ["cancelled-acquire", "leader-killed", "paused-holder", "smallest-program", "stalled-keepalives", "tls-token-failover"]);
});

test("scenario smallest-program", async (t) => {
  const group = await Group.start();
  const c = group.client();
  const s = await c.session({ ttlMs: 10_000 });
  closeAfter(t, s);
  // A new group's first token is 1, and 0 is no token at all: one grant
  // before, so that "the token minus one" is a token.
  await (await s.lock("orders")).release();
  const g = await s.lock("orders");
  await c.kv.put("orders/17", "paid", { grant: g });
  const late = c.kv.put("orders/17", "late", { lock: "orders", token: g.token - 1n });
  await assert.rejects(late, (err: unknown) => {
    assert.ok(err instanceof StaleTokenError, `got ${String(err)}`);
    assert.equal(err.have, g.token);
    assert.equal(err.got, g.token - 1n);
    assert.equal(err.key, "orders/17");
    return true;
  });
  assert.equal(decoder.decode((await c.kv.get("orders/17"))?.value), "paid");
  await g.release();
  await s.close();
});

test("scenario paused-holder", async (t) => {
  const group = await Group.start();
  const resource = await startResource();
  t.after(() => resource.close());
  const holderJS = fileURLToPath(new URL("holder.js", import.meta.url));
  const holder = spawn(process.execPath, [holderJS, group.endpoints[0]!, resource.url], { stdio: ["pipe", "pipe", "inherit"] });
  t.after(() => {
    holder.kill("SIGCONT");
    holder.kill("SIGKILL");
  });
  const lines = createInterface({ input: holder.stdout })[Symbol.asyncIterator]();
  const first = (await lines.next()).value as string;
  const held = BigInt(/^granted (\d+)$/.exec(first)?.[1] ?? assert.fail(`holder printed ${first}`));

  const ttlMs = 2_000;
  holder.kill("SIGSTOP");
  const stopped = performance.now();
  // Meanwhile a second holder is granted the lock once the first one's
  // session expires, and writes through the middleware.
  const c = group.client();
  const s = await c.session();
  closeAfter(t, s);
  const g = await s.lock("paused", { signal: AbortSignal.timeout(3 * ttlMs) });
  assert.ok(g.token > held, `second token ${g.token} after ${held}`);
  assert.equal((await fencedWrite(`${resource.url}/paused`, "paused", g.token, "from the second holder")).status, 200);
  await delay(Math.max(0, stopped + 3 * ttlMs - performance.now())); // paused for 3x the TTL, as the table says

  holder.kill("SIGCONT");
  holder.stdin.write("write\n");
  const answer = JSON.parse((await lines.next()).value as string) as { lost: boolean; reason: string; status: number; text: string };
  assert.equal(answer.lost, true, "the holder did not know its grant was lost before it wrote");
  assert.equal(answer.reason, "SessionLostError");
  assert.equal(answer.status, 409);
  assert.deepEqual(JSON.parse(answer.text), {
    code: "stale_token",
    message: `stale fencing token ${held} < ${g.token} for key paused`,
    key: "paused",
    token: held.toString(),
    highest: g.token.toString(),
  });
  assert.equal(resource.values.get("/paused"), "from the second holder");
  holder.stdin.end();
  await g.release();
  await s.close();
});

test("scenario stalled-keepalives", async (t) => {
  const group = await Group.start();
  const c = group.client();
  const s = await c.session({ ttlMs: 2_000 });
  closeAfter(t, s);
  const g = await s.lock("stalled");
  await group.act("pause", "all");
  try {
    const stalled = performance.now();
    const reason = await aborted(g.signal);
    const lost = performance.now();
    assert.ok(reason instanceof SessionLostError, `grant ended with ${String(reason)}`);
    assert.ok(s.signal.aborted && s.signal.reason instanceof SessionLostError, "the session did not end as lost");
    // The last renewal, sent before the nodes stopped, bounds the session.
    assert.ok(s.safeUntil > stalled, `safe-until ${s.safeUntil} before the stall at ${stalled}`);
    assert.ok(lost >= s.safeUntil - 1, `lost at ${lost}, before its safe-until ${s.safeUntil}`);
    assert.ok(lost <= s.safeUntil + 250, `lost at ${lost}, ${lost - s.safeUntil} ms after its safe-until`);
  } finally {
    await group.act("resume", "all");
  }
});

test("scenario cancelled-acquire", async (t) => {
  const group = await Group.start();
  const c = group.client();
  const [a, b, cs, d] = await Promise.all([1, 2, 3, 4].map(() => c.session()));
  closeAfter(t, a!, b!, cs!, d!);
  const held = await a!.lock("busy");

  await assert.rejects(b!.lock("busy", { waitTimeoutMs: 300 }), WaitTimeoutError);
  await assert.rejects(cs!.lock("busy", { signal: AbortSignal.timeout(300) }), { name: "TimeoutError" });
  const [info] = await c.locks("busy");
  const waiters = (info?.waiters ?? []).map((w) => w.sessionId);
  assert.ok(!waiters.includes(b!.id) && !waiters.includes(cs!.id), `waiters ${waiters.join(", ")} name B or C`);

  await held.release();
  const g = await d!.lock("busy", { signal: AbortSignal.timeout(1_000) });
  assert.ok(g.token > held.token);
  await Promise.all([a, b, cs, d].map((s) => s!.close()));
});

test("scenario leader-killed", async (t) => {
  const group = await Group.start({ nodes: 3 });
  const c = group.client();
  const s = await c.session();
  closeAfter(t, s);
  const m = s.mutex("loop");
  const written = new Map<string, string>();
  let last = 0n;
  let killedAt = -1;
  for (let i = 0; killedAt < 0 || i < killedAt + 20; i++) {
    if (i === 20) {
      await group.act("kill", "leader");
      killedAt = i;
    }
    const g: Grant = await m.lock();
    assert.ok(g.token > last, `token ${g.token} after ${last}`);
    last = g.token;
    await c.kv.put(`loop/${i}`, `${g.token}`, { grant: g });
    written.set(`loop/${i}`, `${g.token}`);
    await m.unlock();
  }
  for (const [key, value] of written) {
    assert.equal(decoder.decode((await c.kv.get(key))?.value), value, key);
  }
  await s.close();
});

test("scenario tls-token-failover", async (t) => {
  const group = await Group.start({ nodes: 3, tls: true, auth: true });
  const c = group.client();
  const s = await c.session();
  closeAfter(t, s);
  const first = await s.lock("tls");
  await c.kv.put("tls/1", "first", { grant: first });
  await first.release();

  const { node } = await group.leader();
  await group.act("kill", node);
  const again = await s.lock("tls");
  assert.ok(again.token > first.token, `token ${again.token} after ${first.token}`);
  await c.kv.put("tls/1", "again", { grant: again });
  const leader = await waitFor("a new leader", async () => {
    const l = await group.leader();
    return l.node !== node && l;
  });
  assert.notEqual(leader.node, node);

  const anonymous = group.client({ token: "" });
  await assert.rejects(anonymous.session(), UnauthenticatedError);
  await again.release();
  await s.close();
});

test("the client names the endpoints it could not reach", async () => {
  const c = new Client({ endpoints: ["127.0.0.1:1"], dialTimeoutMs: 200 });
  await assert.rejects(c.session(), /no node could be reached: tried http:\/\/127\.0\.0\.1:1/);
});
