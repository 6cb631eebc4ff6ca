package server

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fencelock/fence/internal/fsm"
)

// Bootstrapping is a one-time act in a group's life (docs/design.md, "A
// group knows itself"). A node with an empty data dir cannot tell a new
// group from a lost disk by itself, so with static peers it asks them
// first, and founds the group only when every peer answers and each is new
// too, or has just founded this same group. A peer that holds data of
// another group means this node's data dir was lost or replaced: it then
// founds nothing, says so, and waits to be added again.

// bootstrapPoll bounds how often a node waiting to bootstrap asks its
// peers again.
const bootstrapPoll = time.Second

// startBootstrap bootstraps a node that holds no data and was not told to
// join: at once for a node alone, and once its peers agree for a node with
// static peers (in the background: they may start later than this one).
func (s *Server) startBootstrap() error {
	if s.node.hasData() {
		s.noteHeldData()
		return nil
	}
	if s.cfg.Join {
		return nil
	}
	if len(s.cfg.Peers) <= 1 {
		if s.ident.heldData.Load() {
			return fmt.Errorf("this node's data dir %[2]s held group %[1]s's raft data, and holds none now: its raft files were lost, "+
				"its identity file kept. It will not found the group again (its tokens would start over, and members added to it would find two groups of one id). "+
				"If the group has other members: remove this one (fence members remove %[3]s), empty its data dir, start it with --join, "+
				"and add it (fence members add %[3]s ADDRESS); without --join it would found a new group. "+
				"If it was the group's only member: restore the group's data (fence snapshot restore, from a snapshot of it) into an empty data dir. "+
				"To start a new group on purpose, empty the data dir",
				groupName(s.ident.groupID()), s.cfg.DataDir, s.cfg.NodeID)
		}
		group := s.ident.groupID()
		if group == "" {
			group = rand.Text()
		}
		return s.bootstrapGroup(group, founding{
			Protocols:    map[string]uint32{s.cfg.NodeID: fsm.Protocol},
			Incarnations: map[string]string{s.cfg.NodeID: s.ident.incarnation},
		})
	}
	s.wg.Add(1)
	go s.bootstrapWhenAgreed()
	return nil
}

// bootstrapGroup records group as the data dir's, and whom it is founded
// with, then writes the group's first configuration, and records that it
// did.
func (s *Server) bootstrapGroup(group string, founders founding) error {
	if err := s.ident.found(group, founders); err != nil {
		return err
	}
	err := s.node.raft.BootstrapCluster(bootConfiguration(s.cfg, s.node.transport.LocalAddr())).Error()
	switch {
	case errors.Is(err, raft.ErrCantBootstrap) && s.node.hasData():
		s.logger.Info("added to the group while founding it", "cluster_id", group)
		return nil
	case errors.Is(err, raft.ErrCantBootstrap):
		// raft keeps a term, and no entry: the log was lost and raft's
		// stable store (the term, the vote) kept, or a founding stopped
		// half-way.
		return fmt.Errorf("%w: its raft log was lost, or a founding stopped half-way, and it will not found the group again "+
			"(it may have acknowledged entries the group counts on). it asks the group's leader to add it again (with --auto-rejoin on the group's nodes), "+
			"or remove it from the group (fence members remove %s), empty its data dir, start it with --join, and add it again (fence members add %s ADDRESS)",
			errTermWithoutLog, s.cfg.NodeID, s.cfg.NodeID)
	case err != nil:
		return fmt.Errorf("bootstrapping: %w", err)
	}
	s.noteHeldData()
	s.logger.Info("bootstrapped a new group", "cluster_id", group, "members", len(s.cfg.Peers))
	return nil
}

// noteHeldData records in the data dir's identity, once, that it holds
// raft data of its group: should its raft files be lost and its identity
// kept, the node then knows it may have voted and acknowledged entries,
// and founds nothing (census, startBootstrap).
func (s *Server) noteHeldData() {
	if s.ident.heldData.Load() {
		return
	}
	if err := s.ident.setHeldData(); err != nil {
		s.logger.Warn("recording that the data dir holds raft data", "err", err)
	}
}

