package server

import (
	"context"

	"connectrpc.com/connect"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// RevokeSession implements fencev1connect.ClusterServiceHandler: an
// operator ends a session without its secret, as if it had expired,
// releasing its locks to their next waiters after the lock-delay their
// holders asked for (fence sessions revoke). It is an admin call, like
// the membership calls, and every one is logged.
func (s handlers) RevokeSession(ctx context.Context, req *connect.Request[fencev1.RevokeSessionRequest]) (*connect.Response[fencev1.RevokeSessionResponse], error) {
	id := req.Msg.GetSessionId()
	res, err := s.apply(endSession(s.fsm.Protocol(), id, fsmpb.SessionEnd_SESSION_END_REVOKED))
	if err != nil {
		return nil, err
	}
	if len(res.Effects.Ended) > 0 { // a retry, or a session gone already, ends none
		s.logger.Warn("session revoked by an operator", "session", id, "delayed", len(res.Effects.Delayed), "from", req.Peer().Addr)
	}
	return connect.NewResponse(&fencev1.RevokeSessionResponse{}), nil
}

// endSession returns the command that ends session id as end says, for a
// group at protocol: below Protocol3, whose members may not know
// CloseSession's end, a revoke or an abandonment goes as ExpireSessions,
// which puts the same lock-delays in force on every version (and is
// recorded as an expiry).
func endSession(protocol uint32, id uint64, end fsmpb.SessionEnd) *fsmpb.Command {
	if end != fsmpb.SessionEnd_SESSION_END_CLOSED && protocol < fsm.Protocol3 {
		return &fsmpb.Command{Op: &fsmpb.Command_ExpireSessions{ExpireSessions: &fsmpb.ExpireSessions{SessionIds: []uint64{id}}}}
	}
	return &fsmpb.Command{Op: &fsmpb.Command_CloseSession{CloseSession: &fsmpb.CloseSession{SessionId: id, End: end}}}
}
