package cli

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
)

func kvTxnCommand(g *globals) *cobra.Command {
	var (
		f      = fenceFlags{revision: -1}
		file   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:         "txn",
		Annotations: bounded,
		Short:       "Compare keys, then write several keys in one commit (etcdctl txn)",
		Long: `Reads a transaction from --file (or stdin) and runs it: its compares, then
its then-operations if every compare holds, else its else-operations, all
in one commit. Every write is fenced by --lock/--token: a stale token
refuses the whole txn, and none of it applies.

The text form is etcdctl txn's: compares, a blank line, the operations of
then, a blank line, those of else. Each blank line ends a part: a txn
without compares starts with one. Lines starting with # are comments.

  value("cfg/mode") = "blue"      compares: value, version, create, mod
  mod("cfg/epoch") < 7            (with =, !=, <, >), absent, exists
  absent("cfg/lock")

  put cfg/mode green              operations: put KEY VALUE, del KEY, get KEY
  put cfg/epoch "7"               ("quoted" when they hold spaces or quotes)
  get cfg/mode

  get cfg/mode

Input that starts with { is the API's TxnRequest as JSON; a fence in it
wins over --lock/--token. --json prints the API's TxnResponse.`,
		Args: cobra.NoArgs,
		RunE: g.withClient(func(cmd *cobra.Command, _ []string, c *client.Client) error {
			in := g.stdin
			if file != "" && file != "-" {
				fh, err := os.Open(file)
				if err != nil {
					return err
				}
				defer fh.Close()
				in = fh
			}
			data, err := io.ReadAll(io.LimitReader(in, 64<<20))
			if err != nil {
				return err
			}
			t, err := parseTxn(data)
			if err != nil {
				return err
			}
			opts, err := f.options()
			if err != nil {
				return err
			}
			if t.fence != nil {
				opts = t.fence
			}
			resp, err := c.KV().Txn(cmd.Context(), opts...).If(t.compares...).Then(t.then...).Else(t.els...).Commit()
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g, resp)
			}
			return printTxn(g.stdout, t, resp)
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&file, "file", "", "read the txn from this file (- or unset: stdin)")
	fl.BoolVar(&asJSON, "json", false, "print the answer as JSON (the API's TxnResponse)")
	fl.StringVar(&f.lock, "lock", os.Getenv("FENCE_LOCK"), "lock the token was granted under (default $FENCE_LOCK)")
	fl.StringVar(&f.token, "token", os.Getenv("FENCE_TOKEN"), "fencing token of every write (default $FENCE_TOKEN)")
	fl.BoolVar(&f.strict, "strict", false, "the token must be the lock's current grant")
	return cmd
}

// txnInput is a txn as read: its parts for the client's builder, and the
// operations' kinds and keys, for printing the answer.
type txnInput struct {
	compares  []client.Cmp
	then, els []client.Op
	thenOps   []txnOpLine
	elseOps   []txnOpLine
	// fence is the JSON form's fence, nil when it has none.
	fence []client.WriteOption
}

type txnOpLine struct{ kind, key string }

// parseTxn reads the text form or, for input that starts with {, JSON.
func parseTxn(data []byte) (*txnInput, error) {
	if bytes.HasPrefix(bytes.TrimSpace(data), []byte("{")) {
		return parseTxnJSON(data)
	}
	t := &txnInput{}
	section := 0 // compares, then, else: each ends at a blank line
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, len(data)+1)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "#"):
			continue
		case line == "":
			section++
			continue
		case section > 2:
			return nil, fmt.Errorf("line %d: a txn has three parts, compares, then and else, each ended by a blank line; this is a fourth", n)
		}
		if err := t.parseLine(section, line); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
	}
	return t, sc.Err()
}

func (t *txnInput) parseLine(section int, line string) error {
	if section == 0 {
		c, err := parseCompare(line)
		if err != nil {
			return err
		}
		t.compares = append(t.compares, c)
		return nil
	}
	words, err := splitWords(line)
	if err != nil {
		return err
	}
	var op client.Op
	switch {
	case len(words) == 3 && words[0] == "put":
		op = client.OpPut(words[1], []byte(words[2]))
	case len(words) == 2 && (words[0] == "del" || words[0] == "delete"):
		words[0], op = "del", client.OpDelete(words[1])
	case len(words) == 2 && words[0] == "get":
		op = client.OpGet(words[1])
	case len(words) > 0 && words[0] == "put":
		return fmt.Errorf("%q: put takes a key and a value (quote a value with spaces)", line)
	default:
		return fmt.Errorf("%q is no operation: put KEY VALUE, del KEY or get KEY (compares come first, before a blank line)", line)
	}
	if section == 1 {
		t.then, t.thenOps = append(t.then, op), append(t.thenOps, txnOpLine{words[0], words[1]})
	} else {
		t.els, t.elseOps = append(t.els, op), append(t.elseOps, txnOpLine{words[0], words[1]})
	}
	return nil
}

