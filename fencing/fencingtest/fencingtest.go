// Package fencingtest is the conformance suite that every fencing.Store
// must pass: ordering, equal tokens, stale tokens, failed writes,
// independence of keys, concurrent writers and durability across reopen.
// RunTx adds the cases of stores whose writes run in a transaction of
// their database.
package fencingtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/fencing"
)

// Factory makes the stores under test.
type Factory struct {
	// Open returns a new, empty store. The suite closes it.
	Open func(t *testing.T) fencing.Store
	// Reopen closes s and opens the same store again; nil for stores that
	// are not durable.
	Reopen func(t *testing.T, s fencing.Store) fencing.Store
}

// Durable returns the Factory of a durable store kept at a place, such as
// a file or a database schema: place makes a new, empty one for t, and
// open opens the store kept at a place. Reopen closes a store and opens
// the one at its place again.
func Durable[S fencing.Store](place func(t testing.TB) string, open func(t testing.TB, place string) S) Factory {
	var mu sync.Mutex
	places := map[fencing.Store]string{}
	opened := func(t *testing.T, at string) fencing.Store {
		s := open(t, at)
		mu.Lock()
		defer mu.Unlock()
		places[s] = at
		return s
	}
	return Factory{
		Open: func(t *testing.T) fencing.Store { return opened(t, place(t)) },
		Reopen: func(t *testing.T, s fencing.Store) fencing.Store {
			mu.Lock()
			at := places[s]
			mu.Unlock()
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			return opened(t, at)
		},
	}
}

// Run runs the conformance suite as subtests of t.
func Run(t *testing.T, f Factory) {
	t.Run("RisingTokensAccepted", func(t *testing.T) { risingTokens(t, f) })
	t.Run("EqualTokenAccepted", func(t *testing.T) { equalToken(t, f) })
	t.Run("LowerTokenRejected", func(t *testing.T) { lowerToken(t, f) })
	t.Run("ZeroTokenRejected", func(t *testing.T) { zeroToken(t, f) })
	t.Run("FailedWriteKeepsHighest", func(t *testing.T) { failedWrite(t, f) })
	t.Run("KeysAreIndependent", func(t *testing.T) { independentKeys(t, f) })
	t.Run("ConcurrentWriters", func(t *testing.T) { concurrentWriters(t, f) })
	t.Run("DurableAcrossReopen", func(t *testing.T) { durable(t, f) })
}

func open(t *testing.T, f Factory) fencing.Store {
	t.Helper()
	s := f.Open(t)
	t.Cleanup(func() { s.Close() })
	return s
}

func admit(t *testing.T, s fencing.Store, key string, token uint64) (wrote bool, err error) {
	t.Helper()
	err = s.Admit(context.Background(), key, token, func(ctx context.Context) error {
		wrote = true
		return nil
	})
	return wrote, err
}

func mustAdmit(t *testing.T, s fencing.Store, key string, token uint64) {
	t.Helper()
	if wrote, err := admit(t, s, key, token); err != nil || !wrote {
		t.Fatalf("Admit(%q, %d) = wrote %v, %v; want the write applied", key, token, wrote, err)
	}
}

func wantHighest(t *testing.T, s fencing.Store, key string, want uint64) {
	t.Helper()
	got, err := s.Highest(context.Background(), key)
	if err != nil || got != want {
		t.Fatalf("Highest(%q) = %d, %v; want %d", key, got, err, want)
	}
}

func risingTokens(t *testing.T, f Factory) {
	s := open(t, f)
	wantHighest(t, s, "k", 0)
	for _, token := range []uint64{1, 2, 33, 34, 1 << 62} {
		mustAdmit(t, s, "k", token)
		wantHighest(t, s, "k", token)
	}
}

func equalToken(t *testing.T, f Factory) {
	s := open(t, f)
	for range 3 {
		mustAdmit(t, s, "k", 7)
	}
	wantHighest(t, s, "k", 7)
}

func lowerToken(t *testing.T, f Factory) {
	s := open(t, f)
	mustAdmit(t, s, "orders/17", 34)
	wrote, err := admit(t, s, "orders/17", 33)
	if wrote {
		t.Fatal("the write of a stale token ran")
	}
	if !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("stale write: %v, want ErrStaleToken", err)
	}
	var stale *fence.StaleTokenError
	if !errors.As(err, &stale) || stale.Token != 33 || stale.Highest != 34 || stale.Key != "orders/17" {
		t.Fatalf("stale write error %#v, want token 33, highest 34, key orders/17", err)
	}
	if want := "stale fencing token 33 < 34 for key orders/17"; err.Error() != want {
		t.Fatalf("message %q, want %q", err.Error(), want)
	}
	wantHighest(t, s, "orders/17", 34)
}

func zeroToken(t *testing.T, f Factory) {
	s := open(t, f)
	if wrote, err := admit(t, s, "k", 0); wrote || !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("token 0: wrote %v, %v; want ErrInvalidArgument and no write", wrote, err)
	}
}

func failedWrite(t *testing.T, f Factory) {
	s := open(t, f)
	mustAdmit(t, s, "k", 5)
	boom := errors.New("boom")
	err := s.Admit(context.Background(), "k", 9, func(ctx context.Context) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("failing write: %v, want its error", err)
	}
	wantHighest(t, s, "k", 5)
	mustAdmit(t, s, "k", 6) // 9 was never accepted
}

