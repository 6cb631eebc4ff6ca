package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencelock/fence/client"
)

func benchCommand(g *globals) *cobra.Command {
	var (
		clients   []int
		duration  time.Duration
		workloads []string
		asJSON    bool
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure lock+unlock throughput and latency against a running service",
		Long: `Runs each workload with each number of clients for --duration and prints
lock+unlock cycles per second with p50 and p99 latency of one cycle.

Workloads: "own" gives each client its own lock; "hot" has all clients
contend for one lock (FIFO hand-off).

Each client sends its operations on one HTTP/2 stream (the session
stream); --no-stream sends each as a unary call of its own instead, as
clients before the stream did, to compare the two.

With --json, prints {"results": [{"workload", "clients", "cyclesPerSecond",
"p50", "p99"}]} once every run is done.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, w := range workloads {
				if w != "own" && w != "hot" {
					return fmt.Errorf("unknown workload %q: want own or hot", w)
				}
			}
			if !asJSON {
				fmt.Fprintf(g.stdout, "%-8s %8s %12s %10s %10s\n", "workload", "clients", "cycles/s", "p50", "p99")
			}
			results := []benchJSON{}
			for _, w := range workloads {
				for _, n := range clients {
					r, err := runBench(cmd.Context(), g, w, n, duration)
					if err != nil {
						return err
					}
					if asJSON {
						results = append(results, benchJSON{Workload: w, Clients: n, Rate: r.rate, P50: jsonDuration(r.p50), P99: jsonDuration(r.p99)})
						continue
					}
					fmt.Fprintf(g.stdout, "%-8s %8d %12.0f %10s %10s\n", w, n, r.rate, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond))
				}
			}
			if asJSON {
				return printJSONValue(g, map[string]any{"results": results})
			}
			return nil
		},
	}
	cmd.Flags().IntSliceVar(&clients, "clients", []int{1, 16}, "numbers of concurrent clients to run")
	cmd.Flags().DurationVar(&duration, "duration", 5*time.Second, "how long each run lasts")
	cmd.Flags().StringSliceVar(&workloads, "workload", []string{"own", "hot"}, "workloads: own, hot")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON once every run is done")
	cmd.Flags().BoolVar(&g.noStream, "no-stream", false, "send each operation as a unary call, not on the session stream")
	return cmd
}

// benchJSON is one run in bench's --json output.
type benchJSON struct {
	Workload string  `json:"workload"`
	Clients  int     `json:"clients"`
	Rate     float64 `json:"cyclesPerSecond"`
	P50      string  `json:"p50"`
	P99      string  `json:"p99"`
}

type benchResult struct {
	rate     float64
	p50, p99 time.Duration
}

// runBench runs n clients, each with its own connection and session, doing
// lock+unlock cycles for d.
func runBench(ctx context.Context, g *globals, workload string, n int, d time.Duration) (benchResult, error) {
	run := strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")
	type worker struct {
		c *client.Client
		s *client.Session
		m *client.Mutex
	}
	workers := make([]worker, n)
	defer func() {
		for _, w := range workers {
			if w.s != nil {
				_ = w.s.Close(context.Background())
			}
			if w.c != nil {
				w.c.Close()
			}
		}
	}()
	for i := range workers {
		c, err := g.client()
		if err != nil {
			return benchResult{}, err
		}
		s, err := c.NewSession(ctx, client.WithOwner(fmt.Sprintf("fence bench %d", i)))
		if err != nil {
			c.Close()
			return benchResult{}, err
		}
		name := "bench/" + run + "/hot"
		if workload == "own" {
			name = fmt.Sprintf("bench/%s/own-%d", run, i)
		}
		workers[i] = worker{c: c, s: s, m: client.NewMutex(s, name)}
	}

	// Cancel rather than time out: a deadline would travel with every call
	// and could end one on the server a moment before the client sees its
	// own context end, which looked like a failed cycle.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := time.AfterFunc(d, cancel)
	defer stop.Stop()
	var (
		mu        sync.Mutex
		latencies []time.Duration
		firstErr  error
		wg        sync.WaitGroup
	)
	start := time.Now()
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var local []time.Duration
			for ctx.Err() == nil {
				t0 := time.Now()
				if _, err := w.m.Lock(ctx); err != nil {
					if ctx.Err() == nil {
						mu.Lock()
						firstErr = cmpErr(firstErr, err)
						mu.Unlock()
					}
					break
				}
				if err := w.m.Unlock(context.Background()); err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					break
				}
				local = append(local, time.Since(t0))
			}
			mu.Lock()
			latencies = append(latencies, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return benchResult{}, firstErr
	}
	if len(latencies) == 0 {
		return benchResult{}, fmt.Errorf("no lock+unlock cycle completed in %v", d)
	}
	slices.Sort(latencies)
	pct := func(p float64) time.Duration { return latencies[int(float64(len(latencies)-1)*p)] }
	return benchResult{rate: float64(len(latencies)) / elapsed.Seconds(), p50: pct(0.50), p99: pct(0.99)}, nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}
