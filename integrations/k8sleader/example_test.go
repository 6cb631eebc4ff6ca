package k8sleader_test

import (
	"context"
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/tools/leaderelection"

	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/fencing"
	"github.com/fencelock/fence/integrations/k8sleader"
)

// A controller elects its leader with client-go, over fence: each term of
// leadership has a fencing token, and every write of the leader carries
// it. (Compiled, not run: it needs a fence service and a controller.
// docs/kubernetes-leader-election.md quotes it.)
func Example() {
	c, err := client.New(client.WithEndpoints("fence-0.fence:7420", "fence-1.fence:7420", "fence-2.fence:7420"))
	if err != nil {
		log.Fatal(err)
	}
	lock, err := k8sleader.New(c, "my-controller", os.Getenv("POD_NAME"))
	if err != nil {
		log.Fatal(err)
	}
	leaderelection.RunOrDie(context.Background(), leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   15 * time.Second,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				ctx, stop := lock.WithTerm(ctx) // ends with the term; carries its token
				defer stop()
				reconcile(ctx, c, lock.Name(), lock.Token())
			},
			OnStoppedLeading: func() { log.Print("no longer leading") },
		},
	})
}

// reconcile is the leader's work: every write carries the term's token,
// and the resource refuses a token lower than one it has accepted.
func reconcile(ctx context.Context, c *client.Client, lock string, token uint64) {
	// fence's own KV store checks the token itself.
	if _, err := c.KV().Put(ctx, "config/replicas", []byte("3"), client.FencedBy(lock, token)); err != nil {
		log.Print(err) // a *fence.StaleTokenError once a later term wrote
		return
	}
	// An HTTP service behind fencing.Middleware: fencing.Transport sends
	// the lock and token that WithTerm put in ctx as Fence-Lock and Fence-Token.
	hc := &http.Client{Transport: &fencing.Transport{}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://storage:8080/replicas", strings.NewReader("3"))
	if err != nil {
		log.Print(err)
		return
	}
	resp, err := hc.Do(req)
	if err != nil {
		log.Print(err) // ctx ended: the term is over
		return
	}
	if err := fencing.ResponseError(resp); err != nil {
		log.Print(err) // 409: a later term has written
		return
	}
	resp.Body.Close()
}
