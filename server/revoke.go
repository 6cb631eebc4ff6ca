package server

import (
	"context"

	"connectrpc.com/connect"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/fsmpb"
)

// RevokeSession implements fencev1connect.ClusterServiceHandler: an
// operator ends a session without its secret, releasing its locks to
// their next waiters (fence sessions revoke). It is an admin call, like
// the membership calls, and every one is logged.
func (s *Server) RevokeSession(ctx context.Context, req *connect.Request[fencev1.RevokeSessionRequest]) (*connect.Response[fencev1.RevokeSessionResponse], error) {
	id := req.Msg.GetSessionId()
	res, err := s.apply(&fsmpb.Command{Op: &fsmpb.Command_CloseSession{CloseSession: &fsmpb.CloseSession{SessionId: id}}})
	if err != nil {
		return nil, err
	}
	if len(res.Ended) > 0 { // a retry, or a session gone already, ends none
		s.logger.Warn("session revoked by an operator", "session", id, "from", req.Peer().Addr)
	}
	return connect.NewResponse(&fencev1.RevokeSessionResponse{}), nil
}