func independentKeys(t *testing.T, f Factory) {
	s := open(t, f)
	mustAdmit(t, s, "a", 50)
	mustAdmit(t, s, "b", 3)
	wantHighest(t, s, "a", 50)
	wantHighest(t, s, "b", 3)
}

// concurrentWriters: for any interleaving of writers with random tokens,
// the value stored is the one written with the highest token, and no lower
// token is ever applied after a higher one.
func concurrentWriters(t *testing.T, f Factory) {
	s := open(t, f)
	const writers, writes = 8, 25
	var (
		mu      sync.Mutex // guards the "resource": what the writes applied, in order
		applied []uint64
		value   uint64
		wg      sync.WaitGroup
	)
	errs := make(chan error, writers*writes)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for range writes {
				token := 1 + rng.Uint64N(100)
				err := s.Admit(context.Background(), "hot", token, func(ctx context.Context) error {
					mu.Lock()
					defer mu.Unlock()
					applied = append(applied, token)
					value = token
					return nil
				})
				if err != nil && !errors.Is(err, fence.ErrStaleToken) {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("unexpected error: %v", err)
	}
	var max uint64
	for i, token := range applied {
		if token < max {
			t.Fatalf("write %d applied token %d after %d had been applied", i, token, max)
		}
		max = token
	}
	highest, err := s.Highest(context.Background(), "hot")
	if err != nil {
		t.Fatal(err)
	}
	if value != max || highest != max || len(applied) == 0 {
		t.Fatalf("stored value %d, recorded highest %d, highest applied %d (of %d writes)", value, highest, max, len(applied))
	}
}

func durable(t *testing.T, f Factory) {
	if f.Reopen == nil {
		t.Skip("the store is not durable")
	}
	s := f.Open(t)
	for i := range 10 {
		mustAdmit(t, s, fmt.Sprintf("key/%d", i), uint64(100+i))
	}
	s = f.Reopen(t, s)
	t.Cleanup(func() { s.Close() })
	for i := range 10 {
		wantHighest(t, s, fmt.Sprintf("key/%d", i), uint64(100+i))
	}
	if wrote, err := admit(t, s, "key/3", 99); wrote || !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("stale write after reopen: wrote %v, %v", wrote, err)
	}
}

// TxStore is a Store that runs each write in a transaction of its
// database, of type Tx, as pgfence's and sqlitefence's stores do.
type TxStore[Tx comparable] interface {
	fencing.Store
	// AdmitTx is Admit with the write given the transaction, in which it
	// changes rows of the store's database.
	AdmitTx(ctx context.Context, key string, token uint64, write func(tx Tx) error) error
}

// Balance is a row in the database of a TxStore, which RunTx's writes
// change.
type Balance[Tx comparable] struct {
	// Set sets the row's amount, in tx.
	Set func(tx Tx, amount int) error
	// Get reads the row's amount, as committed.
	Get func() (int, error)
	// Tx returns the transaction in the context that Admit gives its
	// write, and the zero Tx in any other context.
	Tx func(ctx context.Context) Tx
}

// RunTx checks that s commits the changes a write makes in its transaction
// together with its token, and rolls both back when the write fails or
// panics or the token is stale; and that Admit's write finds the
// transaction in its context. The row of b must not exist yet.
func RunTx[Tx comparable](t *testing.T, s TxStore[Tx], b Balance[Tx]) {
	const key = "balances/1"
	wantState := func(amount int, highest uint64) {
		t.Helper()
		if got, err := b.Get(); err != nil || got != amount {
			t.Fatalf("amount %d, %v; want %d", got, err, amount)
		}
		wantHighest(t, s, key, highest)
	}
	if err := s.AdmitTx(context.Background(), key, 34, func(tx Tx) error { return b.Set(tx, 100) }); err != nil {
		t.Fatal(err)
	}
	wantState(100, 34)

	boom := errors.New("boom")
	err := s.AdmitTx(context.Background(), key, 40, func(tx Tx) error {
		if err := b.Set(tx, 666); err != nil {
			return err
		}
		return boom // after writing: the write and the token roll back
	})
	if !errors.Is(err, boom) {
		t.Fatalf("failing write: %v", err)
	}
	wantState(100, 34)

	called := false
	err = s.AdmitTx(context.Background(), key, 33, func(tx Tx) error { called = true; return b.Set(tx, 1) })
	var stale *fence.StaleTokenError
	if called || !errors.As(err, &stale) || stale.Token != 33 || stale.Highest != 34 {
		t.Fatalf("stale AdmitTx: called %v, %v", called, err)
	}
	if want := "stale fencing token 33 < 34 for key balances/1"; err.Error() != want {
		t.Fatalf("stale AdmitTx: %q, want %q", err.Error(), want)
	}
	wantState(100, 34)

	// A panicking write rolls back too, and the store stays usable.
	func() {
		defer func() { recover() }()
		s.AdmitTx(context.Background(), key, 50, func(tx Tx) error {
			b.Set(tx, 555)
			panic("write panicked")
		})
	}()
	wantState(100, 34)

	// Admit's write reaches the transaction through b.Tx(ctx).
	var none Tx
	err = s.Admit(context.Background(), key, 35, func(ctx context.Context) error {
		tx := b.Tx(ctx)
		if tx == none {
			return errors.New("no transaction in the write's context")
		}
		return b.Set(tx, 200)
	})
	if err != nil {
		t.Fatal(err)
	}
	wantState(200, 35)
	if b.Tx(context.Background()) != none {
		t.Fatal("the transaction of a plain context is not the zero Tx")
	}
}
