package rpcerr

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
)

// A node killed in the middle of a call resets its connections. connect-go
// reports that as Canceled; the client must see it as Unavailable, so that
// it retries against another node instead of failing the call.
func TestConnectionResetIsUnavailable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				// Read the request, then reset the connection instead of
				// answering, as the kernel does for a process killed by SIGKILL.
				_ = conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
				_, _ = io.Copy(io.Discard, conn)
				_ = conn.(*net.TCPConn).SetLinger(0)
				conn.Close()
			}()
		}
	}()
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	hc := &http.Client{Transport: &http.Transport{Protocols: &protocols}}
	locks := fencev1connect.NewLockServiceClient(hc, "http://"+ln.Addr().String())
	_, cerr := locks.Acquire(context.Background(), connect.NewRequest(&fencev1.AcquireRequest{SessionId: 1, Lock: "x"}))
	if cerr == nil {
		t.Fatal("the call succeeded against a server that resets connections")
	}
	err = FromConnect(cerr)
	if !errors.Is(err, fence.ErrUnavailable) {
		t.Errorf("FromConnect(%v) = %v, want it to wrap fence.ErrUnavailable", cerr, err)
	}
	if errors.Is(err, context.Canceled) {
		t.Errorf("FromConnect(%v) = %v wraps context.Canceled, though no context was cancelled", cerr, err)
	}
}

// A call whose own context is cancelled stays Canceled.
func TestCancelledCallStaysCanceled(t *testing.T) {
	err := FromConnect(connect.NewError(connect.CodeCanceled, context.Canceled))
	if !errors.Is(err, context.Canceled) || errors.Is(err, fence.ErrUnavailable) {
		t.Errorf("FromConnect(canceled) = %v, want context.Canceled", err)
	}
}
