package server

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
)

// The console (fence serve --ui) is a read-only page of the group at /ui/
// on the API port, behind the API's TLS and client-certificate settings
// and, with auth on, open only to a caller with lock read "" (gate), who
// is checked again before each answer and each push (checkedView).
// Its page (server/console/, embedded) renders views the server pushes over
// Server-Sent Events at /ui/events: a JSON snapshot of this node's state,
// sent when the applied index or the raft state changed (checked every
// consolePushInterval) and at least every consoleRefresh, so that the TTLs
// left stay current. /ui/state.json answers one view.

//go:embed console
var consoleFiles embed.FS

const (
	// consolePushInterval is how often an open console checks for a change.
	consolePushInterval = 250 * time.Millisecond
	// consoleRefresh is how often a view is pushed even if nothing was
	// applied: keepalives renew TTLs in the leader's memory, not in the log.
	consoleRefresh = time.Second
	// consoleEventsKept is how many recent grants and ends of grants the
	// console shows.
	consoleEventsKept = 100
	// consoleMaxItems bounds the sessions and the locks of one view.
	consoleMaxItems = 1000
	// consoleMaxStreams bounds the consoles open on one node at once.
	consoleMaxStreams = 64
	// consoleWriteTimeout drops a console that does not read its pushes.
	consoleWriteTimeout = 10 * time.Second
)

// consoleSecurityHeaders keep the page to its own embedded script and
// style: no inline script runs, whatever text reaches the page.
var consoleSecurityHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
	"X-Content-Type-Options":  "nosniff",
	"Referrer-Policy":         "no-referrer",
	"X-Frame-Options":         "DENY",
}

// console serves the page and keeps the recent grants and their ends, as
// the lock watch's feed has them (lockwatch.go). Its methods are safe for
// concurrent use; record runs on raft's apply goroutine and does not block.
type console struct {
	s       *Server
	streams atomic.Int32

	mu     sync.Mutex
	events []consoleEvent // a ring of consoleEventsKept
	seq    uint64         // events recorded so far
}

// consoleEvent is a grant or its end, as the console lists it.
type consoleEvent struct {
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Revision is the lock event's (LockService.Watch), Index the raft
	// index of the entry that made it.
	Revision uint64 `json:"revision,string"`
	Index    uint64 `json:"index"`
	// Kind is "granted", or how the grant ended: "released" (by its
	// holder), "expired", "revoked" (by an operator) or "abandoned" (by a
	// client that could not renew its session).
	Kind string `json:"kind"`
	// End is how the holder's session ended, when that ended the grant:
	// "closed" (by its own client: Kind is then "released"), "expired",
	// "revoked" or "abandoned".
	End     string `json:"end,omitempty"`
	Session uint64 `json:"session,string"`
	Lock    string `json:"lock,omitempty"`
	Token   uint64 `json:"token,omitempty,string"`
	Mode    string `json:"mode,omitempty"`
}

func newConsole(s *Server) *console {
	return &console{s: s, events: make([]consoleEvent, 0, consoleEventsKept)}
}

// record keeps the grants and ends of grants among one applied command's
// lock events.
func (c *console) record(events []lockEvent) {
	if len(events) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ev := range events {
		switch ev.Kind {
		case fsm.LockGranted, fsm.LockReleased, fsm.LockExpired, fsm.LockRevoked, fsm.LockAbandoned:
		default:
			continue
		}
		e := consoleEvent{Time: ev.At, Revision: ev.Revision, Index: ev.Revision >> lockEventBits, Kind: ev.Kind.String(),
			Session: ev.Session, Lock: ev.Lock, Token: ev.Token, Mode: ev.Mode.String()}
		if ev.End != 0 {
			e.End = ev.End.String()
		}
		c.addLocked(e)
	}
}

func (c *console) addLocked(e consoleEvent) {
	c.seq++
	e.Seq = c.seq
	if len(c.events) < consoleEventsKept {
		c.events = append(c.events, e)
		return
	}
	c.events[(c.seq-1)%consoleEventsKept] = e
}

