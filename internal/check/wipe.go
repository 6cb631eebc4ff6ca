package check

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// rejoinWait bounds how long a wipe fault waits for its node to be a voter
// again before the schedule goes on; the end of the run waits up to
// settleWait more for each node that was not.
const (
	rejoinWait = 20 * time.Second
	settleWait = 15 * time.Second
)

// Outcomes of a wipe fault.
const (
	OutcomeRejoined    = "back as a voter"
	OutcomeNotRejoined = "not back as a voter"
	OutcomeOtherGroup  = "answers for another group"
)

// wipeNode kills a follower, or one time in three the leader, deletes its
// data dir and starts it again with its flags. Its peers hold the group's
// data, so it must not found a group; it asks the leader to add it again,
// and catches up as a non-voter before it is made a voter. The fault waits
// for that (rejoinWait at most). It hits only a group whose every node is
// up, a voter and of the run's group: a wipe while another node is down or
// catching up could leave fewer intact data dirs than a quorum, which
// stops the group by design and is not what this fault tests.
func (r *runner) wipeNode(ctx context.Context, ev *FaultEvent) bool {
	ofLeader := r.rng.IntN(3) == 0
	leader, why := r.groupWhole(ctx)
	if leader == nil {
		if ctx.Err() == nil {
			fmt.Fprintf(r.log, "check: no wipe now: %s\n", why)
		}
		return false
	}
	n := leader
	if !ofLeader {
		n = r.follower(leader)
	}
	ev.Target = n.name()
	if ofLeader {
		ev.Target += " (leader)"
	}
	ev.Start = time.Now()
	r.restartNode(n, func() error { return wipeDataDir(n) })
	ev.Outcome, ev.Note = r.awaitRejoin(ctx, n, ev.Start, rejoinWait)
	if ev.Outcome == OutcomeNotRejoined {
		r.mu.Lock()
		r.unrejoined = append(r.unrejoined, pendingRejoin{n: n, fault: len(r.faults), wiped: ev.Start})
		r.mu.Unlock()
	}
	return true
}

// pendingRejoin is a wiped node that was not a voter again when its fault
// ended; fault is the index of its FaultEvent.
type pendingRejoin struct {
	n     *node
	fault int
	wiped time.Time
}

// wipeDataDir deletes the node's data dir, or, when the dir is a disk of
// its own (disk-full), everything on it: an empty volume either way.
func wipeDataDir(n *node) error {
	if !n.mounted {
		return os.RemoveAll(n.dir)
	}
	entries, err := os.ReadDir(n.dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(n.dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// groupWhole returns the leader when every node answers for the run's
// group and the leader counts each as a voter; otherwise nil, and why not.
func (r *runner) groupWhole(ctx context.Context) (*node, string) {
	leader := r.leaderNode()
	if leader == nil {
		return nil, "no leader"
	}
	st, err := statusOf(ctx, leader.api)
	if err != nil {
		return nil, fmt.Sprintf("the leader, %s, does not answer: %v", leader.name(), err)
	}
	voters := map[string]bool{}
	for _, m := range st.GetMembers() {
		voters[m.GetId()] = m.GetVoter()
	}
	for _, n := range r.nodes {
		if !voters[n.id] {
			return nil, fmt.Sprintf("%s is not a voter of the group", n.name())
		}
		st, err := statusOf(ctx, n.api)
		if err != nil {
			return nil, fmt.Sprintf("%s does not answer: %v", n.name(), err)
		}
		if st.GetClusterId() != r.clusterID {
			return nil, fmt.Sprintf("%s answers for group %q", n.name(), st.GetClusterId())
		}
	}
	return leader, ""
}

// awaitRejoin waits, up to bound or the end of ctx, until the wiped node n
// is a voter of the run's group again, and says how that went.
//
// The wiped node holds nothing until the leader has removed its member and
// added it back (the leader cannot replicate to it before: it refuses to be
// dialed as a voter with no data), so once it has applied entries of the
// run's group, the member was removed; a leader that then counts it as a
// voter has made it one again.
func (r *runner) awaitRejoin(ctx context.Context, n *node, wiped time.Time, bound time.Duration) (outcome, note string) {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	caughtUp := time.Duration(0)
	for {
		if st, err := statusOf(ctx, n.api); err == nil {
			group := st.GetClusterId()
			if group != "" && group != r.clusterID {
				return OutcomeOtherGroup, fmt.Sprintf("it answers for group %s", group)
			}
			if group == r.clusterID && st.GetAppliedIndex() > 0 {
				if caughtUp == 0 {
					caughtUp = time.Since(wiped)
				}
				if r.countsAsVoter(ctx, st.GetLeaderAddress(), n.id) {
					return OutcomeRejoined, fmt.Sprintf("holding the group's data after %v, a voter again after %v",
						caughtUp.Round(time.Millisecond), time.Since(wiped).Round(time.Millisecond))
				}
			}
		}
		select {
		case <-ctx.Done():
			note := fmt.Sprintf("not a voter again after %v", time.Since(wiped).Round(time.Millisecond))
			if caughtUp > 0 {
				note += fmt.Sprintf(" (it held the group's data after %v)", caughtUp.Round(time.Millisecond))
			}
			return OutcomeNotRejoined, note
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// countsAsVoter reports whether the node at leaderAPI says it leads and
// counts member id as a voter.
func (r *runner) countsAsVoter(ctx context.Context, leaderAPI, id string) bool {
	if leaderAPI == "" {
		return false
	}
	st, err := statusOf(ctx, leaderAPI)
	if err != nil || st.GetState() != "Leader" || st.GetClusterId() != r.clusterID {
		return false
	}
	for _, m := range st.GetMembers() {
		if m.GetId() == id {
			return m.GetVoter()
		}
	}
	return false
}

// settleRejoins waits, at the end of the run, for the wiped nodes that
// were not voters again when their fault ended, and tells their faults
// how it went.
func (r *runner) settleRejoins(ctx context.Context) {
	r.mu.Lock()
	pending := r.unrejoined
	r.mu.Unlock()
	for _, p := range pending {
		outcome, note := r.awaitRejoin(ctx, p.n, p.wiped, settleWait)
		ev := &r.faults[p.fault]
		ev.Outcome = outcome
		ev.Note += "; at the end of the run: " + note
		fmt.Fprintf(r.log, "check: %s %s at the end of the run: %s\n", ev.Kind, ev.Target, note)
	}
}
