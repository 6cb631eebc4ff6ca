package client

import (
	"context"
	"fmt"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
)

// TxnResponse is what a txn did: Succeeded says which list ran, Revision
// is the store's revision after it (the mod revision of every key it
// wrote), and Results answers each operation of the list that ran, in
// order (GetResults()[i].GetGet().GetKv() for a get).
type TxnResponse = fencev1.TxnResponse

// Txn is a transaction on the KV store, built as etcd's is: If takes the
// compares, Then the operations to run if every one holds, Else those to
// run otherwise, and Commit sends it. Its writes apply in one commit, at
// one revision, or not at all. A Txn is not safe for concurrent use; build
// one per call.
type Txn struct {
	kv    *KV
	ctx   context.Context
	req   *fencev1.TxnRequest
	stage int // 0 before If, 1 after If, 2 after Then, 3 after Else
	err   error
}

// Txn starts a transaction, bounded by ctx (its Commit is). opts fence
// every write of it, as Put's do: WithGrant or FencedBy, and Strict. A
// stale token refuses the whole txn (fence.ErrStaleToken, naming the
// key), and none of it applies. Bind a put to a session with OpPut's
// BoundTo; IfRevision has no place here (compare ModRevision instead).
func (k *KV) Txn(ctx context.Context, opts ...WriteOption) *Txn {
	o := writeOpts(opts)
	t := &Txn{kv: k, ctx: ctx, req: &fencev1.TxnRequest{Fence: &o.fence}}
	switch {
	case o.fence.ExpectRevision != nil:
		t.err = fmt.Errorf("%w: a txn takes no IfRevision: compare the key's ModRevision in If", fence.ErrInvalidArgument)
	case o.session != 0:
		t.err = fmt.Errorf("%w: bind a txn's puts to a session with OpPut(key, value, BoundTo(s))", fence.ErrInvalidArgument)
	}
	return t
}

// If adds compares: Then runs if every one holds, Else otherwise. It may
// be called once, before Then and Else.
func (t *Txn) If(cs ...Cmp) *Txn {
	t.advance(1, "If")
	for _, c := range cs {
		if c.err != nil && t.err == nil {
			t.err = c.err
		}
		t.req.Compares = append(t.req.Compares, c.c)
	}
	return t
}

// Then adds the operations to run if every compare holds. It may be
// called once, after If (if at all) and before Else.
func (t *Txn) Then(ops ...Op) *Txn {
	t.advance(2, "Then")
	t.req.Then = t.ops(ops)
	return t
}

// Else adds the operations to run if a compare does not hold. It may be
// called once, last.
func (t *Txn) Else(ops ...Op) *Txn {
	t.advance(3, "Else")
	t.req.Else = t.ops(ops)
	return t
}

// advance moves the builder to stage, noting a call out of order.
func (t *Txn) advance(stage int, name string) {
	if stage <= t.stage && t.err == nil {
		t.err = fmt.Errorf("%w: Txn.%s called out of order (If, then Then, then Else, each once)", fence.ErrInvalidArgument, name)
	}
	t.stage = stage
}

func (t *Txn) ops(ops []Op) []*fencev1.TxnOp {
	out := make([]*fencev1.TxnOp, 0, len(ops))
	for _, op := range ops {
		if op.err != nil && t.err == nil {
			t.err = op.err
		}
		out = append(out, op.op)
	}
	return out
}

// Commit sends the txn and returns what it did. A compare that does not
// hold is no error: Else ran, and Succeeded is false. A refused write (a
// stale token, fence.ErrStaleToken; strict mode, fence.ErrNotHolder; a
// limit, fence.ErrLimit) fails the whole txn: nothing of it applied. A
// group that still runs an older version of fence on some member fails
// it with fence.ErrUnsupported.
//
// A retry after a lost answer is applied once: every attempt carries the
// call's idempotency key. A retry that finds the txn applied answers
// AlreadyApplied with the first application's Succeeded and Revision, and
// no Results (read the keys again if you need them). A call that fails
// with fence.ErrUnavailable may or may not have applied.
func (t *Txn) Commit() (*TxnResponse, error) {
	if t.err != nil {
		return nil, t.err
	}
	once := newIdempotencyKey()
	var out *TxnResponse
	err := t.kv.c.unary(t.ctx, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.kv.Txn(ctx, keyed(t.req, once))
		if err == nil {
			out = resp.Msg
		}
		return err
	})
	return out, err
}

// Cmp is one compare of a txn: a key's Value, Version, CreateRevision or
// ModRevision with Compare, or Absent and Exists on their own.
type Cmp struct {
	c   *fencev1.Compare
	err error
}

// Value is a key's value, to Compare with a string or []byte. A missing
// key fails every value compare.
func Value(key string) Cmp {
	return operand(&fencev1.Compare{Key: key, Target: &fencev1.Compare_Value{}})
}

// Version is a key's version (its writes since it was created; 0 for a
// missing key), to Compare with a number.
func Version(key string) Cmp {
	return operand(&fencev1.Compare{Key: key, Target: &fencev1.Compare_Version{}})
}

// CreateRevision is the revision a key was created at (0 for a missing
// key), to Compare with a number.
func CreateRevision(key string) Cmp {
	return operand(&fencev1.Compare{Key: key, Target: &fencev1.Compare_CreateRevision{}})
}

