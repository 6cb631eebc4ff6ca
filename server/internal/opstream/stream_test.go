package opstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/wire"
	"github.com/fencelock/fence/server/internal/apinet"
)

// node serves framed streams through Streams and Upgrades on a real
// loopback HTTP server; each stream's Serve error arrives on ended.
type node struct {
	streams  *Streams
	upgrades *Upgrades
	url      string
	ended    chan error
	refused  chan error
}

// startNode serves streams whose operations run is given. An operation
// whose request carries an idempotency key "block" waits for its context
// to end and answers with its cause; any other is answered at once.
func startNode(t *testing.T, maxOps int, silence time.Duration) *node {
	t.Helper()
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	n := &node{upgrades: &Upgrades{}, ended: make(chan error, 16), refused: make(chan error, 16)}
	n.streams = &Streams{
		Run:      answer,
		Workers:  apinet.NewWorkers(done),
		Silence:  silence,
		MaxOps:   maxOps,
		Opens:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "opens"}, []string{"transport"}),
		Open:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "open"}),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "requests"}, []string{"op"}),
		Logger:   slog.New(slog.DiscardHandler),
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := n.upgrades.Serve(w, 1<<20, 5*time.Second, func(f Framed) {
			n.ended <- n.streams.Serve(r.Context(), f)
		})
		if err != nil {
			n.refused <- err
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	}))
	srv.Config.ConnContext = n.streams.ConnContext
	srv.Start()
	t.Cleanup(srv.Close)
	n.url = srv.URL
	return n
}

// answer is the node's Run: see startNode.
func answer(ctx context.Context, req *fencev1.StreamRequest) *fencev1.StreamResponse {
	resp := &fencev1.StreamResponse{Id: req.GetId()}
	if req.GetIdempotencyKey() == "block" {
		<-ctx.Done()
		resp.Error = &fencev1.StreamError{Message: context.Cause(ctx).Error()}
	}
	return resp
}

// open upgrades a connection to the node and reads the stream's first
// message, which says how many operations may be in flight. It sends
// the early messages right behind the upgrade, before its answer.
func (n *node) open(t *testing.T, earlyOps ...*fencev1.StreamRequest) (net.Conn, *wire.Conn, uint32) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(n.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	// The request and the early frames go in one write, so that the
	// server reads them together.
	req := upgradeRequest(n.url)
	var out bytes.Buffer
	if err := req.Write(&out); err != nil {
		t.Fatal(err)
	}
	early := wire.NewConn(recorder{conn, &out}, bufio.NewReader(conn), 1<<20, time.Second)
	for _, m := range earlyOps {
		send(t, early, m)
	}
	if _, err := conn.Write(out.Bytes()); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("the upgrade was answered %s", resp.Status)
	}
	fc := wire.NewConn(conn, br, 1<<20, 5*time.Second)
	first := &fencev1.StreamResponse{}
	if err := fc.Read(first); err != nil {
		t.Fatal(err)
	}
	return conn, fc, first.GetOpened().GetMaxInFlight()
}

// recorder is a connection whose writes go to out instead.
type recorder struct {
	net.Conn
	out *bytes.Buffer
}

func (r recorder) Write(b []byte) (int, error) { return r.out.Write(b) }

