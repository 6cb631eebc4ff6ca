package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
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
		idle      int
		idleConns int
		idleTTL   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure lock+unlock throughput and latency against a running service",
		Long: `Runs each workload with each number of clients for --duration and prints
lock+unlock cycles per second with p50 and p99 latency of one cycle.

Workloads: "own" gives each client its own lock; "hot" has all clients
contend for one lock (FIFO hand-off).

With --idle-sessions N, runs every workload twice: first as above, then
while the bench process holds N more sessions open and kept alive (over
--idle-conns connections), and prints each run's rate against the first.
It also reads the server's resident memory (process_resident_memory_bytes
on the first endpoint's /metrics) before and after creating them, and
prints the difference per idle session.

With --json, prints {"results": [{"workload", "clients", "idleSessions",
"cyclesPerSecond", "p50", "p99"}]} once every run is done, and with
--idle-sessions also "idle": {"sessions", "rssBefore", "rssAfter",
"bytesPerSession"}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, w := range workloads {
				if w != "own" && w != "hot" {
					return fmt.Errorf("unknown workload %q: want own or hot", w)
				}
			}
			if !asJSON {
				fmt.Fprintf(g.stdout, "%-8s %8s %8s %12s %10s %10s\n", "workload", "clients", "idle", "cycles/s", "p50", "p99")
			}
			results := []benchJSON{}
			runAll := func(idleSessions int) error {
				for _, w := range workloads {
					for _, n := range clients {
						r, err := runBench(cmd.Context(), g, w, n, duration)
						if err != nil {
							return err
						}
						row := benchJSON{Workload: w, Clients: n, Idle: idleSessions, Rate: r.rate, P50: jsonDuration(r.p50), P99: jsonDuration(r.p99)}
						results = append(results, row)
						if asJSON {
							continue
						}
						ratio := ""
						if idleSessions > 0 {
							for _, base := range results {
								if base.Idle == 0 && base.Workload == w && base.Clients == n && base.Rate > 0 {
									ratio = fmt.Sprintf("  (%.2fx without)", r.rate/base.Rate)
								}
							}
						}
						fmt.Fprintf(g.stdout, "%-8s %8d %8d %12.0f %10s %10s%s\n", w, n, idleSessions, r.rate, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), ratio)
					}
				}
				return nil
			}
			if err := runAll(0); err != nil {
				return err
			}
			var idleOut *idleJSON
			if idle > 0 {
				before, beforeErr := serverRSS(cmd.Context(), g)
				held, err := holdIdleSessions(cmd.Context(), g, idle, idleConns, idleTTL)
				defer held.close()
				if err != nil {
					return err
				}
				after, afterErr := serverRSS(cmd.Context(), g)
				idleOut = &idleJSON{Sessions: idle}
				if err := errors.Join(beforeErr, afterErr); err != nil {
					fmt.Fprintf(g.stderr, "server memory not measured: %v\n", err)
				} else {
					idleOut.RSSBefore, idleOut.RSSAfter = before, after
					idleOut.BytesPerSession = (float64(after) - float64(before)) / float64(idle)
				}
				if !asJSON {
					fmt.Fprintf(g.stdout, "# %d idle sessions held over %d connections; server RSS %.1f -> %.1f MiB, %.0f B per idle session\n",
						idle, idleConns, float64(before)/(1<<20), float64(after)/(1<<20), idleOut.BytesPerSession)
				}
				if err := runAll(idle); err != nil {
					return err
				}
			}
			if asJSON {
				out := map[string]any{"results": results}
				if idleOut != nil {
					out["idle"] = idleOut
				}
				return printJSONValue(g, out)
			}
			return nil
		},
	}
	cmd.Flags().IntSliceVar(&clients, "clients", []int{1, 16}, "numbers of concurrent clients to run")
	cmd.Flags().DurationVar(&duration, "duration", 5*time.Second, "how long each run lasts")
	cmd.Flags().StringSliceVar(&workloads, "workload", []string{"own", "hot"}, "workloads: own, hot")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON once every run is done")
	cmd.Flags().IntVar(&idle, "idle-sessions", 0, "also run every workload while holding this many more sessions open and kept alive")
	cmd.Flags().IntVar(&idleConns, "idle-conns", 4, "client connections the idle sessions share")
	cmd.Flags().DurationVar(&idleTTL, "idle-ttl", 10*time.Second, "TTL of the idle sessions")
	return cmd
}

// benchJSON is one run in bench's --json output.
type benchJSON struct {
	Workload string  `json:"workload"`
	Clients  int     `json:"clients"`
	Idle     int     `json:"idleSessions"`
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

// idleJSON is bench's report of its idle sessions.
type idleJSON struct {
	Sessions        int     `json:"sessions"`
	RSSBefore       uint64  `json:"rssBefore"`
	RSSAfter        uint64  `json:"rssAfter"`
	BytesPerSession float64 `json:"bytesPerSession"`
}

// idleSessions are sessions the bench holds open, each kept alive by the
// client, over a few shared connections.
type idleSessions struct {
	clients  []*client.Client
	mu       sync.Mutex
	sessions []*client.Session
}

// holdIdleSessions creates n sessions over conns connections, 64 at a time.
func holdIdleSessions(ctx context.Context, g *globals, n, conns int, ttl time.Duration) (*idleSessions, error) {
	held := &idleSessions{}
	for range max(conns, 1) {
		c, err := g.client()
		if err != nil {
			return held, err
		}
		held.clients = append(held.clients, c)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	go func() {
		defer close(next)
		for i := range n {
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
	)
	for range 64 {
		wg.Go(func() {
			for i := range next {
				s, err := held.clients[i%len(held.clients)].NewSession(ctx, client.WithTTL(ttl), client.WithOwner(fmt.Sprintf("fence bench idle %d", i)))
				if err != nil {
					errMu.Lock()
					firstErr = cmpErr(firstErr, err)
					errMu.Unlock()
					cancel()
					return
				}
				held.mu.Lock()
				held.sessions = append(held.sessions, s)
				held.mu.Unlock()
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return held, fmt.Errorf("creating idle session %d of %d: %w", len(held.sessions)+1, n, firstErr)
	}
	return held, nil
}

// close closes every idle session, 64 at a time, and the connections.
func (h *idleSessions) close() {
	if h == nil {
		return
	}
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for _, s := range h.sessions {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = s.Close(ctx)
		})
	}
	wg.Wait()
	for _, c := range h.clients {
		c.Close()
	}
}

// serverRSS reads process_resident_memory_bytes from the first
// endpoint's /metrics.
func serverRSS(ctx context.Context, g *globals) (uint64, error) {
	ep := strings.TrimSpace(strings.Split(g.endpoints, ",")[0])
	if ep == "" {
		ep = client.DefaultEndpoint
	}
	tlsConfig, err := g.tls.config("client TLS", false, false)
	if err != nil {
		return 0, err
	}
	scheme, hc := "http", &http.Client{Timeout: 5 * time.Second}
	if tlsConfig != nil {
		scheme, hc.Transport = "https", &http.Transport{TLSClientConfig: tlsConfig}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+ep+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "process_resident_memory_bytes "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return uint64(f), err
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s/metrics has no process_resident_memory_bytes", ep)
}
