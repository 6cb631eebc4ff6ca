// Package fsmpb is the format of fence's raft log and snapshots: the
// commands that package internal/fsm applies and the snapshot it writes,
// generated from fsm.proto by `go generate ./api/...` (scripts/gen-proto.sh).
// An older fence's entries must stay readable, so fields are only ever
// added, never renumbered (docs/upgrading.md).
//
// It stands on the ground floor, beside internal/fsm: package server
// encodes commands with it, and fsm decodes them. It is not the public API,
// which is api/fence/v1.
package fsmpb
