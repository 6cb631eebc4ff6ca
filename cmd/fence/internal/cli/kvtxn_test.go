package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/fencetest"
)

// runFence runs fence with args against node, stdin as its input, and
// returns its exit code, stdout and stderr.
func runTxnCLI(t *testing.T, node *fencetest.Node, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Run(context.Background(), append([]string{"--endpoints", node.Endpoint()}, args...), strings.NewReader(stdin), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// fence kv txn reads etcdctl's text form from stdin, or JSON from
// --file, and prints which list ran and what each operation did.
func TestKVTxnCommand(t *testing.T) {
	node := fencetest.Start(t)
	code, out, errOut := runTxnCLI(t, node, `# set the mode once
absent("cfg/mode")

put cfg/mode blue
put cfg/note "two words"
get cfg/mode
del cfg/none

get cfg/mode
`, "kv", "txn")
	want := "then (every compare held), revision 1\nput cfg/mode\nput cfg/note\nget cfg/mode: blue\ndel cfg/none: did not exist\n"
	if code != 0 || out != want {
		t.Fatalf("first txn: exit %d, stdout:\n%s\nstderr:\n%s\nwant:\n%s", code, out, errOut, want)
	}
	code, out, _ = runTxnCLI(t, node, "absent(\"cfg/mode\")\n\nput cfg/mode red\n\nget cfg/mode\nget cfg/other\n", "kv", "txn")
	if want := "else (a compare did not hold), revision 1\nget cfg/mode: blue\nget cfg/other: not found\n"; code != 0 || out != want {
		t.Fatalf("second txn: exit %d, stdout:\n%s", code, out)
	}
	// No compares: the input starts with a blank line. --json prints the API's answer.
	code, out, _ = runTxnCLI(t, node, "\nput cfg/mode green\n", "kv", "txn", "--json")
	if flat := strings.Join(strings.Fields(out), ""); code != 0 || !strings.Contains(flat, `"succeeded":true`) || !strings.Contains(flat, `"revision":"2"`) {
		t.Fatalf("txn --json: exit %d, stdout:\n%s", code, out)
	}
	file := filepath.Join(t.TempDir(), "txn.json")
	json := `{"compares": [{"key": "cfg/mode", "value": "Z3JlZW4="}, {"key": "cfg/mode", "op": "COMPARE_OP_GREATER", "version": "1"}],
		"then": [{"delete": {"key": "cfg/note"}}]}`
	if err := os.WriteFile(file, []byte(json), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, _ = runTxnCLI(t, node, "", "kv", "txn", "--file", file)
	if want := "then (every compare held), revision 3\ndel cfg/note\n"; code != 0 || out != want {
		t.Fatalf("txn --file JSON: exit %d, stdout:\n%s", code, out)
	}
}

// A stale token refuses the whole txn; the holder's applies.
func TestKVTxnCommandFenced(t *testing.T) {
	node := fencetest.Start(t)
	ctx := context.Background()
	m := client.NewMutex(mustSession(t, node.Client()), "acct")
	old, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	move := "\nput acct/x 9\nput acct/y 1\n"
	tok := strconv.FormatUint(g.Token(), 10)
	if code, out, errOut := runTxnCLI(t, node, move, "kv", "txn", "--lock", "acct", "--token", tok, "--strict"); code != 0 {
		t.Fatalf("the holder's txn: exit %d\n%s%s", code, out, errOut)
	}
	code, _, errOut := runTxnCLI(t, node, move, "kv", "txn", "--lock", "acct", "--token", strconv.FormatUint(old.Token(), 10))
	if code == 0 || !strings.Contains(errOut, "stale fencing token") || !strings.Contains(errOut, "acct/x") {
		t.Fatalf("a stale txn: exit %d, stderr %s", code, errOut)
	}
}

// Input that is no txn is refused with the line that is wrong, before
// anything is sent.
func TestParseTxnErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"put a 1\n", `line 1: "put a 1" is no compare`},
		{"\nput a\n", "line 2: \"put a\": put takes a key and a value"},
		{"\nset a 1\n", `line 2: "set a 1" is no operation`},
		{"mod(\"a\") > x\n", "mod compares with a number"},
		{"size(\"a\") = 1\n", "size is none of"},
		{"absent(\"a\") = 1\n", "stands alone"},
		{"value(\"a\")\n", "compare value(KEY) with"},
		{"\nput a \"open\n", "a quote is not closed"},
		{"\nget a\n\nget a\n\nget a\n", "line 6: a txn has three parts"},
		{"{\"then\": 3}", "no TxnRequest"},
		{`{"compares": [{"key": "a"}]}`, "names nothing to compare"},
	} {
		if _, err := parseTxn([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseTxn(%q) = %v, want an error saying %q", tc.in, err, tc.want)
		}
	}
	tx, err := parseTxn([]byte("\n\nput \"a b\" \"\"\n"))
	if err != nil || len(tx.compares) != 0 || len(tx.then) != 0 || len(tx.elseOps) != 1 || tx.elseOps[0].key != "a b" {
		t.Fatalf("an else alone: %+v, %v", tx, err)
	}
}
