package fsm

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsmpb"
)

// Auth (docs/design.md, Auth): users with roles, roles with permissions on
// name prefixes, bearer tokens kept as SHA-256 hashes, and whether auth is
// enforced. The state only records and answers; the edge (the server)
// authenticates callers, reads the clock for token expiry and checks
// permissions with Authorize.

// PermKind is what a permission is about.
type PermKind uint32

// Permission kinds; their numbers are the API's PermissionKind values.
const (
	PermLock  PermKind = 1
	PermKV    PermKind = 2
	PermAdmin PermKind = 3
)

func (k PermKind) String() string { return enumName(k, "kind", permKindNames) }

var permKindNames = map[PermKind]string{
	PermLock:  "lock",
	PermKV:    "kv",
	PermAdmin: "admin",
}

// Access is read or write; write includes read.
type Access uint32

// Accesses; their numbers are the API's Access values.
const (
	Read  Access = 1
	Write Access = 2
)

func (a Access) String() string { return enumName(a, "access", accessNames) }

var accessNames = map[Access]string{
	Read:  "read",
	Write: "write",
}

// Permission allows Kind at Access on every name that starts with Prefix.
// An admin permission has no prefix.
type Permission struct {
	Kind   PermKind
	Access Access
	Prefix string
}

func (p Permission) String() string {
	if p.Kind == PermAdmin {
		return "admin"
	}
	return fmt.Sprintf("%s %s on prefix %q", p.Kind, p.Access, p.Prefix)
}

func (p Permission) less(q Permission) bool {
	if p.Kind != q.Kind {
		return p.Kind < q.Kind
	}
	if p.Access != q.Access {
		return p.Access < q.Access
	}
	return p.Prefix < q.Prefix
}

// Covers reports whether p allows what want asks for: the same kind, at
// least its access, and a prefix of want's name. want.Prefix is a name,
// or, for a call on a range (a list, a watch), the range's prefix: every
// name in it starts with p's prefix exactly when the range's prefix does.
func (p Permission) Covers(want Permission) bool {
	if p.Kind != want.Kind || p.Access < want.Access {
		return false
	}
	return p.Kind == PermAdmin || strings.HasPrefix(want.Prefix, p.Prefix)
}

// RootRole is the built-in role that allows everything. It always exists,
// has no permissions of its own, and cannot be removed; AuthEnable needs a
// user "root" with it, as etcd does.
const RootRole = "root"

// RootUser is the user AuthEnable requires.
const RootUser = "root"

// MaxAuthNameBytes bounds user and role names and token descriptions.
const MaxAuthNameBytes = 128

// MaxPrefixBytes bounds a permission's prefix.
const MaxPrefixBytes = 1024

// TokenHashBytes is the size of a bearer token's hash (SHA-256).
const TokenHashBytes = sha256.Size

// UserInfo describes a user.
type UserInfo struct {
	Name  string
	Roles []string // sorted
	Quota Quota
}

// RoleInfo describes a role.
type RoleInfo struct {
	Name        string
	Permissions []Permission // sorted by kind, access, prefix
}

// TokenInfo describes a bearer token, without its secret.
type TokenInfo struct {
	ID          uint64
	User        string
	Description string
	// CreatedUnixNs and ExpiresUnixNs (0: never) are on the leader's clock
	// at creation.
	CreatedUnixNs, ExpiresUnixNs int64
}

type authState struct {
	enabled     bool
	users       map[string]map[string]struct{} // user -> roles
	roles       map[string][]Permission        // sorted, no duplicates
	tokens      map[uint64]*fsmpb.AuthToken
	byHash      map[[TokenHashBytes]byte]uint64
	lastTokenID uint64
	// quotas are the users' quotas; a user without one has none.
	quotas map[string]Quota
}

func newAuthState() authState {
	return authState{
		users:  map[string]map[string]struct{}{},
		roles:  map[string][]Permission{},
		tokens: map[uint64]*fsmpb.AuthToken{},
		byHash: map[[TokenHashBytes]byte]uint64{},
		quotas: map[string]Quota{},
	}
}

