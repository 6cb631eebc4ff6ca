package client

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/server"
)

// Two groups, one client whose endpoints name a node of each: once the
// client has talked to one group, the other's node refuses its calls, and
// nothing is created there. Without the check the client moved on to the
// other group when its own went down, and took locks there.
func TestClientKeepsToOneCluster(t *testing.T) {
	ctx := context.Background()
	a, b := startServer(t, nil), startServer(t, nil)
	c := mustNew(t, WithEndpoints(a.Addr(), b.Addr()), WithRetryBudget(2*time.Second))
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.ClusterId == "" || c.ClusterID() != st.ClusterId {
		t.Fatalf("client's cluster %q, node's %q: want the node's, not empty", c.ClusterID(), st.ClusterId)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = c.NewSession(ctx, WithTTL(5*time.Second))
	if !errors.Is(err, fence.ErrWrongCluster) {
		t.Fatalf("NewSession with the client's group down and another group's node up: %v, want ErrWrongCluster", err)
	}
	other := mustClient(t, b, nil)
	bs, err := other.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if bs.Sessions != 0 {
		t.Errorf("the other group has %d sessions, want 0: the refused call was acted on", bs.Sessions)
	}
	if bs.ClusterId == st.ClusterId {
		t.Errorf("two groups share the id %q", bs.ClusterId)
	}
}

// A client given the group's id never uses a node of another group, even
// one it is told to try first.
func TestWithClusterIDSkipsOtherGroups(t *testing.T) {
	ctx := context.Background()
	a, b := startServer(t, nil), startServer(t, nil)
	want, err := mustClient(t, a, nil).Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := mustNew(t, WithEndpoints(b.Addr(), a.Addr()), WithClusterID(want.ClusterId))
	m := NewMutex(mustSession(t, c, 5*time.Second), "x")
	mustLock(t, ctx, m)
	for _, n := range []struct {
		srv   *server.Server
		locks uint64
	}{{a, 1}, {b, 0}} {
		st, err := mustClient(t, n.srv, nil).Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Sessions != n.locks || st.Locks != n.locks {
			t.Errorf("node %s has %d sessions and %d locks, want %d of each", n.srv.Addr(), st.Sessions, st.Locks, n.locks)
		}
	}
	mustUnlock(t, ctx, m)
}

// A session given up is abandoned on every node the client knows, with its
// secret: never on one known to be of another group.
func TestLostSessionIsNotSentToAnotherGroup(t *testing.T) {
	a := startServer(t, nil)
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	c := mustNew(t, WithEndpoints(a.Addr(), other.Addr().String()))
	s := mustSession(t, c, 5*time.Second)
	c.endpointAt(1).foreign.Store(true) // as a call answered ErrWrongCluster would mark it
	s.lose(errors.New("given up by the test"))
	other.(*net.TCPListener).SetDeadline(time.Now().Add(200 * time.Millisecond))
	if conn, err := other.Accept(); err == nil {
		conn.Close()
		t.Fatal("the lost session's abandonment, with its secret, went to a node of another group")
	}
}
