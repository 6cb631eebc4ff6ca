package server

// handlers is the node's Connect API: its methods are the handlers of the
// fencev1connect services, each validating its request at the edge and
// running it on the node. They live on this type, not on Server, so that
// Server's methods are the node's lifecycle alone (New, Start, Close,
// Shutdown, WaitLeader, Addr, ...): a program that embeds a node, or a
// test given one by fencetest, calls the API through a client, as every
// caller does, and the checks of the interceptors (auth, limits, metrics)
// always run.
type handlers struct {
	*Server
	// The operations of internal/ops are served from its table
	// (operations.go); these stand in for them in the services' interfaces.
	unservedSession
	unservedLock
	unservedKV
}
