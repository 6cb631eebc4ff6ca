package server

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// The AuthService: users, roles, tokens and enforcement, each change one
// command. authInterceptor has checked the caller (admin, once auth is on)
// before any of these runs; every change is logged as an audit line.

// changed answers an auth change whose response, a T, is empty: the
// change's error, or the empty T once the change is committed.
func changed[T any](_ fsm.Result, err error) (*connect.Response[T], error) {
	return respond(new(T), err)
}

// changeAuth commits one auth change and logs it with who made it.
func (s *Server) changeAuth(ctx context.Context, req connect.AnyRequest, c *fsmpb.Auth, attrs ...any) (fsm.Result, error) {
	res, err := s.apply(&fsmpb.Command{Op: &fsmpb.Command_Auth{Auth: c}})
	if err != nil {
		return res, err
	}
	who := s.callerOf(ctx, req)
	s.logger.Warn("auth: changed", append([]any{"audit", true, "user", who.user, "via", who.via, "token_id", who.tokenID,
		"procedure", req.Spec().Procedure, "peer", req.Peer().Addr}, attrs...)...)
	return res, nil
}

// callerOf returns who made a call, as far as its credential says (with
// auth off, a call may name nobody).
func (s *Server) callerOf(ctx context.Context, req connect.AnyRequest) caller {
	cred := credentialOf(ctx, req.Header())
	var who caller
	if cred.present() {
		s.fsm.Read(func(st *fsm.State) { who, _ = authenticateLocked(st, cred, s.cfg.Clock.Now()) })
	}
	return who
}

func permissionFrom(p *fencev1.Permission) fsm.Permission {
	return fsm.Permission{Kind: fsm.PermKind(p.GetKind()), Access: fsm.Access(p.GetAccess()), Prefix: p.GetPrefix()}
}

func apiPermission(p fsm.Permission) *fencev1.Permission {
	return &fencev1.Permission{Kind: fencev1.PermissionKind(p.Kind), Access: fencev1.Access(p.Access), Prefix: p.Prefix}
}