// ModRevision is the revision of a key's last write (0 for a missing
// key), to Compare with a number.
func ModRevision(key string) Cmp {
	return operand(&fencev1.Compare{Key: key, Target: &fencev1.Compare_ModRevision{}})
}

// operand is a key's side of a compare, which Compare completes.
func operand(c *fencev1.Compare) Cmp {
	return Cmp{c: c, err: fmt.Errorf("%w: compare on key %s has no op and operand: pass it to Compare", fence.ErrInvalidArgument, c.GetKey())}
}

// Absent holds when key does not exist.
func Absent(key string) Cmp {
	return Cmp{c: &fencev1.Compare{Key: key, Target: &fencev1.Compare_Absent{Absent: true}}}
}

// Exists holds when key exists.
func Exists(key string) Cmp {
	return Cmp{c: &fencev1.Compare{Key: key, Target: &fencev1.Compare_Absent{Absent: false}}}
}

// compareOps are the ops Compare takes.
var compareOps = map[string]fencev1.CompareOp{
	"=": fencev1.CompareOp_COMPARE_OP_EQUAL, "!=": fencev1.CompareOp_COMPARE_OP_NOT_EQUAL,
	"<": fencev1.CompareOp_COMPARE_OP_LESS, ">": fencev1.CompareOp_COMPARE_OP_GREATER,
}

// Compare compares what c names with v, by op: "=", "!=", "<" or ">"
// (c op v). v is a string or []byte for a Value (compared byte by byte),
// an integer for the others. A bad op or operand fails the txn's Commit
// with fence.ErrInvalidArgument.
func Compare(c Cmp, op string, v any) Cmp {
	out := &fencev1.Compare{Key: c.c.GetKey()}
	bad := func(format string, args ...any) Cmp {
		return Cmp{c: out, err: fmt.Errorf("%w: compare on key %s: %s", fence.ErrInvalidArgument, out.Key, fmt.Sprintf(format, args...))}
	}
	o, ok := compareOps[op]
	if !ok {
		return bad("op %q is none of =, !=, <, >", op)
	}
	out.Op = o
	if _, absent := c.c.GetTarget().(*fencev1.Compare_Absent); absent {
		return bad("Absent and Exists take no Compare")
	}
	if _, isValue := c.c.GetTarget().(*fencev1.Compare_Value); isValue {
		switch v := v.(type) {
		case string:
			out.Target = &fencev1.Compare_Value{Value: []byte(v)}
		case []byte:
			out.Target = &fencev1.Compare_Value{Value: v}
		default:
			return bad("a value compares with a string or []byte, not %T", v)
		}
		return Cmp{c: out}
	}
	n, ok := number(v)
	if !ok {
		return bad("a version or revision compares with a non-negative integer, not %v (%T)", v, v)
	}
	switch c.c.GetTarget().(type) {
	case *fencev1.Compare_Version:
		out.Target = &fencev1.Compare_Version{Version: n}
	case *fencev1.Compare_CreateRevision:
		out.Target = &fencev1.Compare_CreateRevision{CreateRevision: n}
	case *fencev1.Compare_ModRevision:
		out.Target = &fencev1.Compare_ModRevision{ModRevision: n}
	default:
		return bad("compare Value, Version, CreateRevision or ModRevision of a key")
	}
	return Cmp{c: out}
}

// number converts an integer operand.
func number(v any) (uint64, bool) {
	switch n := v.(type) {
	case int:
		return uint64(n), n >= 0
	case int64:
		return uint64(n), n >= 0
	case uint64:
		return n, true
	case uint32:
		return uint64(n), true
	case uint:
		return uint64(n), true
	}
	return 0, false
}

// Op is one operation of a txn: OpPut, OpDelete or OpGet.
type Op struct {
	op  *fencev1.TxnOp
	err error
}

// OpPut writes value under key, fenced by the txn's options. BoundTo
// binds the key to a session, as for Put; other options belong to the
// txn (KV.Txn), not to its puts.
func OpPut(key string, value []byte, opts ...WriteOption) Op {
	o := writeOpts(opts)
	put := &fencev1.TxnPut{Key: key, Value: value, SessionId: o.session, SessionSecret: o.secret}
	op := Op{op: &fencev1.TxnOp{Op: &fencev1.TxnOp_Put{Put: put}}}
	if o.fence.Lock != "" || o.fence.Token != 0 || o.fence.Strict || o.fence.ExpectRevision != nil {
		op.err = fmt.Errorf("%w: OpPut of key %s: fence the txn (KV.Txn's options), not its puts", fence.ErrInvalidArgument, key)
	}
	return op
}

// OpDelete removes key, fenced by the txn's options; its result says
// whether the key existed.
func OpDelete(key string) Op {
	return Op{op: &fencev1.TxnOp{Op: &fencev1.TxnOp_Delete{Delete: &fencev1.TxnDelete{Key: key}}}}
}

// OpGet reads key as the operations before it in the txn left it.
func OpGet(key string) Op {
	return Op{op: &fencev1.TxnOp{Op: &fencev1.TxnOp_Get{Get: &fencev1.TxnGet{Key: key}}}}
}
