package server

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"os"
	"testing"
	"time"

	"connectrpc.com/connect"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
	"github.com/fencelock/fence/internal/testutil/testtls"
)

// With TLS and client certificates required, a client with a certificate
// from the trusted CA gets served; one without a certificate, one that
// does not trust the node, and one speaking plain HTTP do not.
func TestAPIOverMutualTLS(t *testing.T) {
	ca := testtls.NewCA(t, "fence test CA")
	s := startTestServer(t, func(c *Config) { c.TLS = nodeTLS(t, ca, "node") })
	status := func(hc *http.Client, url string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := fencev1connect.NewClusterServiceClient(hc, url).Status(ctx, connect.NewRequest(&fencev1.StatusRequest{}))
		return err
	}
	client := func(cfg *tls.Config, http2 bool) *http.Client {
		var p http.Protocols
		p.SetHTTP1(true)
		p.SetHTTP2(http2)
		return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, Protocols: &p}}
	}
	good := clientTLS(t, ca, "app")
	for _, http2 := range []bool{false, true} {
		if err := status(client(good, http2), "https://"+s.Addr()); err != nil {
			t.Fatalf("client with a trusted certificate (HTTP/2 %v): %v", http2, err)
		}
	}
	other := testtls.NewCA(t, "another CA")
	for name, cfg := range map[string]*tls.Config{
		"no client certificate":       {RootCAs: ca.Pool()},
		"a certificate of another CA": {RootCAs: ca.Pool(), Certificates: []tls.Certificate{other.Cert(t, "app")}},
		"not trusting the node":       {RootCAs: other.Pool(), Certificates: []tls.Certificate{ca.Cert(t, "app")}},
	} {
		if err := status(client(cfg, false), "https://"+s.Addr()); err == nil {
			t.Errorf("%s: served", name)
		}
	}
	if err := status(http.DefaultClient, "http://"+s.Addr()); err == nil {
		t.Error("plain HTTP: served")
	}
}

// A 3-node group whose raft traffic runs over mutual TLS elects a leader
// and replicates; the leader learns the followers' API addresses over
// node links on the raft port, over TLS. A node with a certificate of another
// CA cannot take part.
func TestClusterOverPeerTLS(t *testing.T) {
	ca := testtls.NewCA(t, "fence test CA")
	c := startCluster(t, 3, func(cfg *Config) {
		cfg.PeerTLS = peerTLS(t, ca, cfg.NodeID)
		cfg.TLS = peerTLS(t, ca, cfg.NodeID)
	})
	leader := c.leader()
	waitFor(t, "every node to register its API address", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := handlers{Server: leader}.Status(ctx, connect.NewRequest(&fencev1.StatusRequest{}))
		if err != nil {
			return false
		}
		for _, m := range resp.Msg.GetMembers() {
			if m.GetApiAddress() == "" {
				return false
			}
		}
		return len(resp.Msg.GetMembers()) == 3
	})
	if _, err := leader.apply(&fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: "probe", Value: []byte("x")}}}); err != nil {
		t.Fatal(err)
	}
	// The raft port speaks TLS and takes only certificates of the group's CA.
	handshake := func(cert tls.Certificate) error {
		conn, err := tls.Dial("tcp", leader.RaftAddr(), &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{cert}})
		if err != nil {
			return err
		}
		defer conn.Close()
		conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
			return err // a refused client certificate shows on the first read
		}
		return nil
	}
	if err := handshake(ca.Cert(t, "peer")); err != nil {
		t.Fatalf("TLS handshake on the raft port with the group's CA: %v", err)
	}
	if err := handshake(testtls.NewCA(t, "another CA").Cert(t, "intruder")); err == nil {
		t.Fatal("the raft port accepted a certificate of another CA")
	}
	for _, s := range c.nodes {
		waitFor(t, "the write to reach "+s.cfg.NodeID, func() bool {
			var ok bool
			s.fsm.Read(func(st *fsm.State) { _, ok = st.Get("probe") })
			return ok
		})
	}
}
