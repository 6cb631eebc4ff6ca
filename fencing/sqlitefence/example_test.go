package sqlitefence_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fencelock/fence/fencing/sqlitefence"
)

// A worker holding token 34 writes an order; the paused holder of token 33
// wakes up and tries to write it too, and is refused.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "sqlitefence-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open(sqlitefence.DriverName, sqlitefence.DSN(filepath.Join(dir, "shop.db")))
	defer db.Close()
	db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL)`)
	db.Exec(`INSERT INTO orders VALUES (17, 'new')`)
	if err := sqlitefence.AddTokenColumn(ctx, db, "orders", ""); err != nil {
		fmt.Println(err)
		return
	}

	write := func(status string, token uint64) error {
		return sqlitefence.Update(ctx, db, sqlitefence.UpdateRow{
			Table: "orders",
			Set:   []sqlitefence.Column{{Name: "status", Value: status}},
			Where: []sqlitefence.Column{{Name: "id", Value: 17}},
			Token: token,
		})
	}
	fmt.Println("B, token 34:", write("shipped by B", 34))
	fmt.Println("A, token 33:", write("shipped by A", 33))

	var status string
	db.QueryRow(`SELECT status FROM orders WHERE id = 17`).Scan(&status)
	fmt.Println("status:", status)
	// Output:
	// B, token 34: <nil>
	// A, token 33: stale fencing token 33 < 34 for key orders/17
	// status: shipped by B
}

// A Store guards writes made in the same transaction as the token check.
func ExampleStore_AdmitTx() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "sqlitefence-example")
	defer os.RemoveAll(dir)
	store, err := sqlitefence.Open(ctx, filepath.Join(dir, "tokens.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	store.DB().ExecContext(ctx, `CREATE TABLE log (line TEXT)`)

	for _, token := range []uint64{7, 9, 8} {
		err := store.AdmitTx(ctx, "log", token, func(tx *sql.Tx) error {
			_, err := tx.Exec(`INSERT INTO log VALUES (?1)`, fmt.Sprint("written with ", token))
			return err
		})
		fmt.Println(token, err)
	}
	// Output:
	// 7 <nil>
	// 9 <nil>
	// 8 stale fencing token 8 < 9 for key log
}
