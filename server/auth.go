package server

import (
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/internal/fsm"
)

// Auth at the edge (docs/design.md, Auth). Every node holds the replicated
// auth state, so the node that serves a call checks it: authInterceptor
// runs before every handler of the fence services, authenticates the
// caller (a bearer token, or with --client-cert-auth the certificate's
// common name) and checks the permission the procedure needs on the names
// the request carries. A follower forwards a call to its leader only when
// auth is off or the call carries a bearer token, which the leader checks
// again with its own state; a call identified by a certificate alone is
// served by the follower, after its check, which for a write or a
// linearizable read answers Unavailable naming the leader.

// maxBearerBytes bounds the token a header may carry.
const maxBearerBytes = 512

// parseBearer returns the token of an Authorization header: "Bearer TOKEN"
// (the scheme in any case), TOKEN of printable ASCII without spaces.
func parseBearer(header string) (string, error) {
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", fmt.Errorf("%w: the Authorization header must be \"Bearer TOKEN\"", fence.ErrAuthFailed)
	}
	token = strings.TrimLeft(token, " ")
	if token == "" || len(token) > maxBearerBytes {
		return "", fmt.Errorf("%w: the bearer token is empty or over %d bytes", fence.ErrAuthFailed, maxBearerBytes)
	}
	for i := 0; i < len(token); i++ {
		if c := token[i]; c <= ' ' || c >= 0x7f {
			return "", fmt.Errorf("%w: the bearer token has a character that no token has", fence.ErrAuthFailed)
		}
	}
	return token, nil
}

func tokenHash(token string) [fsm.TokenHashBytes]byte { return sha256.Sum256([]byte(token)) }

// credential is what a call presents: a bearer token's hash, or the
// common name of a verified client certificate (none on a forwarded call:
// its connection is the follower's).
type credential struct {
	bearer    bool
	hash      [fsm.TokenHashBytes]byte
	certUser  string
	malformed error // an Authorization header that does not parse
}

func (c credential) present() bool { return c.bearer || c.certUser != "" || c.malformed != nil }

type certUserKey struct{}

// withCertUser puts the verified client certificate's subject common name
// into the request's context, for the handlers' credentials. A forwarded
// call came over the forwarding node's connection, whose certificate is
// the node's, not the caller's: it has none.
func withCertUser(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 && r.Header.Get(fencev1.ForwardedByHeader) == "" {
			if cn := r.TLS.VerifiedChains[0][0].Subject.CommonName; cn != "" {
				r = r.WithContext(context.WithValue(r.Context(), certUserKey{}, cn))
			}
		}
		next.ServeHTTP(w, r)
	})
}

func credentialOf(ctx context.Context, h http.Header) credential {
	var c credential
	if v := h.Get("Authorization"); v != "" {
		token, err := parseBearer(v)
		if err != nil {
			c.malformed = err
			return c
		}
		c.bearer, c.hash = true, tokenHash(token)
		return c
	}
	c.certUser, _ = ctx.Value(certUserKey{}).(string)
	return c
}

// caller is an authenticated identity.
type caller struct {
	user    string
	via     string // "token" or "certificate"
	tokenID uint64
	expires time.Time // zero: never
}

func (c caller) String() string {
	if c.user == "" {
		return "anonymous"
	}
	if c.via == "token" {
		return fmt.Sprintf("%s (token %d)", c.user, c.tokenID)
	}
	return fmt.Sprintf("%s (%s)", c.user, c.via)
}

