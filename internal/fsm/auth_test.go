package fsm_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

func authCmd(c *fsmpb.Auth) *fsmpb.Command { return &fsmpb.Command{Op: &fsmpb.Command_Auth{Auth: c}} }

func setEnabled(on bool) *fsmpb.Command {
	return authCmd(&fsmpb.Auth{Op: &fsmpb.Auth_SetEnabled{SetEnabled: &fsmpb.SetAuthEnabled{Enabled: on}}})
}

func addUser(name string) *fsmpb.Command {
	return authCmd(&fsmpb.Auth{Op: &fsmpb.Auth_AddUser{AddUser: &fsmpb.AuthUser{Name: name}}})
}

func removeUser(name string) *fsmpb.Command {
	return authCmd(&fsmpb.Auth{Op: &fsmpb.Auth_RemoveUser{RemoveUser: &fsmpb.AuthUser{Name: name}}})
}

func addRole(name string) *fsmpb.Command {
	return authCmd(&fsmpb.Auth{Op: &fsmpb.Auth_AddRole{AddRole: &fsmpb.AuthRole{Name: name}}})
}

func removeRole(name string) *fsmpb.Command {
	return authCmd(&fsmpb.Auth{Op: &fsmpb.Auth_RemoveRole{RemoveRole: &fsmpb.AuthRole{Name: name}}})
}

func grantRole(user, role string) *fsmpb.Command {
	return authCmd(&fsmpb.Auth{Op: &fsmpb.Auth_GrantRole{GrantRole: &fsmpb.UserRole{User: user, Role: role}}})
}

func revokeRole(user, role string) *fsmpb.Command {
	return authCmd(&fsmpb.Auth{Op: &fsmpb.Auth_RevokeRole{RevokeRole: &fsmpb.UserRole{User: user, Role: role}}})
}

func grantPerm(role string, kind fsm.PermKind, access fsm.Access, prefix string) *fsmpb.Command {
	return authCmd(&fsmpb.Auth{Op: &fsmpb.Auth_GrantPermission{GrantPermission: &fsmpb.RolePermission{Role: role,
		Permission: &fsmpb.AuthPermission{Kind: uint32(kind), Access: uint32(access), Prefix: prefix}}}})
}

func revokePerm(role string, kind fsm.PermKind, access fsm.Access, prefix string) *fsmpb.Command {
	return authCmd(&fsmpb.Auth{Op: &fsmpb.Auth_RevokePermission{RevokePermission: &fsmpb.RolePermission{Role: role,
		Permission: &fsmpb.AuthPermission{Kind: uint32(kind), Access: uint32(access), Prefix: prefix}}}})
}

func applyAll(t *testing.T, s *fsm.State, cmds ...*fsmpb.Command) {
	t.Helper()
	for _, c := range cmds {
		if res := s.Apply(c); res.Err != nil {
			t.Fatalf("%v: %v", c, res.Err)
		}
	}
}

