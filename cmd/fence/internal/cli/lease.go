package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
)

// The environment a lease lives in between the commands of a script:
// fence lease acquire prints it for eval, renew and release read it.
const (
	envLock        = "FENCE_LOCK"
	envToken       = "FENCE_TOKEN"
	envLease       = "FENCE_LEASE"
	envLeaseSecret = "FENCE_LEASE_SECRET"
)

func leaseCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lease",
		Short: "Take a lock in one call, for scripts and cron jobs: a lease to renew and release",
		Long: `A lease is a lock taken in one call, for a program that cannot keep a
session alive (a shell script, a cron job), as Redis's SET NX PX is:

    lease=$(fence lease acquire nightly --ttl 5m) || exit   # 124: held
    eval "$lease"                   # FENCE_LOCK, FENCE_TOKEN, FENCE_LEASE, FENCE_LEASE_SECRET
    run-the-job --token "$FENCE_TOKEN"
    fence lease release nightly

Nothing renews a lease: it expires --ttl after it was taken or last
renewed (fence lease renew), and its lock goes to the next holder. Send
FENCE_TOKEN with every write, so that the resource refuses a write made
after the lease was lost. See docs/leases.md.`,
	}
	cmd.AddCommand(leaseAcquireCommand(g), leaseRenewCommand(g), leaseReleaseCommand(g))
	return cmd
}

type leaseFlags struct {
	ttl       time.Duration
	lockDelay time.Duration
	owner     string
	asJSON    bool
}

func leaseAcquireCommand(g *globals) *cobra.Command {
	var f leaseFlags
	cmd := &cobra.Command{
		Use:         "acquire NAME --ttl TTL",
		Annotations: bounded,
		Short:       "Take the lock NAME for TTL, or exit 124 at once if it is held",
		Long: `Takes the lock NAME for --ttl, without waiting, and prints shell
commands for eval that export FENCE_LOCK, FENCE_TOKEN, FENCE_LEASE (the
lease's id) and FENCE_LEASE_SECRET, which fence lease renew and release
read, and which every command the script runs sees. Keep the secret as you
would a password: it renews and releases the lease.

If the lock is held (or under lock-delay, or waited for), exits 124 at
once, naming the holder on standard error, as fence lock --try does. On
any failure it prints "(exit N)" for eval, unless standard output is a
terminal, so that eval "$(fence lease acquire ...)" fails with the same
status instead of succeeding with nothing to evaluate.

The lease is safe until the time it was taken plus --ttl (less a margin
for clock drift); renew it before then. With --json, prints the API's
LeaseResponse instead.

Exit status: 0 when taken; 124 if the lock is held; 1 on other errors.`,
		// The arguments are checked in RunE, so that every failure prints
		// "(exit N)" for eval.
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			err := runLeaseAcquire(cmd.Context(), g, f, args)
			if err != nil && !f.asJSON && !isTerminal(g.stdout) {
				fmt.Fprintf(g.stdout, "(exit %d)\n", exitCodeOf(err))
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&f.ttl, "ttl", 0, "how long the lease lasts without a renewal (1s to 1h; required)")
	fl.DurationVar(&f.lockDelay, "lock-delay", 0, "if the lease expires instead of being released, keep the lock from others this long")
	fl.StringVar(&f.owner, "owner", "", `label shown in listings (default "fence lease, ppid PPID on HOST")`)
	fl.BoolVar(&f.asJSON, "json", false, "print the API's LeaseResponse as JSON")
	return cmd
}

func runLeaseAcquire(ctx context.Context, g *globals, f leaseFlags, args []string) error {
	if err := leaseNameArg("acquire")(nil, args); err != nil {
		return err
	}
	if f.ttl == 0 {
		return errors.New("fence lease acquire needs --ttl: how long the lease lasts without a renewal (1s to 1h)")
	}
	c, err := g.client()
	if err != nil {
		return err
	}
	defer c.Close()
	return leaseAcquire(ctx, g, c, f, args[0])
}

func leaseAcquire(ctx context.Context, g *globals, c *client.Client, f leaseFlags, name string) error {
	owner := f.owner
	if owner == "" {
		host, _ := os.Hostname()
		owner = fmt.Sprintf("fence lease, ppid %d on %s", os.Getppid(), host)
	}
	opts := []client.LeaseOption{client.WithLeaseOwner(owner)}
	if f.lockDelay > 0 {
		opts = append(opts, client.WithLeaseLockDelay(f.lockDelay))
	}
	l, err := c.Lease(ctx, name, f.ttl, opts...)
	var held *fence.LockedError
	switch {
	case errors.As(err, &held):
		return &ExitError{Code: exitTimeout, Err: heldError(ctx, c, held)}
	case err != nil:
		return err // the service's message names the field or the cause
	}
	if f.asJSON {
		return printJSON(g, &fencev1.LeaseResponse{Lock: l.Lock(), Token: l.Token(), LeaseId: l.ID(), LeaseSecret: l.Secret(), Ttl: durationpb.New(l.TTL())})
	}
	for _, kv := range [][2]string{
		{envLock, l.Lock()},
		{envToken, strconv.FormatUint(l.Token(), 10)},
		{envLease, strconv.FormatUint(l.ID(), 10)},
		{envLeaseSecret, l.Secret()},
	} {
		fmt.Fprintf(g.stdout, "export %s=%s\n", kv[0], shellQuote(kv[1]))
	}
	return nil
}

// heldError says who holds the lock a lease was refused: the refusal's
// reason, and the holder's owner when a listing names it.
func heldError(ctx context.Context, c *client.Client, held *fence.LockedError) error {
	msg := held.Reason
	if held.HolderSession != 0 {
		if locks, err := c.Locks(ctx, held.Lock); err == nil {
			for _, l := range locks {
				for _, h := range l.GetHolders() {
					if l.GetName() == held.Lock && h.GetSessionId() == held.HolderSession && h.GetOwner() != "" {
						msg += fmt.Sprintf(" (owner %q)", h.GetOwner())
					}
				}
			}
		}
	}
	return saying{held, msg}
}

func leaseRenewCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:         "renew NAME",
		Annotations: bounded,
		Short:       "Renew the lease in the environment for its full TTL",
		Long: `Renews the lease of FENCE_LEASE and FENCE_LEASE_SECRET (as fence lease
acquire exported them) for its full TTL from now. FENCE_LOCK must be NAME,
so that a script renews the lease it means to.

Exit status: 0 when renewed; 75 if the lease expired or was released (its
lock may be another's by now: stop, and take a new lease); 1 on other
errors.`,
		Args: leaseNameArg("renew"),
		RunE: g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
			l, err := leaseFromEnv(c, args[0])
			if err != nil {
				return err
			}
			if err := l.Renew(cmd.Context()); err != nil {
				return leaseGone(err, fmt.Sprintf("lease %d on %q has expired or was released: its lock may be another's by now; take a new lease", l.ID(), args[0]))
			}
			if l.Lock() != args[0] {
				return fmt.Errorf("lease %d holds lock %q, not %q; FENCE_LEASE is another lock's lease", l.ID(), l.Lock(), args[0])
			}
			if asJSON {
				return printJSON(g, &fencev1.RenewLeaseResponse{Ttl: durationpb.New(l.TTL()), Lock: l.Lock(), Token: l.Token()})
			}
			fmt.Fprintf(g.stdout, "renewed lease %d on %s for %v (token %d)\n", l.ID(), l.Lock(), l.TTL(), l.Token())
			return nil
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the API's RenewLeaseResponse as JSON")
	return cmd
}

func leaseReleaseCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:         "release NAME",
		Annotations: bounded,
		Short:       "Release the lease in the environment and its lock, at once",
		Long: `Ends the lease of FENCE_LEASE and FENCE_LEASE_SECRET (as fence lease
acquire exported them) and hands its lock to the next waiter at once, with
no lock-delay. FENCE_LOCK must be NAME.

Exit status: 0 when released; 75 if the lease had ended before (it
expired, or was revoked: its lock may have been another's while the
script worked); 1 on other errors.`,
		Args: leaseNameArg("release"),
		RunE: g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
			l, err := leaseFromEnv(c, args[0])
			if err != nil {
				return err
			}
			err = l.Release(cmd.Context())
			if asJSON && (err == nil || errors.Is(err, fence.ErrSessionNotFound)) {
				if perr := printJSON(g, &fencev1.ReleaseLeaseResponse{Released: err == nil}); perr != nil {
					return perr
				}
			}
			if err != nil {
				return leaseGone(err, fmt.Sprintf("lease %d on %q had ended before it was released (it expired, or was revoked): its lock may have been another's meanwhile", l.ID(), args[0]))
			}
			if !asJSON {
				fmt.Fprintf(g.stdout, "released %s (lease %d)\n", args[0], l.ID())
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print the API's ReleaseLeaseResponse as JSON ({"released": false} when the lease had ended)`)
	return cmd
}

// leaseFromEnv rebuilds the lease FENCE_LEASE and FENCE_LEASE_SECRET name,
// once FENCE_LOCK says it is name's.
func leaseFromEnv(c *client.Client, name string) (*client.Lease, error) {
	lock, idText, secret := os.Getenv(envLock), os.Getenv(envLease), os.Getenv(envLeaseSecret)
	switch {
	case idText == "" || secret == "":
		return nil, fmt.Errorf("%s and %s are not set: eval the output of fence lease acquire %s first", envLease, envLeaseSecret, shellQuote(name))
	case lock != name:
		return nil, fmt.Errorf("%s is %q, not %q: the lease in the environment is another lock's", envLock, lock, name)
	}
	id, err := strconv.ParseUint(idText, 10, 64)
	if err != nil || id == 0 {
		return nil, fmt.Errorf("%s %q is not a lease id (a decimal number from 1 up, as fence lease acquire printed it)", envLease, idText)
	}
	return c.ResumeLease(id, secret)
}

// leaseGone gives a lease that ended (expired, revoked, released) the exit
// status of a lock lost, 75, and says so in words; other errors stay.
func leaseGone(err error, says string) error {
	if errors.Is(err, fence.ErrSessionNotFound) {
		return &ExitError{Code: exitLockLost, Err: saying{err, says}}
	}
	return err
}

// leaseNameArg checks that a lease command has one NAME.
func leaseNameArg(sub string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != 1 {
			return fmt.Errorf("fence lease %s takes one lock NAME, not %d arguments", sub, len(args))
		}
		return nil
	}
}

// exitCodeOf is the status Run exits with for err.
func exitCodeOf(err error) int {
	var exit *ExitError
	if errors.As(err, &exit) {
		return exit.Code
	}
	return exitFailure
}

// shellSafe are the words a POSIX shell reads as themselves.
var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_./:@%+,=-]+$`)

// shellQuote quotes s for a POSIX shell: as it is when every character is
// safe, else in single quotes, each single quote in s ending the quoted
// run, escaped with a backslash, and starting the next.
func shellQuote(s string) string {
	if shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
