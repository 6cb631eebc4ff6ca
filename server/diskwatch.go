package server

import (
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fencelock/fence/server/internal/durable"
)

// A leader whose disk fills hands leadership to a voter with room while it
// can still write (docs/design.md, Disk full). raft steps a leader down
// only once a log write has failed, and then says nothing to the others:
// they elect a new leader when their heartbeat timeout has passed, and
// until then no grant is answered. raft-wal preallocates its segment
// files, so a leader whose disk has less room than one segment still
// writes until that segment is full: the time a hand-off takes.

// diskPoll is how often a node looks at the free space of its data dir.
const diskPoll = 100 * time.Millisecond

// diskHandOffPause is how long a leader that handed leadership over for
// its disk waits before it tries again (it may be elected once more, when
// every voter's disk is low).
const diskHandOffPause = 2 * time.Second

// watchDisk keeps the node's word on its disk (its hello says when the
// disk is low) up to date, and, while the node leads with a low disk,
// hands leadership to a voter with room.
func (s *Server) watchDisk() {
	defer s.wg.Done()
	t := time.NewTicker(diskPoll)
	defer t.Stop()
	var handedOff time.Time
	warned := false // that nobody can take over, once while the disk is low
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		low := s.diskLow()
		switch was := s.node.lowDisk.Swap(low); {
		case low && !was:
			s.logger.Warn("the data dir's disk is nearly full", "data_dir", s.cfg.DataDir, "min_free_disk", s.cfg.MinFreeDisk)
		case was && !low:
			s.logger.Info("the data dir's disk has room again", "data_dir", s.cfg.DataDir)
		}
		warned = warned && low
		if low && s.node.isLeader() && time.Since(handedOff) >= diskHandOffPause {
			handedOff = time.Now()
			warned = s.handOffForDisk(warned)
		}
	}
}

// diskLow says whether the data dir's disk has less free space than
// MinFreeDisk, or a write to it (the raft log, the token reserve) found
// none.
func (s *Server) diskLow() bool {
	if s.node.log != nil && s.node.log.Full() || s.reserve.Full() {
		return true
	}
	if s.cfg.MinFreeDisk <= 0 {
		return false
	}
	free, err := durable.FreeDiskBytes(s.cfg.DataDir)
	return err == nil && free < uint64(s.cfg.MinFreeDisk)
}

// diskProblem says that the data dir's disk is low, if it is, for Status.
func (s *Server) diskProblem() string {
	if !s.node.lowDisk.Load() {
		return ""
	}
	free, _ := durable.FreeDiskBytes(s.cfg.DataDir)
	return fmt.Sprintf("disk nearly full: %d MiB free in %s, under --min-free-disk (%d MiB); a leader hands leadership to a voter with room",
		free>>20, s.cfg.DataDir, s.cfg.MinFreeDisk>>20)
}

// successor returns the voter, of those whose disk has room, whose log
// writes do not fail and that answer within timeout, with the longest log
// (to.ID is "" when none), and how many voters there are besides this
// node. It asks them all at once.
func (s *Server) successor(timeout time.Duration) (to raft.Server, others int) {
	type answer struct {
		v raft.Server
		h nodeHello
	}
	answers := make(chan answer)
	for _, v := range s.voters() {
		if string(v.ID) == s.cfg.NodeID {
			continue
		}
		others++
		go func() {
			h, err := s.node.links.askHello(s.dialAddress(v.ID, v.Address), timeout)
			if err != nil || h.ID != string(v.ID) || h.LowDisk || h.WriteFailing {
				h = nodeHello{}
			}
			answers <- answer{v, h}
		}()
	}
	var longest uint64
	for range others {
		a := <-answers
		if a.h.ID == "" || a.h.LastIndex < longest || to.ID != "" && a.h.LastIndex == longest && a.v.ID > to.ID {
			continue
		}
		to, longest = a.v, a.h.LastIndex
	}
	return to, others
}

