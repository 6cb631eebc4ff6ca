package server

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fencelock/fence/internal/fsm"
)

// The rules by which a node admits raft connections (docs/design.md, "A
// group knows itself"). raft itself takes any leader of a term at least
// its own, and a node with no data votes for anyone who asks: so a node of
// another group could follow this group's leader, and a node that lost
// its data dir could vote again in a term it voted in, or acknowledge
// entries it will not keep. Every raft connection therefore starts with an
// introduction, checked here before raft reads a byte of it.

// hello is this node's answer on a node link.
func (n *node) hello() nodeHello {
	index, term := n.lastEntry()
	return nodeHello{ID: string(n.id), API: n.api, LastIndex: index, LastTerm: term,
		Group: n.ident.groupID(), Incarnation: n.ident.incarnation, Protocol: fsm.Protocol, Rejoining: n.ident.rejoining.Load(), Joining: n.join && !n.hasData(), LowDisk: n.lowDisk.Load(),
		WriteFailing: n.log != nil && n.log.Failing(), Founders: n.ident.founding()}
}

// lastEntry returns the index and term of the last entry of the node's
// log, or of its snapshot when that goes further.
func (n *node) lastEntry() (index, term uint64) {
	if n.raft == nil {
		return 0, 0
	}
	st := n.raft.Stats()
	u := func(k string) uint64 { v, _ := strconv.ParseUint(st[k], 10, 64); return v }
	index, term = u("last_log_index"), u("last_log_term")
	if snap := u("last_snapshot_index"); snap > index {
		index, term = snap, u("last_snapshot_term")
	}
	return index, term
}

// hasData reports whether the node holds raft state: a log entry or a
// snapshot. A node without is new, or lost its data dir.
func (n *node) hasData() bool { return n.raft != nil && n.raft.LastIndex() > 0 }

// introduce is what this node says on a raft connection it opens to addr:
// who it is, its group, and whom its configuration expects at addr.
func (n *node) introduce(addr raft.ServerAddress) raftIntro {
	intro := raftIntro{From: string(n.id), Group: n.ident.groupID(), Protocol: fsm.Protocol}
	if n.raft == nil {
		return intro
	}
	for _, srv := range n.raft.GetConfiguration().Configuration().Servers {
		if n.dialAddress(srv.ID, srv.Address) != addr {
			continue
		}
		intro.To, intro.Role = string(srv.ID), roleNonvoter
		if srv.Suffrage == raft.Voter {
			intro.Role = roleVoter
		}
		break
	}
	return intro
}

// errFounding is the refusal of a voter's raft connection by a node that
// holds no data while it finds out whether it founds the group with its
// peers (bootstrapWhenAgreed): one of them founded it first, and this
// node is slower to hear from all the others. It passes by itself, unlike
// the refusal of a node whose data was lost.
var errFounding = errors.New("not founded yet")

// foundingGrace bounds how long a node counts as founding (errFounding):
// a founder slower than its peers founds the group within seconds of
// hearing from them all, and one that cannot hear from them for as long
// (a network cut one way, a wiped node behind it) is a problem to say
// loudly. A variable for tests.
var foundingGrace = 30 * time.Second

// founding reports whether the node, holding no data, has been asking its
// peers whether to found the group with them for less than foundingGrace,
// finding nothing wrong and no peer holding data.
func (n *node) founding() bool {
	since := n.foundingSince.Load()
	return since != 0 && time.Since(time.Unix(0, since)) < foundingGrace
}

// admit decides whether a raft connection introduced by intro may reach
// raft. A node with no data that is asked to take part as a non-voter
// joins the dialer's group here, durably, before it answers.
func (n *node) admit(intro raftIntro) error {
	self := string(n.id)
	if intro.To != "" && intro.To != self {
		return fmt.Errorf("this node is %q, not %q: %s's configuration names another node at this address", self, intro.To, intro.From)
	}
	mine := n.ident.groupID()
	if intro.Group != "" && mine != "" && intro.Group != mine {
		return fmt.Errorf("%w: this node (%s) belongs to group %s, and %s, which dialed it, to group %s; a node serves one group for life",
			errWrongGroup, self, mine, intro.From, intro.Group)
	}
	if n.hasData() {
		return nil
	}
	switch intro.Role {
	case roleVoter:
		if n.founding() {
			return fmt.Errorf("%w: this node (%s) holds no data yet, and %s's group %s counts it as a voter: this node is still asking its peers whether to found a group with them, "+
				"and founds that one once it hears from them all, or says its data dir was lost when it hears from one that holds the group's data", errFounding, self, intro.From, groupName(intro.Group))
		}
		return fmt.Errorf("this node (%s) holds no data, and %s's group %s counts it as a voter: its data dir was lost or replaced, "+
			"so it may not vote or count towards a commit. Remove it from the group (fence members remove %s) and add it again (fence members add %s ADDRESS)",
			self, intro.From, groupName(intro.Group), self, self)
	case roleNonvoter:
		if intro.Group != "" {
			if err := n.ident.adopt(intro.Group); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("this node (%s) holds no data and %s's configuration does not name it: it waits to be added to a group (fence members add %s ADDRESS)", self, intro.From, self)
}

// admitUnintroduced decides whether a raft connection that does not
// introduce itself (a node of a version from before introductions) may
// reach raft: only a node with data of its own takes one, and only while
// its group's protocol allows nodes that old.
func (n *node) admitUnintroduced() error {
	if !n.hasData() {
		return errors.New("this node holds no data; it takes raft connections only from nodes that say which group they are of (a version of fence from before introductions cannot add it)")
	}
	return n.dialUnintroduced()
}

// dialUnintroduced decides whether this node may open a raft connection
// without an introduction, to a node that runs a fence from before them.
func (n *node) dialUnintroduced() error {
	if p := n.fsm.Protocol(); p >= fsm.Protocol2 {
		return fmt.Errorf("the group runs protocol %d, at which every member introduces itself on its raft connections", p)
	}
	return nil
}

// dialAddress is where raft dials server id: the address provider's
// answer (--raft-dial) if it has one, else addr.
func (n *node) dialAddress(id raft.ServerID, addr raft.ServerAddress) raft.ServerAddress {
	if p := n.addrs; p != nil {
		if a, err := p.ServerAddr(id); err == nil && a != "" {
			return a
		}
	}
	return addr
}

// groupName is a group id for a message: "(unnamed)" for none.
func groupName(id string) string {
	if id == "" {
		return "(not yet named)"
	}
	return id
}
