package ops

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
)

// Every operation of StreamRequest.op is in the table, in the proto's
// order, but for the two that have no unary call of the same shape.
func TestTableCoversTheStream(t *testing.T) {
	outside := map[protoreflect.Name]bool{"keep_alive": true, "cancel": true}
	var want []protoreflect.Name
	fields := requestOp.Fields()
	for i := range fields.Len() {
		if name := fields.Get(i).Name(); !outside[name] {
			want = append(want, name)
		}
	}
	var got []protoreflect.Name
	for _, op := range All {
		got = append(got, op.Name())
	}
	if len(got) != len(want) {
		t.Fatalf("the table has %v, StreamRequest.op %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("the table has %v, StreamRequest.op %v", got, want)
		}
	}
	if len(byName) != len(All) {
		t.Errorf("%d operations are defined, %d listed in All", len(byName), len(All))
	}
}

// The procedures found in the descriptors are the generated ones.
func TestProcedures(t *testing.T) {
	for op, want := range map[Any]string{
		CreateSession: fencev1connect.SessionServiceCreateSessionProcedure,
		CloseSession:  fencev1connect.SessionServiceCloseSessionProcedure,
		Acquire:       fencev1connect.LockServiceAcquireProcedure,
		Release:       fencev1connect.LockServiceReleaseProcedure,
		CancelAcquire: fencev1connect.LockServiceCancelAcquireProcedure,
		Check:         fencev1connect.LockServiceCheckProcedure,
		Put:           fencev1connect.KVServicePutProcedure,
		Get:           fencev1connect.KVServiceGetProcedure,
		Delete:        fencev1connect.KVServiceDeleteProcedure,
	} {
		if op.Procedure() != want {
			t.Errorf("%s: procedure %s, want %s", op.Name(), op.Procedure(), want)
		}
	}
}

// Of finds the operation and its message, and Answer sets the result of
// the same name.
func TestOfAndAnswer(t *testing.T) {
	acquire := &fencev1.AcquireRequest{Lock: "x"}
	op, msg := Of(&fencev1.StreamRequest{Id: 1, Op: &fencev1.StreamRequest_Acquire{Acquire: acquire}})
	if op != Acquire || msg != acquire {
		t.Fatalf("Of = %v, %v; want acquire and its message", op, msg)
	}
	resp := &fencev1.StreamResponse{Id: 1}
	op.Answer(resp, &fencev1.AcquireResponse{Token: 7})
	if resp.GetAcquire().GetToken() != 7 {
		t.Fatalf("the answer is %v, want the acquire result with token 7", resp)
	}
	for _, req := range []*fencev1.StreamRequest{
		{},
		{Op: &fencev1.StreamRequest_KeepAlive{KeepAlive: &fencev1.KeepAliveManyRequest{}}},
		{Op: &fencev1.StreamRequest_Cancel{Cancel: &fencev1.StreamCancel{}}},
	} {
		if op, msg := Of(req); op != nil || msg != nil {
			t.Errorf("Of(%v) = %v, %v; want none", req, op, msg)
		}
	}
}
