package cli

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The --json output of every command follows the API's JSON (protojson):
// camelCase names, every field present, 64-bit integers such as tokens
// and session ids as strings, durations as strings such as "1.500s".

// printJSON prints m as the API's JSON, indented.
func printJSON(g *globals, m proto.Message) error {
	data, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(g.stdout, string(data))
	return err
}

// rawJSON is m as the API's JSON, compact, to embed in a larger document.
func rawJSON(m proto.Message) (json.RawMessage, error) {
	return protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(m)
}

// printJSONValue prints v as JSON, indented; the API messages it holds
// are rawJSON.
func printJSONValue(g *globals, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(g.stdout, string(data))
	return err
}

// jsonDuration is d as the API's JSON writes a duration.
func jsonDuration(d time.Duration) string {
	data, _ := protojson.Marshal(durationpb.New(d))
	var s string
	_ = json.Unmarshal(data, &s)
	return s
}

// jsonUint is a 64-bit integer as the API's JSON writes it: a string.
func jsonUint(n uint64) string { return fmt.Sprint(n) }

// printTable writes a table with a header (columns separated by tabs) and
// a line for each of items, as row writes it, the columns aligned.
func printTable[T any](g *globals, header string, items []T, row func(T) string) error {
	w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, header)
	for _, it := range items {
		fmt.Fprintln(w, row(it))
	}
	return w.Flush()
}
