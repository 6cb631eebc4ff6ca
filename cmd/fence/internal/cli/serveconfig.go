package cli

// fence serve takes each setting from the first of four places that sets
// it: its flag, the variable FENCE_<FLAG>, the YAML file of --config (or
// FENCE_CONFIG), its default. docs/configuration.md is the user's page.

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// configEnv names the config file when --config is not given.
const configEnv = "FENCE_CONFIG"

// source is where a setting's value came from, in rising precedence.
type source int

const (
	fromDefault source = iota
	fromFile
	fromEnv
	fromFlag
)

// setting is one flag of fence serve and where its value came from.
type setting struct {
	flag   *pflag.Flag
	source source
	where  string // FILE:LINE from a file, the variable from env
}

// origin says where the value came from, as --print-config prints it.
func (s setting) origin() string {
	switch s.source {
	case fromFlag:
		return "flag"
	case fromEnv:
		return "env " + s.where
	case fromFile:
		return "file " + s.where
	}
	return "default"
}

// resolved are the settings of fence serve, in name order.
type resolved []setting

// source returns where the named setting came from.
func (r resolved) source(name string) source {
	for _, s := range r {
		if s.flag.Name == name {
			return s.source
		}
	}
	panic("fence serve has no setting " + name)
}

// settingEnv is the environment variable of the setting of flag name.
func settingEnv(name string) string {
	return "FENCE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// settingsFile is the settings file a command's --config flag names, or
// FENCE_CONFIG's when the flag was not given.
func settingsFile(cmd *cobra.Command, configFlag string) string {
	if cmd.Flags().Changed("config") {
		return configFlag
	}
	return os.Getenv(configEnv)
}

// resolveSettings sets each flag of fs that the command line did not from
// its variable, or else from the config file at path (none when path is
// empty), and says where every value came from. Every value of the file
// and of the environment must parse, also one that a flag overrides; the
// errors name the file's line or the variable, and what the flag takes.
func resolveSettings(fs *pflag.FlagSet, path string, lookupEnv func(string) (string, bool)) (resolved, error) {
	fromCommandLine := map[string]string{}
	fs.VisitAll(func(f *pflag.Flag) { // Changed: the command line's FlagSet set it
		if f.Changed {
			fromCommandLine[f.Name] = f.Value.String()
		}
	})
	sources := map[string]setting{}
	var errs []error
	if path != "" {
		file, err := readConfigFile(path, fs)
		if err != nil {
			return nil, err
		}
		for _, v := range file { // in the file's order
			where := fmt.Sprintf("%s:%d", path, v.line)
			err := v.err
			if f := fs.Lookup(v.name); err == nil {
				if serr := f.Value.Set(v.text); serr != nil {
					err = fmt.Errorf("%s %q: %s", f.Name, v.text, problem(f, serr))
				}
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
				continue
			}
			sources[v.name] = setting{source: fromFile, where: where}
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		name := settingEnv(f.Name)
		if v, ok := lookupEnv(name); ok && v != "" {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("env %s %q: %s", name, v, problem(f, err)))
			}
			sources[f.Name] = setting{source: fromEnv, where: name}
		}
	})
	var out resolved
	fs.VisitAll(func(f *pflag.Flag) {
		s := sources[f.Name]
		if v, ok := fromCommandLine[f.Name]; ok {
			s = setting{source: fromFlag}
			if err := f.Value.Set(v); err != nil {
				panic(fmt.Sprintf("--%s does not take back its own value %q: %v", f.Name, v, err))
			}
		}
		s.flag = f
		out = append(out, s)
	})
	return out, errors.Join(errs...)
}

// wanter is a flag value that says what it takes.
type wanter interface{ want() string }

// want says what a flag takes.
func want(f *pflag.Flag) string {
	if w, ok := f.Value.(wanter); ok {
		return w.want()
	}
	switch f.Value.Type() {
	case "bool":
		return "true or false"
	case "int":
		return "an integer"
	case "uint64":
		return "a whole number, 0 or more"
	case "float64":
		return "a number"
	case "duration":
		return "a duration such as 500ms, 10s or 1m30s"
	}
	return "a string"
}

// problem says what is wrong with a value that f refused with err: its own
// words for fence's value types, what it takes for pflag's.
func problem(f *pflag.Flag, err error) string {
	if _, ok := f.Value.(wanter); ok {
		return err.Error()
	}
	return "want " + want(f)
}

