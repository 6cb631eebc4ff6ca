package check

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
)

// rejoinWait bounds how long a wipe fault waits for its node to be a voter
// again by itself (it takes a second or two); the fault then adds it as an
// operator would, and the end of the run waits up to settleWait more for
// each node that was still not one, and adds by hand those that the run's
// end kept their fault from adding.
const (
	rejoinWait = 10 * time.Second
	settleWait = 15 * time.Second
)

// Outcomes of a wipe fault.
const (
	OutcomeRejoined    = "back as a voter"
	OutcomeNotRejoined = "not back as a voter"
	OutcomeOtherGroup  = "answers for another group"
)

// wipeNode kills a follower, or one time in four the leader, deletes its
// data dir and starts it again with its flags. Its peers hold the group's
// data, so it must not found a group; it asks the leader to add it again,
// and catches up as a non-voter before it is made a voter. The fault waits
// for that, rejoinWait at most, and then adds it by hand as an operator
// would, so that the run goes on with a whole group.
//
// One time in four it also slows the link from the leader to the follower
// and kills the leader (and starts it again on its data) once the leader
// has removed the wiped follower to add it again, and has not made it a
// voter yet: the leader that adds a member again
// may be lost halfway, and a later one must finish from the group's
// record of it.
//
// It hits only a group whose every node is up, a voter and of the run's
// group: a wipe while another node is down or catching up could leave
// fewer intact data dirs than a quorum, which stops the group by design
// and is not what this fault tests.
func (r *runner) wipeNode(ctx context.Context, ev *FaultEvent) bool {
	variant := r.rng.IntN(4)
	ofLeader, interrupt := variant == 0, variant == 1
	leader, why := r.groupWhole(ctx)
	for wait := time.Now().Add(5 * time.Second); leader == nil && ctx.Err() == nil && time.Now().Before(wait); {
		// Just after another fault: an election, a node still starting.
		sleep(ctx, 200*time.Millisecond)
		leader, why = r.groupWhole(ctx)
	}
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
	var halfway func(ctx context.Context) string
	switch {
	case ofLeader:
		ev.Target += " (leader)"
	case interrupt:
		ev.Target += " (and the leader, as it adds it again)"
		// The steps take milliseconds on loopback; a slow link from the
		// leader to the node draws them out to where the check sees them.
		slow := r.links[[2]int{leader.index, n.index}]
		slow.SetDelay(20 * time.Millisecond)
		defer slow.SetDelay(0)
		halfway = func(ctx context.Context) string {
			st, err := statusOf(ctx, leader.api)
			if err != nil || st.GetState() != "Leader" {
				return ""
			}
			if known, voter := memberOf(st, n.id); known && voter {
				return "" // not removed yet, or a voter again already
			}
			r.restartNode(leader, nil)
			return fmt.Sprintf("%s, the leader, killed and started again with %s removed or a non-voter", leader.name(), n.name())
		}
	}
	ev.Start = time.Now()
	r.restartNode(n, func() error { return wipeDataDir(n) })
	w := &rejoinWatch{n: n, wiped: ev.Start}
	ev.Outcome, ev.Note = r.awaitRejoin(ctx, w, rejoinWait, halfway)
	if ev.Outcome != OutcomeNotRejoined {
		return true
	}
	p := pendingRejoin{w: w, fault: len(r.faults)}
	if ctx.Err() != nil {
		// The run ended within the wait: the end of the run waits
		// more, and adds it by hand then if it has to.
		ev.Note = join(ev.Note, "the run ended before it was added by hand")
	} else {
		ev.Note = join(ev.Note, r.addByHand(ctx, n))
		p.addedByHand = true
	}
	if !r.countsAsVoter(ctx, r.leaderAPI(), n.id) {
		r.mu.Lock()
		r.unrejoined = append(r.unrejoined, p)
		r.mu.Unlock()
	}
	return true
}

// pendingRejoin is a wiped node that was not a voter again when its fault
// ended; fault is the index of its FaultEvent, and addedByHand says whether
// the fault ran fence members add for it.
type pendingRejoin struct {
	w           *rejoinWatch
	fault       int
	addedByHand bool
}

