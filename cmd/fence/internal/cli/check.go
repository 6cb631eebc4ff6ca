package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencelock/fence/cmd/fence/internal/check"
)

// checkLong is fence check's help.
const checkLong = `Runs worker processes that take a lock and read-modify-write a counter and a
list in the fenced KV store while a seeded schedule of faults pauses workers
past their TTL (SIGSTOP/SIGCONT), kills them, and kills and restarts the
server; with --nodes 3 or 5 it also kills the leader, partitions it from
the majority (each raft link runs through a proxy the checker can cut), and
pauses the leader (pause-leader: past the election of a new one, but not
past the keepalives sent to it) or a follower, and damages a killed
follower's raft log (corrupt-follower: bytes flipped in the middle, which
must stop it with a message, or a write torn at the end, which it must
drop and start), deletes the data dir of a follower or of the leader and
starts it again with its flags (wipe: it must be added again and be a voter
again, and found no group of its own), and starts a node of a group of its
own and asks the group to add it (foreign-add: it must be refused, naming
both groups); as root on Linux it also fills a node's disk (disk-full:
each node runs on a small tmpfs of its own) and frees it again. Every
endpoint must be a node of one group, and must still answer for it at the
end. It then checks the history:
no write accepted with a token lower than one accepted before, no
acknowledged increment or append lost, grant tokens rising in real-time
order, a linearizable KV history, and, from each worker's report of when it
believed it held the lock (from the grant to its release, or to its
session's safe-until), that no two workers believed so at once and that
none started a write after its belief ended.

Without --endpoints it starts its own server (and may kill it). Exits 1 on
any violation. --unsafe-resource writes without tokens, to show that the
checker finds the lost updates that fencing prevents.`

func checkCommand(g *globals) *cobra.Command {
	var (
		cfg     check.Config
		faults  []string
		report  string
		history string
	)
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Prove, under pauses and crashes, that no stale write is accepted",
		Long:  checkLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bin, err := os.Executable()
			if err != nil {
				return err
			}
			cfg.Binary = bin
			cfg.Endpoints = splitEndpoints(g.endpoints)
			if len(faults) > 0 {
				cfg.Faults = faults
			}
			cfg.Log = g.stderr
			res, err := check.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			printCheck(g, res)
			if history != "" {
				if err := writeHistory(history, res); err != nil {
					return err
				}
			}
			if report != "" {
				if err := writeCheckReport(report, res); err != nil {
					return err
				}
				fmt.Fprintf(g.stdout, "report: %s\n", report)
			}
			if res.Failed() {
				return &ExitError{Code: exitFailure}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Workers, "workers", 5, "worker processes")
	f.IntVar(&cfg.Nodes, "nodes", 1, "servers to start (3 or 5 adds leader kills, partitions, server pauses, wiped data dirs and foreign nodes); ignored with --endpoints")
	f.DurationVar(&cfg.Duration, "duration", 30*time.Second, "how long to run the workload")
	f.Uint64Var(&cfg.Seed, "seed", uint64(time.Now().UnixNano()%1e6), "seed of the fault schedule, to reproduce a run")
	f.DurationVar(&cfg.TTL, "ttl", 0, "the workers' session TTL; pauses of workers last longer (default 1s; with pause-leader, 3-4s drawn by each worker process)")
	f.DurationVar(&cfg.FaultInterval, "fault-interval", 2*time.Second, "mean time between faults")
	f.StringSliceVar(&faults, "faults", nil, "faults to inject: "+strings.Join(check.FaultKinds, ", ")+" (default: all that apply)")
	f.BoolVar(&cfg.Unsafe, "unsafe-resource", false, "write without tokens: the checker must find lost updates")
	f.StringVar(&cfg.Postgres, "postgres", "", "also increment a fenced counter in this PostgreSQL database (DSN)")
	f.StringVar(&cfg.DataDir, "data-dir", "", "keep the server's data and log here (default: a temporary dir)")
	f.StringVar(&report, "report", "", "write an HTML report of the run to this file")
	f.StringVar(&history, "history", "", "write every operation to this file, one JSON object a line")
	return cmd
}