// TestAuthorize is the permission check as a table: prefixes match names
// and ranges, grants from several roles add up, write includes read, and
// root may do everything.
func TestAuthorize(t *testing.T) {
	s := fsm.NewState()
	applyAll(t, s,
		addUser("root"), grantRole("root", fsm.RootRole),
		addUser("app"), addUser("reader"), addUser("nobody"),
		addRole("orders"), addRole("observe"), addRole("ops"),
		grantPerm("orders", fsm.PermLock, fsm.Write, "orders/"),
		grantPerm("orders", fsm.PermKV, fsm.Write, "orders/"),
		grantPerm("observe", fsm.PermLock, fsm.Read, ""),
		grantPerm("observe", fsm.PermKV, fsm.Read, "or"),
		grantPerm("ops", fsm.PermAdmin, fsm.Write, ""),
		grantRole("app", "orders"), grantRole("app", "observe"),
		grantRole("reader", "observe"),
	)
	lock := func(a fsm.Access, p string) fsm.Permission {
		return fsm.Permission{Kind: fsm.PermLock, Access: a, Prefix: p}
	}
	kv := func(a fsm.Access, p string) fsm.Permission {
		return fsm.Permission{Kind: fsm.PermKV, Access: a, Prefix: p}
	}
	admin := fsm.Permission{Kind: fsm.PermAdmin, Access: fsm.Write}
	for _, tc := range []struct {
		user string
		want fsm.Permission
		err  error
	}{
		{"app", lock(fsm.Write, "orders/17"), nil},
		{"app", lock(fsm.Write, "orders/"), nil},
		{"app", lock(fsm.Write, "orders"), fence.ErrPermissionDenied}, // a prefix, not a directory
		{"app", lock(fsm.Write, "jobs/1"), fence.ErrPermissionDenied},
		{"app", lock(fsm.Read, "jobs/1"), nil},    // from observe, overlapping orders
		{"app", lock(fsm.Read, "orders/17"), nil}, // write includes read
		{"app", kv(fsm.Read, "orders/17"), nil},   // from both roles
		{"app", kv(fsm.Read, "ordinal"), nil},     // observe's "or"
		{"app", kv(fsm.Write, "ordinal"), fence.ErrPermissionDenied},
		{"app", kv(fsm.Read, "o"), fence.ErrPermissionDenied}, // a range wider than any grant
		{"app", kv(fsm.Read, ""), fence.ErrPermissionDenied},
		{"app", admin, fence.ErrPermissionDenied},
		{"reader", lock(fsm.Read, ""), nil},
		{"reader", lock(fsm.Write, "orders/17"), fence.ErrPermissionDenied},
		{"reader", kv(fsm.Write, "orders/17"), fence.ErrPermissionDenied},
		{"nobody", lock(fsm.Read, "x"), fence.ErrPermissionDenied},
		{"ghost", lock(fsm.Read, "x"), fence.ErrAuthFailed},
		{"root", admin, nil},
		{"root", kv(fsm.Write, ""), nil},
	} {
		err := s.Authorize(tc.user, tc.want)
		if (tc.err == nil) != (err == nil) || (tc.err != nil && !errors.Is(err, tc.err)) {
			t.Errorf("Authorize(%q, %s) = %v, want %v", tc.user, tc.want, err, tc.err)
		}
	}

	// Revocations take effect at once: the next check is refused.
	applyAll(t, s, revokePerm("orders", fsm.PermLock, fsm.Write, "orders/"))
	if err := s.Authorize("app", lock(fsm.Write, "orders/17")); !errors.Is(err, fence.ErrPermissionDenied) {
		t.Errorf("after revoking the permission: %v", err)
	}
	applyAll(t, s, revokeRole("app", "observe"))
	if err := s.Authorize("app", lock(fsm.Read, "jobs/1")); !errors.Is(err, fence.ErrPermissionDenied) {
		t.Errorf("after revoking the role: %v", err)
	}
	applyAll(t, s, grantRole("app", "ops"), removeRole("ops"))
	if err := s.Authorize("app", admin); !errors.Is(err, fence.ErrPermissionDenied) {
		t.Errorf("after removing the role: %v", err)
	}
	if err := s.Authorize("app", kv(fsm.Write, "orders/1")); err != nil {
		t.Errorf("a grant not revoked: %v", err)
	}
}

// TestAuthEnableNeedsRoot: enabling is refused, changing nothing, until
// user root has role root; then root cannot be removed or demoted.
func TestAuthEnableNeedsRoot(t *testing.T) {
	s := fsm.NewState()
	enable := setEnabled(true)
	for _, setup := range []*fsmpb.Command{nil, addUser("root")} {
		if setup != nil {
			applyAll(t, s, setup)
		}
		before := snapshotBytes(t, s)
		if res := s.Apply(enable); !errors.Is(res.Err, fence.ErrInvalidArgument) || s.AuthEnabled() {
			t.Fatalf("enable without root in role root: %v, enabled %v", res.Err, s.AuthEnabled())
		}
		if !bytes.Equal(before, snapshotBytes(t, s)) {
			t.Fatal("a refused enable changed the state")
		}
	}
	applyAll(t, s, grantRole("root", "root"), enable)
	if !s.AuthEnabled() {
		t.Fatal("not enabled")
	}
	for _, c := range []*fsmpb.Command{revokeRole("root", "root"), removeUser("root")} {
		if res := s.Apply(c); !errors.Is(res.Err, fence.ErrInvalidArgument) {
			t.Errorf("%v while enabled: %v", c, res.Err)
		}
	}
}

// TestAuthSnapshot: the auth state survives Snapshot and Restore, token
// hashes included.
func TestAuthSnapshot(t *testing.T) {
	s := fsm.NewState()
	hash := bytes.Repeat([]byte{7}, fsm.TokenHashBytes)
	applyAll(t, s, addUser("root"), grantRole("root", "root"), addRole("r"), grantPerm("r", fsm.PermKV, fsm.Read, "a/"),
		addUser("u"), grantRole("u", "r"),
		authCmd(&fsmpb.Auth{Op: &fsmpb.Auth_CreateToken{CreateToken: &fsmpb.AuthToken{SecretSha256: hash, User: "u", CreatedUnixNs: 5, ExpiresUnixNs: 9, Description: "ci"}}}),
		setEnabled(true))
	r, err := fsm.Restore(s.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(snapshotBytes(t, s), snapshotBytes(t, r)) {
		t.Fatal("restored state differs")
	}
	tok, ok := r.TokenByHash([fsm.TokenHashBytes]byte(hash))
	if !ok || tok.User != "u" || tok.ExpiresUnixNs != 9 || tok.Description != "ci" || !r.AuthEnabled() {
		t.Fatalf("restored token %+v %v, enabled %v", tok, ok, r.AuthEnabled())
	}
	if err := r.Authorize("u", fsm.Permission{Kind: fsm.PermKV, Access: fsm.Read, Prefix: "a/b"}); err != nil {
		t.Fatal(err)
	}
}