// recent returns the kept events, newest first.
func (c *console) recent() []consoleEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]consoleEvent, 0, len(c.events))
	for i := uint64(0); i < uint64(len(c.events)); i++ {
		out = append(out, c.events[(c.seq-1-i)%consoleEventsKept])
	}
	return out
}

// timeLeft returns each session's time to its deadline on the leader's
// clock; nil on a follower, which keeps no deadlines.
func (t *sessionTracker) timeLeft() map[uint64]time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.leader {
		return nil
	}
	now := t.clock.Now()
	out := make(map[uint64]time.Duration, len(t.sessions))
	for id, s := range t.sessions {
		out[id] = max(s.deadline.Sub(now), 0)
	}
	return out
}

// consoleView is what the page shows: this node's view of the group.
type consoleView struct {
	Time      time.Time `json:"time"`
	Node      string    `json:"node"`
	ClusterID string    `json:"clusterId"`
	Version   string    `json:"version"`
	// State is this node's raft state (Leader, Follower, Candidate, ...).
	State     string          `json:"state"`
	Leader    string          `json:"leader"`
	Term      uint64          `json:"term"`
	LastIndex uint64          `json:"lastIndex"`
	Commit    uint64          `json:"commitIndex"`
	Applied   uint64          `json:"appliedIndex"`
	LastToken uint64          `json:"lastToken,string"`
	Problems  []string        `json:"problems"`
	Members   []consoleMember `json:"members"`
	// TTLLeftKnown is false on a follower: only the leader keeps deadlines.
	TTLLeftKnown bool             `json:"ttlLeftKnown"`
	NumSessions  int              `json:"numSessions"`
	Sessions     []consoleSession `json:"sessions"`
	NumLocks     int              `json:"numLocks"`
	Locks        []consoleLock    `json:"locks"`
	Events       []consoleEvent   `json:"events"`
}

type consoleMember struct {
	ID   string `json:"id"`
	Raft string `json:"raftAddress"`
	API  string `json:"apiAddress"`
	// Role is "leader", "follower" or "nonvoter" as this node sees it;
	// this node's own is its raft state.
	Role string `json:"role"`
	Self bool   `json:"self"`
}

type consoleSession struct {
	ID    uint64 `json:"id,string"`
	Owner string `json:"owner"`
	TTLMs int64  `json:"ttlMs"`
	// LeftMs is the time to the session's deadline; -1 when unknown.
	LeftMs int64 `json:"ttlLeftMs"`
}

type consoleLock struct {
	Name    string          `json:"name"`
	Permits uint32          `json:"permits,omitempty"`
	DelayMs int64           `json:"delayMs,omitempty"`
	Holders []consoleHolder `json:"holders"`
	Waiters []consoleHolder `json:"waiters"`
}

// consoleHolder is a holder (with its token) or a waiter (without).
type consoleHolder struct {
	Session uint64 `json:"session,string"`
	Owner   string `json:"owner"`
	Token   uint64 `json:"token,omitempty,string"`
	Mode    string `json:"mode"`
}

// view takes a snapshot of this node's state for the page.
func (c *console) view() consoleView {
	s := c.s
	r := s.node.raft
	stats := r.Stats()
	_, leader := r.LeaderWithID()
	v := consoleView{
		Time:      s.cfg.Clock.Now(),
		Node:      s.cfg.NodeID,
		ClusterID: s.clusterID(),
		Version:   s.cfg.Version,
		State:     r.State().String(),
		Leader:    string(leader),
		Term:      parseUint(stats["term"]),
		LastIndex: r.LastIndex(),
		Commit:    parseUint(stats["commit_index"]),
		Applied:   r.AppliedIndex(),
		Problems:  s.problems(),
		Events:    c.recent(),
	}
	left := s.tracker.timeLeft()
	v.TTLLeftKnown = left != nil
	owners := map[uint64]string{}
	apis := map[string]string{}
	s.fsm.Read(func(st *fsm.State) {
		v.LastToken = st.LastToken()
		v.NumSessions = st.NumSessions()
		v.NumLocks = st.NumLocks()
		for _, n := range st.Nodes() {
			apis[n[0]] = n[1]
		}
		for _, info := range st.Sessions() {
			owners[info.ID] = info.Owner
			if len(v.Sessions) < consoleMaxItems {
				cs := consoleSession{ID: info.ID, Owner: info.Owner, TTLMs: info.TTL.Milliseconds(), LeftMs: -1}
				if d, ok := left[info.ID]; ok {
					cs.LeftMs = d.Milliseconds()
				}
				v.Sessions = append(v.Sessions, cs)
			}
		}
		locks, _ := st.LocksPage("", "", consoleMaxItems)
		for _, l := range locks {
			v.Locks = append(v.Locks, consoleLockOf(l, owners))
		}
	})
	for _, m := range s.members() {
		v.Members = append(v.Members, consoleMemberOf(m, string(leader), s.cfg.NodeID, v.State, apis))
	}
	return v
}

