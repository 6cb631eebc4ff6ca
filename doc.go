// Package fence holds the errors that every part of fence shares: the lock
// service, its Go client (package client) and the resource-side guards
// (package fencing). Callers test them with errors.Is and errors.As, never by
// matching strings; errors that cross the network keep their identity.
//
// fence is a consensus-backed lock service whose every grant carries a
// fencing token that strictly increases. A lock alone cannot stop a holder
// that pauses past its lease; a resource that rejects tokens lower than the
// highest it has seen can. See docs/guarantees.md for the guarantees and their limits.
package fence
