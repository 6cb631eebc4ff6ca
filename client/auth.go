package client

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
)

// WithBearerToken sends token with every call, as the header
// "Authorization: Bearer TOKEN": the identity the service checks
// permissions against once auth is enabled (fence token create makes
// one). Without it, on a node started with --client-cert-auth, the
// client certificate's common name is the identity.
func WithBearerToken(token string) Option {
	return func(o *options) { o.bearer = token }
}

// bearerToken puts the token, if any, on every call.
type bearerToken string

func (b bearerToken) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if b != "" {
			req.Header().Set("Authorization", "Bearer "+string(b))
		}
		return next(ctx, req)
	}
}

func (b bearerToken) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if b != "" {
			conn.RequestHeader().Set("Authorization", "Bearer "+string(b))
		}
		return conn
	}
}

func (bearerToken) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// Auth types of the API, for the auth calls below.
type (
	// Permission allows a kind of call (lock, kv, admin) at an access
	// (read, write; write includes read) on names with a prefix.
	Permission = fencev1.Permission
	// User is a user and its roles.
	User = fencev1.User
	// Role is a role and its permissions.
	Role = fencev1.Role
	// TokenInfo describes a bearer token, without its secret.
	TokenInfo = fencev1.TokenInfo
	// AuthStatus says whether auth is on and who the caller is.
	AuthStatus = fencev1.AuthStatusResponse
)

// Permission kinds and accesses, for Permission.
const (
	PermLock  = fencev1.PermissionKind_PERMISSION_KIND_LOCK
	PermKV    = fencev1.PermissionKind_PERMISSION_KIND_KV
	PermAdmin = fencev1.PermissionKind_PERMISSION_KIND_ADMIN
	Read      = fencev1.Access_ACCESS_READ
	Write     = fencev1.Access_ACCESS_WRITE
)

// authCall runs one AuthService call against the leader, retried like
// every call while no leader answers. Auth changes are not idempotent: a
// retry of a change whose answer was lost fails as already made.
func authCall[Req, Resp any](c *Client, ctx context.Context, msg *Req, fn func(fencev1connect.AuthServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)) (*Resp, error) {
	var out *Resp
	err := c.unary(ctx, func(ctx context.Context, ep *endpoint) error {
		resp, err := fn(ep.auth, ctx, connect.NewRequest(msg))
		if err == nil {
			out = resp.Msg
		}
		return err
	})
	return out, err
}

// AuthEnable turns auth on. The client's own credential must be an
// admin's (a token of user root, say), or the call is refused: enabling
// never locks the caller out.
func (c *Client) AuthEnable(ctx context.Context) error {
	_, err := authCall(c, ctx, &fencev1.AuthEnableRequest{}, fencev1connect.AuthServiceClient.AuthEnable)
	return err
}

// AuthDisable turns auth off (an admin call).
func (c *Client) AuthDisable(ctx context.Context) error {
	_, err := authCall(c, ctx, &fencev1.AuthDisableRequest{}, fencev1connect.AuthServiceClient.AuthDisable)
	return err
}

// AuthStatus says whether auth is on, and who the client is to the node.
func (c *Client) AuthStatus(ctx context.Context) (*AuthStatus, error) {
	return authCall(c, ctx, &fencev1.AuthStatusRequest{}, fencev1connect.AuthServiceClient.AuthStatus)
}

// UserAdd adds a user without roles.
func (c *Client) UserAdd(ctx context.Context, name string) error {
	_, err := authCall(c, ctx, &fencev1.UserAddRequest{Name: name}, fencev1connect.AuthServiceClient.UserAdd)
	return err
}

// UserRemove removes a user and every token of theirs.
func (c *Client) UserRemove(ctx context.Context, name string) error {
	_, err := authCall(c, ctx, &fencev1.UserRemoveRequest{Name: name}, fencev1connect.AuthServiceClient.UserRemove)
	return err
}

// Users lists the users, in name order.
func (c *Client) Users(ctx context.Context) ([]*User, error) {
	resp, err := authCall(c, ctx, &fencev1.UserListRequest{}, fencev1connect.AuthServiceClient.UserList)
	return resp.GetUsers(), err
}

// Quota is a user's quotas, enforced while auth is on; 0 is no limit
// (see AuthService.UserSetQuota).
type Quota struct {
	// MaxSessions bounds the live sessions the user created.
	MaxSessions uint64
	// MaxLocks bounds the locks the user's sessions hold or wait for (a
	// wait counts, so a waiter granted later never goes over), MaxWaits
	// those they wait for.
	MaxLocks, MaxWaits uint64
	// MaxKVBytes bounds the bytes (key and value) of the live KV keys the
	// user wrote last.
	MaxKVBytes uint64
	// SessionRate (sessions per second) and SessionBurst are a token
	// bucket on creating sessions, kept by the leader; 0: the server's
	// default. A rate needs a burst of at least 1.
	SessionRate  float64
	SessionBurst uint64
}