func authInvalid(format string, args ...any) Result {
	return Result{Err: fmt.Errorf("%w: %s", fence.ErrInvalidArgument, fmt.Sprintf(format, args...))}
}

// checkAuthName checks a user or role name: 1 to MaxAuthNameBytes of
// UTF-8 without control characters or spaces.
func checkAuthName(what, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: %s name is empty", fence.ErrInvalidArgument, what)
	case len(name) > MaxAuthNameBytes:
		return fmt.Errorf("%w: %s name of %d bytes is over the limit of %d", fence.ErrInvalidArgument, what, len(name), MaxAuthNameBytes)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: %s name %q is not UTF-8", fence.ErrInvalidArgument, what, name)
	}
	for _, r := range name {
		if r <= ' ' || r == 0x7f {
			return fmt.Errorf("%w: %s name %q has a space or control character", fence.ErrInvalidArgument, what, name)
		}
	}
	return nil
}

// CheckPermission checks a permission as given by a caller: a known kind
// and access, and a prefix of UTF-8 within MaxPrefixBytes (none for admin).
func CheckPermission(p Permission) error {
	switch {
	case p.Kind != PermLock && p.Kind != PermKV && p.Kind != PermAdmin:
		return fmt.Errorf("%w: permission kind %d is none of lock, kv, admin", fence.ErrInvalidArgument, uint32(p.Kind))
	case p.Access != Read && p.Access != Write:
		return fmt.Errorf("%w: access %d is neither read nor write", fence.ErrInvalidArgument, uint32(p.Access))
	case p.Kind == PermAdmin && p.Prefix != "":
		return fmt.Errorf("%w: an admin permission has no prefix (got %q)", fence.ErrInvalidArgument, p.Prefix)
	case len(p.Prefix) > MaxPrefixBytes:
		return fmt.Errorf("%w: prefix of %d bytes is over the limit of %d", fence.ErrInvalidArgument, len(p.Prefix), MaxPrefixBytes)
	case !utf8.ValidString(p.Prefix):
		return fmt.Errorf("%w: prefix %q is not UTF-8", fence.ErrInvalidArgument, p.Prefix)
	}
	return nil
}

func permissionOf(p *fsmpb.AuthPermission) Permission {
	return Permission{Kind: PermKind(p.GetKind()), Access: Access(p.GetAccess()), Prefix: p.GetPrefix()}
}

func (s *State) applyAuth(c *fsmpb.Auth) Result {
	a := &s.auth
	var res Result
	switch op := c.GetOp().(type) {
	case *fsmpb.Auth_SetEnabled:
		res = a.setEnabled(op.SetEnabled.GetEnabled())
	case *fsmpb.Auth_AddUser:
		res = a.addUser(op.AddUser)
	case *fsmpb.Auth_SetQuota:
		res = a.setUserQuota(op.SetQuota)
	case *fsmpb.Auth_RemoveUser:
		res = a.removeUser(op.RemoveUser.GetName())
	case *fsmpb.Auth_GrantRole:
		res = a.grantRole(op.GrantRole.GetUser(), op.GrantRole.GetRole())
	case *fsmpb.Auth_RevokeRole:
		res = a.revokeRole(op.RevokeRole.GetUser(), op.RevokeRole.GetRole())
	case *fsmpb.Auth_AddRole:
		res = a.addRole(op.AddRole.GetName())
	case *fsmpb.Auth_RemoveRole:
		res = a.removeRole(op.RemoveRole.GetName())
	case *fsmpb.Auth_GrantPermission:
		return a.grantPermission(op.GrantPermission)
	case *fsmpb.Auth_RevokePermission:
		res = a.revokePermission(op.RevokePermission)
	case *fsmpb.Auth_CreateToken:
		return a.createToken(op.CreateToken)
	case *fsmpb.Auth_RevokeToken:
		res = a.revokeToken(op.RevokeToken)
	default:
		return authInvalid("unknown auth command")
	}
	if res.Err != nil {
		return res
	}
	return Result{Effects: Effects{AuthChanged: true}}
}

