package cli

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/cmd/fence/internal/timeline"
	"github.com/fencelock/fence/fencing/sqlitefence"
	"github.com/fencelock/fence/nolock"
)

const inventorySKU = "A1"

// inventoryStory: buyer A reads the last item in stock under the lock and
// is paused past its TTL; B takes the lock, reads the same item and sells
// it; A wakes and sells it too. A fenced write (the token checked in the
// database, as pgfence does on the page) refuses A's sale; so does the
// article's conditional decrement, which needs no lock at all.
var inventoryStory = &demoStory{
	name:  "inventory",
	about: "a buyer paused between its read and its write, and an item sold twice",
	page:  "docs/uses/inventory.md",
	lock:  "stock/" + inventorySKU,
	lane:  "stock db",
	setup: []string{
		"buyers        A and B each buy one of item " + inventorySKU + ", under lock \"stock/" + inventorySKU + "\": read the stock, then write it less one and record the sale",
		"database      $TMP/runN/" + useDBName + ", tables stock (1 of " + inventorySKU + ") and sales: SQLite through modernc.org/sqlite stands in for the page's PostgreSQL,",
		"              sqlitefence for pgfence; nolock.Decrement is the same statement on both",
	},
	runs: []demoRunSpec{
		{title: "without the fix, read-modify-write under a lease lock"},
		{fix: "fenced", title: "with fencing, the database checks the lock's token (sqlitefence, as pgfence)"},
		{fix: "decrement", title: "with the fix that needs no lock, one conditional decrement (nolock.Decrement)"},
	},
	prepare: prepareInventory,
	inspect: inspectInventory,
	note: "A takes the lock, reads 1 item in stock and is paused with SIGSTOP before it writes; its session expires and B takes the lock, reads 1, sells it and releases; " +
		"A is resumed with SIGCONT and, still believing it holds the lock, sells the item it read.",
}

var inventoryActor = actorScript{
	afterGrant: func(ctx context.Context, a *demoActor) (string, error) {
		err := a.db.QueryRowContext(ctx, "SELECT qty FROM stock WHERE sku = ?", inventorySKU).Scan(&a.seen)
		if err != nil {
			return "", fmt.Errorf("reading the stock: %w", err)
		}
		return fmt.Sprintf("read %d in stock", a.seen), nil
	},
	act: buy,
}

// buy sells one item: without a fix it writes the stock it read less one;
// fenced, it does so in sqlitefence's transaction that admits its token;
// with the decrement it takes one only if one is left.
func buy(ctx context.Context, a *demoActor) demoEvent {
	var msg string
	sell := func(tx *sql.Tx) error {
		if a.f.fix == "decrement" {
			left, err := nolock.Decrement(ctx, tx, nolock.SQLite, nolock.Counter{
				Table: "stock", Key: []nolock.Column{{Name: "sku", Value: inventorySKU}}, Column: "qty",
			}, 1)
			if err != nil {
				return err
			}
			msg = fmt.Sprintf("sold 1: UPDATE stock SET qty = qty - 1 WHERE qty >= 1, %d left", left)
		} else {
			if _, err := tx.ExecContext(ctx, "UPDATE stock SET qty = ? WHERE sku = ?", a.seen-1, inventorySKU); err != nil {
				return err
			}
			msg = fmt.Sprintf("sold 1: set qty to %d (read %d)", a.seen-1, a.seen)
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO sales (sku, buyer) VALUES (?, ?)", inventorySKU, a.f.name)
		return err
	}
	var err error
	if a.f.fix == "fenced" {
		var st *sqlitefence.Store
		if st, err = sqlitefence.New(ctx, a.db); err == nil {
			err = st.AdmitTx(ctx, "stock/"+inventorySKU, a.grant.Token(), sell)
		}
		if err == nil {
			msg += fmt.Sprintf(", token %d admitted", a.grant.Token())
		}
	} else {
		err = inTx(ctx, a.db, sell)
	}
	var stale *fence.StaleTokenError
	switch {
	case errors.As(err, &stale):
		return demoEvent{Event: "rejected", Token: stale.Token, Highest: stale.Highest, Message: fmt.Sprintf("sale refused: stale fencing token %d < %d", stale.Token, stale.Highest)}
	case errors.Is(err, nolock.ErrInsufficient):
		return demoEvent{Event: "rejected", Message: "sale refused: sold out, UPDATE ... WHERE qty >= 1 changed no row"}
	case err != nil:
		return stepFailed(err)
	}
	return demoEvent{Event: "wrote", Message: msg}
}

// inTx runs fn in a transaction of db and commits it.
func inTx(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// prepareInventory creates the run's database with one item in stock.
func prepareInventory(ctx context.Context, p *demoPlay) error {
	db, err := openUseDB(p.dir)
	if err != nil {
		return err
	}
	defer db.Close()
	return execAll(ctx, db,
		"CREATE TABLE stock (sku TEXT PRIMARY KEY, qty INTEGER NOT NULL)",
		"CREATE TABLE sales (sku TEXT NOT NULL, buyer TEXT NOT NULL)",
		"INSERT INTO stock (sku, qty) VALUES ('"+inventorySKU+"', 1)",
	)
}

// inspectInventory counts what was sold and what is left.
func inspectInventory(ctx context.Context, p *demoPlay) error {
	db, err := openUseDB(p.dir)
	if err != nil {
		return err
	}
	defer db.Close()
	var left, sold int64
	if err := db.QueryRowContext(ctx, "SELECT qty FROM stock WHERE sku = ?", inventorySKU).Scan(&left); err != nil {
		return err
	}
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM sales WHERE sku = ?", inventorySKU).Scan(&sold); err != nil {
		return err
	}
	r, now := p.run, time.Now()
	found := fmt.Sprintf("1 item to sell, %d sold, %d left", sold, left)
	verb := "sold"
	if p.spec.fix != "" {
		verb = "tried to sell"
	}
	story := fmt.Sprintf("A (token %d) read 1 %s in stock and was paused past its TTL; B took the lock (token %d), read 1 and sold it; A woke and %s the item it had read", r.tokenA, inventorySKU, r.tokenB, verb)
	switch p.spec.fix {
	case "":
		oversold := sold == 2 && left == 0
		if oversold {
			r.mark(p.story.lane, now, timeline.MarkLostUpdate, fmt.Sprintf("oversold: 2 sales of the 1 item, qty %d", left))
		}
		p.judgeUse(oversold, fmt.Sprintf("OVERSOLD: %s. The database took both sales: %s. The lock could not prevent it.", story, found), found)
		return nil
	case "fenced":
		refused := sold == 1 && left == 0 && r.writeA.Event == "rejected" && r.writeA.Token == r.tokenA && r.writeA.Highest == r.tokenB
		if refused {
			r.mark(p.story.lane, now, timeline.MarkInfo, "1 sold (by B), 0 left")
		}
		p.judgeUse(refused, fmt.Sprintf("REFUSED: %s, with token %d; the database admits only tokens at least %d, B's, and refused the sale: %s.", story, r.tokenA, r.tokenB, found), found)
	default:
		refused := sold == 1 && left == 0 && r.writeA.Event == "rejected"
		if refused {
			r.mark(p.story.lane, now, timeline.MarkInfo, "1 sold (by B), 0 left")
		}
		p.judgeUse(refused, fmt.Sprintf("REFUSED: %s, by one UPDATE ... WHERE qty >= 1, which changed no row: sold out. %s: the decrement alone prevents the oversell, with the lock or without it.", story, found), found)
	}
	return nil
}
