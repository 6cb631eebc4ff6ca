package server

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/fsm"
)

// forwarder sends requests that reach a follower on to the leader, so that
// clients that cannot follow the leader hint (curl, a load balancer in
// front of the group) are served by any node. A request the leader cannot
// be reached for is handled here, as if never forwarded: a stale read is
// served, anything else answers Unavailable with the leader's address.
type forwarder struct {
	s      *Server
	local  http.Handler
	client *http.Transport
}

func newForwarder(s *Server, local http.Handler) *forwarder {
	var p http.Protocols
	if s.cfg.TLS != nil {
		p.SetHTTP2(true) // gRPC needs HTTP/2; Connect and JSON are fine with it
	} else {
		p.SetUnencryptedHTTP2(true)
	}
	tr := &http.Transport{
		Protocols:   &p,
		DialContext: (&net.Dialer{}).DialContext,
	}
	if s.cfg.TLS != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: s.cfg.TLS.RootCAs, Certificates: s.cfg.TLS.Certificates, MinVersion: tls.VersionTLS12}
	}
	return &forwarder{s: s, local: local, client: tr}
}

// forwardable are the services whose calls a follower forwards; cluster
// status and membership are each node's own.
var forwardable = []string{
	"/" + fencev1connect.SessionServiceName + "/",
	"/" + fencev1connect.LockServiceName + "/",
	"/" + fencev1connect.KVServiceName + "/",
}

func (f *forwarder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	leader := f.leaderAPI(r)
	if leader == "" {
		f.local.ServeHTTP(w, r)
		return
	}
	// Keep the body, so that the call can still be handled here if the
	// leader cannot be reached.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(f.s.cfg.MaxRequestBytes)))
	if err != nil {
		http.Error(w, "request body too large or unreadable", http.StatusRequestEntityTooLarge)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.Header.Set(fencev1.ForwardedByHeader, f.s.cfg.NodeID)
	f.proxy(leader, body).ServeHTTP(w, r)
}

// leaderAPI returns the leader's API address if r should be forwarded.
func (f *forwarder) leaderAPI(r *http.Request) string {
	if f.s.leaderReady.Load() || r.Header.Get(fencev1.ForwardedByHeader) != "" || r.Header.Get(fencev1.FollowLeaderHeader) != "" {
		return ""
	}
	if !slicesHasPrefix(forwardable, r.URL.Path) {
		return ""
	}
	_, id := f.s.node.raft.LeaderWithID()
	if id == "" || string(id) == f.s.cfg.NodeID {
		return ""
	}
	var api string
	f.s.fsm.Read(func(st *fsm.State) { api, _ = st.NodeAPI(string(id)) })
	return api
}

func slicesHasPrefix(prefixes []string, s string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// proxy returns a reverse proxy to the leader at api. When the leader
// cannot be reached, it handles the request here, with its kept body.
func (f *forwarder) proxy(api string, body []byte) http.Handler {
	target := &url.URL{Scheme: strings.TrimSuffix(f.s.apiScheme(), "://"), Host: api}
	return &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport:     f.client,
		FlushInterval: -1, // watch streams flush at once
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			f.s.logger.Debug("forwarding to the leader failed; answering here", "leader", api, "err", err)
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.Header.Del(fencev1.ForwardedByHeader)
			f.local.ServeHTTP(w, r)
		},
	}
}
