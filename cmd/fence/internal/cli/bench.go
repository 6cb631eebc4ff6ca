package cli

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencelock/fence/client"
)

func benchCommand(g *globals) *cobra.Command {
	b := &bench{g: g}
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

With --idle-procs P, the idle sessions are held by P processes of their
own (N/P each), as many clients of a service would hold them. Then
--expire K kills (SIGKILL) the processes holding K of them while the
largest number of --clients run on their own locks, and reports how long
the service took to expire all K (by its fence_sessions gauge; each should
go within --idle-ttl of the kill) and the workers' rate and latency from
the kill until a second after the last expiry, against the two seconds
before: an expiry storm must not starve the others.

Each client sends its operations on one stream (the session stream),
framed on its connection; --http2-stream carries that stream over HTTP/2
instead, and --no-stream sends each operation as a unary call of its own,
as clients before the stream did, to compare the three.

With --json, prints {"results": [{"workload", "clients", "idleSessions",
"cyclesPerSecond", "p50", "p99"}]} once every run is done, and with
--idle-sessions also "idle": {"sessions", "rssBefore", "rssAfter",
"bytesPerSession"}, and with --expire "storm": {"sessions", "expired",
"expiredIn", "before", "during"}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return b.run(cmd.Context()) },
	}
	cmd.Flags().IntSliceVar(&b.clients, "clients", []int{1, 16}, "numbers of concurrent clients to run")
	cmd.Flags().DurationVar(&b.duration, "duration", 5*time.Second, "how long each run lasts")
	cmd.Flags().StringSliceVar(&b.workloads, "workload", []string{"own", "hot"}, "workloads: own, hot")
	cmd.Flags().BoolVar(&b.asJSON, "json", false, "print JSON once every run is done: the runs' measurements")
	cmd.Flags().IntVar(&b.idle, "idle-sessions", 0, "also run every workload while holding this many more sessions open and kept alive")
	cmd.Flags().IntVar(&b.idleConns, "idle-conns", 4, "client connections the idle sessions share")
	cmd.Flags().DurationVar(&b.idleTTL, "idle-ttl", 10*time.Second, "TTL of the idle sessions")
	cmd.Flags().IntVar(&b.idleProcs, "idle-procs", 0, "hold the idle sessions in this many processes of their own (0: in this one)")
	cmd.Flags().IntVar(&b.expire, "expire", 0, "then kill the processes holding this many idle sessions and measure their expiry (needs --idle-procs)")
	cmd.Flags().StringVar(&b.profile, "cpuprofile", "", "write the bench process's CPU profile to this file (go tool pprof), to see the client's cost")
	cmd.PersistentFlags().BoolVar(&g.noStream, "no-stream", false, "send each operation as a unary call, not on the session stream")
	cmd.PersistentFlags().BoolVar(&g.http2Stream, "http2-stream", false, "carry the session stream over HTTP/2 (Connect), not framed on its connection")
	cmd.AddCommand(benchHoldCommand(g))
	return cmd
}

// bench is one fence bench: its flags, and the runs measured so far.
type bench struct {
	g         *globals
	clients   []int
	duration  time.Duration
	workloads []string
	asJSON    bool
	idle      int
	idleConns int
	idleTTL   time.Duration
	idleProcs int
	expire    int
	profile   string

	results []benchJSON
}

func (b *bench) run(ctx context.Context) error {
	if err := b.check(); err != nil {
		return err
	}
	if b.profile != "" {
		stop, err := startCPUProfile(b.profile)
		if err != nil {
			return err
		}
		defer stop()
	}
	if !b.asJSON {
		fmt.Fprintf(b.g.stdout, "%-8s %8s %8s %12s %10s %10s\n", "workload", "clients", "idle", "cycles/s", "p50", "p99")
	}
	b.results = []benchJSON{}
	if err := b.runAll(ctx, 0); err != nil {
		return err
	}
	var (
		idleOut *idleJSON
		hold    *holders
	)
	if b.idle > 0 {
		out, procs, release, err := b.holdIdle(ctx)
		if err != nil {
			return err
		}
		defer release()
		idleOut, hold = out, procs
		if err := b.runAll(ctx, b.idle); err != nil {
			return err
		}
	}
	var storm *stormJSON
	if b.expire > 0 {
		r, err := b.storm(ctx, hold)
		if err != nil {
			return err
		}
		storm = &r
	}
	if !b.asJSON {
		return nil
	}
	out := map[string]any{"results": b.results}
	if idleOut != nil {
		out["idle"] = idleOut
	}
	if storm != nil {
		out["storm"] = storm
	}
	return printJSONValue(b.g, out)
}

