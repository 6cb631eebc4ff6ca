package boltfence_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fencelock/fence/fencing/boltfence"
)

// A bbolt store keeps the highest token of each key on disk, so that a
// resource restarted after a crash still refuses a stale writer.
func ExampleOpen() {
	dir, _ := os.MkdirTemp("", "boltfence-example")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "tokens.db")
	ctx := context.Background()

	st, err := boltfence.Open(path)
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = st.Admit(ctx, "orders/17", 34, func(context.Context) error { return nil })
	st.Close()

	st, err = boltfence.Open(path) // as after a restart
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()
	fmt.Println(st.Admit(ctx, "orders/17", 33, func(context.Context) error { return nil }))
	// Output: stale fencing token 33 < 34 for key orders/17
}