func splitEndpoints(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

func printCheck(g *globals, res *check.Result) {
	a := res.Analysis
	w := g.stdout
	fmt.Fprintf(w, "seed %d, %v\n", res.Seed, res.Ended.Sub(res.Started).Round(time.Millisecond))
	counts := map[string]int{}
	for _, f := range res.Faults {
		counts[f.Kind]++
	}
	fmt.Fprintf(w, "faults: %d", len(res.Faults))
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		fmt.Fprintf(w, ", %s %d", k, counts[k])
	}
	fmt.Fprintln(w)
	outcomes := map[string]int{}
	for _, f := range res.Faults {
		if f.Outcome != "" {
			outcomes[f.Kind+" "+f.Outcome]++
		}
	}
	if len(outcomes) > 0 {
		fmt.Fprint(w, "fault outcomes:")
		for i, k := range slices.Sorted(maps.Keys(outcomes)) {
			fmt.Fprintf(w, "%s %s %d", map[bool]string{true: "", false: ","}[i == 0], k, outcomes[k])
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "operations: %d (grants %d, accepted writes %d, refused %d, unknown outcome %d)\n", a.Ops, a.Acquires, a.Writes, a.Rejected, a.Unknown)
	gaps := check.GrantGaps(res.Ops, res.Faults)
	gapKinds := slices.Sorted(maps.Keys(gaps))
	fmt.Fprint(w, "longest gap between grants:")
	for i, k := range gapKinds {
		fmt.Fprintf(w, "%s %s %v", map[bool]string{true: "", false: ","}[i == 0], k, gaps[k].Round(time.Millisecond))
	}
	fmt.Fprintln(w, " (none: while no fault was under way)")
	fmt.Fprintf(w, "holds: %d (of unknown end, their worker killed, so not checked for overlap: %d)\n", a.Holds, a.HoldsUnknownEnd)
	fmt.Fprintf(w, "counter: %s after %d acknowledged increments (%d unknown)\n", orZero(res.Final.Counter), a.AckedIncrements, a.UnknownIncrements)
	if res.Final.HaveSQL {
		fmt.Fprintf(w, "sql counter: %d\n", res.Final.SQLCounter)
	}
	fmt.Fprintf(w, "linearizability: %s\n", a.Linearizability)
	if len(a.Violations) == 0 {
		fmt.Fprintln(w, "violations: none")
		return
	}
	byKind := map[string][]check.Violation{}
	for _, v := range a.Violations {
		byKind[v.Kind] = append(byKind[v.Kind], v)
	}
	fmt.Fprintf(w, "violations: %d\n", len(a.Violations))
	for _, k := range slices.Sorted(maps.Keys(byKind)) {
		fmt.Fprintf(w, "  %s: %d\n", k, len(byKind[k]))
		for i, v := range byKind[k] {
			if i == 3 {
				fmt.Fprintf(w, "    ... and %d more\n", len(byKind[k])-3)
				break
			}
			fmt.Fprintf(w, "    %s\n", v.Detail)
		}
	}
}

func orZero(s string) string {
	if s == "" {
		return "0"
	}
	return s
}

func checkWorkerCommand(g *globals) *cobra.Command {
	var (
		cfg      check.WorkerConfig
		postgres string
	)
	cmd := &cobra.Command{
		Use:    "check-worker",
		Short:  "A worker process of fence check",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Endpoints = splitEndpoints(g.endpoints)
			cfg.ClusterID = g.clusterID
			cfg.Lock = "check"
			// SIGTERM ends the loop; SIGKILL is a fault.
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			if postgres != "" {
				target, err := check.OpenSQLTarget(ctx, postgres, cfg.Prefix)
				if err != nil {
					return err
				}
				defer target.Close()
				cfg.SQL = target
			}
			return check.RunWorker(ctx, cfg, g.stdout)
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.ID, "id", 0, "worker id")
	f.IntVar(&cfg.Run, "run", 1, "how many times this worker has been started")
	f.DurationVar(&cfg.TTL, "ttl", time.Second, "session TTL")
	f.StringVar(&cfg.Prefix, "prefix", "check/", "key prefix of the run")
	f.BoolVar(&cfg.Unsafe, "unsafe", false, "write without tokens")
	f.Uint64Var(&cfg.Seed, "seed", 1, "seed")
	f.StringVar(&postgres, "postgres", "", "PostgreSQL DSN")
	return cmd
}

// writeCheckReport writes the run's report: SVG for a .svg path, else HTML.
func writeCheckReport(path string, res *check.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	write := res.Report
	if strings.HasSuffix(path, ".svg") {
		write = res.ReportSVG
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func writeHistory(path string, res *check.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, op := range res.Ops {
		if err := enc.Encode(op); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}