func consoleLockOf(l fsm.LockInfo, owners map[uint64]string) consoleLock {
	cl := consoleLock{Name: l.Name, Permits: l.Permits, DelayMs: l.Delay.Milliseconds(), Holders: []consoleHolder{}, Waiters: []consoleHolder{}}
	for _, h := range l.Holders {
		cl.Holders = append(cl.Holders, consoleHolder{Session: h.Session, Owner: owners[h.Session], Token: h.Token, Mode: h.Mode.String()})
	}
	for _, w := range l.Waiters {
		cl.Waiters = append(cl.Waiters, consoleHolder{Session: w.Session, Owner: owners[w.Session], Mode: w.Mode.String()})
	}
	return cl
}

func consoleMemberOf(m raft.Server, leader, self, selfState string, apis map[string]string) consoleMember {
	cm := consoleMember{ID: string(m.ID), Raft: string(m.Address), API: apis[string(m.ID)], Self: string(m.ID) == self}
	switch {
	case cm.Self:
		cm.Role = selfState
	case string(m.ID) == leader:
		cm.Role = "Leader"
	case m.Suffrage != raft.Voter:
		cm.Role = "Nonvoter"
	default:
		cm.Role = "Follower"
	}
	return cm
}

// viewKey changes whenever a pushed view would show something new besides
// the TTLs left.
type viewKey struct {
	applied uint64
	state   raft.RaftState
	leader  raft.ServerID
	term    string
}

func (c *console) key() viewKey {
	r := c.s.node.raft
	_, leader := r.LeaderWithID()
	return viewKey{applied: r.AppliedIndex(), state: r.State(), leader: leader, term: r.Stats()["term"]}
}

// register adds the console's routes to mux.
func (c *console) register(mux *http.ServeMux) {
	assets, err := fs.Sub(consoleFiles, "console")
	if err != nil {
		panic(err) // the embedded directory is part of the binary
	}
	files := http.StripPrefix("/ui/", http.FileServerFS(assets))
	mux.Handle("GET /ui/", consoleHeaders(c.gate(files)))
	mux.Handle("GET /ui/state.json", consoleHeaders(c.gate(http.HandlerFunc(c.serveState))))
	mux.Handle("GET /ui/events", consoleHeaders(c.gate(http.HandlerFunc(c.serveEvents))))
}

// consoleProcedure names the console's requests in the audit log.
const consoleProcedure = "/ui/"

// consoleNeed is what the console needs with auth on: it shows every lock
// and session.
var consoleNeed = lockNeed(fsm.Read, "")

// gate lets a request through when auth is off, or when its caller (a
// bearer token or a client certificate, as for the API) may read every
// lock. Otherwise it answers 401 (no valid credential) or 403 (no
// permission) with a short text body, and logs the refusal. The request
// it lets through carries its check (authCallKey), which state.json and
// every push of the event stream make again before they answer.
func (c *console) gate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		call := authCall{cred: credentialOf(r.Context(), r.Header), need: consoleNeed}
		who, err := c.s.recheck(call)
		if err != nil {
			c.s.auditRefusal(consoleProcedure, r.RemoteAddr, call, err)
			refuse(w, err)
			return
		}
		call.user = who.user
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), authCallKey{}, call)))
	})
}

