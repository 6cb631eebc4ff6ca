package client_test

import (
	"context"
	"fmt"
	"log"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
)

// Watch the locks under a prefix while a session takes one and gives it
// back. The example runs its own single-node server in a temporary
// directory.
func ExampleClient_WatchLocks() {
	srv, stop := startExampleServer()
	defer stop()

	ctx := context.Background()
	c, err := client.New(client.WithEndpoints(srv.Addr()))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	// From now (0): every event after WatchLocks returns.
	w, err := c.WatchLocks(ctx, "jobs/", 0)
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close()

	s, err := c.NewSession(ctx, client.WithOwner("nightly backup"))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	m := client.NewMutex(s, "jobs/backup")
	if _, err := m.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		log.Fatal(err)
	}

	for ev := range w.Events() {
		// ev.GetRevision() names the event on every node: a later
		// c.WatchLocks(ctx, "jobs/", ev.GetRevision()+1) goes on after it.
		switch ev.GetType() {
		case fencev1.LockEventType_LOCK_EVENT_TYPE_GRANTED:
			fmt.Println(ev.GetLock(), "granted to", ev.GetOwner(), "with token", ev.GetToken())
		case fencev1.LockEventType_LOCK_EVENT_TYPE_RELEASED:
			fmt.Println(ev.GetLock(), "released by", ev.GetOwner())
			return
		}
	}
	// Output:
	// jobs/backup granted to nightly backup with token 1
	// jobs/backup released by nightly backup
}
