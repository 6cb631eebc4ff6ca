// Package apinet is the plumbing between a node's API port and its
// handlers: the listeners that bound how many connections are open
// (LimitListener, ConnLimit) and read each in blocks (ReadAheadListener),
// the middleware that ends a call whose client stops reading
// (BoundWrites) and refuses a malformed gRPC envelope (CheckEnvelopes),
// the strict JSON codec (StrictJSON), and the pool of goroutines that run
// stream operations (Workers).
//
// It sits below package server and knows nothing of fence's operations:
// the server passes it what it needs (the services' paths, the limits).
package apinet
