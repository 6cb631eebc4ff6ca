package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"reflect"
	"sync"
	"testing"
	"time"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
)

// inMemory is the type of a body net/http knows to be in memory.
var inMemory = reflect.TypeOf(io.NopCloser(bytes.NewReader(nil)))

// recordingTransport notes the type and content of every request body it
// is handed, then sends the request on.
type recordingTransport struct {
	next   http.RoundTripper
	mu     sync.Mutex
	bodies map[string]reflect.Type // by URL path
	follow map[string]bool         // by URL path: sent FollowLeaderHeader
}

func (t *recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.mu.Lock()
	if req.Body != nil {
		t.bodies[req.URL.Path] = reflect.TypeOf(req.Body)
	}
	t.follow[req.URL.Path] = req.Header.Get(fencev1.FollowLeaderHeader) != ""
	t.mu.Unlock()
	if reflect.TypeOf(req.Body) == inMemory {
		// A retry must be able to send the same bytes again.
		if req.GetBody == nil {
			return nil, errors.New("no GetBody")
		}
		b, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		again, _ := io.ReadAll(b)
		if int64(len(again)) != req.ContentLength {
			return nil, io.ErrUnexpectedEOF
		}
	}
	return t.next.RoundTrip(req)
}

// Unary calls reach net/http with a body it knows to be in memory, so it
// writes headers and body in one write (one TCP segment, one wake-up of the
// server), and a retry can send them again.
func TestUnaryBodiesAreInMemory(t *testing.T) {
	srv := startServer(t, nil)
	rec := &recordingTransport{next: &http.Transport{}, bodies: map[string]reflect.Type{}, follow: map[string]bool{}}
	c := mustNew(t, WithEndpoints(srv.Addr()), WithHTTPClient(&http.Client{Transport: inMemoryBodies{rec}}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	m := NewMutex(s, "in-memory")
	mustLock(t, ctx, m)
	mustUnlock(t, ctx, m)
	w := mustWatch(t, ctx, c.KV(), "in-memory/")
	mustPut(t, ctx, c.KV(), "in-memory/k", []byte("v"))
	if ev := <-w.Events(); ev == nil || ev.GetKv().GetKey() != "in-memory/k" {
		t.Fatalf("watch delivered %v (%v)", ev, w.Err())
	}

	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, path := range []string{
		"/fence.v1.SessionService/CreateSession",
		"/fence.v1.LockService/Acquire",
		"/fence.v1.LockService/Release",
		"/fence.v1.KVService/Put",
		"/fence.v1.KVService/Watch", // one request message, then the stream of responses
	} {
		if got := rec.bodies[path]; got != inMemory {
			t.Errorf("%s: body of type %v, want %v", path, got, inMemory)
		}
		if !rec.follow[path] {
			t.Errorf("%s: sent without %s: a follower would forward it instead of pointing to the leader", path, fencev1.FollowLeaderHeader)
		}
	}
}
