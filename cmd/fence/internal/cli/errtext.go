package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/rpcerr"
)

// How fence prints an error: one line on stderr that starts with "fence: "
// once (or with the command's own name, "fence lock: ", for what a command
// says while it runs), and names the flag or argument the user typed that
// is wrong or that would fix it. The error values keep their identity
// (errors.Is(err, fence.ErrLocked) still holds): only their text is
// shaped, here and in saying.

// errorText is err's message as fence prints it after its prefix: without
// the "fence: " that the sentinel errors of package fence start with,
// wherever wrapping put one ("creating session: fence: limit reached: ..."
// reads "creating session: limit reached: ...").
func errorText(err error) string {
	msg := strings.TrimPrefix(err.Error(), "fence: ")
	return strings.ReplaceAll(msg, ": fence: ", ": ")
}

// printError prints err as "fence: MESSAGE".
func printError(w io.Writer, err error) {
	fmt.Fprintf(w, "fence: %s\n", errorText(err))
}

// saying is err, said in other words: the command's (which flag to
// change, who holds a lock); errors.Is and errors.As see through it.
type saying struct {
	err  error
	says string
}

func (e saying) Error() string { return e.says }
func (e saying) Unwrap() error { return e.err }

// say returns err with the message format makes of args, in place of its
// own; err stays what errors.Is finds.
func say(err error, format string, args ...any) error {
	return saying{err: err, says: fmt.Sprintf(format, args...)}
}

// explainErrors makes every command under cmd put its errors in the
// command's words where one of the global flags fixes them (g.explain).
func explainErrors(cmd *cobra.Command, g *globals) {
	if run := cmd.RunE; run != nil {
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			err := run(cmd, args)
			var exit *ExitError
			if errors.As(err, &exit) {
				exit.Err = g.explain(cmd, exit.Err)
				return err
			}
			return g.explain(cmd, err)
		}
	}
	for _, sub := range cmd.Commands() {
		explainErrors(sub, g)
	}
}

// explain returns err, said so that it names the flag that fixes it when
// that is one of the global flags: TLS with the nodes (--cacert, --cert,
// --key, --endpoints) and auth (--auth-token-file, or --cert). The node's
// own words follow in parentheses where they add what went wrong.
func (g *globals) explain(cmd *cobra.Command, err error) error {
	if err == nil {
		return nil
	}
	nodes := strings.Join(g.endpointList(), ", ")
	detail := " (" + errorText(err) + ")"
	switch {
	case errors.Is(err, rpcerr.ErrPlainToTLS):
		return say(err, "%s serves TLS, and fence called it without: give --cacert FILE, the CA bundle that signed its certificate (env FENCE_CACERT)", nodes)
	case errors.Is(err, rpcerr.ErrTLSToPlain):
		return say(err, "%s does not serve TLS, and fence called it with TLS, as --cacert, --cert or --key ask: leave them out (and FENCE_CACERT, FENCE_CERT, FENCE_KEY), or check --endpoints%s", nodes, detail)
	case errors.Is(err, rpcerr.ErrUnknownAuthority) && g.tls.ca == "":
		return say(err, "the certificate of %s is not signed by a CA fence trusts: give --cacert FILE, the CA bundle that signed it (env FENCE_CACERT)%s", nodes, detail)
	case errors.Is(err, rpcerr.ErrUnknownAuthority):
		return say(err, "the certificate of %s is not signed by a CA of --cacert %s: give the CA bundle that signed it%s", nodes, g.tls.ca, detail)
	case errors.Is(err, rpcerr.ErrCertificateName):
		return say(err, "the certificate of %s is not for that address: in --endpoints, call the node by a name its certificate is for%s", nodes, detail)
	case errors.Is(err, rpcerr.ErrCertificateRequired) && g.tls.cert == "":
		return say(err, "%s requires a client certificate: give --cert FILE and --key FILE, a certificate signed by a CA the node trusts and its key (env FENCE_CERT, FENCE_KEY)%s", nodes, detail)
	case errors.Is(err, rpcerr.ErrCertificateRequired):
		return say(err, "%s requires a client certificate signed by a CA it trusts, and --cert %s is not: give one that is, with --cert and --key%s", nodes, g.tls.cert, detail)
	case errors.Is(err, rpcerr.ErrCertificateRefused):
		return say(err, "%s refused the client certificate of --cert %s: give one it accepts, with --cert and --key%s", nodes, g.tls.cert, detail)
	case errors.Is(err, fence.ErrAuthFailed) || errors.Is(err, fence.ErrPermissionDenied):
		return g.explainAuth(cmd, err)
	}
	return err
}

// explainAuth says which credential auth refused, or that there was none.
func (g *globals) explainAuth(cmd *cobra.Command, err error) error {
	switch {
	case g.authTokenFile != "":
		return say(err, "--auth-token-file %s: %s", g.authTokenFile, errorText(err))
	case g.tls.cert != "":
		return say(err, "--cert %s: %s", g.tls.cert, errorText(err))
	case errors.Is(err, fence.ErrAuthFailed) && cmd.CommandPath() != "fence auth enable":
		// fence auth enable's refusal says itself what to give.
		return say(err, "auth is on, and fence sent no credential: give --auth-token-file FILE, a token of a user (env %s; fence token create makes one), or --cert and --key, a certificate whose common name is a user", authTokenEnv)
	}
	return err
}