// authenticateLocked finds who presents cred in st, at now.
func authenticateLocked(st *fsm.State, cred credential, now time.Time) (caller, error) {
	switch {
	case cred.malformed != nil:
		return caller{}, cred.malformed
	case cred.bearer:
		t, ok := st.TokenByHash(cred.hash)
		if !ok {
			return caller{}, fmt.Errorf("%w: the bearer token is unknown or revoked", fence.ErrAuthFailed)
		}
		c := caller{user: t.User, via: "token", tokenID: t.ID}
		if t.ExpiresUnixNs != 0 {
			c.expires = time.Unix(0, t.ExpiresUnixNs)
			if !now.Before(c.expires) {
				return c, fmt.Errorf("%w: token %d of user %q expired at %s", fence.ErrAuthFailed, t.ID, t.User, c.expires.UTC().Format(time.RFC3339))
			}
		}
		return c, nil
	case cred.certUser != "":
		c := caller{user: cred.certUser, via: "certificate"}
		if _, ok := st.User(cred.certUser); !ok {
			return c, fmt.Errorf("%w: the client certificate names user %q, who does not exist", fence.ErrAuthFailed, cred.certUser)
		}
		return c, nil
	}
	return caller{}, fmt.Errorf("%w: auth is enabled and the call has no credential; send \"Authorization: Bearer TOKEN\" (fence --auth-token-file), or a client certificate whose common name is a user", fence.ErrAuthFailed)
}

// need is the permission a call needs.
type need struct {
	perm fsm.Permission
	// all, when set, are the permissions a call on several names needs,
	// every one of them (a txn); perm is then unused.
	all []fsm.Permission
	// anyWrite: any lock or kv write permission will do (sessions, which
	// exist to hold locks and bind keys).
	anyWrite bool
	// anyone: any authenticated caller.
	anyone bool
}

func (n need) String() string {
	switch {
	case n.anyone:
		return "any identity"
	case n.anyWrite:
		return "lock write or kv write on any prefix"
	case n.all != nil:
		parts := make([]string, len(n.all))
		for i, p := range n.all {
			parts[i] = p.String()
		}
		return strings.Join(parts, ", ")
	}
	return n.perm.String()
}

// txnNeed is what a txn needs: kv read on each key it compares or gets,
// kv write on each key it puts or deletes. A txn of nothing needs only an
// identity: it reads nothing but the store's revision.
func txnNeed(m *fencev1.TxnRequest) need {
	var perms []fsm.Permission
	add := func(a fsm.Access, key string) {
		perms = append(perms, fsm.Permission{Kind: fsm.PermKV, Access: a, Prefix: key})
	}
	for _, c := range m.GetCompares() {
		add(fsm.Read, c.GetKey())
	}
	for _, op := range append(append([]*fencev1.TxnOp(nil), m.GetThen()...), m.GetElse()...) {
		switch o := op.GetOp().(type) {
		case *fencev1.TxnOp_Put:
			add(fsm.Write, o.Put.GetKey())
		case *fencev1.TxnOp_Delete:
			add(fsm.Write, o.Delete.GetKey())
		case *fencev1.TxnOp_Get:
			add(fsm.Read, o.Get.GetKey())
		}
	}
	if len(perms) == 0 {
		return need{anyone: true}
	}
	slices.SortFunc(perms, func(a, b fsm.Permission) int {
		return cmp.Or(cmp.Compare(a.Prefix, b.Prefix), cmp.Compare(b.Access, a.Access))
	})
	// A key's write covers its read: keep the first of each key, the
	// strongest.
	perms = slices.CompactFunc(perms, func(a, b fsm.Permission) bool { return a.Prefix == b.Prefix })
	return need{all: perms}
}

func lockNeed(a fsm.Access, name string) need {
	return need{perm: fsm.Permission{Kind: fsm.PermLock, Access: a, Prefix: name}}
}

func kvNeed(a fsm.Access, name string) need {
	return need{perm: fsm.Permission{Kind: fsm.PermKV, Access: a, Prefix: name}}
}

var adminNeed = need{perm: fsm.Permission{Kind: fsm.PermAdmin, Access: fsm.Write}}

