// The example programs, run as a user runs them, against a real node.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { Group } from "./control.js";

const run = promisify(execFile);

test("examples/orders.ts writes with its token, and its late write is refused", async () => {
  const group = await Group.start();
  const orders = fileURLToPath(new URL("../examples/orders.js", import.meta.url));
  for (const want of [[1n, 2n], [3n, 4n]]) {
    const { stdout } = await run(process.execPath, [orders, group.endpoints[0]!], { timeout: 20_000 });
    assert.equal(stdout, `refused: token ${want[0]} < ${want[1]}\n`);
  }
});