// QuotaOf returns the quotas a listed user has.
func QuotaOf(u *User) Quota {
	return Quota{MaxSessions: u.GetMaxSessions(), MaxLocks: u.GetMaxLocks(), MaxWaits: u.GetMaxWaits(),
		MaxKVBytes: u.GetMaxKvBytes(), SessionRate: u.GetSessionRate(), SessionBurst: u.GetSessionBurst()}
}

// UserSetQuota sets every quota of user (a field left 0 is no limit). A
// call beyond a quota fails with fence.ErrLimit naming the user and the
// quota; a value out of bounds with fence.ErrInvalidArgument, changing
// nothing.
func (c *Client) UserSetQuota(ctx context.Context, user string, q Quota) error {
	_, err := authCall(c, ctx, &fencev1.UserSetQuotaRequest{User: user, MaxSessions: q.MaxSessions, MaxLocks: q.MaxLocks,
		MaxWaits: q.MaxWaits, MaxKvBytes: q.MaxKVBytes, SessionRate: q.SessionRate, SessionBurst: q.SessionBurst},
		fencev1connect.AuthServiceClient.UserSetQuota)
	return err
}

// UserGrantRole gives user a role ("root" allows everything).
func (c *Client) UserGrantRole(ctx context.Context, user, role string) error {
	_, err := authCall(c, ctx, &fencev1.UserGrantRoleRequest{User: user, Role: role}, fencev1connect.AuthServiceClient.UserGrantRole)
	return err
}

// UserRevokeRole takes a role from user.
func (c *Client) UserRevokeRole(ctx context.Context, user, role string) error {
	_, err := authCall(c, ctx, &fencev1.UserRevokeRoleRequest{User: user, Role: role}, fencev1connect.AuthServiceClient.UserRevokeRole)
	return err
}

// RoleAdd adds a role without permissions.
func (c *Client) RoleAdd(ctx context.Context, name string) error {
	_, err := authCall(c, ctx, &fencev1.RoleAddRequest{Name: name}, fencev1connect.AuthServiceClient.RoleAdd)
	return err
}

// RoleRemove removes a role, taking it from every user.
func (c *Client) RoleRemove(ctx context.Context, name string) error {
	_, err := authCall(c, ctx, &fencev1.RoleRemoveRequest{Name: name}, fencev1connect.AuthServiceClient.RoleRemove)
	return err
}

// RoleGrant gives role a permission.
func (c *Client) RoleGrant(ctx context.Context, role string, p *Permission) error {
	_, err := authCall(c, ctx, &fencev1.RoleGrantPermissionRequest{Role: role, Permission: p}, fencev1connect.AuthServiceClient.RoleGrantPermission)
	return err
}

// RoleRevoke takes a permission from role.
func (c *Client) RoleRevoke(ctx context.Context, role string, p *Permission) error {
	_, err := authCall(c, ctx, &fencev1.RoleRevokePermissionRequest{Role: role, Permission: p}, fencev1connect.AuthServiceClient.RoleRevokePermission)
	return err
}

// Roles lists the roles (the built-in root aside), in name order.
func (c *Client) Roles(ctx context.Context) ([]*Role, error) {
	resp, err := authCall(c, ctx, &fencev1.RoleListRequest{}, fencev1connect.AuthServiceClient.RoleList)
	return resp.GetRoles(), err
}

// TokenCreate makes a bearer token for user, lasting ttl (0: until
// revoked). The token is answered here only: keep it.
func (c *Client) TokenCreate(ctx context.Context, user string, ttl time.Duration, description string) (string, *TokenInfo, error) {
	req := &fencev1.TokenCreateRequest{User: user, Description: description}
	if ttl > 0 {
		req.Ttl = durationpb.New(ttl)
	}
	resp, err := authCall(c, ctx, req, fencev1connect.AuthServiceClient.TokenCreate)
	return resp.GetToken(), resp.GetInfo(), err
}

// TokenRevoke ends the token with id: the next call with it is refused.
func (c *Client) TokenRevoke(ctx context.Context, id uint64) error {
	_, err := authCall(c, ctx, &fencev1.TokenRevokeRequest{Id: id}, fencev1connect.AuthServiceClient.TokenRevoke)
	return err
}

// Tokens lists user's tokens ("": everyone's), without their secrets.
func (c *Client) Tokens(ctx context.Context, user string) ([]*TokenInfo, error) {
	resp, err := authCall(c, ctx, &fencev1.TokenListRequest{User: user}, fencev1connect.AuthServiceClient.TokenList)
	return resp.GetTokens(), err
}
