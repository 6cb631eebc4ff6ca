// Command inventory is the inventory and balance recipe of
// docs/uses/inventory.md, against PostgreSQL:
//
//	inventory setup    --dsn DSN --sku A1 --qty 10     # stock and two balances
//	inventory buy      --dsn DSN --sku A1 --buyer X    # no lock: one conditional UPDATE
//	inventory transfer --dsn DSN --from a --to b --amount 10  # no lock: versioned rows, one transaction
//	inventory locked-buy --dsn DSN --endpoints HOST:PORT --sku A1 --buyer X  # the lock, fenced, for comparison
//
// Exit status: 0 done, 4 sold out or not enough funds, 2 refused as stale
// (locked-buy), 1 other errors.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/fencing/pgfence"
	"github.com/fencelock/fence/nolock"
)

var errSoldOut = errors.New("sold out")

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: inventory setup|buy|transfer|locked-buy [flags]")
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	dsn := fs.String("dsn", os.Getenv("DATABASE_URL"), "the PostgreSQL DSN")
	sku := fs.String("sku", "A1", "the item")
	qty := fs.Int64("qty", 10, "setup: items in stock")
	buyer := fs.String("buyer", "buyer", "this buyer's name")
	from := fs.String("from", "a", "transfer: the account to debit")
	to := fs.String("to", "b", "transfer: the account to credit")
	amount := fs.Int64("amount", 10, "transfer: the amount")
	think := fs.Duration("think", 0, "time between reading and writing")
	endpoints := fs.String("endpoints", "127.0.0.1:7420", "locked-buy: fence nodes")
	ttl := fs.Duration("ttl", time.Second, "locked-buy: session TTL")
	fs.Parse(os.Args[2:])
	db, err := sql.Open("pgx", *dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, "inventory:", err)
		os.Exit(1)
	}
	defer db.Close()
	switch os.Args[1] {
	case "setup":
		err = setup(ctx, db, *sku, *qty)
	case "buy":
		err = buy(ctx, db, *sku, *buyer)
	case "transfer":
		err = transfer(ctx, db, *from, *to, *amount, *think)
	case "locked-buy":
		err = lockedBuy(ctx, *dsn, *endpoints, *ttl, *sku, *buyer, *think)
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	switch {
	case errors.Is(err, errSoldOut), errors.Is(err, nolock.ErrInsufficient):
		os.Exit(4)
	case errors.Is(err, fence.ErrStaleToken):
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "inventory:", err)
		os.Exit(1)
	}
}

func setup(ctx context.Context, db *sql.DB, sku string, qty int64) error {
	for _, q := range []string{
		`CREATE TABLE stock (sku text PRIMARY KEY, qty bigint NOT NULL)`,
		`CREATE TABLE balances (id text PRIMARY KEY, amount bigint NOT NULL, version bigint NOT NULL DEFAULT 0)`,
		`INSERT INTO balances (id, amount) VALUES ('a', 100), ('b', 100)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	_, err := db.ExecContext(ctx, `INSERT INTO stock (sku, qty) VALUES ($1, $2)`, sku, qty)
	return err
}

// buy sells one item in one conditional UPDATE: no lock, and no pause can
// oversell, because the check and the write are one statement.
func buy(ctx context.Context, db *sql.DB, sku, buyer string) error {
	left, err := nolock.Decrement(ctx, db, nolock.Postgres, nolock.Counter{
		Table: "stock", Key: []nolock.Column{{Name: "sku", Value: sku}}, Column: "qty",
	}, 1)
	if errors.Is(err, nolock.ErrInsufficient) {
		fmt.Printf("%s: sold out\n", buyer)
		return err
	}
	if err != nil {
		return err
	}
	fmt.Printf("%s: bought, %d left\n", buyer, left)
	return nil
}

// transfer moves amount between two balances in one transaction; each row
// is written only if its version is still the one read, and the whole
// transfer is retried when another writer got there first.
func transfer(ctx context.Context, db *sql.DB, from, to string, amount int64, think time.Duration) error {
	return nolock.Optimistic(ctx, 20, func(ctx context.Context) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		src, srcVersion, err := balance(ctx, tx, from)
		if err != nil {
			return err
		}
		dst, dstVersion, err := balance(ctx, tx, to)
		if err != nil {
			return err
		}
		if src < amount {
			return fmt.Errorf("%w: %s has %d", nolock.ErrInsufficient, from, src)
		}
		fmt.Printf("transfer %s->%s: read versions %d, %d\n", from, to, srcVersion, dstVersion)
		time.Sleep(think) // a transfer killed here rolls back; one paused here conflicts and retries
		for _, r := range []nolock.VersionedRow{
			{Table: "balances", Key: []nolock.Column{{Name: "id", Value: from}}, Set: []nolock.Column{{Name: "amount", Value: src - amount}}, Version: srcVersion},
			{Table: "balances", Key: []nolock.Column{{Name: "id", Value: to}}, Set: []nolock.Column{{Name: "amount", Value: dst + amount}}, Version: dstVersion},
		} {
			if _, err := nolock.UpdateVersioned(ctx, tx, nolock.Postgres, r); err != nil {
				return err
			}
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		fmt.Printf("transfer %s->%s: done\n", from, to)
		return nil
	})
}

func balance(ctx context.Context, tx *sql.Tx, id string) (amount, version int64, err error) {
	err = tx.QueryRowContext(ctx, `SELECT amount, version FROM balances WHERE id = $1`, id).Scan(&amount, &version)
	return amount, version, err
}

// lockedBuy is the lock-based version, for comparison: take the item's
// lock, then read and write the stock in pgfence's transaction, which
// admits the lock's token only if no newer holder has written.
func lockedBuy(ctx context.Context, dsn, endpoints string, ttl time.Duration, sku, buyer string, think time.Duration) error {
	c, err := client.New(client.WithEndpoints(strings.Split(endpoints, ",")...))
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := c.NewSession(ctx, client.WithTTL(ttl))
	if err != nil {
		return err
	}
	defer s.Close(context.Background())
	m := client.NewMutex(s, "stock/"+sku)
	g, err := m.Lock(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("%s: locked with token %d\n", buyer, g.Token())
	time.Sleep(think) // a buyer paused here wakes up believing it holds the lock
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := pgfence.New(context.Background(), pool)
	if err != nil {
		return err
	}
	var left int64
	err = store.AdmitTx(context.Background(), "stock/"+sku, g.Token(), func(tx pgx.Tx) error {
		if err := tx.QueryRow(context.Background(), `SELECT qty FROM stock WHERE sku = $1`, sku).Scan(&left); err != nil {
			return err
		}
		if left < 1 {
			return errSoldOut
		}
		left--
		_, err := tx.Exec(context.Background(), `UPDATE stock SET qty = $1 WHERE sku = $2`, left, sku)
		return err
	})
	if err != nil {
		fmt.Printf("%s: REFUSED: %v\n", buyer, err)
		return err
	}
	fmt.Printf("%s: bought, %d left\n", buyer, left)
	return m.Unlock(context.Background())
}