func (a *authState) setEnabled(enabled bool) Result {
	if enabled && !a.hasRole(RootUser, RootRole) {
		return authInvalid("auth needs a user %q with role %q before it is enabled (fence user add root; fence user grant-role root root)", RootUser, RootRole)
	}
	a.enabled = enabled
	return Result{}
}

func (a *authState) addUser(c *fsmpb.AuthUser) Result {
	name := c.GetName()
	if err := checkAuthName("user", name); err != nil {
		return Result{Err: err}
	}
	if _, ok := a.users[name]; ok {
		return authInvalid("user %q already exists", name)
	}
	if err := checkQuotaApplied(quotaOf(c), apiField); err != nil {
		return Result{Err: err}
	}
	a.users[name] = map[string]struct{}{}
	a.setQuota(name, quotaOf(c))
	return Result{}
}

func (a *authState) setUserQuota(c *fsmpb.AuthUser) Result {
	name := c.GetName()
	if _, ok := a.users[name]; !ok {
		return authInvalid("no user %q", name)
	}
	if err := checkQuotaApplied(quotaOf(c), apiField); err != nil {
		return Result{Err: err}
	}
	a.setQuota(name, quotaOf(c))
	return Result{}
}

// removeUser removes a user, its quota and its tokens.
func (a *authState) removeUser(name string) Result {
	if _, ok := a.users[name]; !ok {
		return authInvalid("no user %q", name)
	}
	if a.enabled && name == RootUser {
		return authInvalid("user %q cannot be removed while auth is enabled; disable auth first", RootUser)
	}
	delete(a.users, name)
	delete(a.quotas, name)
	for _, id := range a.tokenIDs("") {
		if a.tokens[id].GetUser() == name {
			a.dropToken(id)
		}
	}
	return Result{}
}

func (a *authState) grantRole(user, role string) Result {
	roles, ok := a.users[user]
	if !ok {
		return authInvalid("no user %q", user)
	}
	if _, ok := a.roles[role]; !ok && role != RootRole {
		return authInvalid("no role %q", role)
	}
	if _, ok := roles[role]; ok {
		return authInvalid("user %q already has role %q", user, role)
	}
	roles[role] = struct{}{}
	return Result{}
}

func (a *authState) revokeRole(user, role string) Result {
	if !a.hasRole(user, role) {
		return authInvalid("user %q does not have role %q", user, role)
	}
	if a.enabled && user == RootUser && role == RootRole {
		return authInvalid("role %q cannot be taken from user %q while auth is enabled; disable auth first", RootRole, RootUser)
	}
	delete(a.users[user], role)
	return Result{}
}

func (a *authState) addRole(name string) Result {
	if err := checkAuthName("role", name); err != nil {
		return Result{Err: err}
	}
	if _, ok := a.roles[name]; ok || name == RootRole {
		return authInvalid("role %q already exists", name)
	}
	a.roles[name] = nil
	return Result{}
}

// removeRole removes a role, and takes it from every user.
func (a *authState) removeRole(name string) Result {
	if name == RootRole {
		return authInvalid("role %q is built in and cannot be removed", RootRole)
	}
	if _, ok := a.roles[name]; !ok {
		return authInvalid("no role %q", name)
	}
	delete(a.roles, name)
	for _, roles := range a.users {
		delete(roles, name)
	}
	return Result{}
}

func (a *authState) revokePermission(c *fsmpb.RolePermission) Result {
	role, p := c.GetRole(), permissionOf(c.GetPermission())
	i := slices.Index(a.roles[role], p)
	if _, ok := a.roles[role]; !ok || i < 0 {
		return authInvalid("role %q has no permission %s", role, p)
	}
	a.roles[role] = slices.Delete(slices.Clone(a.roles[role]), i, i+1)
	return Result{}
}

func (a *authState) revokeToken(id uint64) Result {
	if _, ok := a.tokens[id]; !ok {
		return authInvalid("no token %d", id)
	}
	a.dropToken(id)
	return Result{}
}

