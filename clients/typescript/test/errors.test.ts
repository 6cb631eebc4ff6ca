// How the client turns what the service answers into its errors, as Go's
// internal/rpcerr does: by the reason in the detail, else by the code.

import assert from "node:assert/strict";
import { test } from "node:test";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  AuthFailedError,
  DiskFullError,
  FenceError,
  LockedError,
  NotHolderError,
  PermissionDeniedError,
  SessionSecretError,
  StaleTokenError,
  UnauthenticatedError,
  UnavailableError,
  WaitTimeoutError,
  fromConnect,
} from "@fencelock/client";
import { ErrorDetailSchema, Reason } from "@fencelock/client/v1";

function remote(code: Code, detail?: Parameters<typeof create<typeof ErrorDetailSchema>>[1]): ConnectError {
  const details = detail ? [{ desc: ErrorDetailSchema, value: detail }] : [];
  return new ConnectError("from the service", code, undefined, details);
}

test("the reason in the detail names the error, with its fields", () => {
  const stale = fromConnect(remote(Code.FailedPrecondition, { reason: Reason.STALE_TOKEN, lock: "orders/17", token: 33n, currentToken: 34n }));
  assert.ok(stale instanceof StaleTokenError);
  assert.deepEqual([stale.key, stale.got, stale.have, stale.code], ["orders/17", 33n, 34n, Code.FailedPrecondition]);

  const locked = fromConnect(remote(Code.FailedPrecondition, { reason: Reason.LOCKED, lock: "busy", holderSessionId: 7n, holderToken: 9n }));
  assert.ok(locked instanceof LockedError);
  assert.deepEqual([locked.lock, locked.holderSession, locked.holderToken], ["busy", 7n, 9n]);

  const notLeader = fromConnect(remote(Code.Unavailable, { reason: Reason.NOT_LEADER, leaderAddress: "127.0.0.1:7421" }));
  assert.ok(notLeader instanceof UnavailableError);
  assert.equal(notLeader.leaderAddress, "127.0.0.1:7421");

  const table: [Reason, Code, new (...args: never[]) => FenceError][] = [
    [Reason.NOT_HOLDER, Code.FailedPrecondition, NotHolderError],
    [Reason.WAIT_TIMEOUT, Code.DeadlineExceeded, WaitTimeoutError],
    [Reason.DISK_FULL, Code.Unavailable, DiskFullError],
    [Reason.SESSION_SECRET, Code.Unauthenticated, SessionSecretError],
    [Reason.AUTH, Code.Unauthenticated, AuthFailedError],
    [Reason.PERMISSION_DENIED, Code.PermissionDenied, PermissionDeniedError],
  ];
  for (const [reason, code, cls] of table) {
    assert.ok(fromConnect(remote(code, { reason })) instanceof cls, Reason[reason]);
  }
  assert.ok(fromConnect(remote(Code.Unauthenticated, { reason: Reason.AUTH })) instanceof UnauthenticatedError);
  assert.ok(fromConnect(remote(Code.Unavailable, { reason: Reason.DISK_FULL })) instanceof UnavailableError);
});

test("without a detail the code names the error", () => {
  assert.ok(fromConnect(remote(Code.Unavailable)) instanceof UnavailableError);
  assert.ok(fromConnect(remote(Code.PermissionDenied)) instanceof PermissionDeniedError);
  assert.ok(fromConnect(remote(Code.Unauthenticated)) instanceof UnauthenticatedError);
  const other = fromConnect(remote(Code.Internal));
  assert.ok(other instanceof FenceError && other.constructor === FenceError);
});

test("a broken connection is unavailable, a refused certificate unauthenticated", () => {
  const reset = new ConnectError("socket hang up", Code.Aborted, undefined, undefined, Object.assign(new Error("reset"), { code: "ECONNRESET" }));
  assert.ok(fromConnect(reset) instanceof UnavailableError);
  const untrusted = new ConnectError("self-signed", Code.Internal, undefined, undefined, Object.assign(new Error("cert"), { code: "SELF_SIGNED_CERT_IN_CHAIN" }));
  assert.ok(fromConnect(untrusted) instanceof UnauthenticatedError);
  const mine = new Error("not the service's");
  assert.equal(fromConnect(mine), mine);
});
