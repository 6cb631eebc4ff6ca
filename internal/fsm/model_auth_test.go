package fsm_test

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// authModel follows the auth commands of a stream: which must succeed,
// and what the users, roles, tokens and permission answers must then be.
type authModel struct {
	enabled   bool
	users     map[string]map[string]bool
	roles     map[string][]fsm.Permission
	tokens    map[uint64]string // id -> user
	hashes    map[string]bool
	lastToken uint64
	quotas    map[string]fsm.Quota
}

func newAuthModel() *authModel {
	return &authModel{users: map[string]map[string]bool{}, roles: map[string][]fsm.Permission{}, tokens: map[uint64]string{}, hashes: map[string]bool{}, quotas: map[string]fsm.Quota{}}
}

// Pools the fuzzer's auth commands draw from: invalid names and
// permissions among them.
var (
	authUsers    = []string{"root", "u1", "u2", "", "a b"}
	authRoles    = []string{"root", "r1", "r2", "", "\x01"}
	authPrefixes = []string{"", "a", "ab", "b"}
)

func validAuthName(n string) bool { return n != "" && !strings.ContainsAny(n, " \x01") }

// authOp decodes an auth command from three bytes: op, a, b.
func authOp(op, a, b byte) *fsmpb.Command {
	user, role := authUsers[int(a)%len(authUsers)], authRoles[int(b)%len(authRoles)]
	kind, access, prefix := fsm.PermKind(a>>4)%4, fsm.Access(b>>4)%3, authPrefixes[int(a>>2)%len(authPrefixes)]
	switch op % 12 {
	case 0:
		return setEnabled(a%2 == 0)
	case 1:
		return addUser(user)
	case 2:
		return removeUser(user)
	case 3:
		return grantRole(user, role)
	case 4:
		return revokeRole(user, role)
	case 5:
		return addRole(role)
	case 6:
		return removeRole(role)
	case 7:
		return grantPerm(role, kind, access, prefix)
	case 8:
		return revokePerm(role, kind, access, prefix)
	case 9:
		hash := bytes.Repeat([]byte{b % 4}, fsm.TokenHashBytes)
		if b%8 == 7 {
			hash = hash[1:]
		}
		return authCmd(&fsmpb.Auth{Op: &fsmpb.Auth_CreateToken{CreateToken: &fsmpb.AuthToken{SecretSha256: hash, User: user, CreatedUnixNs: int64(b), ExpiresUnixNs: int64(a%3) - 1}}})
	case 10:
		return authCmd(&fsmpb.Auth{Op: &fsmpb.Auth_RevokeToken{RevokeToken: uint64(a % 6)}})
	default: // 11
		// Sessions and locks from a>>4 and b, as older inputs had them;
		// waits, kv bytes and a session rate from b's upper bits (0 in
		// most older inputs); now and then a value out of bounds.
		q := fsm.Quota{MaxSessions: uint64(a>>4) % 3, MaxLocks: uint64(b % 3),
			MaxWaits: uint64(b>>4) % 3, MaxKVBytes: []uint64{0, 4, 12, 0}[(b>>6)%4]}
		switch a & 3 {
		case 1:
			q.SessionRate, q.SessionBurst = 0.5, uint64(b>>2)%3 // burst 0: refused
		case 2:
			if b&0x0c == 0x0c {
				q.MaxKVBytes = math.MaxUint64 // a -1 cast: refused
			}
		}
		return setQuotaOf(user, q)
	}
}

// modelQuota reads the quota fields of an AuthUser.
func modelQuota(u *fsmpb.AuthUser) fsm.Quota {
	return fsm.Quota{MaxSessions: u.GetMaxSessions(), MaxLocks: u.GetMaxLocks(), MaxWaits: u.GetMaxWaits(),
		MaxKVBytes: u.GetMaxKvBytes(), SessionRate: u.GetSessionRate(), SessionBurst: u.GetSessionBurst()}
}

// validQuota is the model's bounds on a quota (fsm.CheckQuota's): counts
// and bytes of reasonable size, a rate from 0 to a million a second with
// a burst, a burst only with a rate.
func validQuota(q fsm.Quota) bool {
	return q.MaxSessions <= 1<<40 && q.MaxLocks <= 1<<40 && q.MaxWaits <= 1<<40 && q.MaxKVBytes <= 1<<50 &&
		q.SessionBurst <= 1<<40 && q.SessionRate >= 0 && q.SessionRate <= 1e6 && (q.SessionRate > 0) == (q.SessionBurst > 0)
}

func permOf(p *fsmpb.AuthPermission) fsm.Permission {
	return fsm.Permission{Kind: fsm.PermKind(p.GetKind()), Access: fsm.Access(p.GetAccess()), Prefix: p.GetPrefix()}
}

