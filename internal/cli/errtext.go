package cli

import (
	"fmt"
	"io"
	"strings"
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
