// The resource side: the HTTP middleware answers as Go's fencing.Middleware
// does, and the PostgreSQL fence applies pgfence's rule.

import assert from "node:assert/strict";
import { test } from "node:test";
import pg from "pg";
import { Guard, type ReplyLike, type ResponseLike, StaleTokenError, fencingHook, pgfence } from "@fencelock/client";
import { Group, closeAfter } from "./control.js";
import { fencedWrite, startResource } from "./resource.js";

test("a stale write gets 409 and the body Go's middleware sends", async (t) => {
  const r = await startResource();
  t.after(() => r.close());
  assert.equal((await fencedWrite(`${r.url}/orders/17`, "orders/17", 34n, "paid")).status, 200);
  const stale = await fencedWrite(`${r.url}/orders/17`, "orders/17", 33n, "late");
  assert.equal(stale.status, 409);
  // Byte for byte what fencing.Middleware writes (fencing/http.go).
  assert.equal(stale.text, '{"code":"stale_token","message":"stale fencing token 33 < 34 for key orders/17","key":"orders/17","token":"33","highest":"34"}\n');
  assert.equal(r.values.get("/orders/17"), "paid");
});

test("a write without a token gets 400, and a failed handler records nothing", async (t) => {
  const r = await startResource();
  t.after(() => r.close());
  const bare = await fetch(`${r.url}/k`, { method: "POST", body: "x" });
  assert.equal(bare.status, 400);
  assert.deepEqual(await bare.json(), { code: "invalid_token", message: "fence: invalid argument: the Fence-Token header is missing" });
  assert.equal((await fetch(`${r.url}/k`)).status, 200, "a read needs no token");
  assert.equal((await fencedWrite(`${r.url}/k`, "", 9n, "fail")).status, 500);
  assert.equal((await fencedWrite(`${r.url}/k`, "", 8n, "ok")).status, 200, "the failed write's token was recorded");
});

test("a strict guard refuses a token that is not the lock's current grant", async (t) => {
  const group = await Group.start();
  const c = group.client();
  const r = await startResource(new Guard(undefined, c));
  t.after(() => r.close());
  const s = await c.session();
  closeAfter(t, s);
  const g = await s.lock("strict");
  assert.equal((await fencedWrite(`${r.url}/strict`, "strict", g.token, "v")).status, 200);
  await g.release();
  const late = await fencedWrite(`${r.url}/strict`, "strict", g.token, "w");
  assert.equal(late.status, 409);
  assert.equal(JSON.parse(late.text).code, "not_holder");
});

test("the Fastify hook admits, then refuses a stale write itself", async () => {
  const hook = fencingHook(new Guard());
  const sent: { status: number; headers: Record<string, string>; body: string }[] = [];
  const reply = (raw: ResponseLike): ReplyLike => {
    const out = { status: 200, headers: {} as Record<string, string>, body: "" };
    const r: ReplyLike = {
      raw,
      code: (s) => ((out.status = s), r),
      header: (k, v) => ((out.headers[k] = v), r),
      send: (b) => sent.push({ ...out, body: b }),
    };
    return r;
  };
  const listeners: (() => void)[] = [];
  const raw: ResponseLike = { statusCode: 200, headersSent: false, setHeader: () => {}, end: () => {}, once: (_e, fn) => listeners.push(fn) };
  const req = (token: string) => ({ method: "PUT", url: "/k", headers: { "fence-token": token } });
  await hook(req("5"), reply(raw)); // admitted: the route runs, then answers
  listeners.forEach((fn) => fn());
  await hook(req("4"), reply(raw));
  assert.equal(sent.length, 1);
  assert.equal(sent[0]!.status, 409);
  assert.equal(JSON.parse(sent[0]!.body).code, "stale_token");
});

const dsn = process.env["FENCE_TEST_POSTGRES"];

test("pgfence admits in the caller's transaction, as Go's pgfence does", { skip: dsn ? false : "FENCE_TEST_POSTGRES is not set (scripts/test.sh starts a server)" }, async (t) => {
  const conn = new pg.Client({ connectionString: dsn });
  await conn.connect();
  t.after(() => conn.end());
  await pgfence.ensureSchema(conn);
  const key = `ts-${process.pid}-${Date.now()}`;
  await conn.query("CREATE TEMP TABLE orders (id int PRIMARY KEY, status text)");
  await conn.query("INSERT INTO orders VALUES (17, 'new')");
  await pgfence.admitTx(conn, key, 34n, (tx) => tx.query("UPDATE orders SET status = 'paid' WHERE id = 17"));
  await assert.rejects(
    pgfence.admitTx(conn, key, 33n, (tx) => tx.query("UPDATE orders SET status = 'late' WHERE id = 17")),
    (err: unknown) => err instanceof StaleTokenError && err.have === 34n && err.got === 33n,
  );
  const { rows } = await conn.query("SELECT status FROM orders WHERE id = 17");
  assert.equal(rows[0].status, "paid");
  const token = await conn.query("SELECT token FROM fence_tokens WHERE key = $1", [key]);
  assert.equal(token.rows[0].token, "34");
});
