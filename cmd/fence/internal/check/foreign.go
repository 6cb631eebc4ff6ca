package check

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
)

// Outcomes of a foreign-add fault.
const (
	OutcomeRefused      = "refused"
	OutcomeRefusedOther = "refused, not naming both groups"
	OutcomeNotAnswered  = "not answered"
	OutcomeAccepted     = "accepted"
)

// foreignAddWait bounds the call that asks the group to add the foreign
// node (one that was taken waits for the node to catch up).
const foreignAddWait = 15 * time.Second

// addForeignNode starts a node alone, which founds a group of its own, and
// asks the checked group to add it, as a voter or a non-voter, under a new
// member id, the one it runs with (so that the leader's hello finds the id
// it expects, and only the node's group can be the reason to refuse it). The group must refuse with
// ErrMembership naming both groups and keep its members; the node must
// still lead its own group afterwards. It is stopped at the end. Once
// begun, the fault runs to its end even if the run's time is up meanwhile
// (each of its waits is bounded): checked with the run's context, an ended
// run would pass for a node that does not answer.
func (r *runner) addForeignNode(ctx context.Context, ev *FaultEvent) bool {
	ctx = context.WithoutCancel(ctx)
	voter := r.rng.IntN(2) == 0
	r.foreign++
	id := fmt.Sprintf("n%d", len(r.nodes)+1)
	f, err := r.newNode(len(r.nodes), id, filepath.Join(r.dataDir, fmt.Sprintf("foreign%d", r.foreign)))
	if err != nil {
		fmt.Fprintf(r.log, "check: foreign node: %v\n", err)
		return false
	}
	ev.Target = fmt.Sprintf("%s of another group (%s), as a %s", f.name(), filepath.Base(f.dir), map[bool]string{true: "voter", false: "non-voter"}[voter])
	if err := f.launch(); err != nil {
		fmt.Fprintf(r.log, "check: starting the foreign %s: %v\n", f.name(), err)
		return false
	}
	defer func() {
		f.stop()
		_ = os.RemoveAll(f.dir) // its log, beside it, stays
	}()
	own, err := r.foreignGroup(ctx, f)
	if err != nil {
		fmt.Fprintf(r.log, "check: the foreign %s: %v\n", f.name(), err)
		return false
	}
	before, _ := r.groupMembers(ctx)
	ev.Start = time.Now()
	c, err := client.New(client.WithEndpoints(r.cfg.Endpoints...), client.WithClusterID(r.clusterID))
	if err != nil {
		return false
	}
	defer c.Close()
	actx, cancel := context.WithTimeout(ctx, foreignAddWait)
	err = c.AddMember(actx, id, f.raft, voter)
	cancel()
	switch {
	case err == nil:
		ev.Outcome, ev.Note = OutcomeAccepted, fmt.Sprintf("group %s took it", r.clusterID)
	case errors.Is(err, fence.ErrMembership) && strings.Contains(err.Error(), own) && strings.Contains(err.Error(), r.clusterID):
		ev.Outcome = OutcomeRefused
	case errors.Is(err, fence.ErrMembership):
		ev.Outcome, ev.Note = OutcomeRefusedOther, err.Error()
	default:
		ev.Outcome, ev.Note = OutcomeNotAnswered, err.Error()
	}

	after, err := r.groupMembers(ctx)
	switch {
	case err != nil:
		ev.Note = join(ev.Note, "the group's members could not be read afterwards: "+err.Error())
	case slices.ContainsFunc(after, func(m *fencev1.Member) bool { return m.GetId() == id || m.GetRaftAddress() == f.raft }):
		ev.Outcome = OutcomeAccepted
		r.addViolation(Violation{Kind: ViolationForeignMember, Detail: fmt.Sprintf("group %s took %s, of group %s, as a member: its members are now %s",
			r.clusterID, f.name(), own, memberList(after))})
		// Take it out again, so that the run goes on with the group it began with.
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := c.RemoveMember(rctx, id); err != nil {
			fmt.Fprintf(r.log, "check: removing the foreign %s from the group: %v\n", f.name(), err)
		}
		cancel()
	case ev.Outcome == OutcomeAccepted:
		r.addViolation(Violation{Kind: ViolationForeignMember, Detail: fmt.Sprintf("group %s said it added %s, of group %s, as a member, though its members are %s",
			r.clusterID, f.name(), own, memberList(after))})
	case before != nil && memberList(before) != memberList(after):
		ev.Note = join(ev.Note, fmt.Sprintf("the group's members changed meanwhile, from %s to %s", memberList(before), memberList(after)))
	}

	if why := r.leadsAlone(ctx, f, own); why != "" {
		r.addViolation(Violation{Kind: ViolationForeignMember, Detail: fmt.Sprintf("after group %s was asked to add it, %s %s", r.clusterID, f.name(), why)})
	}
	return true
}

// foreignGroup waits until the foreign node leads a group of its own, and
// returns that group.
func (r *runner) foreignGroup(ctx context.Context, f *node) (string, error) {
	if err := waitServing(ctx, []*node{f}); err != nil {
		return "", err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := statusOf(ctx, f.api)
		if err == nil && st.GetClusterId() != "" && st.GetState() == "Leader" {
			if st.GetClusterId() == r.clusterID {
				return "", fmt.Errorf("it founded the run's group %s", r.clusterID)
			}
			return st.GetClusterId(), nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("it did not lead a group of its own within 10s (%v)", err)
		}
		sleep(ctx, 50*time.Millisecond)
	}
}

// leadsAlone says what is wrong, if anything, with the foreign node f: it
// must still lead group own, alone.
func (r *runner) leadsAlone(ctx context.Context, f *node, own string) string {
	st, err := statusOf(ctx, f.api)
	switch {
	case err != nil:
		return fmt.Sprintf("does not answer: %v", err)
	case st.GetClusterId() != own:
		return fmt.Sprintf("answers for group %s, not its own %s", st.GetClusterId(), own)
	case st.GetState() != "Leader":
		return fmt.Sprintf("is %s, no longer the leader of its own group %s (its leader is %q)", st.GetState(), own, st.GetLeaderId())
	case len(st.GetMembers()) != 1 || st.GetMembers()[0].GetId() != f.id:
		return fmt.Sprintf("has the members %s, not itself alone", memberList(st.GetMembers()))
	}
	return ""
}

// groupMembers returns the members of the run's group as its leader has
// them.
func (r *runner) groupMembers(ctx context.Context) ([]*fencev1.Member, error) {
	leader := r.leaderNode()
	if leader == nil {
		return nil, errors.New("no leader")
	}
	st, err := statusOf(ctx, leader.api)
	if err != nil {
		return nil, err
	}
	return st.GetMembers(), nil
}

// memberList describes members, in id order, each as id=raft-address, with
// "(non-voter)" after a non-voter.
func memberList(members []*fencev1.Member) string {
	var out []string
	for _, m := range members {
		s := m.GetId() + "=" + m.GetRaftAddress()
		if !m.GetVoter() {
			s += " (non-voter)"
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

func join(note, more string) string {
	if note == "" {
		return more
	}
	return note + "; " + more
}
