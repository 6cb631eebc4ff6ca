package client

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/testutil/testtls"
	"github.com/fencelock/fence/server"
)

// WithTLS reaches a node that requires client certificates; a client
// without a certificate, or that does not trust the node, fails at once
// with ErrUnauthenticated rather than retrying as if the node were down.
func TestWithTLS(t *testing.T) {
	ca := testtls.NewCA(t, "fence test CA")
	srv := startServer(t, func(c *server.Config) {
		c.TLS = &tls.Config{
			Certificates: []tls.Certificate{ca.Cert(t, "node")},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    ca.Pool(),
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, grpc := range []bool{false, true} {
		opts := []Option{WithEndpoints(srv.Addr()), WithTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Cert(t, "app")}})}
		if grpc {
			opts = append(opts, WithGRPC())
		}
		c, err := New(opts...)
		if err != nil {
			t.Fatal(err)
		}
		s, err := c.NewSession(ctx)
		if err != nil {
			t.Fatalf("session over TLS (gRPC %v): %v", grpc, err)
		}
		m := NewMutex(s, "tls")
		mustLock(t, ctx, m)
		mustUnlock(t, ctx, m)
		s.Close(ctx)
		c.Close()
	}
	other := testtls.NewCA(t, "another CA")
	for name, cfg := range map[string]*tls.Config{
		"no client certificate": {RootCAs: ca.Pool()},
		"not trusting the node": {RootCAs: other.Pool(), Certificates: []tls.Certificate{ca.Cert(t, "app")}},
	} {
		c, err := New(WithEndpoints(srv.Addr()), WithTLS(cfg))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Status(ctx); !errors.Is(err, fence.ErrUnauthenticated) {
			t.Errorf("%s: %v, want ErrUnauthenticated", name, err)
		}
		c.Close()
	}
}

// A node whose certificate the client does not accept is passed over for
// the next endpoint, as a node that is down would be.
func TestTLSFailureMovesToTheNextEndpoint(t *testing.T) {
	ca, other := testtls.NewCA(t, "fence test CA"), testtls.NewCA(t, "another CA")
	serve := func(c *tls.Config) *server.Server {
		return startServer(t, func(cfg *server.Config) { cfg.TLS = c })
	}
	bad := serve(&tls.Config{Certificates: []tls.Certificate{other.Cert(t, "stale node")}})
	good := serve(&tls.Config{Certificates: []tls.Certificate{ca.Cert(t, "node")}})
	c := mustNew(t, WithEndpoints(bad.Addr(), good.Addr()), WithTLS(&tls.Config{RootCAs: ca.Pool()}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatalf("Status with a good node second: %v", err)
	}
	if st.GetLeaderRaftAddress() == "" {
		t.Fatalf("status %v", st)
	}
}

// Over TLS the stream (framed after an upgrade over ALPN http/1.1, or
// HTTP/2 with ALPN h2) and the unary calls (HTTP/1.1) each have a
// transport of their own; the HTTP/2 one added "h2" to the NextProtos of
// the tls.Config the two shared, so the unary calls that came after the
// stream offered h2, were answered in HTTP/2, and failed.
func TestTLSStreamThenUnary(t *testing.T) {
	ca := testtls.NewCA(t, "fence test CA")
	srv := startServer(t, func(c *server.Config) {
		c.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Cert(t, "node")}}
	})
	for _, tc := range []struct {
		transport string
		opts      []Option
	}{{"framed", nil}, {"http2", []Option{WithoutFramedStream()}}} {
		t.Run(tc.transport, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			config := &tls.Config{RootCAs: ca.Pool()}
			c := mustNew(t, append([]Option{WithEndpoints(srv.Addr()), WithTLS(config)}, tc.opts...)...)
			s, err := c.NewSession(ctx) // on the stream
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(ctx)
			if _, err := c.Status(ctx); err != nil { // a unary call, on a new connection
				t.Fatalf("a unary call after the stream: %v", err)
			}
			if len(config.NextProtos) != 0 {
				t.Fatalf("the caller's tls.Config was changed: NextProtos %v", config.NextProtos)
			}
			hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
			opens := `fence_stream_opens_total{transport="` + tc.transport + `"}`
			if n := metricAt(t, hc, "https://"+srv.Addr()+"/metrics", opens); n != 1 {
				t.Fatalf("%v streams opened %s over TLS, want 1", n, tc.transport)
			}
		})
	}
}
