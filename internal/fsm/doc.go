// Package fsm is fence's replicated state machine: sessions, locks and the
// fencing tokens of their grants, the KV store, auth and quotas. State holds
// them and changes only by Apply, one raft command (package
// internal/fsmpb) at a time; FSM adapts State to hashicorp/raft, with
// batches and snapshots.
//
// # Determinism
//
// Every node applies the same log and must reach the same state, so Apply
// is a pure function of the state and the command: it reads no clock, draws
// no random number, does no I/O, and never lets map iteration order reach a
// result or a snapshot. A decision that depends on time (a session's
// expiry, the end of a lock-delay) is taken outside, by the leader on its
// clock, and committed as a command (ExpireSessions, LiftDelay) that every
// node then applies alike. A command the state refuses changes nothing. An
// entry that this version does not understand halts the FSM (HaltError)
// rather than being skipped, since skipping it would make this node's state
// differ from its group's.
//
// # Results
//
// Apply reports what a command did as a Result of two parts. Its Effects
// are what every node must act on, whichever command caused them: grants
// made, sessions created or ended, waits dropped, locks put under
// lock-delay, KV and lock events, auth changes; an Observer hears only
// these. Its Answer is the command's own answer to whoever proposed it, of
// a type of its own (AcquireAnswer, KVAnswer, ...), read through the
// accessor named after the command (Result.Acquire, Result.KV, ...); a
// command whose idempotency key was applied before answers Repeat instead.
//
// Its tests hold it to that: tables of commands, a model checker
// (model_*_test.go), CheckInvariants after every command, and fuzzers of the
// command stream (FuzzStateMachine, FuzzApplyBytes).
//
// # Its place
//
// fsm stands on the ground floor of the repository, with the other
// packages of internal/ that the libraries share: it imports only package
// fence (the errors every part shares) and internal/fsmpb. Package server
// runs it under raft and answers the API from it; the fence command checks
// quota flags with it; the end-to-end tests read its protocol numbers.
// Nothing outside this module can build its commands, which is why it is
// internal.
package fsm
