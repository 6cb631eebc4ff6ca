package cli

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/fencetest"
	"github.com/fencelock/fence/internal/testutil/syncbuf"
)

// runUntilCancelled runs fence with args until the returned cancel; its
// exit code comes on the channel.
func runUntilCancelled(args []string, stdout, stderr *syncbuf.Buffer) (context.CancelFunc, <-chan int) {
	ctx, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	go func() { code <- Run(ctx, args, strings.NewReader(""), stdout, stderr) }()
	return cancel, code
}

// fence locks --watch prints a line an event under the prefix, and none
// of other locks, for longer than --command-timeout, until interrupted
// (exit 0); with --json, each event is the API's LockEvent on a line.
func TestLocksWatch(t *testing.T) {
	node := fencetest.Start(t)
	ctx := context.Background()
	var out, errs, jsonOut, jsonErrs syncbuf.Buffer
	base := []string{"--endpoints", node.Endpoint(), "--command-timeout", "300ms", "locks", "--watch", "--prefix", "jobs/", "--from-revision", "1"}
	stop, code := runUntilCancelled(base, &out, &errs)
	stopJSON, codeJSON := runUntilCancelled(append(base, "--json"), &jsonOut, &jsonErrs)
	time.Sleep(500 * time.Millisecond) // past --command-timeout

	c := node.Client()
	holder := mustSession(t, c, client.WithOwner("nightly"))
	waiter := mustSession(t, c)
	m := client.NewMutex(holder, "jobs/a")
	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustLock(t, holder, "other")
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = client.NewMutex(waiter, "jobs/a").Lock(wctx)
	cancel()
	if err == nil {
		t.Fatal("a second holder was granted jobs/a")
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{
		fmt.Sprintf(`^granted jobs/a\trev \d+\ttoken %d\tsession %d \(nightly\)$`, g.Token(), holder.ID()),
		fmt.Sprintf(`^queued jobs/a\trev \d+\tsession %d$`, waiter.ID()),
		fmt.Sprintf(`^gave up jobs/a\trev \d+\tsession %d\tcancelled$`, waiter.ID()),
		fmt.Sprintf(`^released jobs/a\trev \d+\ttoken %d\tsession %d \(nightly\)$`, g.Token(), holder.ID()),
	}
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(out.String(), "\n") < len(want) || strings.Count(jsonOut.String(), "\n") < len(want) {
		if time.Now().After(deadline) {
			t.Fatalf("after 10s, printed:\n%s\nand as JSON:\n%s\nstderr: %s %s", out.String(), jsonOut.String(), errs.String(), jsonErrs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	stopJSON()
	if c, cj := <-code, <-codeJSON; c != 0 || cj != 0 {
		t.Fatalf("interrupted, fence locks --watch exited %d and %d with --json: %s %s", c, cj, errs.String(), jsonErrs.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	jsonLines := strings.Split(strings.TrimSpace(jsonOut.String()), "\n")
	if len(lines) != len(want) || len(jsonLines) != len(want) {
		t.Fatalf("printed:\n%s\nand as JSON:\n%s\nwant %d lines each", out.String(), jsonOut.String(), len(want))
	}
	for i, re := range want {
		if !regexp.MustCompile(re).MatchString(lines[i]) {
			t.Errorf("line %d: %q, want %s", i, lines[i], re)
		}
		var ev fencev1.LockEvent
		if err := protojson.Unmarshal([]byte(jsonLines[i]), &ev); err != nil {
			t.Fatalf("JSON line %d %q: %v", i, jsonLines[i], err)
		}
		if got := lockEventText(&ev); got != lines[i] {
			t.Errorf("JSON line %d reads as %q, the text line is %q", i, got, lines[i])
		}
	}
}

// The flags of a watch go with --watch only, and those of a listing not
// with it; a PREFIX and a --prefix that differ are refused with --watch
// as without it.
func TestLocksWatchFlags(t *testing.T) {
	node := fencetest.Start(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"locks", "--from-revision", "5"}, "--from-revision goes with --watch"},
		{[]string{"locks", "--watch", "--stale"}, "--stale does not go with --watch"},
		{[]string{"locks", "--watch", "--limit", "3"}, "--limit does not go with --watch"},
		{[]string{"locks", "--watch", "--prefix", "jobs/", "orders/"}, `PREFIX "orders/" and --prefix "jobs/" differ`},
	} {
		var stdout, stderr bytes.Buffer
		// A watch that should have been refused ends with the context.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		code := Run(ctx, append([]string{"--endpoints", node.Endpoint()}, tc.args...), strings.NewReader(""), &stdout, &stderr)
		cancel()
		if code == 0 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("fence %v: exit %d, stderr %q; want it to say %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

// Every kind of event reads as a line a person understands.
func TestLockEventText(t *testing.T) {
	ev := func(typ fencev1.LockEventType, edit func(*fencev1.LockEvent)) *fencev1.LockEvent {
		e := &fencev1.LockEvent{Revision: 42, Type: typ, Lock: "l", SessionId: 3, Owner: "w", Token: 7}
		if edit != nil {
			edit(e)
		}
		return e
	}
	for _, tc := range []struct {
		ev   *fencev1.LockEvent
		want string
	}{
		{ev(fencev1.LockEventType_LOCK_EVENT_TYPE_GRANTED, func(e *fencev1.LockEvent) {
			e.Mode, e.Permits = fencev1.Mode_MODE_SEMAPHORE, 2
		}), "granted l\trev 42\ttoken 7\tsession 3 (w)\tsemaphore of 2"},
		{ev(fencev1.LockEventType_LOCK_EVENT_TYPE_RELEASED, nil), "released l\trev 42\ttoken 7\tsession 3 (w)"},
		{ev(fencev1.LockEventType_LOCK_EVENT_TYPE_RELEASED, func(e *fencev1.LockEvent) { e.SessionEnd = fencev1.SessionEnd_SESSION_END_CLOSED }),
			"released l\trev 42\ttoken 7\tsession 3 (w)\tsession closed"},
		{ev(fencev1.LockEventType_LOCK_EVENT_TYPE_EXPIRED, nil), "expired l\trev 42\ttoken 7\tsession 3 (w)"},
		{ev(fencev1.LockEventType_LOCK_EVENT_TYPE_REVOKED, func(e *fencev1.LockEvent) { e.Owner = "" }), "revoked l\trev 42\ttoken 7\tsession 3"},
		{ev(fencev1.LockEventType_LOCK_EVENT_TYPE_ABANDONED, nil), "abandoned l\trev 42\ttoken 7\tsession 3 (w)"},
		{ev(fencev1.LockEventType_LOCK_EVENT_TYPE_QUEUED, func(e *fencev1.LockEvent) { e.Token, e.Mode = 0, fencev1.Mode_MODE_SHARED }),
			"queued l\trev 42\tsession 3 (w)\tshared"},
		{ev(fencev1.LockEventType_LOCK_EVENT_TYPE_GAVE_UP, func(e *fencev1.LockEvent) {
			e.Token, e.Reason = 0, fencev1.GiveUpReason_GIVE_UP_REASON_TIMED_OUT
		}), "gave up l\trev 42\tsession 3 (w)\ttimed out"},
		{ev(fencev1.LockEventType_LOCK_EVENT_TYPE_GAVE_UP, func(e *fencev1.LockEvent) {
			e.Token, e.Reason, e.SessionEnd = 0, fencev1.GiveUpReason_GIVE_UP_REASON_SESSION_ENDED, fencev1.SessionEnd_SESSION_END_EXPIRED
		}), "gave up l\trev 42\tsession 3 (w)\tsession expired"},
		{ev(fencev1.LockEventType_LOCK_EVENT_TYPE_DELAY_STARTED, func(e *fencev1.LockEvent) { e.LockDelay = durationpb.New(5 * time.Second) }),
			"delay started l\trev 42\ttoken 7\tsession 3 (w)\t5s"},
		{ev(fencev1.LockEventType_LOCK_EVENT_TYPE_DELAY_ENDED, func(e *fencev1.LockEvent) { e.SessionId, e.Owner, e.Token = 0, "", 0 }),
			"delay ended l\trev 42"},
	} {
		if got := lockEventText(tc.ev); got != tc.want {
			t.Errorf("%v reads %q, want %q", tc.ev.GetType(), got, tc.want)
		}
	}
}
