// Command fence is the fence lock service and its command-line client. Its
// code is under cmd/fence/internal/ (package cli first), where only this
// command can import it.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/fencelock/fence/cmd/fence/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
