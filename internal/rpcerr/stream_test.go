package rpcerr

import (
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
)

// An error answered on a stream maps to the same sentinel, code, message
// and typed fields as the same error answered to a unary call.
func TestStreamErrorsMatchUnaryErrors(t *testing.T) {
	errs := []error{
		fmt.Errorf("%w: lock name is empty", fence.ErrInvalidArgument),
		&fence.LockedError{Lock: "orders", HolderSession: 7, HolderToken: 33},
		&fence.StaleTokenError{Key: "k", Token: 3, Highest: 4},
		&DetailError{Err: fmt.Errorf("%w: not the leader", fence.ErrUnavailable), Detail: Detail{LeaderAddress: "10.0.0.2:7420"}},
		fmt.Errorf("%w: wrong secret", fence.ErrSessionSecret),
		fmt.Errorf("%w: user bob needs lock write", fence.ErrPermissionDenied),
		fmt.Errorf("%w: disk", fence.ErrDiskFull),
		errors.New("no sentinel at all"),
	}
	for _, err := range errs {
		unary := FromConnect(ToConnect(err))
		stream := FromStream(ToStream(err))
		var u, s *RemoteError
		if !errors.As(unary, &u) || !errors.As(stream, &s) {
			t.Fatalf("%v: not remote errors: %T %T", err, unary, stream)
		}
		if u.Code != s.Code || u.Message != s.Message || u.Detail.String() != s.Detail.String() {
			t.Errorf("%v: unary %v %q %v, stream %v %q %v", err, u.Code, u.Message, u.Detail, s.Code, s.Message, s.Detail)
		}
		if fmt.Sprint(errors.Unwrap(unary)) != fmt.Sprint(errors.Unwrap(stream)) {
			t.Errorf("%v: sentinels differ: %v and %v", err, errors.Unwrap(unary), errors.Unwrap(stream))
		}
	}
	// An error that is a Connect error already keeps its code and detail.
	ce := ToConnect(fmt.Errorf("%w: x", fence.ErrLocked)).(*connect.Error)
	if got := FromStream(ToStream(ce)); !errors.Is(got, fence.ErrLocked) {
		t.Errorf("a Connect error on a stream: %v", got)
	}
	var locked *fence.LockedError
	if !errors.As(FromStream(ToStream(errs[1])), &locked) || locked.HolderSession != 7 || locked.HolderToken != 33 {
		t.Errorf("LockedError lost its holder: %+v", locked)
	}
}
