// Package durable is what a node keeps on its disk, made trustworthy:
// the raft log behind a checksum verified on every read (CheckedLog),
// raft-wal's tail checked for damage a reopen would silently drop
// (CheckWALTail), snapshots checked against the log and cleaned up after
// a failure (RemoveUnfinishedSnapshots, CheckSnapshots, TidySnapshots),
// the token reserve written ahead of every grant (TokenReserve), the data
// dir's lock and free space, and the file writes that survive a crash
// (WriteDurably).
//
// It sits below package server, which assembles a node from these parts,
// and above raft's stores, which it wraps (docs/design.md, Disk full
// and Tokens survive a damaged log, say what the checks guard against).
package durable
