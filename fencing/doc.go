// Package fencing is the resource side of fence: it makes a resource reject
// writes that carry a stale fencing token.
//
// # The fenced write rule
//
// A resource keeps, per protected key, the highest token it has accepted. A
// write carrying token t is accepted if t is at least the highest (the same
// holder may write many times), and then the highest becomes t; otherwise it
// is rejected with a *fence.StaleTokenError ("stale fencing token 33 < 34
// for key orders/17") and nothing of it is applied. The check and the write
// are one atomic step. fence.CheckToken is the rule itself, for stores of
// your own.
//
// # Stores
//
// A Store applies the rule: Memory here, and bbolt, PostgreSQL and SQLite in
// the subpackages boltfence, pgfence and sqlitefence. One conformance suite
// (fencingtest) runs against every store.
//
// # Transports
//
// HTTP: Middleware rejects stale writes with 409 Conflict and a JSON body;
// Transport stamps the token of the request's context onto outgoing
// requests. Connect and gRPC: the subpackage fencingconnect does both, over
// metadata, and answers FailedPrecondition. The headers are Fence-Lock and
// Fence-Token.
//
// # Strict mode
//
// A resource that can reach the fence service may also ask it whether a
// token is the lock's current grant (Chubby's sequencer check): see
// WithChecker, which takes any TokenChecker, such as a *client.Client.
// The highest-token rule still applies on top. The check is not atomic
// with the write (the resource is not the service: it asks, then writes,
// with answers cached up to 1 s), so it narrows the window in which a
// stale holder writes before its successor's first write, but does not
// close it; WithChecker says what closes it.
//
// # Dependencies
//
// fencing and its stores depend on neither the fence client nor raft nor
// Connect, so a resource imports them without the lock service's client.
//
// # Caveats
//
// The guard protects only the writes that pass through it, and only
// atomically with writes to the same store. A Middleware guarding an HTTP
// handler that writes elsewhere serializes writers per key and records the
// token only when the handler succeeds, but it cannot make the handler's
// own side effects atomic with the record; prefer a store that holds the
// data itself (the SQL helpers, or the fenced KV of the service).
package fencing
