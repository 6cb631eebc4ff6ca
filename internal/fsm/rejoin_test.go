package fsm_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

func rejoinMember(id, addr string, done bool) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_RejoinMember{RejoinMember: &fsmpb.RejoinMember{MemberId: id, RaftAddress: addr, Done: done}}}
}

// The record of a member being added again (docs/design.md, Rejoin) is
// state like any other: a snapshot carries it, done drops it, and a record
// without a member or an address is refused and changes nothing.
func TestRejoinRecords(t *testing.T) {
	s := buildState(t, []*fsmpb.Command{
		rejoinMember("n3", "127.0.0.1:7003", false),
		rejoinMember("n1", "127.0.0.1:7001", false),
		rejoinMember("n2", "127.0.0.1:7002", false),
		rejoinMember("n2", "", true),
		rejoinMember("n9", "", true), // dropping what is not there
	})
	want := [][2]string{{"n1", "127.0.0.1:7001"}, {"n3", "127.0.0.1:7003"}}
	if got := s.Rejoins(); !reflect.DeepEqual(got, want) {
		t.Fatalf("rejoins %v, want %v", got, want)
	}
	for _, bad := range []*fsmpb.Command{rejoinMember("", "127.0.0.1:7004", false), rejoinMember("n4", "", false)} {
		if res := mustApply(t, s, bad); !errors.Is(res.Err, fence.ErrInvalidArgument) {
			t.Fatalf("%v: %v, want ErrInvalidArgument", bad, res.Err)
		}
	}
	restored, err := fsm.Restore(s.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if got := restored.Rejoins(); !reflect.DeepEqual(got, want) {
		t.Fatalf("restored rejoins %v, want %v", got, want)
	}
	if addr, ok := restored.Rejoin("n3"); !ok || addr != "127.0.0.1:7003" {
		t.Fatalf("Rejoin(n3) = %q, %v", addr, ok)
	}
	snap := s.Snapshot()
	snap.Rejoins = append(snap.Rejoins, &fsmpb.RejoinMember{MemberId: "n5"})
	if _, err := fsm.Restore(snap); err == nil {
		t.Fatal("restored a snapshot with a member added again at no address")
	}
}
