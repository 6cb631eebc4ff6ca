package pgfence_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/fencing/pgfence"
)

// A worker holding token 34 marks an order paid; a paused holder of token
// 33 that wakes up later is refused, and the row keeps B's write. (Not run
// as a test: it needs a server; the tests cover the same steps.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://fence@127.0.0.1:54329/fence?sslmode=disable")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pgfence.AddTokenColumn(ctx, pool, "orders", ""); err != nil {
		panic(err)
	}
	write := func(status string, token uint64) error {
		return pgfence.Update(ctx, pool, pgfence.UpdateRow{
			Table: "orders",
			Set:   []pgfence.Column{{Name: "status", Value: status}},
			Where: []pgfence.Column{{Name: "id", Value: 17}},
			Token: token,
		})
	}
	fmt.Println(write("paid by B", 34)) // <nil>
	err = write("paid by A", 33)
	fmt.Println(err, errors.Is(err, fence.ErrStaleToken)) // stale fencing token 33 < 34 for key orders/17 true
}

// The Store runs the caller's statements in the transaction that admits
// the token.
func ExampleStore_AdmitTx() {
	ctx := context.Background()
	store, err := pgfence.Open(ctx, "postgres://fence@127.0.0.1:54329/fence?sslmode=disable")
	if err != nil {
		panic(err)
	}
	defer store.Close()
	err = store.AdmitTx(ctx, "orders/17", 34, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE id = 17`)
		return err
	})
	var stale *fence.StaleTokenError
	if errors.As(err, &stale) {
		fmt.Println("refused: the highest token is", stale.Highest)
	}
}