// needOf returns what procedure needs for msg. Unknown procedures need
// admin: a new call is closed until it is given a rule here.
func needOf(procedure string, msg any) need {
	type locked interface{ GetLock() string }
	type keyed interface{ GetKey() string }
	type prefixed interface{ GetPrefix() string }
	name := func() string {
		switch m := msg.(type) {
		case locked:
			return m.GetLock()
		case keyed:
			return m.GetKey()
		case prefixed:
			return m.GetPrefix()
		}
		return ""
	}
	switch procedure {
	case fencev1connect.SessionServiceCreateSessionProcedure, fencev1connect.SessionServiceKeepAliveProcedure,
		fencev1connect.SessionServiceCloseSessionProcedure,
		// A lease's renewal and release are its session's keepalive and
		// close: the secret guards the lease.
		fencev1connect.LockServiceRenewLeaseProcedure, fencev1connect.LockServiceReleaseLeaseProcedure:
		return need{anyWrite: true}
	case fencev1connect.SessionServiceListSessionsProcedure:
		return lockNeed(fsm.Read, "") // every session's locks
	case fencev1connect.LockServiceAcquireProcedure, fencev1connect.LockServiceReleaseProcedure,
		fencev1connect.LockServiceCancelAcquireProcedure,
		// A Lease is a session and an acquire: lock write covers both.
		fencev1connect.LockServiceLeaseProcedure:
		return lockNeed(fsm.Write, name())
	case fencev1connect.LockServiceCheckProcedure, fencev1connect.LockServiceListLocksProcedure,
		fencev1connect.LockServiceWatchProcedure:
		return lockNeed(fsm.Read, name())
	case fencev1connect.KVServicePutProcedure, fencev1connect.KVServiceDeleteProcedure:
		return kvNeed(fsm.Write, name())
	case fencev1connect.KVServiceGetProcedure, fencev1connect.KVServiceListProcedure, fencev1connect.KVServiceWatchProcedure:
		return kvNeed(fsm.Read, name())
	case fencev1connect.KVServiceTxnProcedure:
		if m, ok := msg.(*fencev1.TxnRequest); ok {
			return txnNeed(m)
		}
		return kvNeed(fsm.Write, "")
	case fencev1connect.ClusterServiceStatusProcedure, fencev1connect.AuthServiceAuthStatusProcedure:
		return need{anyone: true}
	case fencev1connect.StreamServiceSessionProcedure:
		// Opening it: each operation is checked as its unary call.
		return need{anyone: true}
	}
	return adminNeed
}

// authorizeLocked checks that who may do n in st.
func authorizeLocked(st *fsm.State, who caller, n need) error {
	switch {
	case n.anyone:
		return nil
	case n.anyWrite:
		if st.HasAny(who.user, fsm.PermLock, fsm.Write) || st.HasAny(who.user, fsm.PermKV, fsm.Write) {
			return nil
		}
		return fmt.Errorf("%w: user %q needs %s", fence.ErrPermissionDenied, who.user, n)
	}
	for _, p := range n.all {
		if err := st.Authorize(who.user, p); err != nil {
			return err
		}
	}
	if n.all != nil {
		return nil
	}
	return st.Authorize(who.user, n.perm)
}

// authCall is a checked call's credential and need, for checking again
// while it runs (a watch).
type authCall struct {
	cred credential
	need need
	// user is who the check at the call's start found ("" with auth
	// off): the user the call's sessions and keys are charged to, even if
	// the credential fails while the call runs.
	user string
}

type authCallKey struct{}

// checkCall authenticates and authorizes a call, when auth is on, and
// logs a refusal. It returns ctx carrying what to check again later.
func (s *Server) checkCall(ctx context.Context, procedure, peer string, h http.Header, msg any) (context.Context, error) {
	call := authCall{cred: credentialOf(ctx, h), need: needOf(procedure, msg)}
	who, err := s.recheck(call)
	call.user = who.user
	ctx = context.WithValue(ctx, authCallKey{}, call)
	if err != nil {
		s.auditRefusal(procedure, peer, call, err)
	}
	return ctx, err
}

// callerUser returns the authenticated user of the call ctx belongs to,
// as the check at its start found it; "" with auth off. Checking again
// here would answer "" for a credential revoked since, and so charge the
// call's session or key to nobody.
func (s *Server) callerUser(ctx context.Context) string {
	call, _ := ctx.Value(authCallKey{}).(authCall)
	return call.user
}

