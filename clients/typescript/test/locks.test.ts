// Sessions, mutexes, read-write mutexes and semaphores against a real node.

import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { setTimeout as delay } from "node:timers/promises";
import { test } from "node:test";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { LockedError, ReleasedError, RevokedError, SessionLostError, SessionNotFoundError } from "@fencelock/client";
import { LockService } from "@fencelock/client/v1";
import { FakeClock } from "./clock.js";
import { Group, aborted, closeAfter, waitFor } from "./control.js";

const group = await Group.start();
const c = group.client();

test("a session is safe until the send of its last renewal plus its TTL's safe share, and renews on its own", async (t) => {
  const before = performance.now();
  const s = await c.session({ ttlMs: 1_500, drift: 0.01, marginMs: 100 });
  const after = performance.now();
  closeAfter(t, s);
  const share = 1_500 * 0.99 - 100;
  assert.ok(s.safeUntil >= before + share && s.safeUntil <= after + share, `safe-until ${s.safeUntil - before} ms after the call began`);
  const first = s.safeUntil;
  await waitFor("a renewal", () => s.safeUntil > first, 3_000);
  assert.equal(s.signal.aborted, false);
});

test("a renewal makes the session safe until its send time plus the TTL's safe share", async (t) => {
  const clock = new FakeClock();
  const s = await group.client({ clock }).session({ ttlMs: 3_000 });
  closeAfter(t, s);
  const share = 3_000 * 0.99 - 100;
  assert.equal(s.safeUntil, share);
  clock.advance(1_000); // the renewal falls due, and is sent at 1 000
  await waitFor("the renewal's answer", () => s.safeUntil > share);
  assert.equal(s.safeUntil, 1_000 + share);
});

test("a session paused past its safe-until renews nothing, ends lost and lets its locks go", async (t) => {
  const clock = new FakeClock();
  const fake = group.client({ clock });
  const s = await fake.session({ ttlMs: 3_000 });
  closeAfter(t, s);
  const g = await s.lock("wake");
  const safe = s.safeUntil;
  // Wakes past safe-until, and the renewal's timer runs before the one that
  // ends the session at its safe-until: it must renew nothing.
  clock.advance(3_000, 1);
  const reason = await Promise.race([aborted(g.signal), delay(2_000)]);
  assert.ok(reason instanceof SessionLostError, `the grant of a session past its safe-until lives on (${String(reason)})`);
  assert.equal(s.safeUntil, safe, "a renewal moved the safe-until of a session past it");
  await assert.rejects(s.lock("wake"), SessionLostError);
  await waitFor("the lock abandoned on the service", async () => (await c.locks("wake")).length === 0, 3_000);
});

test("close ends a session with ReleasedError and releases its locks", async () => {
  const s = await c.session();
  const g = await s.lock("closed");
  await s.close();
  assert.ok(s.signal.reason instanceof ReleasedError);
  assert.ok(g.signal.aborted);
  assert.deepEqual(await c.locks("closed"), []);
  await assert.rejects(s.lock("closed"), ReleasedError);
});

test("closing the client closes its sessions", async () => {
  const own = group.client();
  const [s1, s2] = [await own.session(), await own.session()];
  const g = await s1.lock("client-close");
  await own.close();
  assert.ok(s1.signal.reason instanceof ReleasedError && s2.signal.reason instanceof ReleasedError);
  assert.ok(g.signal.aborted);
  assert.deepEqual(await c.locks("client-close"), []);
});

test("tryLock of a held lock fails with LockedError naming the holder", async (t) => {
  const [a, b] = [await c.session(), await c.session()];
  closeAfter(t, a, b);
  const g = await a.lock("held");
  await assert.rejects(b.mutex("held").tryLock(), (err: unknown) => {
    assert.ok(err instanceof LockedError, String(err));
    assert.equal(err.holderSession, a.id);
    assert.equal(err.holderToken, g.token);
    return true;
  });
});

test("locking a held mutex returns its grant, and await using releases it", async (t) => {
  const s = await c.session();
  closeAfter(t, s);
  const m = s.mutex("disposed");
  {
    await using g = await m.lock();
    assert.equal(await m.lock(), g);
    assert.equal((await c.locks("disposed"))[0]?.holders[0]?.token, g.token);
  }
  assert.equal(m.grant, undefined);
  assert.deepEqual(await c.locks("disposed"), []);
});

test("an acquire aborted while it waits leaves nothing held or queued", async (t) => {
  const [a, b] = [await c.session(), await c.session()];
  closeAfter(t, a, b);
  const held = await a.lock("abort");
  const ctl = new AbortController();
  const refused = assert.rejects(b.lock("abort", { signal: ctl.signal }), /given up/);
  await waitFor("B's wait", async () => (await c.locks("abort"))[0]?.waiters.some((w) => w.sessionId === b.id));
  ctl.abort(new Error("given up"));
  await refused;
  assert.deepEqual((await c.locks("abort"))[0]?.waiters, []);
  await held.release();
  assert.deepEqual(await c.locks("abort"), [], "the lock went to the aborted acquire");
  await assert.rejects(b.lock("abort", { signal: AbortSignal.abort(new Error("before")) }), /before/);
});

