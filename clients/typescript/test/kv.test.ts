// The fenced KV store, elections and leases against a real node.

import assert from "node:assert/strict";
import { createServer, request } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";
import { type Event, InvalidArgumentError, LockedError, NotHolderError, RevisionMismatchError } from "@fencelock/client";
import { EventType } from "@fencelock/client/v1";
import { Group, closeAfter } from "./control.js";

const group = await Group.start();
const c = group.client();
const decoder = new TextDecoder();
const text = (v: Uint8Array | undefined) => decoder.decode(v);

test("put, get, list and delete", async () => {
  const rev = await c.kv.put("kv/a", "1");
  await c.kv.put("kv/b", new Uint8Array([50]));
  const a = await c.kv.get("kv/a");
  assert.equal(text(a?.value), "1");
  assert.equal(a?.modRevision, rev);
  const l = await c.kv.list("kv/");
  assert.deepEqual(l.kvs.map((kv) => [kv.key, text(kv.value)]), [["kv/a", "1"], ["kv/b", "2"]]);
  assert.ok(l.revision >= rev);
  assert.equal(await c.kv.delete("kv/a"), true);
  assert.equal(await c.kv.get("kv/a"), undefined);
  assert.equal(await c.kv.delete("kv/a"), false);
});

test("a put with ifRevision is a compare-and-swap", async () => {
  const rev = await c.kv.put("cas", "first", { ifRevision: 0n });
  await assert.rejects(c.kv.put("cas", "again", { ifRevision: 0n }), RevisionMismatchError);
  await c.kv.put("cas", "second", { ifRevision: rev });
  assert.equal(text((await c.kv.get("cas"))?.value), "second");
});

test("a write retried with its idempotency key is applied once", async () => {
  const idempotencyKey = `retry-${process.pid}`;
  const rev = await c.kv.put("once", "first", { idempotencyKey });
  await c.kv.put("once", "between");
  assert.equal(await c.kv.put("once", "first", { idempotencyKey }), rev);
  assert.equal(text((await c.kv.get("once"))?.value), "between");
});

test("a strict write needs the lock's current grant", async (t) => {
  const s = await c.session();
  closeAfter(t, s);
  const g = await s.lock("strict");
  await c.kv.put("strict/1", "v", { grant: g, strict: true });
  await g.release();
  await assert.rejects(c.kv.put("strict/1", "w", { grant: g, strict: true }), NotHolderError);
});

test("a txn runs then or else in one commit", async () => {
  const created = await c.kv.txn({ if: [{ key: "txn/k", absent: true }], then: [{ put: { key: "txn/k", value: "v1" } }], else: [{ get: "txn/k" }] });
  assert.equal(created.succeeded, true);
  const again = await c.kv.txn({ if: [{ key: "txn/k", absent: true }], then: [{ put: { key: "txn/k", value: "v2" } }], else: [{ get: "txn/k" }] });
  assert.equal(again.succeeded, false);
  const got = again.results[0]?.result;
  assert.equal(got?.case, "get");
  assert.equal(text(got?.case === "get" ? got.value.kv?.value : undefined), "v1");
  const swapped = await c.kv.txn({ if: [{ key: "txn/k", value: "v1" }], then: [{ put: { key: "txn/k", value: "v3" } }] });
  assert.equal(swapped.succeeded, true);
});

test("a watch delivers every change after it is in place, in order", async () => {
  const ctl = new AbortController();
  const w = await c.kv.watch("watch/", { signal: ctl.signal });
  await c.kv.put("watch/1", "a");
  await c.kv.put("watch/2", "b");
  await c.kv.delete("watch/1");
  const seen: Event[] = [];
  for await (const ev of w) {
    seen.push(ev);
    if (seen.length === 3) {
      break;
    }
  }
  assert.deepEqual(
    seen.map((ev) => [ev.type, ev.kv?.key]),
    [[EventType.PUT, "watch/1"], [EventType.PUT, "watch/2"], [EventType.DELETE, "watch/1"]],
  );
  const from = seen[0]!.kv!.modRevision;
  const replay = await c.kv.watch("watch/", { fromRevision: from, signal: ctl.signal });
  for await (const ev of replay) {
    assert.equal(ev.kv?.modRevision, from);
    break;
  }
  ctl.abort();
});

