// Package k8sleader is a resourcelock.Interface for client-go's leader
// election (k8s.io/client-go/tools/leaderelection) backed by fence, so
// that a controller's leadership comes with a fencing token that the
// resources it writes can check.
//
// client-go's own locks (a Lease or ConfigMap object) do not fence, and
// its documentation says so: a leader that is paused (a GC pause, a VM
// migration, a stuck node) past its lease keeps acting when it resumes,
// while another replica has taken over. Only the resource can refuse the
// late writer, and only if every write carries a number that grows with
// each new leader. A Lock gives each term of leadership such a number:
// the token of a fence lease.
//
//	lock, err := k8sleader.New(fenceClient, "my-controller", podName)
//	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
//		Lock: lock, LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second,
//		RetryPeriod: 2 * time.Second, ReleaseOnCancel: true,
//		Callbacks: leaderelection.LeaderCallbacks{
//			OnStartedLeading: func(ctx context.Context) {
//				ctx, stop := lock.WithTerm(ctx) // ends with the term, carries the token
//				defer stop()
//				run(ctx, lock.Token())          // send the token with every write
//			},
//			OnStoppedLeading: func() { os.Exit(0) },
//		},
//	})
//
// # Design
//
// The election record (client-go's LeaderElectionRecord, as JSON) lives in
// fence's fenced KV store under a key named after the lock ("k8sleader/"
// + name unless WithRecordKey says otherwise). Get reads it linearizably
// and remembers the key's mod revision; Create writes it only if the key
// is absent, and Update only if the key is still at the revision this
// Lock last read or wrote (compare-and-swap). A swap that fails is a
// Kubernetes Conflict, a missing record NotFound, as client-go expects.
//
// Leadership itself is a fence lease (client.Client.Lease) on the fence
// lock of the same name, taken with the record's lease duration as its
// TTL. When this identity writes the record as its holder, the Lock first
// takes the lease (a new term) or renews the one it holds (the same term),
// and then writes the record fenced by the lease's token in strict mode:
// fence itself refuses the write unless that token is the lock's current
// grant. So:
//
//   - While another identity's lease lives, taking the lease fails
//     (fence.ErrLocked), Create and Update fail, and the LeaderElector does
//     not become leader, whatever the record's times say.
//   - A leader whose lease ended (it was paused past the TTL, or cut off
//     from fence) cannot write the record any more, and its next Update
//     fails with ErrLeaseLost: its elector stops leading after its renew
//     deadline. The Lock then takes no new lease for one lease duration
//     and a second, longer than any renew deadline client-go accepts, so
//     that the elector gives up the lost term instead of carrying on
//     under a new token as if nothing had happened.
//   - Update with an empty holder, which is how client-go's
//     ReleaseOnCancel steps down, ends the term, writes the record, and
//     releases the fence lease, so the next candidate takes over at its
//     next retry, not a lease duration later.
//
// # The token
//
// Token returns the token of the current term (0 when not leading), and
// SafeUntil the instant until which the term's lease is known to hold
// (after it the service may have given the lock to another). Context is
// the term's context: it ends when the term is released or lost, or when
// SafeUntil passes without a renewal. WithTerm derives from a context one
// that also ends with the term and carries the lock's name and token for
// package fencing (fencing.Transport sends them as the Fence-Lock and
// Fence-Token headers; fencing.TokenFrom reads them back, for fence's own
// KV: client.FencedBy(lock, token)).
//
// # Guarantees and limits
//
// Two terms never hold the fence lease at once, and a later term's token
// is higher. A resource that checks tokens (package fencing, fence's KV
// store, a conditional SQL write) refuses a write of an earlier term once
// it has accepted one of a later term; with strict checks, as soon as the
// later term began. A resource that does not check tokens is not
// protected: nothing can stop a paused process from writing when it
// resumes.
//
// client-go's own view of who leads (LeaderElector.IsLeader, GetLeader,
// OnNewLeader) is still made from the record's times and this process's
// clock; it can lag behind fence's for up to a lease duration. Trust the
// token, not that view.
//
// Each term renews its lease only when client-go renews the record
// (every RetryPeriod while leading): nothing renews it in the background.
// The lease's TTL is the record's whole seconds (at least 1 s). See
// docs/kubernetes-leader-election.md.
package k8sleader
