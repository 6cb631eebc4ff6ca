package client

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
)

// A txn built out of order, or with a compare or an operation it cannot
// send, fails at Commit with ErrInvalidArgument saying what, and sends
// nothing.
func TestTxnBuilderRefusesMisuse(t *testing.T) {
	c := clientOfNewServer(t)
	ctx := context.Background()
	kv := c.KV()
	s := mustSession(t, c, 10*time.Second)
	put := OpPut("k", []byte("v"))
	for _, tc := range []struct {
		name string
		txn  *Txn
		msg  string
	}{
		{"If after Then", kv.Txn(ctx).Then(put).If(Absent("k")), "Txn.If called out of order"},
		{"Then twice", kv.Txn(ctx).Then(put).Then(put), "Txn.Then called out of order"},
		{"Else before Then, then Then", kv.Txn(ctx).Else(put).Then(put), "Txn.Then called out of order"},
		{"a compare without Compare", kv.Txn(ctx).If(Value("k")).Then(put), "pass it to Compare"},
		{"a bad op", kv.Txn(ctx).If(Compare(Version("k"), "==", 1)).Then(put), `op "==" is none of`},
		{"a value compared with a number", kv.Txn(ctx).If(Compare(Value("k"), "=", 1)).Then(put), "not int"},
		{"a revision compared with a string", kv.Txn(ctx).If(Compare(ModRevision("k"), "<", "3")).Then(put), "non-negative integer"},
		{"a negative version", kv.Txn(ctx).If(Compare(Version("k"), ">", -1)).Then(put), "non-negative integer"},
		{"Absent compared", kv.Txn(ctx).If(Compare(Absent("k"), "=", 0)).Then(put), "take no Compare"},
		{"a fenced put", kv.Txn(ctx).Then(OpPut("k", nil, FencedBy("l", 1))), "fence the txn"},
		{"IfRevision on the txn", kv.Txn(ctx, IfRevision(0)).Then(put), "no IfRevision"},
		{"BoundTo on the txn", kv.Txn(ctx, BoundTo(s)).Then(put), "OpPut(key, value, BoundTo(s))"},
	} {
		if _, err := tc.txn.Commit(); !errors.Is(err, fence.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want ErrInvalidArgument saying %q", tc.name, err, tc.msg)
		}
	}
	if l, err := kv.List(ctx, ""); err != nil || l.Revision != 0 {
		t.Fatalf("after refused txns: %v, %v; want nothing written", l, err)
	}
}

// Each compare the builder makes holds as etcd's does, a put bound with
// BoundTo goes with its session, and the results answer the list that
// ran.
func TestTxnCommit(t *testing.T) {
	c := clientOfNewServer(t)
	ctx := context.Background()
	kv := c.KV()
	mustPut(t, ctx, kv, "k", []byte("b"))
	s := mustSession(t, c, 10*time.Second)
	for _, tc := range []struct {
		cmp  Cmp
		want bool
	}{
		{Compare(Value("k"), "=", "b"), true}, {Compare(Value("k"), "=", []byte("c")), false}, {Compare(Value("k"), "<", "c"), true},
		{Compare(Value("k"), "!=", "b"), false}, {Compare(Value("none"), "!=", "b"), false},
		{Compare(Version("k"), "=", 1), true}, {Compare(CreateRevision("k"), ">", uint64(0)), true}, {Compare(ModRevision("k"), "<", int64(1)), false},
		{Absent("none"), true}, {Absent("k"), false}, {Exists("k"), true}, {Exists("none"), false},
	} {
		resp, err := kv.Txn(ctx).If(tc.cmp).Commit()
		if err != nil || resp.GetSucceeded() != tc.want {
			t.Errorf("compare %v: %v, %v; want succeeded %v", tc.cmp.c, resp, err, tc.want)
		}
	}
	resp, err := kv.Txn(ctx).If(Exists("k")).
		Then(OpPut("svc/a", []byte("up"), BoundTo(s)), OpDelete("k"), OpGet("svc/a")).
		Else(OpGet("k")).Commit()
	if err != nil {
		t.Fatal(err)
	}
	res := resp.GetResults()
	if !resp.GetSucceeded() || len(res) != 3 || res[0].GetPut().GetRevision() != resp.GetRevision() || !res[1].GetDelete().GetDeleted() ||
		res[2].GetGet().GetKv().GetSessionId() != s.ID() {
		t.Fatalf("txn answered %v", resp)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := kv.Get(ctx, "svc/a"); err != nil || got != nil {
		t.Fatalf("svc/a after its session closed: %v, %v", got, err)
	}
}

// A node of a version without Txn answers Unimplemented: the client
// reports fence.ErrUnsupported, as for a group at an older protocol.
func TestTxnOnANodeWithoutIt(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle(fencev1connect.NewKVServiceHandler(fencev1connect.UnimplementedKVServiceHandler{}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: mux}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	c := mustNew(t, WithEndpoints(ln.Addr().String()))
	_, err = c.KV().Txn(context.Background()).Then(OpGet("k")).Commit()
	if !errors.Is(err, fence.ErrUnsupported) {
		t.Fatalf("txn on a node without Txn: %v, want ErrUnsupported", err)
	}
}