// AuthEnable implements fencev1connect.AuthServiceHandler.
func (s handlers) AuthEnable(ctx context.Context, req *connect.Request[fencev1.AuthEnableRequest]) (*connect.Response[fencev1.AuthEnableResponse], error) {
	// The caller must still be able to administer once auth is on.
	cred := credentialOf(ctx, req.Header())
	var err error
	s.fsm.Read(func(st *fsm.State) {
		var who caller
		if who, err = authenticateLocked(st, cred, s.cfg.Clock.Now()); err == nil {
			err = authorizeLocked(st, who, adminNeed)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("enabling auth would lock this caller out: %w; call with an admin's credential, such as a token of user root (fence --auth-token-file FILE auth enable)", err)
	}
	return changed[fencev1.AuthEnableResponse](s.changeAuth(ctx, req, &fsmpb.Auth{Op: &fsmpb.Auth_SetEnabled{SetEnabled: &fsmpb.SetAuthEnabled{Enabled: true}}}, "change", "auth enabled"))
}

// AuthDisable implements fencev1connect.AuthServiceHandler.
func (s handlers) AuthDisable(ctx context.Context, req *connect.Request[fencev1.AuthDisableRequest]) (*connect.Response[fencev1.AuthDisableResponse], error) {
	return changed[fencev1.AuthDisableResponse](s.changeAuth(ctx, req, &fsmpb.Auth{Op: &fsmpb.Auth_SetEnabled{SetEnabled: &fsmpb.SetAuthEnabled{}}}, "change", "auth disabled"))
}

// AuthStatus answers from this node's state: whether auth is on, and who
// the caller is.
func (s handlers) AuthStatus(ctx context.Context, req *connect.Request[fencev1.AuthStatusRequest]) (*connect.Response[fencev1.AuthStatusResponse], error) {
	out := &fencev1.AuthStatusResponse{}
	who := s.callerOf(ctx, req)
	s.fsm.Read(func(st *fsm.State) {
		out.Enabled = st.AuthEnabled()
		if u, ok := st.User(who.user); ok {
			out.User, out.IdentifiedBy, out.Roles = u.Name, who.via, u.Roles
		}
	})
	return connect.NewResponse(out), nil
}

// UserAdd implements fencev1connect.AuthServiceHandler.
func (s handlers) UserAdd(ctx context.Context, req *connect.Request[fencev1.UserAddRequest]) (*connect.Response[fencev1.UserAddResponse], error) {
	name := req.Msg.GetName()
	return changed[fencev1.UserAddResponse](s.changeAuth(ctx, req, &fsmpb.Auth{Op: &fsmpb.Auth_AddUser{AddUser: &fsmpb.AuthUser{Name: name}}}, "change", "user added", "name", name))
}

// UserRemove implements fencev1connect.AuthServiceHandler.
func (s handlers) UserRemove(ctx context.Context, req *connect.Request[fencev1.UserRemoveRequest]) (*connect.Response[fencev1.UserRemoveResponse], error) {
	name := req.Msg.GetName()
	return changed[fencev1.UserRemoveResponse](s.changeAuth(ctx, req, &fsmpb.Auth{Op: &fsmpb.Auth_RemoveUser{RemoveUser: &fsmpb.AuthUser{Name: name}}}, "change", "user removed", "name", name))
}

// UserSetQuota implements fencev1connect.AuthServiceHandler.
func (s handlers) UserSetQuota(ctx context.Context, req *connect.Request[fencev1.UserSetQuotaRequest]) (*connect.Response[fencev1.UserSetQuotaResponse], error) {
	m := req.Msg
	q := fsm.Quota{MaxSessions: m.GetMaxSessions(), MaxLocks: m.GetMaxLocks(), MaxWaits: m.GetMaxWaits(),
		MaxKVBytes: m.GetMaxKvBytes(), SessionRate: m.GetSessionRate(), SessionBurst: m.GetSessionBurst()}
	if err := fsm.CheckQuota(q); err != nil {
		return nil, err
	}
	op := &fsmpb.AuthUser{Name: m.GetUser(), MaxSessions: q.MaxSessions, MaxLocks: q.MaxLocks, MaxWaits: q.MaxWaits,
		MaxKvBytes: q.MaxKVBytes, SessionRate: q.SessionRate, SessionBurst: q.SessionBurst}
	return changed[fencev1.UserSetQuotaResponse](s.changeAuth(ctx, req, &fsmpb.Auth{Op: &fsmpb.Auth_SetQuota{SetQuota: op}}, "change", "quota set",
		"name", m.GetUser(), "quota", q.String()))
}

// UserGrantRole implements fencev1connect.AuthServiceHandler.
func (s handlers) UserGrantRole(ctx context.Context, req *connect.Request[fencev1.UserGrantRoleRequest]) (*connect.Response[fencev1.UserGrantRoleResponse], error) {
	u, r := req.Msg.GetUser(), req.Msg.GetRole()
	return changed[fencev1.UserGrantRoleResponse](s.changeAuth(ctx, req, &fsmpb.Auth{Op: &fsmpb.Auth_GrantRole{GrantRole: &fsmpb.UserRole{User: u, Role: r}}}, "change", "role granted", "name", u, "role", r))
}

// UserRevokeRole implements fencev1connect.AuthServiceHandler.
func (s handlers) UserRevokeRole(ctx context.Context, req *connect.Request[fencev1.UserRevokeRoleRequest]) (*connect.Response[fencev1.UserRevokeRoleResponse], error) {
	u, r := req.Msg.GetUser(), req.Msg.GetRole()
	return changed[fencev1.UserRevokeRoleResponse](s.changeAuth(ctx, req, &fsmpb.Auth{Op: &fsmpb.Auth_RevokeRole{RevokeRole: &fsmpb.UserRole{User: u, Role: r}}}, "change", "role revoked", "name", u, "role", r))
}

// RoleAdd implements fencev1connect.AuthServiceHandler.
func (s handlers) RoleAdd(ctx context.Context, req *connect.Request[fencev1.RoleAddRequest]) (*connect.Response[fencev1.RoleAddResponse], error) {
	name := req.Msg.GetName()
	return changed[fencev1.RoleAddResponse](s.changeAuth(ctx, req, &fsmpb.Auth{Op: &fsmpb.Auth_AddRole{AddRole: &fsmpb.AuthRole{Name: name}}}, "change", "role added", "role", name))
}

// RoleRemove implements fencev1connect.AuthServiceHandler.
func (s handlers) RoleRemove(ctx context.Context, req *connect.Request[fencev1.RoleRemoveRequest]) (*connect.Response[fencev1.RoleRemoveResponse], error) {
	name := req.Msg.GetName()
	return changed[fencev1.RoleRemoveResponse](s.changeAuth(ctx, req, &fsmpb.Auth{Op: &fsmpb.Auth_RemoveRole{RemoveRole: &fsmpb.AuthRole{Name: name}}}, "change", "role removed", "role", name))
}

// RoleGrantPermission implements fencev1connect.AuthServiceHandler.
func (s handlers) RoleGrantPermission(ctx context.Context, req *connect.Request[fencev1.RoleGrantPermissionRequest]) (*connect.Response[fencev1.RoleGrantPermissionResponse], error) {
	r, p := req.Msg.GetRole(), permissionFrom(req.Msg.GetPermission())
	if err := fsm.CheckPermission(p); err != nil {
		return nil, err
	}
	c := &fsmpb.Auth{Op: &fsmpb.Auth_GrantPermission{GrantPermission: &fsmpb.RolePermission{Role: r,
		Permission: &fsmpb.AuthPermission{Kind: uint32(p.Kind), Access: uint32(p.Access), Prefix: p.Prefix}}}}
	return changed[fencev1.RoleGrantPermissionResponse](s.changeAuth(ctx, req, c, "change", "permission granted", "role", r, "permission", p.String()))
}

// RoleRevokePermission implements fencev1connect.AuthServiceHandler.
func (s handlers) RoleRevokePermission(ctx context.Context, req *connect.Request[fencev1.RoleRevokePermissionRequest]) (*connect.Response[fencev1.RoleRevokePermissionResponse], error) {
	r, p := req.Msg.GetRole(), permissionFrom(req.Msg.GetPermission())
	c := &fsmpb.Auth{Op: &fsmpb.Auth_RevokePermission{RevokePermission: &fsmpb.RolePermission{Role: r,
		Permission: &fsmpb.AuthPermission{Kind: uint32(p.Kind), Access: uint32(p.Access), Prefix: p.Prefix}}}}
	return changed[fencev1.RoleRevokePermissionResponse](s.changeAuth(ctx, req, c, "change", "permission revoked", "role", r, "permission", p.String()))
}

// UserList implements fencev1connect.AuthServiceHandler.
func (s handlers) UserList(ctx context.Context, req *connect.Request[fencev1.UserListRequest]) (*connect.Response[fencev1.UserListResponse], error) {
	if err := s.read(ctx, false); err != nil {
		return nil, err
	}
	out := &fencev1.UserListResponse{}
	s.fsm.Read(func(st *fsm.State) {
		for _, u := range st.Users() {
			use, q := st.UserUsage(u.Name), u.Quota
			out.Users = append(out.Users, &fencev1.User{Name: u.Name, Roles: u.Roles,
				MaxSessions: q.MaxSessions, MaxLocks: q.MaxLocks, MaxWaits: q.MaxWaits, MaxKvBytes: q.MaxKVBytes,
				SessionRate: q.SessionRate, SessionBurst: q.SessionBurst,
				Sessions: use.Sessions, Locks: use.Locks, Waits: use.Waits, KvBytes: use.KVBytes})
		}
	})
	return connect.NewResponse(out), nil
}

// RoleList implements fencev1connect.AuthServiceHandler.
func (s handlers) RoleList(ctx context.Context, req *connect.Request[fencev1.RoleListRequest]) (*connect.Response[fencev1.RoleListResponse], error) {
	if err := s.read(ctx, false); err != nil {
		return nil, err
	}
	out := &fencev1.RoleListResponse{}
	s.fsm.Read(func(st *fsm.State) {
		for _, r := range st.Roles() {
			role := &fencev1.Role{Name: r.Name}
			for _, p := range r.Permissions {
				role.Permissions = append(role.Permissions, apiPermission(p))
			}
			out.Roles = append(out.Roles, role)
		}
	})
	return connect.NewResponse(out), nil
}

func apiToken(t fsm.TokenInfo) *fencev1.TokenInfo {
	out := &fencev1.TokenInfo{Id: t.ID, User: t.User, Description: t.Description, Created: timestamppb.New(time.Unix(0, t.CreatedUnixNs))}
	if t.ExpiresUnixNs != 0 {
		out.Expires = timestamppb.New(time.Unix(0, t.ExpiresUnixNs))
	}
	return out
}

// TokenCreate draws a token's secret here, on the leader (apply proposes
// only there), and commits its hash with the leader's time.
func (s handlers) TokenCreate(ctx context.Context, req *connect.Request[fencev1.TokenCreateRequest]) (*connect.Response[fencev1.TokenCreateResponse], error) {
	ttl, err := duration("ttl", req.Msg.GetTtl(), 0)
	if err != nil {
		return nil, err
	}
	if ttl < 0 {
		return nil, fmt.Errorf("%w: ttl %v is negative", fence.ErrInvalidArgument, ttl)
	}
	token := newSecret()
	hash := tokenHash(token)
	now := s.cfg.Clock.Now()
	t := &fsmpb.AuthToken{SecretSha256: hash[:], User: req.Msg.GetUser(), CreatedUnixNs: now.UnixNano(), Description: req.Msg.GetDescription()}
	if ttl > 0 {
		t.ExpiresUnixNs = now.Add(ttl).UnixNano()
	}
	res, err := s.changeAuth(ctx, req, &fsmpb.Auth{Op: &fsmpb.Auth_CreateToken{CreateToken: t}}, "change", "token created", "name", t.User, "ttl", ttl)
	if err != nil {
		return nil, err
	}
	info := fsm.TokenInfo{ID: res.CreateToken().TokenID, User: t.User, Description: t.Description, CreatedUnixNs: t.CreatedUnixNs, ExpiresUnixNs: t.ExpiresUnixNs}
	return connect.NewResponse(&fencev1.TokenCreateResponse{Info: apiToken(info), Token: token}), nil
}

// TokenRevoke implements fencev1connect.AuthServiceHandler.
func (s handlers) TokenRevoke(ctx context.Context, req *connect.Request[fencev1.TokenRevokeRequest]) (*connect.Response[fencev1.TokenRevokeResponse], error) {
	id := req.Msg.GetId()
	return changed[fencev1.TokenRevokeResponse](s.changeAuth(ctx, req, &fsmpb.Auth{Op: &fsmpb.Auth_RevokeToken{RevokeToken: id}}, "change", "token revoked", "revoked_token", id))
}

// TokenList implements fencev1connect.AuthServiceHandler.
func (s handlers) TokenList(ctx context.Context, req *connect.Request[fencev1.TokenListRequest]) (*connect.Response[fencev1.TokenListResponse], error) {
	if err := s.read(ctx, false); err != nil {
		return nil, err
	}
	out := &fencev1.TokenListResponse{}
	s.fsm.Read(func(st *fsm.State) {
		for _, t := range st.Tokens(req.Msg.GetUser()) {
			out.Tokens = append(out.Tokens, apiToken(t))
		}
	})
	return connect.NewResponse(out), nil
}
