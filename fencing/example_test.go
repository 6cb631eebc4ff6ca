package fencing_test

import (
	"context"
	"fmt"

	"github.com/fencelock/fence/fencing"
)

// A Guard admits a write only with a token at least the highest it has
// accepted for the key: the holder of token 34 writes, and a paused holder
// of token 33 that wakes up late is refused, its write never run.
func ExampleGuard() {
	g := fencing.NewGuard(fencing.NewMemory())
	ctx := context.Background()
	write := func(token uint64) error {
		return g.Admit(ctx, "orders/17", "orders", token, func(context.Context) error {
			fmt.Println("written with token", token)
			return nil
		})
	}
	fmt.Println(write(34))
	fmt.Println(write(33))
	// Output:
	// written with token 34
	// <nil>
	// stale fencing token 33 < 34 for key orders/17
}
