// The fenced write rule as HTTP middleware, for Express (and Connect, and
// node:http) and for Fastify. The types are structural: neither framework
// is a dependency. Requests and answers are those of Go's
// fencing.Middleware, so a Go, Python or Node resource answers a stale
// write with the same 409 and the same JSON body.

import { InvalidArgumentError, NotHolderError, StaleTokenError } from "../errors.js";
import type { Guard } from "./guard.js";

/** The headers that carry a write's lock name and fencing token. */
export const HEADER_LOCK = "Fence-Lock";
export const HEADER_TOKEN = "Fence-Token";

/** The JSON body of a request the middleware refused (Go's fencing.ErrorBody). */
export interface ErrorBody {
  /** "stale_token", "not_holder", "invalid_token" or "unavailable". */
  code: string;
  message: string;
  key?: string;
  /** For stale_token: the write's token and the key's highest, as decimal strings. */
  token?: string;
  highest?: string;
}

/** What the middleware reads of a request: node:http's IncomingMessage, Express's and Fastify's requests are ones. */
export interface RequestLike {
  method?: string;
  url?: string;
  headers: Record<string, string | string[] | undefined>;
}

/** What the middleware writes of a response: node:http's ServerResponse, and Express's, are ones. */
export interface ResponseLike {
  statusCode: number;
  readonly headersSent: boolean;
  setHeader(name: string, value: string): unknown;
  end(body: string): unknown;
  once(event: "finish" | "close", listener: () => void): unknown;
}

/** Which requests are writes, and of what key. */
export interface MiddlewareOptions {
  /** The resource a request writes (default: the Fence-Lock header, or the URL path when there is none). */
  key?: (req: RequestLike) => string;
  /** Which requests need a token (default: every method but GET, HEAD and OPTIONS). */
  guarded?: (req: RequestLike) => boolean;
}

/** Parses a Fence-Token header value: a decimal number from 1 up. */
export function parseToken(s: string): bigint {
  if (s === "") {
    throw new InvalidArgumentError(`fence: invalid argument: the ${HEADER_TOKEN} header is missing`);
  }
  if (!/^[0-9]{1,20}$/.test(s) || BigInt(s) === 0n || BigInt(s) > 0xffffffffffffffffn) {
    throw new InvalidArgumentError(`fence: invalid argument: ${HEADER_TOKEN} ${JSON.stringify(s)} is not a fencing token (a decimal number from 1 up)`);
  }
  return BigInt(s);
}

/** The status and body the middleware answers a refused write with, as Go's does. */
export function errorResponse(key: string, err: unknown): { status: number; body: ErrorBody } {
  const body: ErrorBody = { code: "unavailable", message: err instanceof Error ? err.message : String(err) };
  if (key !== "") {
    body.key = key;
  }
  if (err instanceof StaleTokenError) {
    return { status: 409, body: { ...body, code: "stale_token", token: err.got.toString(), highest: err.have.toString() } };
  }
  if (err instanceof NotHolderError) {
    return { status: 409, body: { ...body, code: "not_holder" } };
  }
  if (err instanceof InvalidArgumentError) {
    return { status: 400, body: { ...body, code: "invalid_token" } };
  }
  return { status: 503, body };
}

/**
 * Express-style middleware (`app.use(fencingMiddleware(guard))`, also
 * Connect and plain node:http) that guards a handler with the fenced write
 * rule. A guarded request must carry Fence-Token (and Fence-Lock when the
 * guard is strict); the handler runs inside guard.admit, so writers of one
 * key are serialized, and a handler that answers below 400 records the
 * token. A stale token gets 409 with a stale_token body, a missing or
 * malformed one 400, a token that is not the lock's current grant (strict)
 * 409 not_holder; and the handler is not called.
 */
export function fencingMiddleware(guard: Guard, options: MiddlewareOptions = {}): (req: RequestLike, res: ResponseLike, next: (err?: unknown) => void) => void {
  return (req, res, next) => {
    admitRequest(guard, options, req, res, () => next(), (status, body) => writeJSON(res, status, body));
  };
}

/** What the Fastify hook uses of a reply: Fastify's FastifyReply is one. */
export interface ReplyLike {
  raw: ResponseLike;
  code(status: number): ReplyLike;
  header(name: string, value: string): ReplyLike;
  send(body: string): unknown;
}

/**
 * The same rule as a Fastify hook: `app.addHook("preHandler",
 * fencingHook(guard))`. It resolves once the request is admitted (the
 * route's handler then runs, and its key stays serialized until the reply
 * is sent), or after answering the refusal itself.
 */
export function fencingHook(guard: Guard, options: MiddlewareOptions = {}): (request: RequestLike, reply: ReplyLike) => Promise<void> {
  return (request, reply) =>
    new Promise<void>((resolve) => {
      admitRequest(guard, options, request, reply.raw, resolve, (status, body) => {
        reply.code(status).header("Content-Type", "application/json").send(JSON.stringify(body) + "\n");
        resolve();
      });
    });
}

/** The handler answered an error: its token is not recorded. */
class HandlerFailed extends Error {}

function admitRequest(
  guard: Guard,
  options: MiddlewareOptions,
  req: RequestLike,
  res: ResponseLike,
  proceed: () => void,
  refuse: (status: number, body: ErrorBody) => void,
): void {
  const guarded = options.guarded ?? ((r: RequestLike) => !["GET", "HEAD", "OPTIONS"].includes(r.method ?? "GET"));
  if (!guarded(req)) {
    proceed();
    return;
  }
  let token: bigint;
  try {
    token = parseToken(header(req, HEADER_TOKEN));
  } catch (err) {
    const { status, body } = errorResponse("", err);
    refuse(status, body);
    return;
  }
  const lock = header(req, HEADER_LOCK);
  const key = (options.key ?? ((r: RequestLike) => header(r, HEADER_LOCK) || path(r)))(req);
  let started = false;
  guard
    .admit(key, lock, token, () => {
      started = true;
      const answered = responded(res);
      proceed();
      return answered;
    })
    .catch((err: unknown) => {
      if (!started && !res.headersSent && !(err instanceof HandlerFailed)) {
        const { status, body } = errorResponse(key, err);
        refuse(status, body);
      }
    });
}

/** Resolves when res is sent with a status below 400; rejects with HandlerFailed otherwise. */
function responded(res: ResponseLike): Promise<void> {
  return new Promise((resolve, reject) => {
    const done = () => (res.statusCode < 400 ? resolve() : reject(new HandlerFailed(`the handler answered ${res.statusCode}`)));
    res.once("finish", done);
    res.once("close", done);
  });
}

function writeJSON(res: ResponseLike, status: number, body: ErrorBody): void {
  res.statusCode = status;
  res.setHeader("Content-Type", "application/json");
  res.end(JSON.stringify(body) + "\n");
}

function header(req: RequestLike, name: string): string {
  const v = req.headers[name.toLowerCase()];
  return (Array.isArray(v) ? v[0] : v) ?? "";
}

function path(req: RequestLike): string {
  return new URL(req.url ?? "/", "http://resource").pathname;
}