// upgradeRequest asks the node at url for a framed stream.
func upgradeRequest(url string) *http.Request {
	req, _ := http.NewRequest(http.MethodGet, url+"/fence.v1.StreamService/Session", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", wire.Protocol)
	return req
}

func send(t *testing.T, fc *wire.Conn, req *fencev1.StreamRequest) {
	t.Helper()
	if err := fc.Write(req); err != nil {
		t.Fatal(err)
	}
}

func receive(t *testing.T, fc *wire.Conn) *fencev1.StreamResponse {
	t.Helper()
	resp := &fencev1.StreamResponse{}
	if err := fc.Read(resp); err != nil {
		t.Fatal(err)
	}
	return resp
}

func op(id uint64, key string) *fencev1.StreamRequest {
	return &fencev1.StreamRequest{Id: id, IdempotencyKey: key, Op: &fencev1.StreamRequest_Release{Release: &fencev1.ReleaseRequest{}}}
}

func cancelOp(id uint64) *fencev1.StreamRequest {
	return &fencev1.StreamRequest{Id: id, Op: &fencev1.StreamRequest_Cancel{Cancel: &fencev1.StreamCancel{}}}
}

// An operation that blocks holds up none after it; a cancel ends it, and
// it is answered by its id.
func TestABlockedOperationHoldsUpNothingElse(t *testing.T) {
	n := startNode(t, 8, time.Minute)
	_, fc, max := n.open(t)
	if max != 8 {
		t.Errorf("the stream opened with %d operations in flight, want the connection's 8", max)
	}
	send(t, fc, op(1, "block"))
	send(t, fc, op(2, ""))
	if resp := receive(t, fc); resp.GetId() != 2 || resp.GetError() != nil {
		t.Fatalf("first answer %v, want operation 2's while 1 blocks", resp)
	}
	send(t, fc, cancelOp(1))
	resp := receive(t, fc)
	if resp.GetId() != 1 || !strings.Contains(resp.GetError().GetMessage(), context.Canceled.Error()) {
		t.Fatalf("answer %v after cancelling operation 1, want it ended as cancelled", resp)
	}
}

// A framed client that closes its side is gone (the Go client closes the
// connection when its stream ends, as a dead process's kernel does): the
// operations it left running are ended, as a unary caller's call is when
// it goes away, and Serve returns nil.
func TestAClientThatGoesAwayEndsItsOperations(t *testing.T) {
	n := startNode(t, 8, time.Minute)
	conn, fc, _ := n.open(t)
	send(t, fc, op(1, "block"))
	send(t, fc, op(2, ""))
	if resp := receive(t, fc); resp.GetId() != 2 {
		t.Fatalf("first answer %v, want operation 2's", resp)
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if resp := receive(t, fc); resp.GetId() != 1 || !strings.Contains(resp.GetError().GetMessage(), ErrEnded.Error()) {
		t.Errorf("operation 1 was answered %v, want it ended with its stream", resp)
	}
	if err := <-n.ended; err != nil {
		t.Errorf("Serve returned %v after the client went away, want nil", err)
	}
}

// Frames a client sends right behind its upgrade, which the HTTP server
// may have read with the request, are the stream's first.
func TestFramesSentWithTheUpgradeAreRead(t *testing.T) {
	n := startNode(t, 8, time.Minute)
	_, fc, _ := n.open(t, op(7, ""))
	if resp := receive(t, fc); resp.GetId() != 7 || resp.GetError() != nil {
		t.Fatalf("answer %v, want operation 7's", resp)
	}
}

// An id already in flight, or an id of 0, ends the stream as an invalid
// argument, and the operations in flight with it.
func TestABadIDEndsTheStream(t *testing.T) {
	for name, second := range map[string]*fencev1.StreamRequest{
		"an id in flight": op(1, ""),
		"id 0":            op(0, ""),
	} {
		t.Run(name, func(t *testing.T) {
			n := startNode(t, 8, time.Minute)
			_, fc, _ := n.open(t)
			send(t, fc, op(1, "block"))
			send(t, fc, second)
			if err := <-n.ended; !errors.Is(err, fence.ErrInvalidArgument) {
				t.Errorf("Serve returned %v, want an invalid argument", err)
			}
			if resp := receive(t, fc); resp.GetId() != 1 || !strings.Contains(resp.GetError().GetMessage(), "invalid argument") {
				t.Errorf("operation 1 was answered %v, want it ended with its stream", resp)
			}
		})
	}
}

// A connection's slots bound the operations in flight on it: one beyond
// them waits for a slot to be freed, and is not run meanwhile.
func TestSlotsBoundTheOperationsInFlight(t *testing.T) {
	n := startNode(t, 1, 400*time.Millisecond)
	_, fc, max := n.open(t)
	if max != 1 {
		t.Fatalf("the stream opened with %d operations in flight, want 1", max)
	}
	send(t, fc, op(1, "block"))
	send(t, fc, op(2, "")) // would be answered at once if it ran
	// Nothing frees operation 1's slot, and the client, silent, is
	// dropped: operation 1 ends with the stream, and 2 never ran.
	if resp := receive(t, fc); resp.GetId() != 1 || !strings.Contains(resp.GetError().GetMessage(), "nothing came from the client") {
		t.Fatalf("first answer %v, want operation 1 ended with its stream", resp)
	}
	if err := fc.Read(&fencev1.StreamResponse{}); err == nil {
		t.Error("operation 2 was answered, though no slot was free for it")
	}
}

// A framed stream that nothing comes on for Silence is dropped.
func TestASilentStreamIsDropped(t *testing.T) {
	n := startNode(t, 8, 300*time.Millisecond)
	_, fc, _ := n.open(t)
	err := <-n.ended
	if !errors.Is(err, fence.ErrUnavailable) || !strings.Contains(err.Error(), "nothing came from the client") {
		t.Fatalf("Serve returned %v, want the stream dropped as silent", err)
	}
	if err := fc.Read(&fencev1.StreamResponse{}); err == nil {
		t.Error("the connection of a dropped stream is still open")
	}
}

// Close refuses new streams and, once its context ends, closes the
// connections of those still open.
func TestUpgradesCloseEndsWhatItWaitedFor(t *testing.T) {
	n := startNode(t, 8, time.Minute)
	_, fc, _ := n.open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	closed := make(chan struct{})
	go func() {
		n.upgrades.Close(ctx)
		close(closed)
	}()
	if err := fc.Read(&fencev1.StreamResponse{}); err == nil {
		t.Fatal("a stream open at Close still reads")
	}
	<-closed
	if err := <-n.ended; err == nil {
		t.Error("Serve returned nil for a stream whose connection Close closed")
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(n.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := upgradeRequest(n.url)
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.ReadResponse(bufio.NewReader(conn), req); err != nil || resp.StatusCode == http.StatusSwitchingProtocols {
		t.Fatalf("an upgrade after Close: %v, %v; want it refused", resp, err)
	}
	if err := <-n.refused; !errors.Is(err, fence.ErrUnavailable) {
		t.Errorf("an upgrade after Close was refused with %v, want unavailable", err)
	}
}