// recheck checks call against the current state; it returns who made it.
func (s *Server) recheck(call authCall) (caller, error) {
	var who caller
	var err error
	now := s.cfg.Clock.Now()
	s.fsm.Read(func(st *fsm.State) {
		if !st.AuthEnabled() {
			return
		}
		if who, err = authenticateLocked(st, call.cred, now); err == nil {
			err = authorizeLocked(st, who, call.need)
		}
	})
	return who, err
}

func (s *Server) auditRefusal(procedure, peer string, call authCall, err error) {
	var who caller
	s.fsm.Read(func(st *fsm.State) { who, _ = authenticateLocked(st, call.cred, s.cfg.Clock.Now()) })
	s.logger.Warn("auth: call refused", "audit", true, "user", who.user, "via", who.via, "token_id", who.tokenID,
		"procedure", procedure, "needs", call.need.String(), "peer", peer, "err", err)
}

// authInterceptor checks every call of the fence services (see checkCall).
type authInterceptor struct{ s *Server }

func (a authInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		ctx, err := a.s.checkCall(ctx, req.Spec().Procedure, req.Peer().Addr, req.Header(), req.Any())
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (a authInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler checks a stream when its request arrives: the
// generated handler receives it before calling the method, whose context
// then carries the check for later (recheckContext).
func (a authInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if conn.Spec().Procedure == fencev1connect.StreamServiceSessionProcedure {
			ctx, err := a.s.checkStreamOpen(ctx, conn.Peer().Addr, conn.RequestHeader())
			if err != nil {
				return err
			}
			return next(ctx, conn)
		}
		slot := &authSlot{peer: conn.Peer().Addr}
		ctx = context.WithValue(ctx, authSlotKey{}, slot)
		return next(ctx, &checkedStream{StreamingHandlerConn: conn, check: func(msg any) error {
			cctx, err := a.s.checkCall(ctx, conn.Spec().Procedure, conn.Peer().Addr, conn.RequestHeader(), msg)
			slot.set(cctx.Value(authCallKey{}).(authCall))
			return err
		}})
	}
}

// checkStreamOpen checks the caller of a session stream (Connect's or
// framed) when it opens, before it reads anything, and returns the
// stream's context, which carries the check: checkStreamOp checks each
// operation with the credential the stream opened with.
func (s *Server) checkStreamOpen(ctx context.Context, peer string, h http.Header) (context.Context, error) {
	slot := &authSlot{peer: peer}
	ctx = context.WithValue(ctx, authSlotKey{}, slot)
	cctx, err := s.checkCall(ctx, fencev1connect.StreamServiceSessionProcedure, peer, h, nil)
	slot.set(cctx.Value(authCallKey{}).(authCall))
	return ctx, err
}

// authSlot holds a stream's check once its request arrived.
type authSlot struct {
	peer string
	mu   sync.Mutex
	call *authCall
}

type authSlotKey struct{}

func (s *authSlot) set(c authCall) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.call = &c
}

// streamCall returns the check of the stream ctx belongs to.
func streamCall(ctx context.Context) (authCall, bool) {
	slot, ok := ctx.Value(authSlotKey{}).(*authSlot)
	if !ok {
		return authCall{}, false
	}
	slot.mu.Lock()
	defer slot.mu.Unlock()
	if slot.call == nil {
		return authCall{}, false
	}
	return *slot.call, true
}

// checkStreamOp checks one operation of a session stream as its unary
// call, procedure, is checked: the credential the stream opened with
// needs the permission that call needs on the names msg carries. A
// refusal is logged as the unary call's. It returns ctx carrying the
// operation's check (for callerUser).
func (s *Server) checkStreamOp(ctx context.Context, procedure string, msg any) (context.Context, error) {
	slot, _ := ctx.Value(authSlotKey{}).(*authSlot)
	open, _ := streamCall(ctx)
	call := authCall{cred: open.cred, need: needOf(procedure, msg)}
	who, err := s.recheck(call)
	call.user = who.user
	ctx = context.WithValue(ctx, authCallKey{}, call)
	if err != nil {
		peer := ""
		if slot != nil {
			peer = slot.peer
		}
		s.auditRefusal(procedure, peer, call, err)
		return ctx, err
	}
	return ctx, nil
}