// refusalStatus is the HTTP status of a failed check: 401 for no valid
// credential, 403 for no permission.
func refusalStatus(err error) int {
	if errors.Is(err, fence.ErrUnauthenticated) {
		return http.StatusUnauthorized
	}
	return http.StatusForbidden
}

// refuse answers a failed check with its status and a short text.
func refuse(w http.ResponseWriter, err error) {
	code := refusalStatus(err)
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="fence"`)
	}
	http.Error(w, err.Error(), code)
}

// checkedView takes a view for the caller of r (as gate checked it), and
// then checks the caller again against the current state: a view is
// answered only if its caller may read every lock after all of it was
// taken, so no change (a token revoked or expired, a user removed, a
// permission taken) made before the answer is missed, however long the
// request has been open. A failed check is logged as gate's.
func (c *console) checkedView(r *http.Request) (consoleView, error) {
	call, _ := r.Context().Value(authCallKey{}).(authCall)
	v := c.view()
	if _, err := c.s.recheck(call); err != nil {
		c.s.auditRefusal(consoleProcedure, r.RemoteAddr, call, err)
		return consoleView{}, err
	}
	return v, nil
}

func consoleHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, v := range consoleSecurityHeaders {
			w.Header().Set(k, v)
		}
		w.Header().Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

func (c *console) serveState(w http.ResponseWriter, r *http.Request) {
	v, err := c.checkedView(r)
	if err != nil {
		refuse(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w) // escapes <, > and & in strings
	enc.Encode(v)
}

// consoleEnd is the data of the "end" event that closes a stream whose
// caller may no longer read it.
type consoleEnd struct {
	// Status is the HTTP status a new request would get (401 or 403).
	Status int    `json:"status"`
	Error  string `json:"error"`
}

// serveEvents pushes views as Server-Sent Events ("event: view") until the
// page goes away, the node shuts down, or its caller may no longer read
// every lock: each push checks the caller again (checkedView), and the
// first that fails ends the stream with "event: end" saying why, before
// any view taken after the change is sent. A change is seen at the next
// push: within consolePushInterval of an auth command (it is applied, so
// the view's key changes), within consoleRefresh of a token's expiry.
func (c *console) serveEvents(w http.ResponseWriter, r *http.Request) {
	if c.streams.Add(1) > consoleMaxStreams {
		c.streams.Add(-1)
		http.Error(w, fmt.Sprintf("%d consoles are open on this node already", consoleMaxStreams), http.StatusTooManyRequests)
		return
	}
	defer c.streams.Add(-1)
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	ticker := time.NewTicker(consolePushInterval)
	defer ticker.Stop()
	var (
		sent   viewKey
		sentAt time.Time
	)
	for first := true; ; first = false {
		key := c.key()
		if first || key != sent || time.Since(sentAt) >= consoleRefresh {
			if err := c.push(r, w, rc, first); err != nil {
				return
			}
			sent, sentAt = key, time.Now()
		}
		select {
		case <-r.Context().Done():
			return
		case <-c.s.done:
			return
		case <-ticker.C:
		}
	}
}

// push sends one view, or the end event if its caller may no longer see
// it; it returns an error when the stream is to end.
func (c *console) push(r *http.Request, w http.ResponseWriter, rc *http.ResponseController, first bool) error {
	event := "view"
	var data []byte
	v, refused := c.checkedView(r)
	if refused != nil {
		event = "end"
		data, _ = json.Marshal(consoleEnd{Status: refusalStatus(refused), Error: refused.Error()})
	} else {
		var err error
		if data, err = json.Marshal(v); err != nil {
			return err
		}
	}
	if err := rc.SetWriteDeadline(time.Now().Add(consoleWriteTimeout)); err != nil && first {
		c.s.logger.Debug("console: no write deadline", "err", err)
	}
	if first {
		// The page reconnects after 2s when the stream breaks.
		if _, err := fmt.Fprint(w, "retry: 2000\n\n"); err != nil {
			return err
		}
	}
	if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, data); err != nil {
		return err
	}
	if err := rc.Flush(); err != nil {
		return err
	}
	return refused
}
