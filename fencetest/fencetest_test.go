package fencetest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/fencetest"
	"github.com/fencelock/fence/server"
)

// A node from Start grants locks with rising tokens to two sessions, and
// honours the configuration a test gives it.
func TestStart(t *testing.T) {
	node := fencetest.Start(t, fencetest.WithConfig(func(c *server.Config) { c.MaxSessions = 2 }))
	ctx := context.Background()
	c := node.Client()
	a, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := node.NewClient().NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.NewSession(ctx); !errors.Is(err, fence.ErrLimit) {
		t.Fatalf("a third session with MaxSessions 2: %v, want ErrLimit", err)
	}
	ga, err := client.NewMutex(a, "job").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.NewMutex(b, "job").TryLock(ctx); !errors.Is(err, fence.ErrLocked) {
		t.Fatalf("TryLock of a held lock: %v, want ErrLocked", err)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	gb, err := client.NewMutex(b, "job").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if gb.Token() <= ga.Token() {
		t.Fatalf("token %d after %d", gb.Token(), ga.Token())
	}
}