test("a grant's signal stops a fetch when the grant is released", async (t) => {
  const server = createServer(() => {}); // never answers
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  const s = await c.session();
  closeAfter(t, s);
  const g = await s.lock("fetch");
  const stopped = assert.rejects(fetch(`http://127.0.0.1:${(server.address() as AddressInfo).port}/`, { signal: g.signal }), ReleasedError);
  await g.release();
  await stopped;
});

test("a grant's signal aborts when its session is revoked", async (t) => {
  const s = await c.session({ ttlMs: 1_500 });
  closeAfter(t, s);
  const g = await s.lock("revoked");
  await c.revokeSession(s.id);
  assert.ok((await aborted(g.signal)) instanceof SessionNotFoundError);
});

test("a grant released by someone else ends with RevokedError, and the session goes on", async (t) => {
  const s = await c.session({ ttlMs: 1_500 });
  closeAfter(t, s);
  const [taken, kept] = [await s.lock("taken"), await s.lock("kept")];
  // Another program that was given the session's secret.
  const other = createClient(LockService, createConnectTransport({ baseUrl: `http://${group.endpoints[0]}`, httpVersion: "1.1" }));
  const secret = (s as unknown as { secret: string }).secret;
  await other.release({ sessionId: s.id, sessionSecret: secret, lock: "taken", token: taken.token });
  const reason = await Promise.race([aborted(taken.signal), delay(1_500)]);
  assert.ok(reason instanceof RevokedError, `the released grant ended with ${String(reason)}, not within a keepalive interval`);
  const safe = s.safeUntil;
  await waitFor("two more renewals", () => s.safeUntil > safe + 900, 3_000);
  assert.equal(kept.signal.aborted, false);
});

test("an RWMutex admits readers together and a writer alone", async (t) => {
  const [r1, r2, w] = [await c.session(), await c.session(), await c.session()];
  closeAfter(t, r1, r2, w);
  const [g1, g2] = [await r1.rwMutex("rw").rLock(), await r2.rwMutex("rw").rLock()];
  assert.notEqual(g1.token, g2.token);
  const writer = w.rwMutex("rw");
  await assert.rejects(writer.tryLock(), LockedError);
  const waiting = writer.lock();
  await g1.release();
  await g2.release();
  const gw = await waiting;
  assert.ok(gw.token > g2.token);
});

test("a semaphore admits as many holders as it has permits", async (t) => {
  const sessions = [await c.session(), await c.session(), await c.session()];
  closeAfter(t, ...sessions);
  const [a, b, x] = sessions.map((s) => s.semaphore("pool", 2));
  const ga = await a!.acquire();
  await b!.acquire();
  await assert.rejects(x!.tryAcquire(), LockedError);
  const waiting = x!.acquire();
  await ga.release();
  assert.ok((await waiting).token > ga.token);
});

test("a release given the grant's own signal, or one that follows it, waits for the release", async (t) => {
  // The release aborts the grant's signal first, so that work under it
  // stops: a signal that aborts only for that is not the caller giving up.
  const s = await c.session();
  closeAfter(t, s);
  const own = await s.lock("own-signal");
  await own.release({ signal: own.signal });
  const caller = new AbortController();
  const follows = await s.lock("own-signal");
  await follows.release({ signal: AbortSignal.any([follows.signal, caller.signal]) });
  assert.deepEqual(await c.locks("own-signal"), []);
  assert.equal(s.signal.aborted, false);
});

test("a release the caller stopped waiting for while the node was down goes on, and the lock is free once it is back", async (t) => {
  const g = await Group.start();
  const own = g.client({ attemptTimeoutMs: 200 });
  t.after(() => own.close());
  const s = await own.session({ ttlMs: 15_000 });
  closeAfter(t, s);
  const grant = await s.lock("outage-release");
  await g.act("kill", "all");
  await assert.rejects(grant.release({ signal: AbortSignal.timeout(300) }));
  await g.act("restart", "all");
  await waitFor("the lock released on the service", async () => (await own.locks("outage-release")).length === 0, 10_000);
  assert.equal(s.signal.aborted, false, `the session ended (${String(s.signal.reason)}), though its release could be sent again`);
});

test("a release that no node answers within the retry budget gives the session up, and its end releases the lock", async (t) => {
  const g = await Group.start();
  const own = g.client({ attemptTimeoutMs: 200, retryBudgetMs: 1_000 });
  t.after(() => own.close());
  const s = await own.session({ ttlMs: 3_000 });
  closeAfter(t, s);
  const grant = await s.lock("budget-release");
  await g.act("pause", "all");
  t.after(() => g.act("resume", "all"));
  await assert.rejects(grant.release());
  await g.act("resume", "all");
  await waitFor("the session given up", () => s.signal.reason instanceof SessionLostError, 3_000);
  await waitFor("the lock released by the session's end", async () => (await own.locks("budget-release")).length === 0, 8_000);
});
