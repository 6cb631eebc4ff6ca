package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"

	"connectrpc.com/connect"

	"github.com/fencelock/fence/internal/ops"
)

// Every operation of the table answers its unary call from the table's
// handler, not from the generated services' stand-ins: an empty request
// is refused by the handler's validation (invalid_argument, or a session
// not found), never as unimplemented.
func TestOperationsAreServedByTheTable(t *testing.T) {
	s := startTestServer(t, nil)
	if len(operations) != len(ops.All) {
		t.Fatalf("the node serves %d operations, the table has %d", len(operations), len(ops.All))
	}
	for _, op := range ops.All {
		if byOperation[op.Name()].op != op {
			t.Errorf("%s has no handler of its own", op.Name())
		}
		resp, err := http.Post("http://"+s.Addr()+op.Procedure(), "application/json", bytes.NewBufferString("{}"))
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Code string }
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if body.Code == connect.CodeUnimplemented.String() || resp.StatusCode == http.StatusNotFound {
			t.Errorf("%s: %d %q, want its handler's answer", op.Procedure(), resp.StatusCode, body.Code)
		}
	}
}