// compareLine is a compare: target("key") OP operand, or absent("key"),
// exists("key").
var compareLine = regexp.MustCompile(`^(\w+)\(\s*("(?:[^"\\]|\\.)*"|[^()\s]+)\s*\)\s*(?:(!=|=|<|>)\s*(.+))?$`)

func parseCompare(line string) (client.Cmp, error) {
	m := compareLine.FindStringSubmatch(line)
	if m == nil {
		return client.Cmp{}, fmt.Errorf("%q is no compare: value(\"KEY\") = \"VALUE\", version, create or mod(\"KEY\") with =, !=, <, > and a number, absent(\"KEY\") or exists(\"KEY\")", line)
	}
	key, err := unquoteWord(m[2])
	if err != nil {
		return client.Cmp{}, err
	}
	what, op, operand := m[1], m[3], strings.TrimSpace(m[4])
	if what == "absent" || what == "exists" {
		if op != "" {
			return client.Cmp{}, fmt.Errorf("%q: %s(KEY) stands alone, without an operand", line, what)
		}
		if what == "absent" {
			return client.Absent(key), nil
		}
		return client.Exists(key), nil
	}
	if op == "" {
		return client.Cmp{}, fmt.Errorf("%q: compare %s(KEY) with =, !=, < or > and an operand", line, what)
	}
	v, err := unquoteWord(operand)
	if err != nil {
		return client.Cmp{}, err
	}
	if what == "value" || what == "val" {
		return client.Compare(client.Value(key), op, v), nil
	}
	targets := map[string]func(string) client.Cmp{
		"version": client.Version, "ver": client.Version, "create": client.CreateRevision, "mod": client.ModRevision,
	}
	target, ok := targets[what]
	if !ok {
		return client.Cmp{}, fmt.Errorf("%q: %s is none of value, version, create, mod, absent, exists", line, what)
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return client.Cmp{}, fmt.Errorf("%q: %s compares with a number, not %q", line, what, v)
	}
	return client.Compare(target(key), op, n), nil
}

// splitWords splits a line into words at spaces; a word in double quotes
// (Go's escapes) may hold spaces, quotes and be empty.
func splitWords(line string) ([]string, error) {
	var words []string
	for line = strings.TrimSpace(line); line != ""; line = strings.TrimSpace(line) {
		end := strings.IndexAny(line, " \t")
		if line[0] == '"' {
			end = closingQuote(line)
			if end < 0 {
				return nil, fmt.Errorf("%q: a quote is not closed", line)
			}
		}
		if end < 0 {
			end = len(line)
		}
		w, err := unquoteWord(line[:end])
		if err != nil {
			return nil, err
		}
		words, line = append(words, w), line[end:]
	}
	return words, nil
}

