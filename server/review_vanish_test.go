package server

import (
	"context"
	"testing"
	"time"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/rpcerr"
	"github.com/fencelock/fence/internal/wire"
)

// REVIEW: a framed client that closes its connection (the Go client never
// half-closes: it closes the connection when its stream ends, and a
// killed process's kernel does the same) while an Acquire of it waits
// must have that wait given up, as a unary caller that goes away does,
// and as the framed stream did before e98ba0c (the request context was
// cancelled at EOF). Since e98ba0c the wait stays queued until the
// silence check drops the stream (45 to 60 s by default), and may be
// granted the lock meanwhile.
func TestReviewFramedClientThatVanishesGivesUpItsWait(t *testing.T) {
	s := startTestServer(t, nil)
	holder := mustOpen(t, openFramedStream, s)
	a := holder.session(30 * time.Second)
	holder.mustDo(acquireOp(a, "L", false))

	conn, br, err := upgradeAt(context.Background(), "http://"+s.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	fc := wire.NewConn(conn, br, 64<<20, 10*time.Second)
	first := &fencev1.StreamResponse{}
	if err := fc.Read(first); err != nil {
		t.Fatal(err)
	}
	rs := newRawStream(t, first, func(r *fencev1.StreamRequest) error { return fc.Write(r) }, func() (*fencev1.StreamResponse, error) {
		resp := &fencev1.StreamResponse{}
		if err := fc.Read(resp); err != nil {
			return nil, err
		}
		if resp.GetId() == 0 && resp.GetError() != nil {
			return nil, rpcerr.FromStream(resp.GetError())
		}
		return resp, nil
	})
	b := rs.session(30 * time.Second)
	wait := acquireOp(b, "L", false)
	wait.GetAcquire().RequestId = 9
	rs.start(wait)
	waitFor(t, "b to queue", func() bool { return waitersOf(s, "L") == 1 })

	_ = conn.Close() // the client goes away (FIN, no RST: nothing unread)

	waitForWithin(t, 5*time.Second, "the vanished client's wait to be given up", func() bool { return waitersOf(s, "L") == 0 })
}
