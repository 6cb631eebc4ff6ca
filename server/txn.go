package server

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// Txn implements fencev1connect.KVServiceHandler.
func (s handlers) Txn(ctx context.Context, req *connect.Request[fencev1.TxnRequest]) (*connect.Response[fencev1.TxnResponse], error) {
	return respond(s.txn(ctx, req.Msg, req.Header().Get(fencev1.IdempotencyKeyHeader)))
}

// txn is Txn with the call's idempotency key ("" for none).
func (s *Server) txn(ctx context.Context, m *fencev1.TxnRequest, idempotencyKey string) (*fencev1.TxnResponse, error) {
	cmd, err := s.txnCommand(m)
	if err != nil {
		return nil, err
	}
	key, err := checkIdempotencyKey(idempotencyKey)
	if err != nil {
		return nil, err
	}
	if err := s.authorizeTxnSessions(m); err != nil {
		return nil, err
	}
	if err := s.checkProtocol(fsm.Protocol5, "a KV txn"); err != nil {
		return nil, err
	}
	cmd.MaxKeys, cmd.User = uint64(s.cfg.MaxKeys), s.callerUser(ctx)
	res, err := s.apply(&fsmpb.Command{IdempotencyKey: key, Op: &fsmpb.Command_KvTxn{KvTxn: cmd}})
	if err != nil {
		return nil, err
	}
	if r, ok := res.Repeat(); ok {
		return &fencev1.TxnResponse{Succeeded: r.Succeeded, Revision: r.Revision, AlreadyApplied: true}, nil
	}
	return txnResponse(cmd, res.Txn()), nil
}

// checkProtocol refuses, on a ready leader, what needs a newer group
// protocol than the group runs: a member that does not know the command
// would stop at it. A node that is not ready leaves the answer to apply.
func (s *Server) checkProtocol(need uint32, what string) error {
	if !s.leaderReady.Load() {
		return nil
	}
	if have := s.fsm.Protocol(); have < need {
		return fmt.Errorf("%w: %s needs group protocol %d, and the group runs protocol %d: some member runs an older version of fence. "+
			"Upgrade every member (fence status shows each one's protocol); the group moves to the newer protocol by itself", fence.ErrUnsupported, what, need, have)
	}
	return nil
}

// txnCommand validates a txn at the edge (names, sizes, limits, the shape
// the state machine would refuse) and converts it for the state machine.
func (s *Server) txnCommand(m *fencev1.TxnRequest) (*fsmpb.KVTxn, error) {
	if n := len(m.GetCompares()) + len(m.GetThen()) + len(m.GetElse()); n > s.cfg.MaxTxnOps {
		return nil, invalid("the txn has %d operations, compares included, over the limit of %d", n, s.cfg.MaxTxnOps)
	}
	f, err := s.kvFence(m.GetFence())
	if err != nil {
		return nil, err
	}
	if f.ExpectRevision != nil {
		return nil, invalid("a txn's fence takes no expect_revision: compare the keys' mod_revision instead")
	}
	out := &fsmpb.KVTxn{Fence: f}
	size := 0
	for i, c := range m.GetCompares() {
		cmp, err := s.txnCompare(fmt.Sprintf("compares[%d]", i), c)
		if err != nil {
			return nil, err
		}
		size += len(c.GetKey()) + len(c.GetValue())
		out.Compares = append(out.Compares, cmp)
	}
	for _, list := range []struct {
		name string
		ops  []*fencev1.TxnOp
		to   *[]*fsmpb.KVTxnOp
	}{{"then", m.GetThen(), &out.Then}, {"else", m.GetElse(), &out.Else}} {
		written := map[string]bool{}
		for i, op := range list.ops {
			what := fmt.Sprintf("%s[%d]", list.name, i)
			o, key, write, err := s.txnOp(what, op)
			if err != nil {
				return nil, err
			}
			if write && written[key] {
				return nil, invalid("%s writes key %s, which the list writes before it: a txn writes a key at most once in each list", what, key)
			}
			written[key] = written[key] || write
			size += len(key) + len(op.GetPut().GetValue())
			*list.to = append(*list.to, o)
		}
	}
	if size > s.cfg.MaxTxnBytes {
		return nil, invalid("the txn's keys and values are %d bytes, over the limit of %d", size, s.cfg.MaxTxnBytes)
	}
	return out, nil
}

