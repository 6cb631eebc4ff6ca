// A fenced resource for the tests: an HTTP server whose writes go through
// fencingMiddleware, keeping each key's last admitted body.

import { type IncomingMessage, type ServerResponse, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { Guard, fencingMiddleware } from "@fencelock/client";

export interface Resource {
  url: string;
  values: Map<string, string>;
  close(): Promise<void>;
}

/** Starts the resource on loopback; a handler answers `fail` bodies with 500. */
export async function startResource(guard = new Guard()): Promise<Resource> {
  const values = new Map<string, string>();
  const guarded = fencingMiddleware(guard);
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    guarded(req, res, async () => {
      let body = "";
      for await (const chunk of req) {
        body += chunk;
      }
      if (body === "fail") {
        res.statusCode = 500;
        res.end("failed\n");
        return;
      }
      values.set(new URL(req.url ?? "/", "http://x").pathname, body);
      res.end("ok\n");
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    values,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

/** Writes body to the resource's path with a lock's token, as a holder does. */
export async function fencedWrite(url: string, lock: string, token: bigint, body: string): Promise<{ status: number; text: string }> {
  const res = await fetch(url, { method: "PUT", body, headers: { "Fence-Lock": lock, "Fence-Token": token.toString() } });
  return { status: res.status, text: await res.text() };
}
