package server

import (
	"bytes"
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
	cases := []struct {
		name, body, encoding, want string
	}{
		{"truncated", "\x00\x00\x00\x00\x05abc", "", "promises 5 bytes"},
		{"short", "\x00\x00", "", "shorter than a message envelope"},
		{"compressed without encoding", "\x01\x00\x00\x00\x03abc", "", "names no grpc-encoding"},
		{"unknown flags", "\x07\x00\x00\x00\x03abc", "", "unknown flags"},
		{"two messages", "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", "", "promises 0 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, "http://"+s.Addr()+"/fence.v1.SessionService/CreateSession", strings.NewReader(c.body))
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
			status, msg := resp.Trailer.Get("Grpc-Status"), resp.Trailer.Get("Grpc-Message")
			if status == "" {
				status, msg = resp.Header.Get("Grpc-Status"), resp.Header.Get("Grpc-Message")
			}
			if status != "3" || !strings.Contains(msg, strings.ReplaceAll(c.want, " ", "%20")) && !strings.Contains(msg, c.want) {
				t.Errorf("grpc-status %q, message %q; want 3 (InvalidArgument) saying %q", status, msg, c.want)
			}
		})
	}
	// A well-formed call still works.
	req, _ := http.NewRequest(http.MethodPost, "http://"+s.Addr()+"/fence.v1.ClusterService/Status", bytes.NewReader([]byte{0, 0, 0, 0, 0}))
	req.Header.Set("Content-Type", "application/grpc")
	resp, err := h2c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if st := resp.Trailer.Get("Grpc-Status"); st != "0" {
		t.Fatalf("a well-formed Status call: grpc-status %q %q", st, resp.Trailer.Get("Grpc-Message"))
	}
}