test("an election elects one leader at a time, and observers follow it", async (t) => {
  const [s1, s2] = [await c.session(), await c.session()];
  closeAfter(t, s1, s2);
  const ctl = new AbortController();
  t.after(() => ctl.abort());
  const observed = c.observeLeader("e1", { signal: ctl.signal })[Symbol.asyncIterator]();
  const next = async () => (await observed.next()).value;
  assert.deepEqual(await next(), { elected: false, value: "", token: 0n });
  // A write to the election's key that no leader made elects nobody.
  await c.kv.put("election/e1", "impostor");
  assert.equal((await c.leader("e1")).elected, false);

  const e1 = s1.election("e1");
  const won = await e1.campaign("one");
  assert.deepEqual(await next(), { elected: true, value: "one", token: won.grant.token });
  const second = s2.election("e1").campaign("two");
  await e1.proclaim("uno");
  assert.deepEqual(await next(), { elected: true, value: "uno", token: won.grant.token });
  assert.equal((await c.leader("e1")).value, "uno");
  await assert.rejects(s1.election("e1").proclaim("not me"), NotHolderError);

  await e1.resign();
  assert.ok(won.grant.signal.aborted);
  const taken = await second;
  assert.deepEqual(await next(), { elected: false, value: "", token: 0n });
  assert.deepEqual(await next(), { elected: true, value: "two", token: taken.grant.token });
  assert.ok(taken.grant.token > won.grant.token);
});

test("a campaign whose value cannot be recorded gives leadership up", async (t) => {
  const [s1, s2] = [await c.session(), await c.session()];
  closeAfter(t, s1, s2);
  await assert.rejects(s1.election("big").campaign("x".repeat(300 << 10)), InvalidArgumentError);
  const won = await s2.election("big").campaign("small", { signal: AbortSignal.timeout(2_000) });
  assert.equal((await c.leader("big")).token, won.grant.token);
});

test("a lease whose answer a gateway lost is retried, and the retry is answered the lease", async (t) => {
  // The client draws the lease's secret and sends it with each attempt:
  // the retry after the lost answer (502) is answered the lease the lost
  // attempt took, not refused as held by it.
  const node = new URL(group.endpoints[0]!.includes("://") ? group.endpoints[0]! : `http://${group.endpoints[0]}`);
  let leases = 0;
  const gateway = createServer((req, res) => {
    const lose = req.url!.endsWith(".LockService/Lease") && ++leases === 1;
    const out = request({ host: node.hostname, port: node.port, path: req.url, method: req.method, headers: req.headers }, (answer) => {
      if (lose) {
        answer.resume();
        res.writeHead(502).end();
        return;
      }
      res.writeHead(answer.statusCode!, answer.headers);
      answer.pipe(res);
    });
    req.pipe(out);
  });
  await new Promise<void>((resolve) => gateway.listen(0, "127.0.0.1", resolve));
  t.after(() => gateway.close());
  const viaGateway = group.client({ endpoints: [`127.0.0.1:${(gateway.address() as AddressInfo).port}`] });
  t.after(() => viaGateway.close());
  const l = await viaGateway.lease("lost-answer", { ttlMs: 30_000 });
  assert.equal(leases, 2);
  const held = await c.locks("lost-answer");
  assert.deepEqual(held[0]?.holders.map((h) => [h.sessionId, h.token]), [[l.id, l.token]]);
  await l.release();
});

test("a lease holds its lock until released", async () => {
  const l = await c.lease("leased", { ttlMs: 5_000 });
  assert.ok(l.safeUntil > performance.now());
  await assert.rejects(c.lease("leased", { ttlMs: 5_000 }), LockedError);
  await l.renew();
  await l.release();
  const again = await c.lease("leased", { ttlMs: 5_000 });
  assert.ok(again.token > l.token);
  await again.release();
});