// bootstrapWhenAgreed asks the peers until they agree that the group is
// new, then bootstraps it; it ends early once the node holds data (the
// group added it) or closes.
func (s *Server) bootstrapWhenAgreed() {
	defer s.wg.Done()
	defer s.bootstrapNote.Store(nil)
	defer s.node.foundingSince.Store(0)
	s.node.foundingSince.Store(time.Now().UnixNano())
	wait := 20 * time.Millisecond
	for !s.node.hasData() {
		c := s.censusOfPeers()
		note, level := c.note, c.level
		s.noteFounding(c)
		if note == "" {
			err := s.bootstrapGroup(c.group, c.founders)
			if err == nil {
				return
			}
			note, level = err.Error(), slog.LevelError
			s.node.foundingSince.Store(0)
			if errors.Is(err, errTermWithoutLog) {
				s.rejoinFrom(c.holders)
			}
		} else {
			s.rejoinFrom(c.holders)
		}
		s.bootstrapNote.Store(&note)
		s.bootstrapLogs.log(s.logger, level, note, "not bootstrapping a group yet", "why", note)
		select {
		case <-s.done:
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, bootstrapPoll)
	}
}

// errTermWithoutLog marks a node whose raft state keeps a term but no log
// entry: raft refuses to bootstrap it.
var errTermWithoutLog = errors.New("this node's raft state keeps a term but no log entry")

// rejoinFrom asks holders, the peers holding the group's data, to add
// this node again, and if one agrees waits to be added: whether this node
// lost its data, or is slow to found a group a peer founded, the leader
// adds it with a check of its own, and it catches up.
func (s *Server) rejoinFrom(holders []string) {
	if len(holders) > 0 && s.askToRejoin(s.peerServers(holders)).Accepted {
		s.startRejoin()
	}
}

// noteFounding keeps, after census c, when the node began counting as
// founding (node.founding). A census that found something wrong (this
// node's data lost, a peer of another version, a bootstrap that failed),
// or a peer holding data while this node may not found the group (another
// is silent: this node cannot tell its own data's loss from a founder's
// head start yet), ends it: a voter's connection is then refused as for
// good.
func (s *Server) noteFounding(c census) {
	switch {
	case c.level >= slog.LevelError || len(c.holders) > 0 && c.note != "":
		s.node.foundingSince.Store(0)
	case s.node.foundingSince.Load() == 0:
		s.node.foundingSince.Store(time.Now().UnixNano())
	}
}

// census is what a node with no data learns from its peers' hellos.
type census struct {
	// group is the id of the group the peers would found together; note is
	// why this node may not found it now, "" when it may, and level how
	// loud to say so: a peer did not answer (it waits, info), or one holds
	// another group's data (error).
	group, note string
	level       slog.Level
	// holders are the peers that hold data.
	holders []string
	// founders are, when the node may found the group, whom it founds it
	// with (this node included).
	founders founding
}