func (a *authState) grantPermission(c *fsmpb.RolePermission) Result {
	role, p := c.GetRole(), permissionOf(c.GetPermission())
	if err := CheckPermission(p); err != nil {
		return Result{Err: err}
	}
	perms, ok := a.roles[role]
	if role == RootRole {
		return authInvalid("role %q allows everything already", RootRole)
	}
	if !ok {
		return authInvalid("no role %q", role)
	}
	if slices.Contains(perms, p) {
		return authInvalid("role %q already has permission %s", role, p)
	}
	perms = append(slices.Clone(perms), p)
	sort.Slice(perms, func(i, j int) bool { return perms[i].less(perms[j]) })
	a.roles[role] = perms
	return Result{Effects: Effects{AuthChanged: true}}
}

func (a *authState) createToken(t *fsmpb.AuthToken) Result {
	if len(t.GetSecretSha256()) != TokenHashBytes {
		return authInvalid("a token's hash has %d bytes, not %d", len(t.GetSecretSha256()), TokenHashBytes)
	}
	if _, ok := a.users[t.GetUser()]; !ok {
		return authInvalid("no user %q", t.GetUser())
	}
	if len(t.GetDescription()) > MaxAuthNameBytes || !utf8.ValidString(t.GetDescription()) {
		return authInvalid("a token's description must be UTF-8 of at most %d bytes", MaxAuthNameBytes)
	}
	if t.GetExpiresUnixNs() < 0 || t.GetCreatedUnixNs() < 0 {
		return authInvalid("a token's times must not be negative")
	}
	hash := [TokenHashBytes]byte(t.GetSecretSha256())
	if _, dup := a.byHash[hash]; dup {
		return authInvalid("a token with this secret exists")
	}
	a.lastTokenID++
	tok := &fsmpb.AuthToken{Id: a.lastTokenID, SecretSha256: slices.Clone(t.GetSecretSha256()), User: t.GetUser(),
		CreatedUnixNs: t.GetCreatedUnixNs(), ExpiresUnixNs: t.GetExpiresUnixNs(), Description: t.GetDescription()}
	a.tokens[tok.Id] = tok
	a.byHash[hash] = tok.Id
	return Result{Answer: CreateTokenAnswer{TokenID: tok.Id}, Effects: Effects{AuthChanged: true}}
}

func (a *authState) dropToken(id uint64) {
	delete(a.byHash, [TokenHashBytes]byte(a.tokens[id].GetSecretSha256()))
	delete(a.tokens, id)
}

// setQuota sets user's quota; a quota of all zeros is none, and not kept.
func (a *authState) setQuota(user string, q Quota) {
	if q == (Quota{}) {
		delete(a.quotas, user)
		return
	}
	a.quotas[user] = q
}

func (a *authState) hasRole(user, role string) bool {
	_, ok := a.users[user][role]
	return ok
}