// rejoinWatch is what the checker saw of a wiped node coming back: when it
// was wiped, and how long after that it first held the group's data.
type rejoinWatch struct {
	n        *node
	wiped    time.Time
	caughtUp time.Duration
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

// awaitRejoin waits, up to bound or the end of ctx, until w's wiped node is
// a voter of the run's group again, and says how that went. Until halfway,
// if any, says what it did (it acts once it finds the rejoin under way),
// it calls it every few milliseconds: the steps of a rejoin take that long.
//
// The wiped node holds nothing until the leader has removed its member and
// added it back (the leader cannot replicate to it before: it refuses to be
// dialed as a voter with no data), so once it has applied entries of the
// run's group, the member was removed; a leader that then counts it as a
// voter has made it one again.
func (r *runner) awaitRejoin(ctx context.Context, w *rejoinWatch, bound time.Duration, halfway func(context.Context) string) (outcome, note string) {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	n, wiped := w.n, w.wiped
	did := ""
	for {
		if halfway != nil {
			if did = halfway(ctx); did != "" {
				halfway = nil
			}
		}
		if st, err := statusOf(ctx, n.api); err == nil {
			group := st.GetClusterId()
			if group != "" && group != r.clusterID {
				return OutcomeOtherGroup, fmt.Sprintf("it answers for group %s", group)
			}
			if group == r.clusterID && st.GetAppliedIndex() > 0 {
				if w.caughtUp == 0 {
					w.caughtUp = time.Since(wiped)
				}
				if r.countsAsVoter(ctx, st.GetLeaderAddress(), n.id) {
					return OutcomeRejoined, join(did, fmt.Sprintf("holding the group's data after %v, a voter again after %v",
						w.caughtUp.Round(time.Millisecond), time.Since(wiped).Round(time.Millisecond)))
				}
			}
		}
		poll := 100 * time.Millisecond
		if halfway != nil {
			poll = 5 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			note := fmt.Sprintf("not a voter again after %v", time.Since(wiped).Round(time.Millisecond))
			if w.caughtUp > 0 {
				note += fmt.Sprintf(" (it held the group's data after %v)", w.caughtUp.Round(time.Millisecond))
			}
			return OutcomeNotRejoined, join(did, note)
		case <-time.After(poll):
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
	_, voter := memberOf(st, id)
	return voter
}

// memberOf says whether a node's status names member id, and as a voter.
func memberOf(st *fencev1.StatusResponse, id string) (known, voter bool) {
	for _, m := range st.GetMembers() {
		if m.GetId() == id {
			return true, m.GetVoter()
		}
	}
	return false, false
}

// settleRejoins waits, at the end of the run, for the wiped nodes that
// were not voters again when their fault ended, adds by hand those that
// are still not and that their fault did not add (the run ended first),
// and tells their faults how it went.
func (r *runner) settleRejoins(ctx context.Context) {
	r.mu.Lock()
	pending := r.unrejoined
	r.mu.Unlock()
	for _, p := range pending {
		outcome, note := r.awaitRejoin(ctx, p.w, settleWait, nil)
		if outcome == OutcomeNotRejoined && !p.addedByHand && ctx.Err() == nil {
			note = join(note, r.addByHand(ctx, p.w.n))
		}
		ev := &r.faults[p.fault]
		ev.Outcome = outcome
		ev.Note += "; at the end of the run: " + note
		fmt.Fprintf(r.log, "check: %s %s at the end of the run: %s\n", ev.Kind, ev.Target, note)
	}
}

// addByHand does what an operator does for a wiped node that the group did
// not make a voter again by itself (docs/design.md, Rejoin): fence members
// add, which makes a non-voter a voter once it has caught up; and, first,
// fence members remove while the leader still counts the node as a voter
// (add leaves a voter as it is, data or none). It says what it ran and
// how that went, as the leader sees it afterwards.
func (r *runner) addByHand(ctx context.Context, n *node) string {
	c, err := client.New(client.WithEndpoints(r.cfg.Endpoints...), client.WithClusterID(r.clusterID))
	if err != nil {
		return "fence members add could not be run: " + err.Error()
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	ran := "fence members add"
	if r.countsAsVoter(ctx, r.leaderAPI(), n.id) {
		if st, err := statusOf(ctx, n.api); err == nil && st.GetClusterId() == r.clusterID && st.GetAppliedIndex() > 0 {
			return "it was a voter holding the group's data by the time it was to be added by hand"
		}
		if err := c.RemoveMember(ctx, n.id); err != nil {
			return "fence members remove, to add it again by hand, failed: " + err.Error()
		}
		ran = "fence members remove and add"
	}
	if err := c.AddMember(ctx, n.id, n.raft, true); err != nil {
		return ran + " did not make it a voter either: " + err.Error()
	}
	if !r.countsAsVoter(ctx, r.leaderAPI(), n.id) {
		return ran + " succeeded, and yet the leader does not count it as a voter"
	}
	return fmt.Sprintf("%s made it a voter in %v", ran, time.Since(start).Round(time.Millisecond))
}

// leaderAPI returns the API address of the node that leads, "" if none.
func (r *runner) leaderAPI() string {
	if l := r.leaderNode(); l != nil {
		return l.api
	}
	return ""
}
