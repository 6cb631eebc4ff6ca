package cli

import "testing"

// The console is on by default only where the API listens on loopback.
func TestConsoleDefaultsToLoopbackOnly(t *testing.T) {
	for listen, want := range map[string]bool{
		"127.0.0.1:7420": true,
		"127.0.0.9:7420": true,
		"[::1]:7420":     true,
		"localhost:7420": true,
		"0.0.0.0:7420":   false,
		":7420":          false,
		"[::]:7420":      false,
		"10.0.0.5:7420":  false,
		"node1:7420":     false,
		"garbage":        false,
	} {
		if got := isLoopback(listen); got != want {
			t.Errorf("isLoopback(%q) = %v, want %v", listen, got, want)
		}
	}
}
