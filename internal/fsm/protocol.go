package fsm

import (
	"fmt"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/fencelock/fence/internal/fsmpb"
)

// Group protocols: what a group's log may hold (docs/design.md, "Versions
// in a group"). A node speaks every protocol up to its own, Protocol; a
// group's leader proposes only what the protocol the group agreed on
// allows, and the group moves to a newer one (SetProtocol) only once every
// member speaks it. An entry a node does not understand stops its state
// machine instead of being skipped.
const (
	// Protocol1 is what fences from before protocols were numbered wrote:
	// one command per entry, every kind of command but Batch and
	// SetProtocol. A node that does not say which protocol it speaks
	// speaks this one.
	Protocol1 uint32 = 1
	// Protocol2 adds Batch entries and SetProtocol commands, and raft
	// connections on which the dialer introduces itself (its group and id):
	// at protocol 2 a node refuses a raft connection that does not.
	Protocol2 uint32 = 2
	// Protocol3 adds CloseSession's end (revoked, abandoned), which puts
	// the holders' lock-delays in force. Below it a leader commits a
	// revoke or an abandonment as ExpireSessions, which every version
	// applies the same way.
	Protocol3 uint32 = 3
	// Protocol4 adds CancelWait's timed_out, which names a wait's end in
	// its lock event. Below it a leader leaves it out, and a timed-out
	// wait's event says it was cancelled.
	Protocol4 uint32 = 4
	// Protocol5 adds KVTxn, the KV store's transactions. Below it the
	// edge refuses a txn (fence.ErrUnsupported): a member that does not
	// know the command would stop at it.
	Protocol5 uint32 = 5
	// Protocol6 adds RejoinMember, the record by which any leader finishes
	// adding again a member whose data dir was lost. Below it a member
	// that lost its data is added again by hand (fence members remove,
	// then add).
	Protocol6 uint32 = 6

	// Protocol is the newest protocol this version speaks.
	Protocol = Protocol6
)

// notUnderstood says what in cmd this version cannot apply: a kind of
// command, a field or a session end newer than it knows, or a protocol
// past its own. "" when it understands all of it.
func notUnderstood(cmd *fsmpb.Command) string {
	switch {
	case cmd.GetOp() == nil && len(cmd.ProtoReflect().GetUnknown()) > 0:
		return "a kind of command"
	case unknownFields(cmd.ProtoReflect()):
		return "a command with a field"
	}
	if what := newerValue(cmd); what != "" {
		return what
	}
	for _, c := range cmd.GetBatch().GetCommands() {
		if what := newerValue(c); what != "" {
			return what
		}
	}
	return ""
}

// newerValue says which value of cmd's own fields is newer than this
// version knows: a protocol past its own, or a session end (an enum value,
// unlike a field, decodes without a trace of being new).
func newerValue(cmd *fsmpb.Command) string {
	if v := cmd.GetSetProtocol().GetVersion(); v > Protocol {
		return fmt.Sprintf("a move to protocol %d", v)
	}
	if end := cmd.GetCloseSession().GetEnd(); fsmpb.SessionEnd_name[int32(end)] == "" {
		return fmt.Sprintf("a session end (%d)", int32(end))
	}
	for _, c := range cmd.GetKvTxn().GetCompares() {
		if t := c.GetTarget(); fsmpb.KVCompareTarget_name[int32(t)] == "" {
			return fmt.Sprintf("a txn compare target (%d)", int32(t))
		}
		if op := c.GetOp(); fsmpb.KVCompareOp_name[int32(op)] == "" {
			return fmt.Sprintf("a txn compare op (%d)", int32(op))
		}
	}
	return ""
}

// unknownFields reports whether m, or any message in it, holds a field
// its type does not declare: one a newer version added.
func unknownFields(m protoreflect.Message) bool {
	if len(m.GetUnknown()) > 0 {
		return true
	}
	found := false
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					found = unknownFields(mv.Message())
					return !found
				})
			}
		case fd.Message() == nil:
		case fd.IsList():
			for i, l := 0, v.List(); i < l.Len() && !found; i++ {
				found = unknownFields(l.Get(i).Message())
			}
		default:
			found = unknownFields(v.Message())
		}
		return !found
	})
	return found
}
