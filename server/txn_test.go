package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// compact is JSON without the spaces the API's encoder puts in at random
// from build to build (none of these answers has a space in a value).
func compact(json string) string { return strings.Join(strings.Fields(json), "") }

// mustGet reads a key through c, nil when it does not exist.
func mustGet(t *testing.T, c *client.Client, key string) *fencev1.KeyValue {
	t.Helper()
	kv, err := c.KV().Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// A txn's compares pick its list, its writes share one revision and reach
// a watch together, at that revision, and its gets read what came before
// them; curl's JSON gets the same answers.
func TestTxnOnARealNode(t *testing.T) {
	s := startTestServer(t, nil)
	c := mustClient(t, s, "")
	ctx := context.Background()
	kv := c.KV()
	if _, err := kv.Put(ctx, "cfg/a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, "cfg/")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	resp, err := kv.Txn(ctx).
		If(client.Compare(client.Value("cfg/a"), "=", "1"), client.Absent("cfg/b")).
		Then(client.OpPut("cfg/a", []byte("2")), client.OpPut("cfg/b", []byte("x")), client.OpGet("cfg/a"), client.OpDelete("cfg/none")).
		Else(client.OpGet("cfg/a")).
		Commit()
	if err != nil {
		t.Fatal(err)
	}
	res := resp.GetResults()
	if !resp.GetSucceeded() || resp.GetRevision() != 2 || len(res) != 4 || res[0].GetPut().GetRevision() != 2 ||
		string(res[2].GetGet().GetKv().GetValue()) != "2" || res[3].GetDelete().GetDeleted() {
		t.Fatalf("txn answered %v", resp)
	}
	for _, want := range []string{"cfg/a", "cfg/b"} {
		select {
		case ev := <-w.Events():
			if ev.GetKv().GetKey() != want || ev.GetKv().GetModRevision() != 2 {
				t.Fatalf("watch: %v, want a put of %s at revision 2", ev, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("watch: no event for %s", want)
		}
	}

	// The same compares fail now: else runs, and nothing changes.
	resp, err = kv.Txn(ctx).
		If(client.Compare(client.Value("cfg/a"), "=", "1"), client.Absent("cfg/b")).
		Then(client.OpPut("cfg/a", []byte("3"))).
		Else(client.OpGet("cfg/a")).
		Commit()
	if err != nil || resp.GetSucceeded() || resp.GetRevision() != 2 || string(resp.GetResults()[0].GetGet().GetKv().GetValue()) != "2" {
		t.Fatalf("txn whose compares fail: %v, %v", resp, err)
	}

	// curl: compares by mod revision and existence, then a delete.
	r, body := postJSON(t, s.Addr(), "KVService/Txn", `{"compares":[{"key":"cfg/a","modRevision":"2"},{"key":"cfg/b","absent":false},`+
		`{"key":"cfg/a","op":"COMPARE_OP_GREATER","version":"1"}],"then":[{"delete":{"key":"cfg/b"}},{"get":{"key":"cfg/b"}}]}`)
	if body := compact(body); r.StatusCode != http.StatusOK || !strings.Contains(body, `"succeeded":true`) || !strings.Contains(body, `"deleted":true`) || !strings.Contains(body, `"revision":"3"`) {
		t.Fatalf("curl txn: %d %s", r.StatusCode, body)
	}
	if kv := mustGet(t, c, "cfg/b"); kv != nil {
		t.Fatalf("cfg/b after its delete: %v", kv)
	}
}

// A fenced txn applies whole for the lock's holder and is refused whole,
// naming the key, for a stale token: its first write alone would have
// been accepted, and does not apply either.
func TestTxnFencedAllOrNothing(t *testing.T) {
	s := startTestServer(t, nil)
	c := mustClient(t, s, "")
	ctx := context.Background()
	kv := c.KV()
	a := mustNewSession(t, c)
	ga := mustLock(t, client.NewMutex(a, "acct"))
	move := func(opts []client.WriteOption, from, to string) (*client.TxnResponse, error) {
		return kv.Txn(ctx, opts...).Then(client.OpPut("acct/x", []byte(from)), client.OpPut("acct/y", []byte(to))).Commit()
	}
	if _, err := move([]client.WriteOption{client.WithGrant(ga), client.Strict()}, "10", "0"); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	b := mustNewSession(t, c)
	defer b.Close(ctx)
	gb := mustLock(t, client.NewMutex(b, "acct"))
	// The new holder writes y alone; x still has only a's token.
	if _, err := kv.Put(ctx, "acct/y", []byte("1"), client.WithGrant(gb)); err != nil {
		t.Fatal(err)
	}
	_, err := move([]client.WriteOption{client.FencedBy("acct", ga.Token())}, "9", "2")
	var stale *fence.StaleTokenError
	if !errors.As(err, &stale) || stale.Key != "acct/y" || stale.Token != ga.Token() || stale.Highest != gb.Token() {
		t.Fatalf("a stale holder's txn: %v, want a StaleTokenError for acct/y", err)
	}
	if _, err := move([]client.WriteOption{client.FencedBy("acct", ga.Token()), client.Strict()}, "9", "2"); !errors.Is(err, fence.ErrNotHolder) {
		t.Fatalf("a stale holder's strict txn: %v, want ErrNotHolder", err)
	}
	if x, y := mustGet(t, c, "acct/x"), mustGet(t, c, "acct/y"); string(x.GetValue()) != "10" || string(y.GetValue()) != "1" {
		t.Fatalf("after the refused txns: x %q, y %q; want 10 and 1", x.GetValue(), y.GetValue())
	}
	resp, err := move([]client.WriteOption{client.WithGrant(gb), client.Strict()}, "9", "2")
	if err != nil {
		t.Fatal(err)
	}
	x, y := mustGet(t, c, "acct/x"), mustGet(t, c, "acct/y")
	if string(x.GetValue()) != "9" || string(y.GetValue()) != "2" || x.GetModRevision() != resp.GetRevision() || y.GetModRevision() != resp.GetRevision() || x.GetToken() != gb.Token() {
		t.Fatalf("after the holder's txn: %v, %v", x, y)
	}
}

// The limits on a txn's operations and bytes, its values and max_keys
// are refused at the edge or whole, and nothing applies.
func TestTxnLimits(t *testing.T) {
	s := startTestServer(t, func(c *Config) { c.MaxTxnOps, c.MaxTxnBytes, c.MaxValueBytes, c.MaxKeys = 3, 64, 40, 3 })
	c := mustClient(t, s, "")
	ctx := context.Background()
	kv := c.KV()
	if _, err := kv.Put(ctx, "k1", nil); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 41)
	for _, tc := range []struct {
		name string
		txn  *client.Txn
		want error
		msg  string
	}{
		{"too many operations", kv.Txn(ctx).If(client.Exists("k1")).Then(client.OpPut("a", nil), client.OpPut("b", nil), client.OpPut("c", nil)),
			fence.ErrInvalidArgument, "the txn has 4 operations, compares included, over the limit of 3"},
		{"too many bytes", kv.Txn(ctx).Then(client.OpPut("a", make([]byte, 40)), client.OpPut("b", make([]byte, 30))),
			fence.ErrInvalidArgument, "the txn's keys and values are 72 bytes, over the limit of 64"},
		{"a value too large", kv.Txn(ctx).Then(client.OpPut("a", big)), fence.ErrInvalidArgument, "then[0].put.value is 41 bytes"},
		{"an empty key", kv.Txn(ctx).Then(client.OpGet("a")).Else(client.OpDelete("")), fence.ErrInvalidArgument, "else[0].delete.key is empty"},
		{"a key written twice", kv.Txn(ctx).Then(client.OpPut("a", nil), client.OpDelete("a")), fence.ErrInvalidArgument, "then[1] writes key a"},
		{"max keys", kv.Txn(ctx).Then(client.OpPut("a", nil), client.OpPut("b", nil), client.OpPut("c", nil)), fence.ErrLimit, "over its limit of 3"},
	} {
		_, err := tc.txn.Commit()
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want %v saying %q", tc.name, err, tc.want, tc.msg)
		}
	}
	if l, err := kv.List(ctx, ""); err != nil || len(l.KVs) != 1 || l.Revision != 1 {
		t.Fatalf("after refused txns: %v, %v; want k1 alone at revision 1", l, err)
	}
	// Within the limits, the same shape applies.
	if _, err := kv.Txn(ctx).Then(client.OpPut("a", nil), client.OpDelete("k1")).Commit(); err != nil {
		t.Fatal(err)
	}
}

// With auth on, a txn needs kv read on each key it compares or gets and
// kv write on each it puts or deletes; one missing refuses it whole.
func TestTxnPermissions(t *testing.T) {
	s := startTestServer(t, nil)
	ctx := context.Background()
	root, _ := mustRootClient(t, s)
	appToken := addUser(t, root, "app", perm(client.PermKV, client.Write, "orders/"), perm(client.PermKV, client.Read, "config/"))
	if _, err := root.KV().Put(ctx, "config/mode", []byte("on")); err != nil {
		t.Fatal(err)
	}
	mustAuthEnable(t, root)
	kv := mustClient(t, s, appToken).KV()
	for _, tc := range []struct {
		name string
		txn  *client.Txn
		key  string
	}{
		{"a write outside its prefix", kv.Txn(ctx).Then(client.OpPut("orders/1", nil), client.OpPut("config/mode", nil)), "config/mode"},
		{"a delete in else", kv.Txn(ctx).Then(client.OpPut("orders/1", nil)).Else(client.OpDelete("other")), "other"},
		{"a compare it may not read", kv.Txn(ctx).If(client.Absent("secret")).Then(client.OpPut("orders/1", nil)), "secret"},
		{"a get it may not read", kv.Txn(ctx).Then(client.OpPut("orders/1", nil), client.OpGet("secret")), "secret"},
	} {
		_, err := tc.txn.Commit()
		if !errors.Is(err, fence.ErrPermissionDenied) || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s: %v, want ErrPermissionDenied naming %s", tc.name, err, tc.key)
		}
	}
	if got := mustGet(t, root, "orders/1"); got != nil {
		t.Fatalf("orders/1 was written by a refused txn: %v", got)
	}
	resp, err := kv.Txn(ctx).If(client.Compare(client.Value("config/mode"), "=", "on")).
		Then(client.OpPut("orders/1", []byte("paid")), client.OpGet("orders/1")).Commit()
	if err != nil || !resp.GetSucceeded() {
		t.Fatalf("a txn within its permissions: %v, %v", resp, err)
	}
}

// A txn's puts bound to a session need its secret, and their keys go
// with it; an idempotency key answers a retry without applying it again.
func TestTxnSessionsAndRetries(t *testing.T) {
	_, a := startWithAPI(t, nil)
	ctx := context.Background()
	sid := a.session(10 * time.Second)
	txn := func(secret, key string) (*fencev1.TxnResponse, error) {
		req := connect.NewRequest(&fencev1.TxnRequest{Then: []*fencev1.TxnOp{
			{Op: &fencev1.TxnOp_Put{Put: &fencev1.TxnPut{Key: "svc/n1", Value: []byte("up"), SessionId: sid, SessionSecret: secret}}},
			{Op: &fencev1.TxnOp_Put{Put: &fencev1.TxnPut{Key: "svc/count", Value: []byte("1")}}},
		}})
		if key != "" {
			req.Header().Set(fencev1.IdempotencyKeyHeader, key)
		}
		resp, err := a.kv.Txn(ctx, req)
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	if _, err := txn("wrong", ""); codeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("a bound put with a wrong secret: %v, want Unauthenticated", err)
	}
	first, err := txn(a.secrets.secret(sid), "call-1")
	if err != nil || first.GetAlreadyApplied() || first.GetRevision() != 1 {
		t.Fatalf("first: %v, %v", first, err)
	}
	again, err := txn(a.secrets.secret(sid), "call-1")
	if err != nil || !again.GetAlreadyApplied() || !again.GetSucceeded() || again.GetRevision() != 1 || len(again.GetResults()) != 0 {
		t.Fatalf("retry: %v, %v; want the first's answer, already applied", again, err)
	}
	if _, err := a.sessions.CloseSession(ctx, connect.NewRequest(&fencev1.CloseSessionRequest{SessionId: sid})); err != nil {
		t.Fatal(err)
	}
	got, err := a.kv.List(ctx, connect.NewRequest(&fencev1.ListRequest{Prefix: "svc/"}))
	if err != nil || len(got.Msg.GetKvs()) != 1 || got.Msg.GetKvs()[0].GetKey() != "svc/count" {
		t.Fatalf("after the session closed: %v, %v; want svc/count alone", got, err)
	}
}

// protocol3Backup writes a backup of an empty state of a group at
// protocol 3, as a fence before txns took it, and returns its path.
func protocol3Backup(t *testing.T) string {
	st := fsm.NewState()
	if res := st.Apply(&fsmpb.Command{Op: &fsmpb.Command_SetProtocol{SetProtocol: &fsmpb.SetProtocol{Version: fsm.Protocol3}}}); res.Err != nil {
		t.Fatal(res.Err)
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(st.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	path := filepath.Join(t.TempDir(), "protocol3.fsnap")
	h := SnapshotHeader{NodeID: "old", Version: "before txns", Index: 10, Term: 1, Size: uint64(len(body)), SHA256: hex.EncodeToString(sum[:])}
	if err := WriteSnapshotFile(path, h, bytes.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	return path
}

// A group at protocol 3 (restored from a backup of one, and one of its
// members not up, so that the group cannot agree on a newer protocol)
// refuses a txn, naming the protocols, and applies nothing; once every
// member answers that it speaks protocol 5, the group moves to it and the
// txn applies, at the leader or through a follower.
func TestTxnNeedsProtocol5(t *testing.T) {
	path := protocol3Backup(t)
	c := newCluster(t, 3, nil)
	for _, id := range c.ids {
		if _, err := RestoreSnapshot(c.cfgs[id], path, 0); err != nil {
			t.Fatal(err)
		}
	}
	c.start("n1")
	c.start("n2")
	leader := c.leader()
	time.Sleep(time.Second) // two rounds of hellos: n3 never answers
	if p := leader.fsm.Protocol(); p != fsm.Protocol3 {
		t.Fatalf("the group runs protocol %d with a member that never answered, want 3", p)
	}
	cl := c.client()
	ctx := context.Background()
	txn := func() error {
		_, err := cl.KV().Txn(ctx).Then(client.OpPut("k", []byte("v"))).Commit()
		return err
	}
	err := txn()
	if !errors.Is(err, fence.ErrUnsupported) || !strings.Contains(err.Error(), "a KV txn needs group protocol 5, and the group runs protocol 3") {
		t.Fatalf("txn at protocol 3: %v, want ErrUnsupported naming the protocols", err)
	}
	r, body := postJSON(t, leader.Addr(), "KVService/Txn", `{"then":[{"put":{"key":"k"}}]}`)
	if r.StatusCode != http.StatusBadRequest || !strings.Contains(body, "failed_precondition") || !strings.Contains(body, "REASON_UNSUPPORTED") {
		t.Fatalf("curl txn at protocol 3: %d %s", r.StatusCode, body)
	}
	if kv := mustGet(t, cl, "k"); kv != nil {
		t.Fatalf("a refused txn wrote %v", kv)
	}
	c.start("n3")
	waitFor(t, "the group to move to protocol 5", func() bool { return leader.fsm.Protocol() >= fsm.Protocol5 })
	if err := txn(); err != nil {
		t.Fatal(err)
	}
	// A follower forwards a txn to the leader, as any write.
	r, body = postJSON(t, c.followers(leader)[0].Addr(), "KVService/Txn", `{"compares":[{"key":"k","value":"dg=="}],"then":[{"delete":{"key":"k"}}]}`)
	if body := compact(body); r.StatusCode != http.StatusOK || !strings.Contains(body, `"succeeded":true`) || !strings.Contains(body, `"deleted":true`) {
		t.Fatalf("curl txn at a follower: %d %s", r.StatusCode, body)
	}
}

// The watch history may begin inside a txn's revision once its oldest
// changes are dropped: that revision is no longer kept whole, and a watch
// from it is refused as compacted rather than given part of it.
func TestEventRingKeepsRevisionsWhole(t *testing.T) {
	r := eventRing[fsm.KVEvent]{kind: &kvEvents, maxEvents: 4, maxBytes: 1 << 20}
	push := func(rev uint64, keys ...string) {
		for _, k := range keys {
			r.push(fsm.KVEvent{KV: fsm.KeyValue{Key: k, ModRevision: rev}})
		}
	}
	push(1, "a")
	push(2, "a", "b", "c") // a txn
	if r.floor > 1 {
		t.Fatalf("floor = %d with nothing dropped, want at most 1", r.floor)
	}
	push(3, "d") // drops 1
	if r.floor != 2 {
		t.Fatalf("floor = %d, want 2", r.floor)
	}
	push(4, "e") // drops the first change of 2
	if r.floor != 3 {
		t.Fatalf("with part of revision 2 dropped, floor = %d, want 3", r.floor)
	}
	h := newEventHub(kvEvents, &watchSlots{}, 4, 1<<20)
	h.publish([]fsm.KVEvent{{KV: fsm.KeyValue{Key: "a", ModRevision: 1}}}, 1)
	h.publish([]fsm.KVEvent{{KV: fsm.KeyValue{Key: "a", ModRevision: 2}}, {KV: fsm.KeyValue{Key: "b", ModRevision: 2}}, {KV: fsm.KeyValue{Key: "c", ModRevision: 2}}}, 2)
	h.publish([]fsm.KVEvent{{KV: fsm.KeyValue{Key: "d", ModRevision: 3}}, {KV: fsm.KeyValue{Key: "e", ModRevision: 3}}}, 3)
	if _, _, err := h.add("", 2); !errors.Is(err, fence.ErrCompacted) {
		t.Fatalf("watch from a revision kept in part: %v, want ErrCompacted", err)
	}
	w, _, err := h.add("", 3)
	if err != nil {
		t.Fatal(err)
	}
	if got := <-w.ch; len(got) != 2 || got[0].KV.Key != "d" || got[1].KV.Key != "e" {
		t.Fatalf("replay from revision 3: %v", got)
	}
}

// A txn's changes share a revision, and go in one watch message however
// large, so that a client resuming after the last revision it saw misses
// none of them; other changes are split at about watchMessageBytes.
func TestWatchMessagesKeepARevisionWhole(t *testing.T) {
	big := string(make([]byte, watchMessageBytes/2))
	events := []fsm.KVEvent{
		{KV: fsm.KeyValue{Key: "a", Value: []byte(big), ModRevision: 1}},
		{KV: fsm.KeyValue{Key: "b", Value: []byte(big), ModRevision: 1}},
		{KV: fsm.KeyValue{Key: "c", Value: []byte(big), ModRevision: 1}},
		{KV: fsm.KeyValue{Key: "d", Value: []byte(big), ModRevision: 2}},
		{KV: fsm.KeyValue{Key: "e", Value: []byte(big), ModRevision: 3}},
	}
	var sizes []int
	if err := inMessages(events, &kvEvents, func(m []fsm.KVEvent) error { sizes = append(sizes, len(m)); return nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sizes, []int{3, 2}) {
		t.Fatalf("messages of %v events, want [3 2]: revision 1 whole, then the rest", sizes)
	}
}
