// Command job-once is the "scheduled job runs once" recipe of
// docs/uses/job-once.md, in its two forms:
//
//	# efficiency: a cheap job run once a day by whichever machine's cron runs it first
//	fence run-once nightly-$(date +%F) -- job-once cheap --out report.txt --worker $(hostname)
//
//	# correctness: the job key recorded in the job's own transaction, no lock
//	job-once report --dsn postgres://... --day 2026-12-02 --worker $(hostname)
//
// cheap appends "start W" and, after --work, "done W" to --out. report
// writes the day's report row in PostgreSQL at most once, ever: it prints
// "W: ran" or "W: already done".
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
		fmt.Fprintln(os.Stderr, "usage: job-once cheap|report [flags]")
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	worker := fs.String("worker", "w", "this worker's name")
	work := fs.Duration("work", 300*time.Millisecond, "how long the job takes")
	out := fs.String("out", "report.txt", "cheap: the file the job appends to")
	dsn := fs.String("dsn", os.Getenv("DATABASE_URL"), "report: the PostgreSQL DSN")
	day := fs.String("day", time.Now().Format(time.DateOnly), "report: the day to report")
	fs.Parse(os.Args[2:])
	var err error
	switch os.Args[1] {
	case "cheap":
		err = cheap(*out, *worker, *work)
	case "report":
		err = report(ctx, *dsn, *day, *worker, *work)
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "job-once:", err)
		os.Exit(1)
	}
}

// cheap is a job whose double run only wastes effort.
func cheap(out, worker string, work time.Duration) error {
	f, err := os.OpenFile(out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(f, "start %s\n", worker)
	fmt.Printf("%s: running\n", worker)
	time.Sleep(work)
	fmt.Fprintf(f, "done %s\n", worker)
	return nil
}

// report writes the day's report once: the job key and the report commit
// in one transaction, or neither does.
func report(ctx context.Context, dsn, day, worker string, work time.Duration) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := setup(ctx, db); err != nil {
		return err
	}
	ran, err := nolock.Once(ctx, db, nolock.Postgres, "job_runs", "report/"+day, func(ctx context.Context, tx *sql.Tx) error {
		fmt.Printf("%s: running\n", worker)
		time.Sleep(work) // a worker killed here leaves nothing behind: the transaction rolls back
		_, err := tx.ExecContext(ctx, `INSERT INTO reports (day, worker) VALUES ($1, $2)`, day, worker)
		return err
	})
	if err != nil {
		return err
	}
	if ran {
		fmt.Printf("%s: ran\n", worker)
	} else {
		fmt.Printf("%s: already done\n", worker)
	}
	return nil
}

func setup(ctx context.Context, db *sql.DB) error {
	if err := nolock.CreateKeyTable(ctx, db, nolock.Postgres, "job_runs"); err != nil {
		return err
	}
	_, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS reports (day text NOT NULL, worker text NOT NULL)`)
	return err
}