// expect applies c to the model and says whether the state must accept it.
func (m *authModel) expect(c *fsmpb.Auth) bool {
	switch op := c.GetOp().(type) {
	case *fsmpb.Auth_SetEnabled:
		if op.SetEnabled.GetEnabled() && !m.users["root"]["root"] {
			return false
		}
		m.enabled = op.SetEnabled.GetEnabled()
	case *fsmpb.Auth_AddUser:
		n := op.AddUser.GetName()
		if !validAuthName(n) || m.users[n] != nil || !validQuota(modelQuota(op.AddUser)) {
			return false
		}
		m.users[n] = map[string]bool{}
		m.quotas[n] = modelQuota(op.AddUser)
	case *fsmpb.Auth_RemoveUser:
		n := op.RemoveUser.GetName()
		if m.users[n] == nil || (m.enabled && n == "root") {
			return false
		}
		delete(m.users, n)
		delete(m.quotas, n)
		maps.DeleteFunc(m.tokens, func(_ uint64, u string) bool { return u == n })
	case *fsmpb.Auth_GrantRole:
		u, r := op.GrantRole.GetUser(), op.GrantRole.GetRole()
		_, roleExists := m.roles[r]
		if m.users[u] == nil || (!roleExists && r != "root") || m.users[u][r] {
			return false
		}
		m.users[u][r] = true
	case *fsmpb.Auth_RevokeRole:
		u, r := op.RevokeRole.GetUser(), op.RevokeRole.GetRole()
		if !m.users[u][r] || (m.enabled && u == "root" && r == "root") {
			return false
		}
		delete(m.users[u], r)
	case *fsmpb.Auth_AddRole:
		r := op.AddRole.GetName()
		if _, ok := m.roles[r]; ok || !validAuthName(r) || r == "root" {
			return false
		}
		m.roles[r] = nil
	case *fsmpb.Auth_RemoveRole:
		r := op.RemoveRole.GetName()
		if _, ok := m.roles[r]; !ok {
			return false
		}
		delete(m.roles, r)
		for _, roles := range m.users {
			delete(roles, r)
		}
	case *fsmpb.Auth_GrantPermission:
		r, p := op.GrantPermission.GetRole(), permOf(op.GrantPermission.GetPermission())
		perms, ok := m.roles[r]
		if !ok || fsm.CheckPermission(p) != nil || slices.Contains(perms, p) {
			return false
		}
		m.roles[r] = append(perms, p)
	case *fsmpb.Auth_RevokePermission:
		r, p := op.RevokePermission.GetRole(), permOf(op.RevokePermission.GetPermission())
		i := slices.Index(m.roles[r], p)
		if i < 0 {
			return false
		}
		m.roles[r] = slices.Delete(m.roles[r], i, i+1)
	case *fsmpb.Auth_CreateToken:
		t := op.CreateToken
		if len(t.GetSecretSha256()) != fsm.TokenHashBytes || m.users[t.GetUser()] == nil || t.GetExpiresUnixNs() < 0 || m.hashes[string(t.GetSecretSha256())] {
			return false
		}
		m.lastToken++
		m.tokens[m.lastToken] = t.GetUser()
	case *fsmpb.Auth_RevokeToken:
		if _, ok := m.tokens[op.RevokeToken]; !ok {
			return false
		}
		delete(m.tokens, op.RevokeToken)
	case *fsmpb.Auth_SetQuota:
		u := op.SetQuota
		q := modelQuota(u)
		if m.users[u.GetName()] == nil || !validQuota(q) {
			return false
		}
		m.quotas[u.GetName()] = q
	default:
		return false
	}
	m.hashes = nil // recomputed by compare
	return true
}

// allowed is the model's permission check.
func (m *authModel) allowed(user string, want fsm.Permission) bool {
	for r := range m.users[user] {
		if r == "root" {
			return true
		}
		for _, p := range m.roles[r] {
			if p.Kind == want.Kind && p.Access >= want.Access && (p.Kind == fsm.PermAdmin || strings.HasPrefix(want.Prefix, p.Prefix)) {
				return true
			}
		}
	}
	return false
}

// observe checks an auth command's result and the state after it.
func (m *authModel) observe(cmd *fsmpb.Command, c *fsmpb.Auth, res fsm.Result, s *fsm.State) error {
	want := m.expect(c)
	if got := res.Err == nil; got != want {
		return fmt.Errorf("%v: succeeded %v (%v), model says %v", cmd, got, res.Err, want)
	}
	if res.Err != nil && !errors.Is(res.Err, fence.ErrInvalidArgument) {
		return fmt.Errorf("%v failed with %v, want ErrInvalidArgument", cmd, res.Err)
	}
	if want != res.Effects.AuthChanged {
		return fmt.Errorf("%v: AuthChanged %v", cmd, res.Effects.AuthChanged)
	}
	return m.compare(s)
}

