//go:build !unix

package server

// openFileLimit reports the open-file limit unknown where there is no
// RLIMIT_NOFILE: there, only Config.MaxConnections bounds connections.
func openFileLimit() (uint64, bool) { return 0, false }
