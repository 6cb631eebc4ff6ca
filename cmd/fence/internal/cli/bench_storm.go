package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

// benchHoldCommand is `fence bench hold`, a process of `fence bench
// --idle-procs` that holds idle sessions. It is hidden: its protocol is
// the bench's. It prints "ready N" once it holds N sessions, keeps them
// alive until its stdin ends or it is signalled, then closes them.
func benchHoldCommand(g *globals) *cobra.Command {
	var (
		sessions, conns int
		ttl             time.Duration
	)
	cmd := &cobra.Command{
		Use:    "hold",
		Short:  "Hold idle sessions for fence bench",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			held, err := holdIdleSessions(ctx, g, sessions, conns, ttl)
			defer held.close()
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "ready %d\n", len(held.sessions))
			stdinDone := make(chan struct{})
			go func() {
				_, _ = io.Copy(io.Discard, g.stdin)
				close(stdinDone)
			}()
			select {
			case <-ctx.Done():
			case <-stdinDone:
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&sessions, "sessions", 0, "sessions to hold")
	cmd.Flags().IntVar(&conns, "conns", 1, "client connections the sessions share")
	cmd.Flags().DurationVar(&ttl, "ttl", 10*time.Second, "TTL of the sessions")
	return cmd
}

// holders are the `fence bench hold` processes of a bench run.
type holders struct {
	procs []*holder
	// perProc is the number of sessions each holds.
	perProc int
}

type holder struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	killed bool
}

// startHolders starts procs processes that hold n sessions between them,
// n/procs each, and waits until all hold theirs.
func startHolders(ctx context.Context, g *globals, n, procs, conns int, ttl time.Duration) (*holders, error) {
	if procs <= 0 || n%procs != 0 {
		return nil, fmt.Errorf("--idle-sessions %d must be a multiple of --idle-procs %d", n, procs)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding this executable to hold the idle sessions: %w", err)
	}
	h := &holders{perProc: n / procs}
	ready := make(chan error, procs)
	for range procs {
		args := append(g.childArgs(), "bench", "hold", "--sessions", strconv.Itoa(h.perProc),
			"--conns", strconv.Itoa(max(1, conns/procs)), "--ttl", ttl.String(), "--no-stream="+strconv.FormatBool(g.noStream), "--http2-stream="+strconv.FormatBool(g.http2Stream))
		cmd := exec.Command(exe, args...)
		cmd.Stderr = g.stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			h.close()
			return nil, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			h.close()
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			h.close()
			return nil, fmt.Errorf("starting a holder of idle sessions: %w", err)
		}
		h.procs = append(h.procs, &holder{cmd: cmd, stdin: stdin})
		go func() {
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err == nil && !strings.HasPrefix(line, "ready ") {
				err = fmt.Errorf("holder said %q", line)
			}
			if err != nil {
				err = fmt.Errorf("a holder of idle sessions failed before it held them all: %w", err)
			}
			ready <- err
			_, _ = io.Copy(io.Discard, stdout)
		}()
	}
	for range procs {
		select {
		case err := <-ready:
			if err != nil {
				h.close()
				return nil, err
			}
		case <-ctx.Done():
			h.close()
			return nil, ctx.Err()
		}
	}
	return h, nil
}

// kill SIGKILLs k of the holders, as a crash would end them: their
// sessions are left to expire.
func (h *holders) kill(k int) error {
	var errs []error
	for _, p := range h.procs {
		if k == 0 {
			break
		}
		if p.killed {
			continue
		}
		p.killed = true
		k--
		errs = append(errs, p.cmd.Process.Kill())
	}
	return errors.Join(errs...)
}

// close ends the holders still running: each closes its sessions when its
// stdin ends.
func (h *holders) close() {
	if h == nil {
		return
	}
	for _, p := range h.procs {
		p.stdin.Close()
	}
	for _, p := range h.procs {
		done := make(chan struct{})
		go func() {
			_ = p.cmd.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
	}
}

// childArgs are the global flags that make a child fence process talk to
// the same nodes, as the same user, as this one.
func (g *globals) childArgs() []string {
	args := []string{"--endpoints", g.endpoints, "--dial-timeout", g.dialTimeout.String()}
	for _, f := range [][2]string{
		{"--cluster-id", g.clusterID}, {"--auth-token-file", g.authTokenFile},
		{"--cacert", g.tls.ca}, {"--cert", g.tls.cert}, {"--key", g.tls.key},
	} {
		if f[1] != "" {
			args = append(args, f[0], f[1])
		}
	}
	return args
}

// stormJSON is bench's report of an expiry storm.
type stormJSON struct {
	Sessions int `json:"sessions"`
	// Expired is how many of them the service expired, and ExpiredIn the
	// time from killing their holders until the last one was.
	Expired   int    `json:"expired"`
	ExpiredIn string `json:"expiredIn"`
	// Before is the workers' run before the kill, During from the kill
	// until a second after the last expiry.
	Before benchJSON `json:"before"`
	During benchJSON `json:"during"`

	before, during benchResult
}

// runStorm runs n workers on their own locks, kills the holders of k
// sessions once the workers have run for a while, and measures how long
// the service takes to expire them all and what that does to the workers.
func runStorm(ctx context.Context, g *globals, h *holders, k, n int, ttl time.Duration) (stormJSON, error) {
	const warmup, after = 2 * time.Second, time.Second
	out := stormJSON{Sessions: k}
	var killedAt, expiredAt time.Time
	r, err := runBenchWhile(ctx, g, "own", n, func(ctx context.Context) error {
		select {
		case <-time.After(warmup):
		case <-ctx.Done():
			return ctx.Err()
		}
		live, err := scrapeMetric(ctx, g, "fence_sessions")
		if err != nil {
			return err
		}
		killedAt = time.Now()
		if err := h.kill(k / h.perProc); err != nil {
			return fmt.Errorf("killing the holders: %w", err)
		}
		giveUp := time.After(ttl + 10*time.Second)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
			case <-giveUp:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
			now, err := scrapeMetric(ctx, g, "fence_sessions")
			if err != nil {
				return err
			}
			out.Expired = min(k, int(live-now))
			if out.Expired >= k {
				expiredAt = time.Now()
				break
			}
		}
		select {
		case <-time.After(after):
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	})
	if err != nil {
		return out, err
	}
	row := func(res benchResult) benchJSON {
		return benchJSON{Workload: "own", Clients: n, Idle: h.perProc * len(h.procs), Rate: res.rate, P50: jsonDuration(res.p50), P99: jsonDuration(res.p99)}
	}
	end := time.Now()
	if !expiredAt.IsZero() {
		out.ExpiredIn = jsonDuration(expiredAt.Sub(killedAt))
		end = expiredAt.Add(after)
	}
	out.before = summarize(r.samples, killedAt.Add(-warmup/2), killedAt)
	out.during = summarize(r.samples, killedAt, end)
	out.Before, out.During = row(out.before), row(out.during)
	return out, nil
}
