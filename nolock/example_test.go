package nolock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fencelock/fence/fencing/sqlitefence"
	"github.com/fencelock/fence/nolock"
)

// The article's inventory decrement: no lock, one conditional UPDATE.
func ExampleDecrement() {
	dir, _ := os.MkdirTemp("", "nolock")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", sqlitefence.DSN(filepath.Join(dir, "shop.db")))
	defer db.Close()
	ctx := context.Background()
	db.ExecContext(ctx, `CREATE TABLE inventory (sku TEXT PRIMARY KEY, qty INTEGER NOT NULL)`)
	db.ExecContext(ctx, `INSERT INTO inventory VALUES ('A1', 2)`)

	stock := nolock.Counter{Table: "inventory", Key: []nolock.Column{{Name: "sku", Value: "A1"}}, Column: "qty"}
	for range 3 {
		left, err := nolock.Decrement(ctx, db, nolock.SQLite, stock, 1)
		if errors.Is(err, nolock.ErrInsufficient) {
			fmt.Println("sold out")
			continue
		}
		fmt.Println("sold one,", left, "left")
	}
	// Output:
	// sold one, 1 left
	// sold one, 0 left
	// sold out
}
