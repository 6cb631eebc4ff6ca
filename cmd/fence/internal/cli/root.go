// Package cli implements the fence command: the server (`fence serve`) and
// the client commands. Run is the whole program; cmd/fence only calls it.
//
// Each subcommand is a file of its own (lock.go, kv.go, serve.go, ...);
// `fence demo` and `fence bench` are files of this package too, since they
// stand on the root command's flags and printing. Like everything under
// cmd/fence/internal/, it is the fence tool's alone: it may import the
// public packages and internal/, and nothing imports it but cmd/fence.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/buildinfo"
)

// ExitError asks Run to exit with Code after printing Err, if any.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// Exit codes of fence itself; a command run by `fence lock` exits with its own.
const (
	exitFailure  = 1
	exitLockLost = 75  // the lock was lost while CMD ran (EX_TEMPFAIL)
	exitTimeout  = 124 // the lock was not granted within --timeout
	exitNoExec   = 126 // CMD could not be started
	exitNotFound = 127 // CMD was not found
)

type globals struct {
	endpoints string
	clusterID string
	// authTokenFile holds the bearer token sent with every call.
	authTokenFile string
	// dialTimeout and commandTimeout are etcdctl's: how long a command
	// tries to reach any node, and how long a bounded command may take.
	dialTimeout, commandTimeout time.Duration
	tls                         tlsFiles
	// noStream sends every operation as a unary call (fence bench
	// --no-stream), not on the session stream; http2Stream sends the
	// stream over HTTP/2, not framed on its connection (--http2-stream).
	noStream, http2Stream bool
	stdin                 io.Reader
	stdout                io.Writer
	stderr                io.Writer
}

// endpointList is --endpoints, or FENCE_ENDPOINTS, or the default, as a
// list.
func (g *globals) endpointList() []string {
	var eps []string
	for _, e := range strings.Split(g.endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		eps = []string{client.DefaultEndpoint}
	}
	return eps
}

// client returns a client for --endpoints, or FENCE_ENDPOINTS, or the default.
func (g *globals) client() (*client.Client, error) {
	opts := []client.Option{client.WithEndpoints(g.endpointList()...), client.WithDialTimeout(g.dialTimeout), client.WithClusterID(g.clusterID)}
	tlsConfig, err := g.tls.config("client TLS", false, false)
	if err != nil {
		return nil, err
	}
	if tlsConfig != nil {
		opts = append(opts, client.WithTLS(tlsConfig))
	}
	token, err := readAuthToken(g.authTokenFile)
	if err != nil {
		return nil, err
	}
	if token != "" {
		opts = append(opts, client.WithBearerToken(token))
	}
	if g.noStream {
		opts = append(opts, client.WithoutStream())
	}
	if g.http2Stream {
		opts = append(opts, client.WithoutFramedStream())
	}
	return client.New(opts...)
}

// withClient is a command's RunE that hands fn a client of --endpoints,
// closed when fn returns.
func (g *globals) withClient(fn func(cmd *cobra.Command, args []string, c *client.Client) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, err := g.client()
		if err != nil {
			return err
		}
		defer c.Close()
		return fn(cmd, args, c)
	}
}

// Run runs the fence command with args (without the program name) and
// returns the process exit code.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	g := &globals{stdin: stdin, stdout: stdout, stderr: stderr}
	root := rootCommand(g)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	var cancelCommand context.CancelFunc = func() {}
	root.PersistentPreRun = func(cmd *cobra.Command, _ []string) {
		if cmd.Annotations[boundedKey] != "" && !runsUntilInterrupted(cmd) && g.commandTimeout > 0 {
			ctx, cancel := context.WithTimeout(cmd.Context(), g.commandTimeout)
			cmd.SetContext(ctx)
			cancelCommand = cancel
		}
	}
	defer func() { cancelCommand() }()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var exit *ExitError
	if errors.As(err, &exit) {
		if exit.Err != nil {
			printError(stderr, exit.Err)
		}
		return exit.Code
	}
	printError(stderr, err)
	return exitFailure
}

// rootCommand is the fence command with its global (client) flags, which
// read their defaults from the environment, and every subcommand.
func rootCommand(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:           "fence",
		Short:         "A lock service whose every grant carries a fencing token",
		Version:       buildinfo.Read().Short(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate(buildinfo.Read().String())
	root.PersistentFlags().StringVar(&g.endpoints, "endpoints", os.Getenv("FENCE_ENDPOINTS"),
		"comma-separated fence nodes, host:port (env FENCE_ENDPOINTS; default "+client.DefaultEndpoint+")")
	root.PersistentFlags().StringVar(&g.clusterID, "cluster-id", os.Getenv("FENCE_CLUSTER_ID"),
		"talk only to the group with this id, as fence status shows it (env FENCE_CLUSTER_ID; default: the group of the first node that answers)")
	root.PersistentFlags().StringVar(&g.authTokenFile, "auth-token-file", os.Getenv(authTokenEnv),
		"send the bearer token in this file with every call, for auth (env "+authTokenEnv+"; fence token create makes one)")
	root.PersistentFlags().DurationVar(&g.dialTimeout, "dial-timeout", time.Second,
		"fail once no node could be connected to for this long, until one has answered (0: retry for 15s, waiting for nodes that are starting)")
	root.PersistentFlags().DurationVar(&g.commandTimeout, "command-timeout", 5*time.Second,
		"bound on a command that answers at once (status, locks, kv get/put/del/list, members); 0: none")
	clientTLSFlags(root, &g.tls)
	root.AddCommand(
		serveCommand(g),
		lockCommand(g),
		leaseCommand(g),
		runOnceCommand(g),
		withLockWatch(g, locksCommand(g)),
		statusCommand(g),
		benchCommand(g),
		kvCommand(g),
		demoCommand(g),
		checkCommand(g),
		membersCommand(g),
		electCommand(g),
		leaderCommand(g),
		snapshotCommand(g),
		sessionsCommand(g),
		checkWorkerCommand(g),
		versionCommand(g),
		authCommand(g),
		userCommand(g),
		roleCommand(g),
		tokenCommand(g),
	)
	explainErrors(root, g)
	return root
}

// boundedKey marks, in a command's annotations, one that answers at once,
// so that --command-timeout bounds it.
const boundedKey = "fence-bounded"

var bounded = map[string]string{boundedKey: "yes"}