// censusOfPeers asks every peer for its hello.
func (s *Server) censusOfPeers() census {
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		hellos  = map[string]nodeHello{}
		silent  []string
		strange []string
	)
	for id, addr := range s.cfg.Peers {
		if id == s.cfg.NodeID {
			continue
		}
		wg.Go(func() {
			h, err := s.node.links.askHello(s.dialAddress(raft.ServerID(id), raft.ServerAddress(addr)), helloTimeout)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				silent = append(silent, id)
			case h.ID != id:
				strange = append(strange, fmt.Sprintf("the node at %s is %q, not %q", addr, h.ID, id))
			case h.Incarnation == "":
				strange = append(strange, fmt.Sprintf("%s runs a version of fence from before groups had identities; found a group with nodes of one version", id))
			default:
				hellos[id] = h
			}
		})
	}
	wg.Wait()
	slices.Sort(silent)
	slices.Sort(strange)
	if len(strange) > 0 {
		return census{note: strings.Join(strange, "; "), level: slog.LevelError}
	}
	holders := dataHolders(hellos)
	if s.ident.heldData.Load() {
		return census{holders: holders, level: slog.LevelError, note: fmt.Sprintf("this node's data dir held group %s's raft data, and holds none now: "+
			"its raft files were lost (its identity file kept), and it will not found the group again (it may have acknowledged entries the group counts on). "+
			"it asks the group's leader to add it again (with --auto-rejoin on the group's nodes), or remove it from the group "+
			"(fence members remove %s) and add it again (fence members add %s ADDRESS); it waits until then",
			groupName(s.ident.groupID()), s.cfg.NodeID, s.cfg.NodeID)}
	}
	if len(silent) > 0 {
		if c, ok := s.fromFounders(hellos, holders); ok {
			return c
		}
		note := fmt.Sprintf("this node holds no data, and waits for every peer to answer before it founds a group (no answer yet from %s)", strings.Join(silent, ", "))
		if len(holders) > 0 {
			note += fmt.Sprintf("; %s hold data already", strings.Join(holders, ", "))
		}
		return census{note: note, level: slog.LevelInfo, holders: holders}
	}
	incarnations := map[string]string{s.cfg.NodeID: s.ident.incarnation}
	protocols := map[string]uint32{s.cfg.NodeID: fsm.Protocol}
	for id, h := range hellos {
		incarnations[id] = h.Incarnation
		protocols[id] = helloProtocol(h)
	}
	group := bootstrapGroupID(incarnations)
	founders := founding{Protocols: protocols, Incarnations: incarnations}
	for _, id := range holders {
		if h := hellos[id]; h.Group != group {
			return census{holders: holders, level: slog.LevelError, note: fmt.Sprintf("%s answers with group %s and holds its data (log index %d), while this node holds none: "+
				"this node's data dir was lost or replaced, and it will not found a second group. "+
				"it asks the group's leader to add it again (with --auto-rejoin on the group's nodes), or remove it from the group "+
				"(fence members remove %s) and add it again (fence members add %s ADDRESS); it waits until then",
				id, groupName(h.Group), h.LastIndex, s.cfg.NodeID, s.cfg.NodeID)}
		}
	}
	if mine := s.ident.groupID(); mine != "" && mine != group {
		return census{level: slog.LevelError, note: fmt.Sprintf("this data dir belongs to group %s, and its peers would found group %s: "+
			"a peer's data dir was replaced since; it waits to be added to a group", mine, group)}
	}
	return census{group: group, founders: founders, holders: holders}
}

// fromFounders is the census of a founder slower than the others while a
// peer is silent: a peer that founded the group says whom with, each by
// its data dir's incarnation. A node whose own incarnation is among them,
// that holds no data and whose data dir names no group never held the
// group's data (a lost data dir comes back with a new incarnation), so it
// founds the group as the others did, and the group does not wait on a
// founder that may never come back. A data dir that names a group does
// not: it founded one, or was admitted to one as a non-voter (both write
// the group down before raft sees a byte), so it may have voted and
// acknowledged entries, and holding no data now it lost its raft files
// but kept its identity; it waits for every peer, as before (and a crash
// between writing the group down and founding it is one such wait).
// It reports false when no holder's record says so: the peers of today's
// configuration, this node by its incarnation, and the group every holder
// answers with.
func (s *Server) fromFounders(hellos map[string]nodeHello, holders []string) (census, bool) {
	if s.ident.groupID() != "" || s.ident.rejoining.Load() {
		return census{}, false
	}
	for _, id := range holders {
		h := hellos[id]
		f := h.Founders
		if f == nil || f.Incarnations[s.cfg.NodeID] != s.ident.incarnation || bootstrapGroupID(f.Incarnations) != h.Group ||
			!samePeers(f.Incarnations, s.cfg.Peers) {
			continue
		}
		for _, other := range holders {
			if hellos[other].Group != h.Group {
				return census{}, false
			}
		}
		return census{group: h.Group, founders: *f, holders: holders}, true
	}
	return census{}, false
}

// samePeers reports whether founders names the peers of peers, no more.
func samePeers(founders map[string]string, peers map[string]string) bool {
	if len(founders) != len(peers) {
		return false
	}
	for id := range peers {
		if _, ok := founders[id]; !ok {
			return false
		}
	}
	return true
}

// dataHolders lists, in id order, the peers whose hello says they hold
// data or belong to a group.
func dataHolders(hellos map[string]nodeHello) []string {
	var out []string
	for id, h := range hellos {
		if h.LastIndex > 0 || h.Group != "" {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}