func (m *authModel) compare(s *fsm.State) error {
	if s.AuthEnabled() != m.enabled {
		return fmt.Errorf("auth enabled %v, model %v", s.AuthEnabled(), m.enabled)
	}
	users := s.Users()
	if len(users) != len(m.users) {
		return fmt.Errorf("users %+v, model %v", users, m.users)
	}
	for _, u := range users {
		if !slices.Equal(u.Roles, slices.Sorted(maps.Keys(m.users[u.Name]))) {
			return fmt.Errorf("user %q roles %v, model %v", u.Name, u.Roles, m.users[u.Name])
		}
		if want := m.quotas[u.Name]; u.Quota != want {
			return fmt.Errorf("user %q quota %v, model %v", u.Name, u.Quota, want)
		}
	}
	if roles := s.Roles(); len(roles) != len(m.roles) {
		return fmt.Errorf("roles %+v, model %v", roles, m.roles)
	}
	m.hashes = map[string]bool{}
	var ids []uint64
	for _, t := range s.Tokens("") {
		if m.tokens[t.ID] != t.User {
			return fmt.Errorf("token %d of %q, model %q", t.ID, t.User, m.tokens[t.ID])
		}
		ids = append(ids, t.ID)
	}
	if len(ids) != len(m.tokens) || !slices.IsSorted(ids) {
		return fmt.Errorf("tokens %v, model %v", ids, m.tokens)
	}
	for _, id := range ids {
		for h := range 4 {
			hash := [fsm.TokenHashBytes]byte(bytes.Repeat([]byte{byte(h)}, fsm.TokenHashBytes))
			if t, ok := s.TokenByHash(hash); ok && t.ID == id {
				m.hashes[string(hash[:])] = true
			}
		}
	}
	for _, user := range authUsers {
		for _, kind := range []fsm.PermKind{fsm.PermLock, fsm.PermKV, fsm.PermAdmin} {
			for _, access := range []fsm.Access{fsm.Read, fsm.Write} {
				for _, prefix := range []string{"", "a", "ab", "abc", "b"} {
					want := fsm.Permission{Kind: kind, Access: access, Prefix: prefix}
					got := s.Authorize(user, want) == nil
					if got != m.allowed(user, want) {
						return fmt.Errorf("Authorize(%q, %s) = %v, model %v", user, want, got, !got)
					}
				}
			}
		}
	}
	return nil
}

// sessionQuotaReached reports whether the model refuses a session created
// by user for its sessions quota: auth on, and as many live sessions of
// the user as the quota.
func (m *modelChecker) sessionQuotaReached(user string) bool {
	q := m.auth.quotas[user]
	if !m.auth.enabled || user == "" || q.MaxSessions == 0 {
		return false
	}
	n := uint64(0)
	for id, u := range m.users {
		if u == user && m.live[id] {
			n++
		}
	}
	return n >= q.MaxSessions
}

// lockQuotaReached reports whether the model refuses session sid a new
// lock for its user's locks quota: auth on, and the user's live sessions
// hold or wait for as many locks as the quota.
func (m *modelChecker) lockQuotaReached(sid uint64) bool {
	user := m.users[sid]
	q := m.auth.quotas[user]
	if !m.auth.enabled || user == "" || q.MaxLocks == 0 {
		return false
	}
	mine := func(s uint64) bool { return m.live[s] && m.users[s] == user }
	n := uint64(0)
	for _, hs := range m.holders {
		for _, h := range hs {
			if mine(h.Session) {
				n++
			}
		}
	}
	for _, ws := range m.queues {
		for _, w := range ws {
			if mine(w.Session) {
				n++
			}
		}
	}
	if n >= q.MaxLocks {
		m.req.note("quota: locks quota refused an acquire")
		return true
	}
	return false
}

// waitQuotaReached reports whether the model refuses session sid a new
// wait for its user's waits quota: auth on, and the user's live sessions
// wait for as many locks as the quota.
func (m *modelChecker) waitQuotaReached(sid uint64) bool {
	user := m.users[sid]
	q := m.auth.quotas[user]
	if !m.auth.enabled || user == "" || q.MaxWaits == 0 {
		return false
	}
	if m.userUsage(user).Waits >= q.MaxWaits {
		m.req.note("quota: waits quota refused an acquire")
		return true
	}
	return false
}