// closingQuote returns the index just past the quote that closes the one
// s starts with, -1 if none does.
func closingQuote(s string) int {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

func unquoteWord(w string) (string, error) {
	if !strings.HasPrefix(w, `"`) {
		return w, nil
	}
	s, err := strconv.Unquote(w)
	if err != nil {
		return "", fmt.Errorf("%s is not a quoted string (Go's escapes): %v", w, err)
	}
	return s, nil
}

// compareOpSymbols are the API's compare ops as the client's Compare takes them.
var compareOpSymbols = map[fencev1.CompareOp]string{
	fencev1.CompareOp_COMPARE_OP_EQUAL: "=", fencev1.CompareOp_COMPARE_OP_NOT_EQUAL: "!=",
	fencev1.CompareOp_COMPARE_OP_LESS: "<", fencev1.CompareOp_COMPARE_OP_GREATER: ">",
}

// parseTxnJSON reads the API's TxnRequest as JSON.
func parseTxnJSON(data []byte) (*txnInput, error) {
	var req fencev1.TxnRequest
	if err := protojson.Unmarshal(data, &req); err != nil {
		return nil, fmt.Errorf("the txn's JSON is no TxnRequest: %v", err)
	}
	t := &txnInput{}
	for i, c := range req.GetCompares() {
		op, ok := compareOpSymbols[c.GetOp()]
		if !ok {
			return nil, fmt.Errorf("compares[%d]: op %v is no compare op", i, c.GetOp())
		}
		switch v := c.GetTarget().(type) {
		case *fencev1.Compare_Value:
			t.compares = append(t.compares, client.Compare(client.Value(c.GetKey()), op, v.Value))
		case *fencev1.Compare_Version:
			t.compares = append(t.compares, client.Compare(client.Version(c.GetKey()), op, v.Version))
		case *fencev1.Compare_CreateRevision:
			t.compares = append(t.compares, client.Compare(client.CreateRevision(c.GetKey()), op, v.CreateRevision))
		case *fencev1.Compare_ModRevision:
			t.compares = append(t.compares, client.Compare(client.ModRevision(c.GetKey()), op, v.ModRevision))
		case *fencev1.Compare_Absent:
			if v.Absent {
				t.compares = append(t.compares, client.Absent(c.GetKey()))
			} else {
				t.compares = append(t.compares, client.Exists(c.GetKey()))
			}
		default:
			return nil, fmt.Errorf("compares[%d] names nothing to compare: set one of value, version, createRevision, modRevision, absent", i)
		}
	}
	var err error
	if t.then, t.thenOps, err = jsonOps("then", req.GetThen()); err != nil {
		return nil, err
	}
	if t.els, t.elseOps, err = jsonOps("else", req.GetElse()); err != nil {
		return nil, err
	}
	if f := req.GetFence(); f != nil {
		if f.ExpectRevision != nil {
			return nil, fmt.Errorf("a txn's fence takes no expectRevision: compare the keys' modRevision instead")
		}
		t.fence = []client.WriteOption{client.FencedBy(f.GetLock(), f.GetToken())}
		if f.GetStrict() {
			t.fence = append(t.fence, client.Strict())
		}
	}
	return t, nil
}

func jsonOps(list string, ops []*fencev1.TxnOp) ([]client.Op, []txnOpLine, error) {
	var out []client.Op
	var lines []txnOpLine
	for i, op := range ops {
		switch o := op.GetOp().(type) {
		case *fencev1.TxnOp_Put:
			if o.Put.GetSessionId() != 0 {
				return nil, nil, fmt.Errorf("%s[%d]: fence kv txn binds no key to a session (a session of this command would end with it)", list, i)
			}
			out, lines = append(out, client.OpPut(o.Put.GetKey(), o.Put.GetValue())), append(lines, txnOpLine{"put", o.Put.GetKey()})
		case *fencev1.TxnOp_Delete:
			out, lines = append(out, client.OpDelete(o.Delete.GetKey())), append(lines, txnOpLine{"del", o.Delete.GetKey()})
		case *fencev1.TxnOp_Get:
			out, lines = append(out, client.OpGet(o.Get.GetKey())), append(lines, txnOpLine{"get", o.Get.GetKey()})
		default:
			return nil, nil, fmt.Errorf("%s[%d] is no operation: set one of put, delete, get", list, i)
		}
	}
	return out, lines, nil
}

// printTxn prints which list ran and what each of its operations did, a
// line each.
func printTxn(w io.Writer, t *txnInput, resp *client.TxnResponse) error {
	bw := bufio.NewWriter(w)
	ops := t.thenOps
	if resp.GetSucceeded() {
		fmt.Fprintf(bw, "then (every compare held), revision %d\n", resp.GetRevision())
	} else {
		ops = t.elseOps
		fmt.Fprintf(bw, "else (a compare did not hold), revision %d\n", resp.GetRevision())
	}
	if resp.GetAlreadyApplied() {
		fmt.Fprintln(bw, "(a retry: the txn had applied already; its operations' answers are lost)")
	}
	for i, r := range resp.GetResults() {
		if i >= len(ops) {
			break
		}
		switch op := ops[i]; {
		case r.GetGet() != nil && r.GetGet().GetFound():
			fmt.Fprintf(bw, "get %s: %s\n", op.key, r.GetGet().GetKv().GetValue())
		case r.GetGet() != nil:
			fmt.Fprintf(bw, "get %s: not found\n", op.key)
		case r.GetDelete() != nil && !r.GetDelete().GetDeleted():
			fmt.Fprintf(bw, "del %s: did not exist\n", op.key)
		default:
			fmt.Fprintf(bw, "%s %s\n", op.kind, op.key)
		}
	}
	return bw.Flush()
}
