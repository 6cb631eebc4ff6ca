// Package client is the Go client of the fence lock service.
//
// # Basics
//
// A Client talks to one or more nodes. A Session is a lease on the service
// that keeps itself alive in the background; everything a session holds is
// released when it is closed or expires. A Mutex is a named exclusive lock
// held through a session, and every Grant carries a fencing token:
//
//	c, err := client.New(client.WithEndpoints("127.0.0.1:7420"))
//	if err != nil {
//		return err
//	}
//	defer c.Close()
//	s, err := c.NewSession(ctx, client.WithTTL(10*time.Second))
//	if err != nil {
//		return err
//	}
//	defer s.Close(ctx)
//	m := client.NewMutex(s, "orders")
//	g, err := m.Lock(ctx)
//	if err != nil {
//		return err
//	}
//	defer m.Unlock(ctx)
//	// The fenced KV store refuses a write whose token is stale; a resource
//	// of your own does the same with package fencing.
//	_, err = c.KV().Put(g.Context(), "orders/17", []byte("paid"), client.WithGrant(g))
//
// A program that cannot keep a session alive (a cron job, a serverless
// function) takes a Lease instead: one call that answers a token, or
// fence.ErrLocked at once, and that nothing renews in the background:
//
//	l, err := c.Lease(ctx, "nightly", 30*time.Second)
//	if err != nil {
//		return err // fence.ErrLocked: another holds it
//	}
//	// Send l.Token() with each write, before l.SafeUntil();
//	// l.Renew(ctx) moves it on, l.Release(ctx) lets it go.
//
// # Caveats
//
// A lock cannot stop a holder that pauses: when a session's "safe until"
// deadline passes without a renewal, its context and its grants' contexts
// are cancelled, so the holder learns early that it may have lost the lock;
// but a paused process cannot act on anything. Send the token with each
// write and let the resource reject stale ones (package fencing).
//
// Errors wrap the sentinels of package fence; test them with errors.Is.
package client
