// Package e2e holds fence's process-level end-to-end tests. It has no code
// of its own: the tests build the fence binary once, run real `fence serve`
// nodes on loopback ports with their own data directories, and drive them
// with `fence lock` processes, the Go client and plain JSON over HTTP.
//
// # What is covered
//
//   - kill -9 of a node under load, and restart on the same data: no
//     acknowledged grant is lost and the token counter never goes back;
//   - concurrent `fence lock` processes never overlap and are granted in
//     FIFO order with rising tokens;
//   - a `fence lock` stopped with SIGSTOP past its TTL loses the lock to a
//     waiter, and on SIGCONT kills its command and exits 75;
//   - malformed and out-of-bounds requests get the right Connect code and
//     an actionable message, and leave the node serving, state unchanged;
//   - `fence lock` exit statuses (the command's own, 124 on --timeout);
//   - a 3-node cluster whose leader is killed with SIGKILL under load: the
//     survivors elect a leader and keep serving, no acknowledged grant is
//     lost, no token is handed out twice or goes back, no lock ever has two
//     holders, sessions survive, and the failover time is logged; the
//     killed node, restarted on its data, rejoins and catches up;
//   - membership with real processes: a fourth node started with --join is
//     added with `fence members add` and catches up, a follower is removed,
//     `fence members list` shows the three left, and locks are still granted.
//
// # Running
//
//	go test -race -count=1 ./e2e/
//
// Under -race the fence binary is built with -race too, and a test fails if
// any process it started reports a data race. Processes are started in their
// own process groups and killed at cleanup (SIGCONT first, then SIGKILL).
package e2e
