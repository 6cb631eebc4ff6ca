package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
)

// Node-to-node calls go over the raft port, not the client API
// (docs/design.md, Node-to-node calls and membership). The first byte of a
// connection to the raft port says what it is: nodeLinkMagic a node link,
// on which the node answers one hello (who it is, where it serves the API,
// how far its log goes, its group) and closes; rejoinMagic a member's ask
// to be added again; raftIntroMagic a raft connection whose dialer
// introduces itself first (admit.go); and a byte below 8 a raft connection
// of a node from before introductions (raft's own RPCs start with their
// type). The raft port is as trusted as raft (with TLS, both sides present
// node certificates), so a hello is as trustworthy as the log itself; and
// the leader asks each member at the raft address of its membership, so a
// node can only speak for itself.

// nodeLinkMagic opens a node link: raft never starts a connection with it.
const nodeLinkMagic = 'F'

// firstByteTimeout bounds how long an accepted raft-port connection may
// take to send its first byte.
const firstByteTimeout = 10 * time.Second

// nodeHello is a node's answer on a node link. Fields were added over
// versions: an older node's hello has only ID, API and LastIndex.
type nodeHello struct {
	// ID is the node's raft server id.
	ID string `json:"id"`
	// API is the address the node serves the client API on.
	API string `json:"api"`
	// LastIndex is the index of the last entry in the node's raft log (or
	// of its snapshot): 0 for a node that holds no data.
	LastIndex uint64 `json:"last_index"`
	// LastTerm is the term of that entry.
	LastTerm uint64 `json:"last_term,omitempty"`
	// Group is the group the node's data dir belongs to, "" while it
	// knows none.
	Group string `json:"group,omitempty"`
	// Incarnation names the node's data dir: drawn when it was first used,
	// so a node whose data dir was replaced answers a new one.
	Incarnation string `json:"incarnation,omitempty"`
	// Protocol is the newest group protocol the node speaks (0: an older
	// node, which speaks protocol 1).
	Protocol uint32 `json:"protocol,omitempty"`
	// Rejoining says the node lost its data dir and asked its group to add
	// it again, and no leader has told it yet that it is a voter again: a
	// leader that finds such a member takes its rejoin up (finishRejoins).
	Rejoining bool `json:"rejoining,omitempty"`
	// Joining says the node was started with --join and holds no data. A
	// member added by hand whose data dir was lost knows no peers and asks
	// nobody; a leader that finds it a voter adds it again (finishRejoins).
	Joining bool `json:"joining,omitempty"`
	// LowDisk says the node's data dir has less free space than its
	// --min-free-disk: a leader handing leadership over passes it by.
	LowDisk bool `json:"low_disk,omitempty"`
	// WriteFailing says the node's last append to its raft log failed,
	// for whatever reason: a leader handing leadership over passes it by.
	WriteFailing bool `json:"write_failing,omitempty"`
	// Founders says, on a node that founded its group, whom it founded it
	// with: a founder slower than the others, holding no data, finds its
	// own incarnation there (census.fromFounders).
	Founders *founding `json:"founders,omitempty"`
}

// raftIntroMagic opens a raft connection on which the dialer introduces
// itself before raft's first RPC (a raftIntro frame, answered by a
// raftIntroAnswer frame), so that the node it dials can refuse a node of
// another group, or a role its data cannot fill, before raft sees a byte.
const raftIntroMagic = 'G'

// raftIntro is what a node says of itself, and of the node it dials, on
// every raft connection it opens.
type raftIntro struct {
	// From is the dialer's id, Group its group ("" while it knows none).
	From  string `json:"from"`
	Group string `json:"group,omitempty"`
	// To is the id the dialer's configuration gives the node at the
	// address it dialed, and Role that node's part in it (roleVoter or
	// roleNonvoter); both are empty when the configuration has no node
	// there.
	To   string `json:"to,omitempty"`
	Role string `json:"role,omitempty"`
	// Protocol is the newest group protocol the dialer speaks.
	Protocol uint32 `json:"protocol"`
}

