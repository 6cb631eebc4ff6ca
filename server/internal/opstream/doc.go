// Package opstream serves the session stream (docs/design.md, The session
// stream): one bidirectional stream per client that carries every
// operation of its sessions, each run in a goroutine of its own and
// answered by its id when it completes, so that a blocked acquire holds up
// nothing else on the stream.
//
// A stream travels either as a Connect (or gRPC) stream over HTTP/2
// (NewConnect) or as frames on an HTTP/1.1 connection taken over by an
// upgrade (Upgrades). Either way a Streams serves it the same.
//
// It sits below package server and knows nothing of what an operation
// does: the server passes each one to Streams.Run, and ends a stream
// (leadership lost, a credential revoked, the node shutting down) by
// ending the context it serves it under.
package opstream