// fileValue is a setting in the config file, as its flag takes it, or
// the reason it is refused.
type fileValue struct {
	name, text string
	line       int
	err        error
}

// readConfigFile reads a YAML map from names of fs's flags to their values,
// in the file's order. A flag of peers takes its id=host:port,... or a map
// of id: host:port; a boolean one a YAML boolean; the others a scalar, as
// the flag writes it. It returns an error only for a file it cannot read
// as a map; a key it refuses is a fileValue with an err.
func readConfigFile(path string, fs *pflag.FlagSet) ([]fileValue, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(doc.Content) == 0 { // an empty file, or only comments
		return nil, nil
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s:%d: want a map of settings, flag-name: value", path, top.Line)
	}
	var out []fileValue
	seen := map[string]int{} // line of each key
	for i := 0; i+1 < len(top.Content); i += 2 {
		key, val := top.Content[i], top.Content[i+1]
		v := fileValue{name: key.Value, line: key.Line}
		f := fs.Lookup(key.Value)
		switch {
		case key.Kind != yaml.ScalarNode || f == nil:
			v.err = fmt.Errorf("unknown key %q: fence serve has no flag --%[1]s", key.Value)
		case seen[f.Name] > 0:
			v.err = fmt.Errorf("%s is set again (first on line %d)", f.Name, seen[f.Name])
		default:
			seen[f.Name] = key.Line
			v.text, v.err = flagText(f, val)
		}
		out = append(out, v)
	}
	return out, nil
}

// flagText returns a YAML value as flag f takes it on the command line.
func flagText(f *pflag.Flag, n *yaml.Node) (string, error) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	_, isPeers := f.Value.(*peerList)
	switch {
	case n.Kind == yaml.MappingNode && isPeers:
		var pairs []string
		for i := 0; i+1 < len(n.Content); i += 2 {
			id, addr := n.Content[i], n.Content[i+1]
			if id.Kind != yaml.ScalarNode || addr.Kind != yaml.ScalarNode {
				return "", fmt.Errorf("%s: want %s", f.Name, want(f))
			}
			pairs = append(pairs, id.Value+"="+addr.Value)
		}
		return strings.Join(pairs, ","), nil
	case n.Kind != yaml.ScalarNode:
		return "", fmt.Errorf("%s: want %s, not a %s", f.Name, want(f), kindName(n.Kind))
	case n.ShortTag() == "!!null":
		return "", fmt.Errorf("%s has no value: want %s", f.Name, want(f))
	case f.Value.Type() == "bool" && n.ShortTag() != "!!bool":
		return "", fmt.Errorf("%s %q: want %s", f.Name, n.Value, want(f))
	}
	return n.Value, nil
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "map"
	case yaml.SequenceNode:
		return "list"
	}
	return "document"
}

// write prints the settings as a config file for --config, each value
// commented with where it came from (file, when set, is the file read).
func (r resolved) write(w io.Writer, file string) error {
	top := &yaml.Node{Kind: yaml.MappingNode}
	for _, s := range r {
		key := &yaml.Node{Kind: yaml.ScalarNode, Value: s.flag.Name}
		val := valueNode(s.flag)
		if val.Kind == yaml.ScalarNode {
			val.LineComment = s.origin()
		} else {
			key.LineComment = s.origin()
		}
		top.Content = append(top.Content, key, val)
	}
	head := "fence serve's settings, each with where it came from: flag, env VARIABLE,\nfile FILE:LINE or default. fence serve --config FILE reads them back."
	if file != "" {
		head += "\nRead with the config file " + file + "."
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&yaml.Node{Kind: yaml.DocumentNode, HeadComment: head, Content: []*yaml.Node{top}}); err != nil {
		return err
	}
	return enc.Close()
}

// valueNode is a flag's value as the config file writes it.
func valueNode(f *pflag.Flag) *yaml.Node {
	if p, ok := f.Value.(*peerList); ok && len(*p) > 0 {
		m := &yaml.Node{Kind: yaml.MappingNode}
		for _, peer := range *p {
			m.Content = append(m.Content,
				&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: peer.id},
				&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: peer.addr})
		}
		return m
	}
	n := &yaml.Node{Kind: yaml.ScalarNode, Value: f.Value.String()}
	switch f.Value.Type() {
	case "bool", "int", "uint64", "float64":
	default:
		n.Tag = "!!str" // quoted where YAML would read something else
	}
	return n
}