// rejoinMagic opens a node link on which a node whose data dir was lost
// asks to be added to its group again (rejoinRequest, answered by a
// rejoinAnswer).
const rejoinMagic = 'R'

// rejoinRequest is a member's ask to be added again, as a new member.
type rejoinRequest struct {
	ID          string `json:"id"`
	Incarnation string `json:"incarnation"`
}

// rejoinAnswer says whether the leader is adding the member again, and
// whether it is done: Voter says the leader counts the member as a voter,
// and the node at its address (the one asking) holds data.
type rejoinAnswer struct {
	Accepted bool   `json:"accepted,omitempty"`
	Voter    bool   `json:"voter,omitempty"`
	Refused  string `json:"refused,omitempty"`
}

// Roles a raftIntro gives the node dialed.
const (
	roleVoter    = "voter"
	roleNonvoter = "nonvoter"
)

// raftIntroAnswer admits a raft connection, or refuses it with a reason.
type raftIntroAnswer struct {
	ID      string `json:"id"`
	Group   string `json:"group,omitempty"`
	Refused string `json:"refused,omitempty"`
	// Founding says the refusal will pass: the node holds no data yet,
	// and is finding out whether it founds the group (errFounding).
	Founding bool `json:"founding,omitempty"`
}

// maxIntroFrame bounds an introduction's frame.
const maxIntroFrame = 4 << 10

// errNoFrame is a connection closed before the first byte of a frame:
// what a node from before introductions does with one.
var errNoFrame = errors.New("connection closed before the answer")

// writeFrame writes v as JSON after its length, two bytes big-endian.
func writeFrame(w io.Writer, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(data) > maxIntroFrame {
		return fmt.Errorf("a frame of %d bytes is over the limit of %d", len(data), maxIntroFrame)
	}
	_, err = w.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(data))), data...))
	return err
}

// readFrame reads a frame written by writeFrame into v, reading no byte
// past it (the connection is raft's afterwards).
func readFrame(r io.Reader, v any) error {
	var size [2]byte
	if n, err := io.ReadFull(r, size[:]); err != nil {
		if n == 0 && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
			return errNoFrame
		}
		return err
	}
	n := binary.BigEndian.Uint16(size[:])
	if n > maxIntroFrame {
		return fmt.Errorf("a frame of %d bytes is over the limit of %d", n, maxIntroFrame)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(r, data); err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}

// peerStream is raft's stream layer over TCP, or over mutual TLS when
// config is set. A peer's certificate is verified against the host it is
// dialed at, so with RaftAddressProvider (--raft-dial) the certificates
// must name the dial addresses.
type peerStream struct {
	net.Listener
	advertise net.Addr
	config    *tls.Config // nil: plain TCP
}

func listenPeerStream(listen string, advertise net.Addr, config *tls.Config) (*peerStream, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	if advertise == nil {
		advertise = ln.Addr()
	}
	if a, ok := advertise.(*net.TCPAddr); !ok || a.IP.IsUnspecified() {
		ln.Close()
		return nil, fmt.Errorf("raft address %s is not one peers can dial; set the raft advertise address", advertise)
	}
	if config != nil {
		ln = tls.NewListener(ln, config)
	}
	return &peerStream{Listener: ln, advertise: advertise, config: config}, nil
}

// Addr is the address peers reach this node on.
func (s *peerStream) Addr() net.Addr { return s.advertise }

// Dial opens a connection to a peer, TLS handshake included, within timeout.
func (s *peerStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if s.config == nil {
		return (&net.Dialer{Timeout: timeout}).DialContext(ctx, "tcp", string(address))
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout}, Config: s.config}
	return d.DialContext(ctx, "tcp", string(address))
}

var _ raft.StreamLayer = (*peerStream)(nil)

// nodeLinkMux shares the raft port between raft and node links: it
// accepts every connection, answers node links itself and hands the others
// to raft's Accept, once the node admits them; and it introduces this node
// on every raft connection it dials (see raftIntro).
type nodeLinkMux struct {
	raft.StreamLayer
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
	node      atomic.Pointer[node] // nil until the node can answer
	refusals  logLimiter           // of raft connections refused
}