type checkedStream struct {
	connect.StreamingHandlerConn
	check   func(msg any) error
	checked bool
}

func (c *checkedStream) Receive(msg any) error {
	if err := c.StreamingHandlerConn.Receive(msg); err != nil {
		return err
	}
	if !c.checked {
		c.checked = true
		return c.check(msg)
	}
	return nil
}

// authChanges tells open calls that the auth state changed.
type authChanges struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns a channel closed at the next change.
func (a *authChanges) wait() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ch == nil {
		a.ch = make(chan struct{})
	}
	return a.ch
}

func (a *authChanges) notify() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ch != nil {
		close(a.ch)
		a.ch = nil
	}
}

// AuthEnabled reports whether this node's state enforces auth.
func (s *Server) AuthEnabled() bool {
	var on bool
	s.fsm.Read(func(st *fsm.State) { on = st.AuthEnabled() })
	return on
}

// authWatch fires once the call it watches fails its check again.
type authWatch struct {
	lost chan struct{} // closed, with err set, once the check fails
	err  error
	stop chan struct{}
	once sync.Once

	s     *Server
	call  authCall
	watch bool // call is a checked call
}

// Check checks the call again now: nil while it may go on. A wait whose
// context ended uses it to tell a caller that went away from one whose
// stream ended because its credential failed (the stream's end and the
// watch's wake race), so that a revoked caller's wait never stays queued.
func (w *authWatch) Check() error {
	select {
	case <-w.lost:
		return w.err
	default:
	}
	if !w.watch {
		return nil
	}
	_, err := w.s.recheck(w.call)
	return err
}

// Lost is closed once the call may no longer go on; Err then says why.
func (w *authWatch) Lost() <-chan struct{} { return w.lost }

// Err is the failed check's error, once Lost is closed.
func (w *authWatch) Err() error { return w.err }

// Stop ends the watching.
func (w *authWatch) Stop() { w.once.Do(func() { close(w.stop) }) }

// watchAuth watches the call ctx belongs to (a unary call or a stream):
// it checks it again at once (a change made since the call's check is not
// missed), at every auth change (a token or permission revoked, a user
// removed, auth enabled, a snapshot restored) and when its token expires,
// and fires once a check fails. A call that blocks for long (a waiting
// Acquire) ends then, as a KV watch and a session stream do, instead of
// going on under a permission its caller no longer has. Lost fires on
// its own goroutine: a call that sends what its caller may no longer see
// (a watch's changes) checks with Check before each send.
func (s *Server) watchAuth(ctx context.Context) *authWatch {
	w := &authWatch{lost: make(chan struct{}), stop: make(chan struct{}), s: s}
	call, ok := ctx.Value(authCallKey{}).(authCall)
	if !ok {
		if call, ok = streamCall(ctx); !ok {
			return w // not a checked call: never fires
		}
	}
	w.call, w.watch = call, true
	go func() {
		for {
			// Take the channel before checking, so that no change made
			// after the check is missed.
			changed := s.authChanges.wait()
			who, err := s.recheck(call)
			if err != nil {
				w.err = err
				close(w.lost)
				return
			}
			var expired <-chan time.Time
			stopTimer := func() {}
			if !who.expires.IsZero() {
				t := s.cfg.Clock.NewTimer(max(who.expires.Sub(s.cfg.Clock.Now()), 0))
				expired, stopTimer = t.C(), func() { t.Stop() }
			}
			select {
			case <-changed:
			case <-expired:
			case <-w.stop:
			case <-ctx.Done():
			case <-s.done:
			}
			stopTimer()
			select {
			case <-w.stop:
				return
			case <-ctx.Done():
				return
			case <-s.done:
				return
			default:
			}
		}
	}()
	return w
}