// check refuses flags that cannot make a run.
func (b *bench) check() error {
	for _, w := range b.workloads {
		if w != "own" && w != "hot" {
			return fmt.Errorf("unknown workload %q: want own or hot", w)
		}
	}
	if len(b.clients) == 0 || slices.Min(b.clients) <= 0 {
		return fmt.Errorf("--clients must name positive numbers of clients")
	}
	idle, idleProcs, expire := b.idle, b.idleProcs, b.expire
	switch {
	case idle < 0 || idleProcs < 0 || expire < 0:
		return fmt.Errorf("--idle-sessions, --idle-procs and --expire cannot be negative")
	case idleProcs > 0 && idle%idleProcs != 0:
		return fmt.Errorf("--idle-sessions %d must be a multiple of --idle-procs %d", idle, idleProcs)
	case expire > 0 && idleProcs == 0:
		return fmt.Errorf("--expire needs --idle-procs: it kills the processes that hold the sessions")
	case expire > idle || (expire > 0 && expire%(idle/idleProcs) != 0):
		return fmt.Errorf("--expire %d must be a multiple of the %d sessions each of the --idle-procs holds, at most --idle-sessions", expire, idle/max(idleProcs, 1))
	}
	return nil
}

// runAll runs every workload with every number of clients, while
// idleSessions more sessions are held, and prints each run.
func (b *bench) runAll(ctx context.Context, idleSessions int) error {
	for _, w := range b.workloads {
		for _, n := range b.clients {
			r, err := runBench(ctx, b.g, w, n, b.duration)
			if err != nil {
				return err
			}
			b.results = append(b.results, benchJSON{Workload: w, Clients: n, Idle: idleSessions, Rate: r.rate, P50: jsonDuration(r.p50), P99: jsonDuration(r.p99)})
			if b.asJSON {
				continue
			}
			ratio := ""
			if idleSessions > 0 {
				for _, base := range b.results {
					if base.Idle == 0 && base.Workload == w && base.Clients == n && base.Rate > 0 {
						ratio = fmt.Sprintf("  (%.2fx without)", r.rate/base.Rate)
					}
				}
			}
			fmt.Fprintf(b.g.stdout, "%-8s %8d %8d %12.0f %10s %10s%s\n", w, n, idleSessions, r.rate, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), ratio)
		}
	}
	return nil
}

// holdIdle opens the idle sessions (in this process, or in --idle-procs
// of their own) and measures the server's memory before and after; the
// caller calls release when done with them.
func (b *bench) holdIdle(ctx context.Context) (out *idleJSON, hold *holders, release func(), err error) {
	g, idle := b.g, b.idle
	before, beforeErr := serverRSS(ctx, g)
	if b.idleProcs > 0 {
		procs, err := startHolders(ctx, g, idle, b.idleProcs, b.idleConns, b.idleTTL)
		if err != nil {
			return nil, nil, nil, err
		}
		hold, release = procs, procs.close
	} else {
		held, err := holdIdleSessions(ctx, g, idle, b.idleConns, b.idleTTL)
		if err != nil {
			held.close()
			return nil, nil, nil, err
		}
		release = held.close
	}
	after, afterErr := serverRSS(ctx, g)
	out = &idleJSON{Sessions: idle}
	if err := errors.Join(beforeErr, afterErr); err != nil {
		fmt.Fprintf(g.stderr, "server memory not measured: %v\n", err)
	} else {
		out.RSSBefore, out.RSSAfter = before, after
		out.BytesPerSession = (float64(after) - float64(before)) / float64(idle)
	}
	if !b.asJSON {
		by := fmt.Sprintf("over %d connections", b.idleConns)
		if b.idleProcs > 0 {
			by = fmt.Sprintf("by %d processes", b.idleProcs)
		}
		fmt.Fprintf(g.stdout, "# %d idle sessions held %s; server RSS %.1f -> %.1f MiB, %.0f B per idle session\n",
			idle, by, float64(before)/(1<<20), float64(after)/(1<<20), out.BytesPerSession)
	}
	return out, hold, release, nil
}

// storm kills the holders of --expire idle sessions while the largest
// number of clients run, and prints how the service coped.
func (b *bench) storm(ctx context.Context, hold *holders) (stormJSON, error) {
	n := slices.Max(b.clients)
	r, err := runStorm(ctx, b.g, hold, b.expire, n, b.idleTTL)
	if err != nil || b.asJSON {
		return r, err
	}
	fmt.Fprintf(b.g.stdout, "# expiry storm: %d of %d sessions expired in %s after their holders were killed (TTL %s)\n",
		r.Expired, r.Sessions, cmp.Or(r.ExpiredIn, "more than TTL+10s"), b.idleTTL)
	for _, row := range []struct {
		when string
		r    benchResult
	}{{"before the kill", r.before}, {"until a second after the last expiry", r.during}} {
		fmt.Fprintf(b.g.stdout, "#   %d workers %s: %.0f cycles/s, p50 %s, p99 %s\n",
			n, row.when, row.r.rate, row.r.p50.Round(time.Microsecond), row.r.p99.Round(time.Microsecond))
	}
	return r, nil
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
	// samples are the cycles, in no particular order.
	samples []benchSample
}