// tokenIDs returns the ids of user's tokens ("": everyone's), in order.
func (a *authState) tokenIDs(user string) []uint64 {
	ids := make([]uint64, 0, len(a.tokens))
	for id, t := range a.tokens {
		if user == "" || t.GetUser() == user {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// AuthEnabled reports whether auth is enforced.
func (s *State) AuthEnabled() bool { return s.auth.enabled }

// TokenByHash returns the token whose secret has the given SHA-256.
func (s *State) TokenByHash(hash [TokenHashBytes]byte) (TokenInfo, bool) {
	id, ok := s.auth.byHash[hash]
	if !ok {
		return TokenInfo{}, false
	}
	return tokenInfo(s.auth.tokens[id]), true
}

func tokenInfo(t *fsmpb.AuthToken) TokenInfo {
	return TokenInfo{ID: t.GetId(), User: t.GetUser(), Description: t.GetDescription(), CreatedUnixNs: t.GetCreatedUnixNs(), ExpiresUnixNs: t.GetExpiresUnixNs()}
}

// Tokens returns user's tokens ("": everyone's), in id order.
func (s *State) Tokens(user string) []TokenInfo {
	var out []TokenInfo
	for _, id := range s.auth.tokenIDs(user) {
		out = append(out, tokenInfo(s.auth.tokens[id]))
	}
	return out
}

// User returns a user, if it exists.
func (s *State) User(name string) (UserInfo, bool) {
	roles, ok := s.auth.users[name]
	if !ok {
		return UserInfo{}, false
	}
	info := UserInfo{Name: name, Roles: make([]string, 0, len(roles)), Quota: s.auth.quotas[name]}
	for r := range roles {
		info.Roles = append(info.Roles, r)
	}
	sort.Strings(info.Roles)
	return info, true
}

// Users returns every user, in name order.
func (s *State) Users() []UserInfo {
	names := sortedKeys(s.auth.users)
	out := make([]UserInfo, 0, len(names))
	for _, n := range names {
		u, _ := s.User(n)
		out = append(out, u)
	}
	return out
}

// Roles returns every role but the built-in root, in name order.
func (s *State) Roles() []RoleInfo {
	names := sortedKeys(s.auth.roles)
	out := make([]RoleInfo, 0, len(names))
	for _, n := range names {
		out = append(out, RoleInfo{Name: n, Permissions: slices.Clone(s.auth.roles[n])})
	}
	return out
}

// Authorize reports whether user may do want: the user exists and has the
// root role, or a role with a permission that covers want. The error
// (ErrAuthFailed for an unknown user, ErrPermissionDenied otherwise) names
// what was missing.
func (s *State) Authorize(user string, want Permission) error {
	roles, ok := s.auth.users[user]
	if !ok {
		return fmt.Errorf("%w: user %q does not exist", fence.ErrAuthFailed, user)
	}
	if _, root := roles[RootRole]; root {
		return nil
	}
	for role := range roles {
		for _, p := range s.auth.roles[role] {
			if p.Covers(want) {
				return nil
			}
		}
	}
	return fmt.Errorf("%w: user %q needs %s", fence.ErrPermissionDenied, user, want)
}

// HasAny reports whether user has the root role or any permission of kind
// at access or more, on any prefix.
func (s *State) HasAny(user string, kind PermKind, access Access) bool {
	roles := s.auth.users[user]
	if _, root := roles[RootRole]; root {
		return true
	}
	for role := range roles {
		for _, p := range s.auth.roles[role] {
			if p.Kind == kind && p.Access >= access {
				return true
			}
		}
	}
	return false
}

func (a *authState) snapshot() *fsmpb.AuthState {
	st := &fsmpb.AuthState{Enabled: a.enabled, LastTokenId: a.lastTokenID}
	for _, u := range sortedKeys(a.users) {
		q := a.quotas[u]
		pu := &fsmpb.AuthUser{Name: u, MaxSessions: q.MaxSessions, MaxLocks: q.MaxLocks, MaxWaits: q.MaxWaits,
			MaxKvBytes: q.MaxKVBytes, SessionRate: q.SessionRate, SessionBurst: q.SessionBurst, Roles: sortedKeys(a.users[u])}
		st.Users = append(st.Users, pu)
	}
	for _, r := range sortedKeys(a.roles) {
		pr := &fsmpb.AuthRole{Name: r}
		for _, p := range a.roles[r] {
			pr.Permissions = append(pr.Permissions, &fsmpb.AuthPermission{Kind: uint32(p.Kind), Access: uint32(p.Access), Prefix: p.Prefix})
		}
		st.Roles = append(st.Roles, pr)
	}
	for _, id := range a.tokenIDs("") {
		st.Tokens = append(st.Tokens, cloneToken(a.tokens[id]))
	}
	return st
}

func cloneToken(t *fsmpb.AuthToken) *fsmpb.AuthToken {
	return &fsmpb.AuthToken{Id: t.GetId(), SecretSha256: slices.Clone(t.GetSecretSha256()), User: t.GetUser(),
		CreatedUnixNs: t.GetCreatedUnixNs(), ExpiresUnixNs: t.GetExpiresUnixNs(), Description: t.GetDescription()}
}

// restoreAuth loads a snapshot's auth state, refusing one that breaks its
// invariants (see checkAuth).
func restoreAuth(st *fsmpb.AuthState) (authState, error) {
	a := newAuthState()
	a.enabled = st.GetEnabled()
	a.lastTokenID = st.GetLastTokenId()
	for _, pr := range st.GetRoles() {
		if _, dup := a.roles[pr.GetName()]; dup || pr.GetName() == RootRole {
			return a, fmt.Errorf("fsm: snapshot has role %q twice, or the built-in one", pr.GetName())
		}
		var perms []Permission
		for _, pp := range pr.GetPermissions() {
			perms = append(perms, permissionOf(pp))
		}
		a.roles[pr.GetName()] = perms
	}
	for _, pu := range st.GetUsers() {
		if _, dup := a.users[pu.GetName()]; dup {
			return a, fmt.Errorf("fsm: snapshot has user %q twice", pu.GetName())
		}
		roles := map[string]struct{}{}
		for _, r := range pu.GetRoles() {
			roles[r] = struct{}{}
		}
		a.users[pu.GetName()] = roles
		a.setQuota(pu.GetName(), quotaOf(pu))
	}
	for _, pt := range st.GetTokens() {
		if _, dup := a.tokens[pt.GetId()]; dup || len(pt.GetSecretSha256()) != TokenHashBytes {
			return a, fmt.Errorf("fsm: snapshot has token %d twice, or with a bad hash", pt.GetId())
		}
		hash := [TokenHashBytes]byte(pt.GetSecretSha256())
		if _, dup := a.byHash[hash]; dup {
			return a, fmt.Errorf("fsm: snapshot has two tokens with one secret")
		}
		a.tokens[pt.GetId()] = cloneToken(pt)
		a.byHash[hash] = pt.GetId()
	}
	return a, nil
}

// checkAuth verifies the auth state's invariants: every user's roles
// exist (root is built in); every role's permissions are valid, sorted and
// distinct; every token belongs to a user, is indexed by its hash, and has
// an id no higher than the counter; enabled only with root holding root.
func (a *authState) checkAuth() error {
	for u, roles := range a.users {
		if err := checkAuthName("user", u); err != nil {
			return err
		}
		for r := range roles {
			if _, ok := a.roles[r]; !ok && r != RootRole {
				return fmt.Errorf("user %q has unknown role %q", u, r)
			}
		}
	}
	for r, perms := range a.roles {
		if err := checkAuthName("role", r); err != nil {
			return err
		}
		for i, p := range perms {
			if err := CheckPermission(p); err != nil {
				return fmt.Errorf("role %q: %w", r, err)
			}
			if i > 0 && !perms[i-1].less(p) {
				return fmt.Errorf("role %q permissions are not sorted and distinct", r)
			}
		}
	}
	for u, q := range a.quotas {
		if _, ok := a.users[u]; !ok || q == (Quota{}) {
			return fmt.Errorf("quota %s of user %q, who does not exist, or a quota of none kept", q, u)
		}
		if err := checkQuotaApplied(q, apiField); err != nil {
			return fmt.Errorf("user %q: %w", u, err)
		}
	}
	if len(a.byHash) != len(a.tokens) {
		return fmt.Errorf("%d tokens, %d hashes", len(a.tokens), len(a.byHash))
	}
	for id, t := range a.tokens {
		if t.GetId() != id || id == 0 || id > a.lastTokenID {
			return fmt.Errorf("token %d is filed under %d or above the counter %d", t.GetId(), id, a.lastTokenID)
		}
		if _, ok := a.users[t.GetUser()]; !ok {
			return fmt.Errorf("token %d belongs to unknown user %q", id, t.GetUser())
		}
		if a.byHash[[TokenHashBytes]byte(t.GetSecretSha256())] != id {
			return fmt.Errorf("token %d is not indexed by its hash", id)
		}
	}
	if a.enabled && !a.hasRole(RootUser, RootRole) {
		return fmt.Errorf("auth is enabled without user %q in role %q", RootUser, RootRole)
	}
	return nil
}
