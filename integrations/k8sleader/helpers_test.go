package k8sleader_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/fencetest"
	"github.com/fencelock/fence/integrations/k8sleader"
)

// timing is a LeaderElector's lease duration, renew deadline and retry
// period.
type timing struct{ lease, renew, retry time.Duration }

// fast is short enough that a test sees a takeover within seconds, and
// long enough that renewals on a loaded machine under -race keep up.
var fast = timing{lease: 4 * time.Second, renew: 3 * time.Second, retry: 400 * time.Millisecond}

// elector is a real client-go LeaderElector over a Lock, run in this
// process, with its callbacks recorded on channels.
type elector struct {
	lock    *k8sleader.Lock
	started chan uint64   // the Lock's token when OnStartedLeading was called
	leaders chan string   // each OnNewLeader
	done    chan struct{} // closed once Run returned
	cancel  context.CancelFunc
}

// startElector runs an elector as identity for the election name against
// node, with ReleaseOnCancel, until the test ends or cancel is called.
func startElector(t *testing.T, node *fencetest.Node, name, identity string, tm timing) *elector {
	t.Helper()
	lock, err := k8sleader.New(node.NewClient(), name, identity)
	if err != nil {
		t.Fatal(err)
	}
	e := &elector{lock: lock, started: make(chan uint64, 8), leaders: make(chan string, 64), done: make(chan struct{})}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   tm.lease,
		RenewDeadline:   tm.renew,
		RetryPeriod:     tm.retry,
		ReleaseOnCancel: true,
		Name:            name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { e.started <- lock.Token() },
			OnStoppedLeading: func() {},
			OnNewLeader: func(id string) {
				select {
				case e.leaders <- id:
				default: // a test that waits for a leader reads them; others need not
				}
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() {
		defer close(e.done)
		le.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-e.done
	})
	return e
}

// waitStarted waits until the elector leads, and returns its token.
func (e *elector) waitStarted(t *testing.T, within time.Duration) uint64 {
	t.Helper()
	select {
	case token := <-e.started:
		return token
	case <-time.After(within):
		t.Fatalf("%s did not become leader within %v", e.lock.Identity(), within)
		return 0
	}
}

// waitLeader waits until the elector has seen identity lead.
func (e *elector) waitLeader(t *testing.T, identity string, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case id := <-e.leaders:
			if id == identity {
				return
			}
		case <-deadline:
			t.Fatalf("%s did not see %s lead within %v", e.lock.Identity(), identity, within)
		}
	}
}

// readRecord reads the election record of name from fence's KV store.
func readRecord(t *testing.T, c *client.Client, name string) resourcelock.LeaderElectionRecord {
	t.Helper()
	kv, err := c.KV().Get(context.Background(), "k8sleader/"+name)
	if err != nil || kv == nil {
		t.Fatalf("reading the record of %s: %v, %v", name, kv, err)
	}
	var rec resourcelock.LeaderElectionRecord
	if err := json.Unmarshal(kv.GetValue(), &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}
