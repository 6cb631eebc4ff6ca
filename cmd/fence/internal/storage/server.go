package storage

import (
	"fmt"
	"net"
	"net/http"
	"time"
)

// Server serves a handler on a loopback port of its own.
type Server struct {
	// URL is the server's base URL: http://127.0.0.1:PORT.
	URL string

	srv  *http.Server
	done chan struct{}
}

// Serve serves h on a free loopback port until Close.
func Serve(h http.Handler) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting the storage: %w", err)
	}
	s := &Server{
		URL:  "http://" + ln.Addr().String(),
		srv:  &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second},
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln) // ErrServerClosed, at Close
	}()
	return s, nil
}

// Close stops the server, dropping open connections, and waits until it
// has stopped.
func (s *Server) Close() {
	_ = s.srv.Close()
	<-s.done
}
