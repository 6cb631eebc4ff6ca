// Command sessions is the session-update recipe of docs/uses/sessions.md:
// web servers add items to a user's cart, kept in PostgreSQL, without a
// lock.
//
//	sessions setup --dsn DSN --session u1
//	sessions add   --dsn DSN --session u1 --item book   # optimistic, versioned
//	sessions route --session u1 --servers 3             # the server that owns u1
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/fencelock/fence/nolock"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: sessions setup|add|route [flags]")
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	dsn := fs.String("dsn", os.Getenv("DATABASE_URL"), "the PostgreSQL DSN")
	session := fs.String("session", "u1", "the user session")
	item := fs.String("item", "book", "add: the item to put in the cart")
	think := fs.Duration("think", 0, "add: time between reading the cart and writing it")
	servers := fs.Int("servers", 3, "route: the number of servers")
	fs.Parse(os.Args[2:])
	var err error
	switch os.Args[1] {
	case "route":
		fmt.Println(route(*session, *servers))
		return
	case "setup", "add":
		var db *sql.DB
		if db, err = sql.Open("pgx", *dsn); err != nil {
			break
		}
		defer db.Close()
		if os.Args[1] == "setup" {
			err = setup(ctx, db, *session)
		} else {
			err = addItem(ctx, db, *session, *item, *think)
		}
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sessions:", err)
		os.Exit(1)
	}
}

func setup(ctx context.Context, db *sql.DB, session string) error {
	if _, err := db.ExecContext(ctx, `CREATE TABLE carts (session text PRIMARY KEY, items text NOT NULL, version bigint NOT NULL DEFAULT 0)`); err != nil {
		return err
	}
	_, err := db.ExecContext(ctx, `INSERT INTO carts (session, items) VALUES ($1, '')`, session)
	return err
}

// addItem reads the cart, adds the item, and writes the cart only if
// nobody wrote it since the read; otherwise it reads again and retries.
func addItem(ctx context.Context, db *sql.DB, session, item string, think time.Duration) error {
	return nolock.Optimistic(ctx, 20, func(ctx context.Context) error {
		var items string
		var version int64
		err := db.QueryRowContext(ctx, `SELECT items, version FROM carts WHERE session = $1`, session).Scan(&items, &version)
		if err != nil {
			return err
		}
		fmt.Printf("%s: read cart %q at version %d\n", item, items, version)
		time.Sleep(think) // a server paused here finds the version moved when it wakes
		_, err = nolock.UpdateVersioned(ctx, db, nolock.Postgres, nolock.VersionedRow{
			Table:   "carts",
			Key:     []nolock.Column{{Name: "session", Value: session}},
			Set:     []nolock.Column{{Name: "items", Value: items + item + ";"}},
			Version: version,
		})
		if err == nil {
			fmt.Printf("%s: added\n", item)
		}
		return err
	})
}

// route names the server that handles every write of a session, so that
// one server (and, in it, one goroutine: nolock.Serializer) writes it.
func route(session string, servers int) int {
	return nolock.Partition(session, servers)
}