// txnCompare validates one compare (what names it in errors).
func (s *Server) txnCompare(what string, c *fencev1.Compare) (*fsmpb.KVCompare, error) {
	if err := checkText(what+".key", c.GetKey(), s.cfg.MaxKeyBytes, true); err != nil {
		return nil, err
	}
	if _, ok := fencev1.CompareOp_name[int32(c.GetOp())]; !ok {
		return nil, invalid("%s.op %d is no compare op", what, c.GetOp())
	}
	out := &fsmpb.KVCompare{Key: c.GetKey(), Op: fsmpb.KVCompareOp(c.GetOp())}
	switch t := c.GetTarget().(type) {
	case *fencev1.Compare_Value:
		if len(t.Value) > s.cfg.MaxValueBytes {
			return nil, invalid("%s.value is %d bytes, over the limit of %d", what, len(t.Value), s.cfg.MaxValueBytes)
		}
		out.Target, out.Value = fsmpb.KVCompareTarget_KV_COMPARE_TARGET_VALUE, t.Value
	case *fencev1.Compare_Version:
		out.Target, out.Number = fsmpb.KVCompareTarget_KV_COMPARE_TARGET_VERSION, t.Version
	case *fencev1.Compare_CreateRevision:
		out.Target, out.Number = fsmpb.KVCompareTarget_KV_COMPARE_TARGET_CREATE_REVISION, t.CreateRevision
	case *fencev1.Compare_ModRevision:
		out.Target, out.Number = fsmpb.KVCompareTarget_KV_COMPARE_TARGET_MOD_REVISION, t.ModRevision
	case *fencev1.Compare_Absent:
		if c.GetOp() != fencev1.CompareOp_COMPARE_OP_EQUAL {
			return nil, invalid("%s compares absent, whose op is COMPARE_OP_EQUAL: absent false holds when the key exists", what)
		}
		out.Target = fsmpb.KVCompareTarget_KV_COMPARE_TARGET_ABSENT
		if !t.Absent {
			out.Op = fsmpb.KVCompareOp_KV_COMPARE_OP_NOT_EQUAL
		}
	default:
		return nil, invalid("%s names nothing to compare: set one of value, version, create_revision, mod_revision, absent", what)
	}
	return out, nil
}

// txnOp validates one operation (what names it in errors) and returns it
// converted, its key, and whether it writes the key.
func (s *Server) txnOp(what string, op *fencev1.TxnOp) (out *fsmpb.KVTxnOp, key string, write bool, err error) {
	switch o := op.GetOp().(type) {
	case *fencev1.TxnOp_Put:
		key = o.Put.GetKey()
		if err := checkText(what+".put.key", key, s.cfg.MaxKeyBytes, true); err != nil {
			return nil, "", false, err
		}
		if n := len(o.Put.GetValue()); n > s.cfg.MaxValueBytes {
			return nil, "", false, invalid("%s.put.value is %d bytes, over the limit of %d", what, n, s.cfg.MaxValueBytes)
		}
		put := &fsmpb.KVTxnPut{Key: key, Value: o.Put.GetValue(), SessionId: o.Put.GetSessionId()}
		return &fsmpb.KVTxnOp{Op: &fsmpb.KVTxnOp_Put{Put: put}}, key, true, nil
	case *fencev1.TxnOp_Delete:
		key = o.Delete.GetKey()
		if err := checkText(what+".delete.key", key, s.cfg.MaxKeyBytes, true); err != nil {
			return nil, "", false, err
		}
		return &fsmpb.KVTxnOp{Op: &fsmpb.KVTxnOp_Delete{Delete: key}}, key, true, nil
	case *fencev1.TxnOp_Get:
		key = o.Get.GetKey()
		if err := checkText(what+".get.key", key, s.cfg.MaxKeyBytes, true); err != nil {
			return nil, "", false, err
		}
		return &fsmpb.KVTxnOp{Op: &fsmpb.KVTxnOp_Get{Get: key}}, key, false, nil
	}
	return nil, "", false, invalid("%s is no operation: set one of put, delete, get", what)
}

// authorizeTxnSessions checks the secret of every session a txn's puts
// bind keys to: binding a key to a session acts as the session.
func (s *Server) authorizeTxnSessions(m *fencev1.TxnRequest) error {
	checked := map[uint64]string{}
	for _, list := range [][]*fencev1.TxnOp{m.GetThen(), m.GetElse()} {
		for _, op := range list {
			id, secret := op.GetPut().GetSessionId(), op.GetPut().GetSessionSecret()
			if id == 0 {
				continue
			}
			if have, ok := checked[id]; ok && have == secret {
				continue
			}
			if err := s.authorizeSession(id, secret); err != nil {
				return err
			}
			checked[id] = secret
		}
	}
	return nil
}

// txnResponse answers a txn the state machine applied as ans.
func txnResponse(cmd *fsmpb.KVTxn, ans fsm.TxnAnswer) *fencev1.TxnResponse {
	out := &fencev1.TxnResponse{Succeeded: ans.Succeeded, Revision: ans.Revision}
	list := cmd.GetThen()
	if !ans.Succeeded {
		list = cmd.GetElse()
	}
	for i, op := range list {
		var r fencev1.TxnResult
		answer := ans.Ops[i]
		switch op.GetOp().(type) {
		case *fsmpb.KVTxnOp_Put:
			r.Result = &fencev1.TxnResult_Put{Put: &fencev1.PutResponse{Revision: ans.Revision}}
		case *fsmpb.KVTxnOp_Delete:
			r.Result = &fencev1.TxnResult_Delete{Delete: &fencev1.DeleteResponse{Deleted: answer.Deleted, Revision: ans.Revision}}
		case *fsmpb.KVTxnOp_Get:
			get := &fencev1.GetResponse{Found: answer.Found, Revision: ans.Revision}
			if answer.Found {
				get.Kv = apiKV(answer.KV)
			}
			r.Result = &fencev1.TxnResult_Get{Get: get}
		}
		out.Results = append(out.Results, &r)
	}
	return out
}