func newNodeLinkMux(inner raft.StreamLayer) *nodeLinkMux {
	m := &nodeLinkMux{StreamLayer: inner, conns: make(chan net.Conn), done: make(chan struct{})}
	go m.acceptLoop()
	return m
}

// serve makes the mux answer hellos for n, and admit raft connections by
// its rules.
func (m *nodeLinkMux) serve(n *node) { m.node.Store(n) }

// Accept returns the next connection for raft.
func (m *nodeLinkMux) Accept() (net.Conn, error) {
	select {
	case c := <-m.conns:
		return c, nil
	case <-m.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting.
func (m *nodeLinkMux) Close() error {
	m.closeOnce.Do(func() { close(m.done) })
	return m.StreamLayer.Close()
}

func (m *nodeLinkMux) acceptLoop() {
	for {
		c, err := m.StreamLayer.Accept()
		if err != nil {
			select {
			case <-m.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				m.closeOnce.Do(func() { close(m.done) })
				return
			}
			time.Sleep(5 * time.Millisecond) // a transient failure (out of files)
			continue
		}
		go m.route(c)
	}
}

// route reads a connection's first byte and serves it as a node link, or
// as a raft connection that introduces itself, or passes it, the byte
// included, to raft as a raft connection of an older node.
func (m *nodeLinkMux) route(c net.Conn) {
	var first [1]byte
	c.SetReadDeadline(time.Now().Add(firstByteTimeout))
	if _, err := c.Read(first[:]); err != nil {
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	n := m.node.Load()
	switch {
	case n == nil:
		c.Close() // not ready to answer or admit anyone
		return
	case first[0] == nodeLinkMagic:
		m.answer(c, n)
		return
	case first[0] == rejoinMagic:
		m.answerRejoin(c, n)
		return
	case first[0] == raftIntroMagic:
		if !m.admitIntroduced(c, n) {
			return
		}
	default:
		if err := n.admitUnintroduced(); err != nil {
			m.refusals.log(n.logger, slog.LevelWarn, "unintroduced:"+c.RemoteAddr().String(), "refused a raft connection", "from", c.RemoteAddr().String(), "err", err)
			c.Close()
			return
		}
		c = &peekedConn{Conn: c, first: first[0]}
	}
	select {
	case m.conns <- c:
	case <-m.done:
		c.Close()
	}
}

func (m *nodeLinkMux) answer(c net.Conn, n *node) {
	defer c.Close()
	c.SetWriteDeadline(time.Now().Add(firstByteTimeout))
	json.NewEncoder(c).Encode(n.hello())
}

// answerRejoin reads a rejoin request and answers what the node's
// handler says of it.
func (m *nodeLinkMux) answerRejoin(c net.Conn, n *node) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(firstByteTimeout))
	var req rejoinRequest
	if err := readFrame(c, &req); err != nil {
		return
	}
	answer := rejoinAnswer{Refused: "this node does not take rejoin requests yet"}
	if h := n.rejoins.Load(); h != nil {
		answer = (*h)(req)
	}
	writeFrame(c, answer)
}

// dialExchange dials the node at addr for one exchange that must end
// within timeout, and opens it with magic, the byte that tells the node's
// listener what the connection is for.
func (m *nodeLinkMux) dialExchange(addr raft.ServerAddress, magic byte, timeout time.Duration) (net.Conn, error) {
	c, err := m.StreamLayer.Dial(addr, timeout)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte{magic}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// askRejoin asks the node at addr to add this node again.
func (m *nodeLinkMux) askRejoin(addr raft.ServerAddress, req rejoinRequest, timeout time.Duration) (rejoinAnswer, error) {
	var answer rejoinAnswer
	c, err := m.dialExchange(addr, rejoinMagic, timeout)
	if err != nil {
		return answer, err
	}
	defer c.Close()
	if err := writeFrame(c, req); err != nil {
		return answer, err
	}
	err = readFrame(c, &answer)
	return answer, err
}

// admitIntroduced reads a dialer's introduction, answers it, and reports
// whether the connection is raft's now.
func (m *nodeLinkMux) admitIntroduced(c net.Conn, n *node) bool {
	c.SetDeadline(time.Now().Add(firstByteTimeout))
	var intro raftIntro
	if err := readFrame(c, &intro); err != nil {
		c.Close()
		return false
	}
	answer := raftIntroAnswer{ID: string(n.id), Group: n.ident.groupID()}
	err := n.admit(intro)
	if err != nil {
		answer.Refused, answer.Founding = err.Error(), errors.Is(err, errFounding)
		level := slog.LevelWarn
		if answer.Founding {
			level = slog.LevelInfo
		}
		m.refusals.log(n.logger, level, intro.From+":"+answer.Refused, "refused a raft connection", "from", intro.From, "from_group", intro.Group, "err", err)
	}
	if werr := writeFrame(c, answer); werr != nil || err != nil {
		c.Close()
		return false
	}
	c.SetDeadline(time.Time{})
	return true
}

// Dial opens a raft connection to a peer and introduces this node on it.
// A peer that closes the connection without an answer runs a fence from
// before introductions: the node dials it again without one, as long as
// its group's protocol allows it.
func (m *nodeLinkMux) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	n := m.node.Load()
	if n == nil {
		return nil, errors.New("this node is still starting: it cannot introduce itself yet")
	}
	c, err := m.StreamLayer.Dial(addr, timeout)
	if err != nil {
		return nil, err
	}
	intro := n.introduce(addr)
	c.SetDeadline(time.Now().Add(timeout))
	var answer raftIntroAnswer
	if _, err = c.Write([]byte{raftIntroMagic}); err == nil {
		err = writeFrame(c, intro)
	}
	if err == nil {
		err = readFrame(c, &answer)
	}
	c.SetDeadline(time.Time{})
	switch {
	case err != nil && !errors.Is(err, errNoFrame):
		c.Close()
		return nil, err
	case err != nil:
		c.Close()
		if perr := n.dialUnintroduced(); perr != nil {
			return nil, fmt.Errorf("the node at %s closed the connection without answering this node's introduction: "+
				"it is down behind something that accepts connections for it (a proxy, a load balancer), "+
				"or runs a fence from before introductions (%w)", addr, perr)
		}
		return m.StreamLayer.Dial(addr, timeout)
	case answer.Refused != "":
		c.Close()
		return nil, &raftRefusedError{id: answer.ID, addr: addr, reason: answer.Refused, founding: answer.Founding}
	}
	return c, nil
}

// raftRefusedError is a peer's refusal of a raft connection this node
// dialed, by the rules of admit.go: the peer is of another group, or
// holds no data, or expects another node here. It does not pass by
// itself, unlike a peer that is down, but for a founder's (founding).
type raftRefusedError struct {
	id       string // the peer's own id
	addr     raft.ServerAddress
	reason   string
	founding bool // the peer holds no data yet, and will found the group or find its data lost
}

func (e *raftRefusedError) Error() string {
	return fmt.Sprintf("%s at %s refused this node's raft connection: %s", e.id, e.addr, e.reason)
}

// askHello dials a node's raft address and reads its hello, within timeout.
func (m *nodeLinkMux) askHello(addr raft.ServerAddress, timeout time.Duration) (nodeHello, error) {
	var h nodeHello
	c, err := m.dialExchange(addr, nodeLinkMagic, timeout)
	if err != nil {
		return h, err
	}
	defer c.Close()
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return h, fmt.Errorf("no answer from a fence node: %w", err)
	}
	if err := json.Unmarshal(line, &h); err != nil || h.ID == "" {
		return h, fmt.Errorf("the answer is not a fence node's hello")
	}
	return h, nil
}

// peekedConn is a connection whose first byte was read already.
type peekedConn struct {
	net.Conn
	first byte
	read  bool
}

func (c *peekedConn) Read(p []byte) (int, error) {
	if c.read || len(p) == 0 {
		return c.Conn.Read(p)
	}
	c.read = true
	p[0] = c.first
	return 1, nil
}
