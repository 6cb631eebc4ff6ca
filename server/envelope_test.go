package server

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// A gRPC call whose body is not one well-formed envelope is the caller's
// fault: InvalidArgument, with what is wrong; connect-go said Internal.
func TestMalformedGRPCEnvelopeIsInvalidArgument(t *testing.T) {
	s := startTestServer(t, nil)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: &http.Transport{Protocols: &p}}
	// call sends body as a gRPC call and returns its status and message.
	call := func(procedure, body string) (status, msg string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, "http://"+s.Addr()+"/fence.v1."+procedure, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("Te", "trailers")
		resp, err := h2c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if st := resp.Trailer.Get("Grpc-Status"); st != "" {
			return st, resp.Trailer.Get("Grpc-Message")
		}
		return resp.Header.Get("Grpc-Status"), resp.Header.Get("Grpc-Message")
	}
	cases := []struct {
		name, body, want string
	}{
		{"truncated", "\x00\x00\x00\x00\x05abc", "promises 5 bytes"},
		{"short", "\x00\x00", "shorter than a message envelope"},
		{"compressed without encoding", "\x01\x00\x00\x00\x03abc", "names no grpc-encoding"},
		{"unknown flags", "\x07\x00\x00\x00\x03abc", "unknown flags"},
		{"two messages", "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", "promises 0 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, msg := call("SessionService/CreateSession", c.body)
			if status != "3" || !strings.Contains(msg, c.want) {
				t.Errorf("grpc-status %q, message %q; want 3 (InvalidArgument) saying %q", status, msg, c.want)
			}
		})
	}
	// A well-formed call still works.
	if status, msg := call("ClusterService/Status", "\x00\x00\x00\x00\x00"); status != "0" {
		t.Fatalf("a well-formed Status call: grpc-status %q %q", status, msg)
	}
}