// peerList is the value of --peers and --raft-dial: id=host:port,... in the
// order given.
type peerList []peer

type peer struct{ id, addr string }

func (p *peerList) String() string {
	var parts []string
	for _, e := range *p {
		parts = append(parts, e.id+"="+e.addr)
	}
	return strings.Join(parts, ",")
}

func (p *peerList) Set(s string) error {
	var out peerList
	seen := map[string]bool{}
	for e := range strings.SplitSeq(s, ",") {
		if strings.TrimSpace(s) == "" {
			break // empty: no peers
		}
		id, addr, ok := strings.Cut(e, "=")
		id, addr = strings.TrimSpace(id), strings.TrimSpace(addr)
		if _, _, err := net.SplitHostPort(addr); !ok || id == "" || err != nil {
			return fmt.Errorf("%q is not id=host:port", e)
		}
		if seen[id] {
			return fmt.Errorf("%s is listed twice", id)
		}
		seen[id] = true
		out = append(out, peer{id, addr})
	}
	*p = out
	return nil
}

func (p *peerList) Type() string { return "peers" }

func (p *peerList) want() string {
	return "id=host:port,... or a map of id: host:port"
}

// addresses returns the peers' addresses by id.
func (p peerList) addresses() map[string]string {
	m := map[string]string{}
	for _, e := range p {
		m[e.id] = e.addr
	}
	return m
}

// checked is a string flag whose values check accepts.
type checked struct {
	p     *string
	check func(string) error
	what  string
}

func newChecked(p *string, check func(string) error, what string) *checked {
	return &checked{p: p, check: check, what: what}
}

func (c *checked) String() string { return *c.p }

func (c *checked) Set(s string) error {
	if err := c.check(s); err != nil {
		return err
	}
	*c.p = s
	return nil
}

func (c *checked) Type() string { return "string" }

func (c *checked) want() string { return c.what }

// newChoice is a string flag that takes one of choices, set to def.
func newChoice(p *string, def string, choices ...string) *checked {
	*p = def
	var shown []string
	for _, c := range choices {
		if c != "" {
			shown = append(shown, c)
		}
	}
	what := strings.Join(shown[:len(shown)-1], ", ") + " or " + shown[len(shown)-1]
	return newChecked(p, func(s string) error {
		if !slices.Contains(choices, s) {
			return errors.New("want " + what)
		}
		return nil
	}, what)
}

// checkLogLevel accepts what slog.Level reads: debug, info, warn, error,
// with an offset (info+2).
func checkLogLevel(s string) error {
	var l slog.Level
	if l.UnmarshalText([]byte(s)) != nil {
		return errors.New("want debug, info, warn or error")
	}
	return nil
}

// notServeEnv are FENCE_ variables that other fence commands read or set:
// fence lock's child gets FENCE_LOCK, FENCE_TOKEN and FENCE_SESSION (which
// fence kv reads), the systemd unit passes flags in FENCE_OPTS. fence serve
// ignores them, and the variables of the client's global flags, without a
// word; no setting of fence serve may have one of their names.
var notServeEnv = []string{"FENCE_LOCK", "FENCE_TOKEN", "FENCE_SESSION", "FENCE_OPTS", configEnv}

// serviceLinkEnv matches the variables that Kubernetes (and Docker's
// links) set for a Service named fence or fence-something: FENCE_PORT,
// FENCE_SERVICE_HOST, FENCE_CLIENT_PORT_7420_TCP_ADDR...
var serviceLinkEnv = regexp.MustCompile(`^FENCE_([A-Z0-9_]+_)?(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)?)$`)

// unknownFenceEnv returns the names of environ's FENCE_ variables that are
// neither a setting of fs nor one another command reads, nor one that
// Kubernetes sets for a Service, nor one of the test suite (FENCE_TEST_):
// most likely a misspelt setting.
func unknownFenceEnv(environ []string, fs *pflag.FlagSet, client *pflag.FlagSet) []string {
	known := map[string]bool{}
	for _, name := range notServeEnv {
		known[name] = true
	}
	for _, set := range []*pflag.FlagSet{fs, client} {
		set.VisitAll(func(f *pflag.Flag) { known[settingEnv(f.Name)] = true })
	}
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "FENCE_") && !known[name] && !strings.HasPrefix(name, "FENCE_TEST_") && !serviceLinkEnv.MatchString(name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
