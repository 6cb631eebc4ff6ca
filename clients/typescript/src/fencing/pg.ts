// The fenced write rule in PostgreSQL, for node-postgres: the same table
// and statements as Go's fencing/pgfence, so that Go and Node writers of
// one database fence each other. Any object with pg's query method does;
// pg is not a dependency.

import { InvalidArgumentError } from "../errors.js";
import { checkToken } from "./guard.js";

/** What the functions here need of a connection: pg's Client and PoolClient are ones. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: Record<string, unknown>[] }>;
}

/** The transaction-level advisory lock ensureSchema takes ("fencetkn"), as pgfence does. */
const schemaLock = "7378424937699371886";

const createTable = "CREATE TABLE IF NOT EXISTS fence_tokens (key text PRIMARY KEY, token bigint NOT NULL)";

/**
 * The upsert of admit. ON CONFLICT DO UPDATE locks the key's row even
 * when the WHERE is false, so the transaction holds the row lock either
 * way, and a concurrent admit of the key waits until this one commits or
 * rolls back.
 */
const admitSQL = `INSERT INTO fence_tokens AS f (key, token) VALUES ($1, $2)
ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token
RETURNING f.token`;

const highestSQL = "SELECT token FROM fence_tokens WHERE key = $1";

/**
 * Creates the table fence_tokens(key text primary key, token bigint not
 * null) unless it exists, in its own transaction: give it one connection
 * (a pg Client, or a PoolClient), not a Pool. Safe to run from many
 * processes at once: they serialize on an advisory lock.
 */
export async function ensureSchema(conn: Queryable): Promise<void> {
  await conn.query("BEGIN");
  try {
    await conn.query("SELECT pg_advisory_xact_lock($1)", [schemaLock]);
    await conn.query(createTable);
    await conn.query("COMMIT");
  } catch (err) {
    await conn.query("ROLLBACK").catch(() => {});
    throw err;
  }
}

/**
 * Applies the fenced write rule for key in the caller's transaction, in
 * one conditional statement: it raises key's token to token unless the key
 * has seen a higher one, and throws StaleTokenError (have: the key's
 * token, got: token) otherwise. Either way the transaction then holds the
 * key's row lock until it ends, so writers of one key run one at a time,
 * in any process: make the write in the same transaction, after admit, and
 * commit both, or neither. Tokens above 2^63−1 are refused.
 */
export async function admit(tx: Queryable, key: string, token: bigint): Promise<void> {
  checkToken(key, token, 0n);
  if (token > 0x7fffffffffffffffn) {
    throw new InvalidArgumentError(`fence: invalid argument: fencing token ${token} of ${key} is above ${0x7fffffffffffffffn}, the largest an SQL bigint holds`);
  }
  const admitted = await tx.query(admitSQL, [key, token.toString()]);
  if (admitted.rows.length > 0) {
    return;
  }
  const r = await tx.query(highestSQL, [key]);
  checkToken(key, token, BigInt(String(r.rows[0]?.token ?? 0)));
  throw new Error(`pgfence: admitting ${key}: the upsert refused token ${token} though the highest is ${String(r.rows[0]?.token)}`);
}

/**
 * Runs write in a READ COMMITTED transaction on conn (one connection: a pg
 * Client or a PoolClient) after admit: the new highest token and the
 * write commit together, or neither. An error from write, or a stale
 * token, rolls back and is thrown as it is.
 */
export async function admitTx<T>(conn: Queryable, key: string, token: bigint, write: (tx: Queryable) => Promise<T>): Promise<T> {
  await conn.query("BEGIN ISOLATION LEVEL READ COMMITTED");
  try {
    await admit(conn, key, token);
    const out = await write(conn);
    await conn.query("COMMIT");
    return out;
  } catch (err) {
    await conn.query("ROLLBACK").catch(() => {});
    throw err;
  }
}