// benchSample is one lock+unlock cycle: when it ended and how long it took.
type benchSample struct {
	end     time.Time
	latency time.Duration
}

// summarize gives the rate and percentiles of the cycles that ended in
// [from, to).
func summarize(samples []benchSample, from, to time.Time) benchResult {
	var lat []time.Duration
	for _, s := range samples {
		if !s.end.Before(from) && s.end.Before(to) {
			lat = append(lat, s.latency)
		}
	}
	if len(lat) == 0 {
		return benchResult{}
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[int(float64(len(lat)-1)*p)] }
	return benchResult{rate: float64(len(lat)) / to.Sub(from).Seconds(), p50: pct(0.50), p99: pct(0.99)}
}

// runBench runs n clients, each with its own connection and session, doing
// lock+unlock cycles for d.
func runBench(ctx context.Context, g *globals, workload string, n int, d time.Duration) (benchResult, error) {
	return runBenchWhile(ctx, g, workload, n, func(ctx context.Context) error {
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
		return nil
	})
}

// benchWorker is one client of a bench run: its own connection, session
// and mutex.
type benchWorker struct {
	c *client.Client
	s *client.Session
	m *client.Mutex
}

// newBenchWorkers connects n workers, each on its own lock for workload
// "own", all on one for "hot"; with an error, those made so far.
func newBenchWorkers(ctx context.Context, g *globals, workload string, n int) ([]benchWorker, error) {
	run := strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")
	var workers []benchWorker
	for i := range n {
		c, err := g.client()
		if err != nil {
			return workers, err
		}
		s, err := c.NewSession(ctx, client.WithOwner(fmt.Sprintf("fence bench %d", i)))
		if err != nil {
			c.Close()
			return workers, err
		}
		name := "bench/" + run + "/hot"
		if workload == "own" {
			name = fmt.Sprintf("bench/%s/own-%d", run, i)
		}
		workers = append(workers, benchWorker{c: c, s: s, m: client.NewMutex(s, name)})
	}
	return workers, nil
}

// closeBenchWorkers ends the workers' sessions and connections.
func closeBenchWorkers(workers []benchWorker) {
	for _, w := range workers {
		_ = w.s.Close(context.Background())
		w.c.Close()
	}
}

// runBenchWhile runs n clients, each with its own connection and session,
// doing lock+unlock cycles while during runs; during's error is the run's.
func runBenchWhile(ctx context.Context, g *globals, workload string, n int, during func(ctx context.Context) error) (benchResult, error) {
	workers, err := newBenchWorkers(ctx, g, workload, n)
	defer closeBenchWorkers(workers)
	if err != nil {
		return benchResult{}, err
	}

	// Cancel rather than time out: a deadline would travel with every call
	// and could end one on the server a moment before the client sees its
	// own context end, which looked like a failed cycle.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		samples  []benchSample
		firstErr error
		wg       sync.WaitGroup
	)
	start := time.Now()
	wg.Go(func() {
		err := during(ctx)
		mu.Lock()
		firstErr = cmpErr(firstErr, err)
		mu.Unlock()
		cancel()
	})
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var local []benchSample
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
				end := time.Now()
				local = append(local, benchSample{end: end, latency: end.Sub(t0)})
			}
			mu.Lock()
			samples = append(samples, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	end := time.Now()
	if firstErr != nil {
		return benchResult{}, firstErr
	}
	if len(samples) == 0 {
		return benchResult{}, fmt.Errorf("no lock+unlock cycle completed in %v", end.Sub(start).Round(time.Millisecond))
	}
	r := summarize(samples, start, end.Add(time.Nanosecond))
	r.samples = samples
	return r, nil
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
	v, err := scrapeMetric(ctx, g, "process_resident_memory_bytes")
	return uint64(v), err
}

// scrapeMetric reads the value of a metric without labels from the first
// endpoint's /metrics.
func scrapeMetric(ctx context.Context, g *globals, name string) (float64, error) {
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
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s/metrics has no %s", ep, name)
}

// startCPUProfile profiles this process's CPU into file until stop.
func startCPUProfile(file string) (stop func(), err error) {
	f, err := os.Create(file)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
