// Package clients holds no code of its own: it runs the Python client
// (clients/python) and the TypeScript client (clients/typescript) against
// real fence nodes from go test, and the Go client through the same table of
// scenarios (scenarios.json), so that the three clients cannot drift apart.
//
// A suite in another language drives the nodes through a small control
// service that the Go test serves on loopback (FENCE_TEST_CONTROL, see
// control_test.go): it starts groups of `fence serve` processes, with TLS
// and a bearer token when asked, and kills, pauses, resumes and restarts
// their nodes. Every fault is a real signal to a real process.
package clients