// kvQuota is the kv bytes quota the model applies to a put by user.
func (m *modelChecker) kvQuota(user string) (uint64, bool) {
	q := m.auth.quotas[user]
	return q.MaxKVBytes, m.auth.enabled && user != "" && q.MaxKVBytes > 0
}

// userUsage counts, from the model alone, what user's live sessions hold
// and wait for, and the bytes of the live keys the user wrote last.
func (m *modelChecker) userUsage(user string) fsm.Usage {
	var u fsm.Usage
	mine := func(s uint64) bool { return m.live[s] && m.users[s] == user }
	for id := range m.live {
		if mine(id) {
			u.Sessions++
		}
	}
	for _, hs := range m.holders {
		for _, h := range hs {
			if mine(h.Session) {
				u.Locks++
			}
		}
	}
	for _, ws := range m.queues {
		for _, w := range ws {
			if mine(w.Session) {
				u.Locks++
				u.Waits++
			}
		}
	}
	u.KVBytes = m.kv.charged(user)
	return u
}

// compareUsage checks the state's running counters against the model's
// count, for every user the streams name.
func (m *modelChecker) compareUsage(s *fsm.State) error {
	for _, user := range authUsers {
		if got, want := s.UserUsage(user), m.userUsage(user); user != "" && got != want {
			return fmt.Errorf("user %q uses %+v, model %+v", user, got, want)
		}
	}
	return nil
}

// quotaStream returns the input of a stream of about n commands under
// auth with quotas (see commandSource.next and authOp for the encoding):
// users u1 (2 sessions, 2 locks, 1 wait, 12 KV bytes) and u2 (1 session,
// 1 wait, 4 KV bytes, and a session rate the state only keeps), auth on;
// then sessions created by u1, u2 or no user, acquires, releases, closes
// and expiries, unfenced puts by u1, u2 or no user (and txns of two
// writes by u1 or u2), now and then auth off
// and on again or a quota changed.
func quotaStream(r *rand.Rand, n int) []byte {
	data := []byte{
		0xfc, 1, 0, 0, // add user root
		0xfc, 3, 0, 0, // grant root the root role
		0xfc, 1, 1, 0, // add user u1
		0xfc, 1, 2, 0, // add user u2
		0xfc, 11, 0x24, 0xa1, // u1: 2 sessions, 2 locks, 1 wait, 12 kv bytes
		0xfc, 11, 0x11, 0x42, // u2: 1 session (0.5/s, burst 2), 1 wait, 4 kv bytes
		0xfc, 0, 0, 0, // enable
	}
	session := func() byte { return byte(8 * r.IntN(8)) } // a live session
	name := func() byte { return byte(r.IntN(4)) }
	for range n {
		switch x := r.IntN(100); {
		case x < 30: // a session of u1, u2 or no user, without a server limit
			data = append(data, []byte{0x00, 0x20, 0x20, 0x30, 0x30}[r.IntN(5)], byte(r.IntN(0x30)))
		case x < 65: // an exclusive or shared acquire, now and then a try
			data = append(data, 4, session(), byte(3*r.IntN(2))+name(), byte(r.IntN(2)))
		case x < 78: // a holder releases
			data = append(data, 11, name(), byte(r.IntN(256)))
		case x < 86: // a live session closes
			data = append(data, 2, session())
		case x < 92: // a holder's session expires or closes
			data = append(data, 14, name(), byte(r.IntN(256)))
		case x < 95: // auth off, or on
			data = append(data, 0xfc, 0, byte(r.IntN(2)), 0)
		case x < 97: // u1's quota changes
			data = append(data, 0xfc, 11, []byte{0x04, 0x14, 0x24}[r.IntN(3)], byte(r.IntN(3))|[]byte{0, 0x10, 0x80, 0x40}[r.IntN(4)])
		case x < 99: // an unfenced put by u1, u2 or no user, now and then bound to a session
			k := byte(r.IntN(3)) | []byte{0x00, 0x80, 0xc0, 0xc0, 0x80}[r.IntN(5)]
			data = append(data, []byte{0xa0, 0xa4, 0xa8, 0xac, 0xa3, 0xb0}[r.IntN(6)], k, 0x08, 0)
		default: // an unfenced txn by u1 or u2 of two puts or deletes of distinct keys (see txnOp)
			data = append(data, 0xe3, 1<<2, []byte{0x80, 0xc0}[r.IntN(2)], 0x08, 0)
			for _, key := range r.Perm(3)[:2] {
				data = append(data, byte(key)|byte([]int{0, 0, 0, 2}[r.IntN(4)])<<2, byte(r.IntN(4)))
			}
		}
	}
	return data
}