// handOffForDisk transfers leadership to the voter, of those whose disk
// has room, with the longest log. When none can take over it says so,
// unless warned (it said so already), and reports whether it did.
func (s *Server) handOffForDisk(warned bool) bool {
	to, others := s.successor(helloTimeout)
	switch {
	case others == 0: // a node alone: Status says its disk is low
		return true
	case to.ID == "":
		if !warned {
			s.logger.Warn("the data dir's disk is nearly full, and no other voter with room answers to take leadership over", "data_dir", s.cfg.DataDir)
		}
		return true
	}
	s.logger.Warn("the data dir's disk is nearly full: handing leadership to a voter with room", "data_dir", s.cfg.DataDir, "to", to.ID)
	if err := s.node.raft.LeadershipTransferToServer(to.ID, to.Address).Error(); err != nil {
		s.logger.Warn("handing leadership over", "to", to.ID, "err", err)
	}
	return false
}

// leaderWriteFailed is called on raft's goroutine when an append to the
// raft log failed (a disk that filled before watchDisk saw it, an I/O
// error). On a leader, raft answers the append's callers with the error
// and steps down, and tells the others nothing: they would elect a leader
// once their heartbeat timeout passed, and until then no grant is
// answered. This node knows why it stepped down, and asks its successor
// to stand for election at once, unless it did within diskHandOffPause
// (two voters whose writes fail would hand over to each other on end).
func (s *Server) leaderWriteFailed(err error) {
	r := s.node.raft
	if r.State() != raft.Leader {
		return // a follower's append: the leader sends it again
	}
	now := time.Now().UnixNano()
	if last := s.stoodDown.Load(); last != 0 && now-last < int64(diskHandOffPause) {
		return
	}
	s.stoodDown.Store(now)
	s.wg.Add(1) // raft, which calls this, is shut down before Close waits
	go func() {
		defer s.wg.Done()
		s.standDown(err, r.CurrentTerm(), time.Now().Add(s.cfg.HeartbeatTimeout/2))
	}()
}

// standDown waits for raft to step this node down in term after its log
// write failed with cause, and asks its successor to stand for election
// now: raft's TimeoutNow, the message a leadership transfer ends with,
// which has the successor campaign at once and its voters grant their
// votes though they heard from a leader lately. The election is raft's,
// with its rules: the successor wins only with a log as long as a
// majority's. raft obeys a TimeoutNow in any state and term, so none is
// sent after deadline (by then the others' own election is near), nor
// once this node knows of a newer term or of a leader: a late one would
// depose the group's next leader.
func (s *Server) standDown(cause error, term uint64, deadline time.Time) {
	r := s.node.raft
	for r.State() == raft.Leader {
		if time.Now().After(deadline) {
			return
		}
		select {
		case <-s.done:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
	moved := func() bool {
		addr, _ := r.LeaderWithID()
		return r.State() == raft.Shutdown || r.CurrentTerm() != term || addr != "" || time.Now().After(deadline)
	}
	if moved() {
		return
	}
	to, others := s.successor(time.Until(deadline))
	switch {
	case others == 0 || moved():
		return
	case to.ID == "":
		s.logger.Warn("a write to the raft log failed, and raft stepped this node down; no other voter with room answers to stand for election", "err", cause)
		return
	}
	s.logger.Warn("a write to the raft log failed, and raft stepped this node down: asking the voter with the longest log to stand for election now", "err", cause, "to", to.ID)
	trans := s.node.transport
	req := &raft.TimeoutNowRequest{RPCHeader: raft.RPCHeader{
		ProtocolVersion: s.node.protocolVersion,
		ID:              []byte(s.cfg.NodeID),
		Addr:            trans.EncodePeer(raft.ServerID(s.cfg.NodeID), trans.LocalAddr()),
	}}
	if err := trans.TimeoutNow(to.ID, to.Address, req, &raft.TimeoutNowResponse{}); err != nil {
		s.logger.Warn("asking a voter to stand for election", "to", to.ID, "err", err)
	}
}
