package cli

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/fencelock/fence/cmd/fence/internal/timeline"
	"github.com/fencelock/fence/nolock"
)

const (
	jobOnceDay   = "2026-12-02"
	jobOnceKey   = "report/" + jobOnceDay // the job's key, as in docs/uses/job-once.md
	jobOnceTable = "job_keys"
)

// jobOnceStory: the nightly job's lock holder A is paused past its TTL
// before it runs the job; B takes the lock and runs it; A wakes and runs it
// too. With nolock.Once the job key recorded in B's transaction makes A's
// run a no-op.
var jobOnceStory = &demoStory{
	name:  "job-once",
	about: "a scheduled job's lock holder paused past its TTL, and the job run twice",
	page:  "docs/uses/job-once.md",
	lock:  "nightly",
	lane:  "jobs db",
	setup: []string{
		"cron          A and B are two machines' cron runs of the nightly job, each under lock \"nightly\" (as fence lock)",
		"the job       sends the report of " + jobOnceDay + ": a row in table report_runs of an SQLite file (standing in for the job's database)",
		"database      $TMP/runN/" + useDBName + " (SQLite through modernc.org/sqlite; the page uses PostgreSQL)",
	},
	runs: []demoRunSpec{
		{title: "without the fix, a lease lock alone (fine for efficiency, a rare duplicate)"},
		{fix: "once", title: "with the fix, nolock.Once records the job key in the job's own transaction"},
	},
	prepare: prepareJobOnce,
	inspect: inspectJobOnce,
	note: "A takes lock nightly and is paused with SIGSTOP before it runs the job; its session expires and B takes the lock, runs the job and releases; " +
		"A is resumed with SIGCONT and, still believing it holds the lock, runs the job too.",
}

var jobOnceActor = actorScript{act: runNightlyJob}

// runNightlyJob runs the job: it records that the report was sent. With
// the fix it does so under nolock.Once, in the transaction that records the
// job key.
func runNightlyJob(ctx context.Context, a *demoActor) demoEvent {
	job := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO report_runs (day, worker) VALUES (?, ?)", jobOnceDay, a.f.name)
		return err
	}
	if a.f.fix != "once" {
		tx, err := a.db.BeginTx(ctx, nil)
		if err != nil {
			return stepFailed(err)
		}
		defer tx.Rollback()
		if err := job(ctx, tx); err != nil {
			return stepFailed(err)
		}
		if err := tx.Commit(); err != nil {
			return stepFailed(err)
		}
		return demoEvent{Event: "wrote", Message: "ran the job: report of " + jobOnceDay + " sent"}
	}
	ran, err := nolock.Once(ctx, a.db, nolock.SQLite, jobOnceTable, jobOnceKey, job)
	switch {
	case err != nil:
		return stepFailed(err)
	case !ran:
		return demoEvent{Event: "rejected", Message: "job skipped: nolock.Once found key " + jobOnceKey + " recorded, the job ran already"}
	}
	return demoEvent{Event: "wrote", Message: "ran the job under nolock.Once: key " + jobOnceKey + " recorded, report sent"}
}

// prepareJobOnce creates the run's database: the job's table and the
// table of job keys.
func prepareJobOnce(ctx context.Context, p *demoPlay) error {
	db, err := openUseDB(p.dir)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := execAll(ctx, db, "CREATE TABLE report_runs (day TEXT NOT NULL, worker TEXT NOT NULL)"); err != nil {
		return err
	}
	return nolock.CreateKeyTable(ctx, db, nolock.SQLite, jobOnceTable)
}

// inspectJobOnce counts the job's runs.
func inspectJobOnce(ctx context.Context, p *demoPlay) error {
	db, err := openUseDB(p.dir)
	if err != nil {
		return err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, "SELECT worker FROM report_runs WHERE day = ? ORDER BY rowid", jobOnceDay)
	if err != nil {
		return err
	}
	defer rows.Close()
	var workers []string
	for rows.Next() {
		var w string
		if err := rows.Scan(&w); err != nil {
			return err
		}
		workers = append(workers, w)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	r, now := p.run, time.Now()
	times := map[int]string{0: "never", 1: "once", 2: "twice"}[len(workers)]
	if times == "" {
		times = fmt.Sprintf("%d times", len(workers))
	}
	ran := fmt.Sprintf("the report of %s was sent %s (by %s)", jobOnceDay, times, strings.Join(workers, ", "))
	story := fmt.Sprintf("A (token %d) took lock nightly and was paused past its TTL before it ran the job; B took the lock (token %d) and ran the job; A woke and ran it too", r.tokenA, r.tokenB)
	twice := len(workers) == 2 && workers[0] == "B" && workers[1] == "A"
	once := len(workers) == 1 && workers[0] == "B"
	switch {
	case p.spec.fix == "":
		if twice {
			r.mark(p.story.lane, now, timeline.MarkLostUpdate, "the job ran twice: sent by B and A")
		}
		p.judgeUse(twice, fmt.Sprintf("RAN TWICE: %s: %s. A lease lock alone allows this duplicate: fine for a job run for efficiency, damage for one that must run once.", story, ran), ran)
	default:
		if once {
			r.mark(p.story.lane, now, timeline.MarkInfo, "the job ran once: sent by B")
		}
		p.judgeUse(once && r.writeA.Event == "rejected", fmt.Sprintf("RAN ONCE: %s, but nolock.Once found job key %s recorded in B's run's transaction and skipped it: %s.", story, jobOnceKey, ran), ran)
	}
	return nil
}
