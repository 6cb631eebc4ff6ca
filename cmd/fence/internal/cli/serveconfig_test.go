package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// serveSettings returns fence serve's setting flags, by name order.
func serveSettings(t *testing.T) []*pflag.Flag {
	t.Helper()
	_, fs := newServeSettings()
	var out []*pflag.Flag
	fs.VisitAll(func(f *pflag.Flag) { out = append(out, f) })
	if len(out) < 40 {
		t.Fatalf("only %d settings", len(out))
	}
	return out
}

// checkedSamples are valid values of the string settings that take only
// some values, three that differ from one to the next.
var checkedSamples = map[string][3]string{
	"log-level":  {"debug", "warn", "error"},
	"log-format": {"json", "text", "json"},
	"log-store":  {"wal", "bolt", "wal"},
}

// sampleValue returns a value that f takes, as its flag does, other than
// its default and than the sample of the variant before (variant 0, 1, 2).
// A setting of a type it does not know fails the test: give it samples.
func sampleValue(t *testing.T, f *pflag.Flag, variant int) string {
	t.Helper()
	n := variant + 1
	switch v := f.Value.(type) {
	case *peerList:
		return fmt.Sprintf("a%d=127.0.0.1:%d,b%d=127.0.0.2:%d", n, 7000+n, n, 7100+n)
	case *rateValue:
		return fmt.Sprintf("%d/m", 90*n) // 1.5/s, 3/s, 4.5/s
	case *checked:
		s, ok := checkedSamples[f.Name]
		if !ok {
			t.Fatalf("--%s: no sample values in checkedSamples", f.Name)
		}
		return s[variant]
	case pflag.Value:
		switch v.Type() {
		case "bool":
			def, _ := strconv.ParseBool(f.DefValue)
			return strconv.FormatBool(def != (variant%2 == 0))
		case "int", "int64", "uint64":
			def, _ := strconv.Atoi(f.DefValue)
			return strconv.Itoa(def + 7*n)
		case "float64":
			def, _ := strconv.ParseFloat(f.DefValue, 64)
			return strconv.FormatFloat(def+1.5*float64(n), 'g', -1, 64)
		case "duration":
			def, _ := time.ParseDuration(f.DefValue)
			return (def + time.Duration(n)*1500*time.Millisecond).String()
		case "string":
			return fmt.Sprintf("%s-%d", f.Name, n)
		}
	}
	t.Fatalf("--%s: no sample value for a %s (%T)", f.Name, f.Value.Type(), f.Value)
	return ""
}

// asFlagWrites returns value as f's flag writes it back (10s for 10000ms).
func asFlagWrites(t *testing.T, name, value string) string {
	t.Helper()
	_, fs := newServeSettings()
	f := fs.Lookup(name)
	if err := f.Value.Set(value); err != nil {
		t.Fatalf("--%s %q: %v", name, value, err)
	}
	return f.Value.String()
}

// configFile writes a config file that sets each of flags to values[name],
// and returns its path and the line of each setting. Peers are written as a
// YAML map, strings quoted, the rest as they are.
func configFile(t *testing.T, flags []*pflag.Flag, values map[string]string) (string, map[string]int) {
	t.Helper()
	var b strings.Builder
	lines := map[string]int{}
	line := 1
	b.WriteString("# every setting of fence serve\n")
	for _, f := range flags {
		line++
		lines[f.Name] = line
		v := values[f.Name]
		switch f.Value.(type) {
		case *peerList:
			fmt.Fprintf(&b, "%s:\n", f.Name)
			for e := range strings.SplitSeq(v, ",") {
				id, addr, _ := strings.Cut(e, "=")
				fmt.Fprintf(&b, "  %s: %s\n", id, addr)
				line++
			}
			continue
		case *checked:
		default:
			if f.Value.Type() != "string" {
				fmt.Fprintf(&b, "%s: %s\n", f.Name, v)
				continue
			}
		}
		fmt.Fprintf(&b, "%s: %q\n", f.Name, v)
	}
	path := filepath.Join(t.TempDir(), "fence.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, lines
}

// printed is one setting as --print-config prints it.
type printed struct {
	value  string // as its flag takes it
	origin string // flag, env VAR, file FILE:LINE or default
}

// cleanEnv is the test's environment without its FENCE_ variables, and env.
func cleanEnv(env ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FENCE_") {
			out = append(out, kv)
		}
	}
	return append(out, env...)
}

// printConfig runs fence serve --print-config with args and env (added to
// the test's environment without its FENCE_ variables) and returns the
// settings it printed, by name, and what it printed on stderr.
func printConfig(t *testing.T, env []string, args ...string) (map[string]printed, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(fenceBin, append([]string{"serve", "--print-config"}, args...)...)
	cmd.Env = cleanEnv(env...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("fence serve --print-config %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return parsePrinted(t, stdout.Bytes()), stderr.String()
}

// parsePrinted reads --print-config's output.
func parsePrinted(t *testing.T, out []byte) map[string]printed {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal(out, &doc); err != nil || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		t.Fatalf("--print-config printed no YAML map (%v):\n%s", err, out)
	}
	_, fs := newServeSettings()
	m := doc.Content[0].Content
	got := map[string]printed{}
	for i := 0; i+1 < len(m); i += 2 {
		f := fs.Lookup(m[i].Value)
		if f == nil {
			t.Fatalf("--print-config printed %q, no setting", m[i].Value)
		}
		text, err := flagText(f, m[i+1])
		if err != nil {
			t.Fatalf("--print-config printed %s that --config refuses: %v", f.Name, err)
		}
		comment := m[i].LineComment + m[i+1].LineComment
		got[f.Name] = printed{value: asFlagWrites(t, f.Name, text), origin: strings.TrimPrefix(comment, "# ")}
	}
	return got
}

// checkPrinted fails for each setting printed otherwise than want says, and
// for one printed that is not a setting or a setting not printed.
func checkPrinted(t *testing.T, got map[string]printed, want func(f *pflag.Flag) printed) {
	t.Helper()
	flags := serveSettings(t)
	for _, f := range flags {
		w := want(f)
		w.value = asFlagWrites(t, f.Name, w.value)
		if g, ok := got[f.Name]; !ok {
			t.Errorf("%s is not printed", f.Name)
		} else if g != w {
			t.Errorf("%s: printed %q # %s, want %q # %s", f.Name, g.value, g.origin, w.value, w.origin)
		}
	}
	if len(got) != len(flags) {
		t.Errorf("%d settings printed, want %d", len(got), len(flags))
	}
}

// Every setting of fence serve is read from a config file, from its
// variable and from its flag, the one over the other; --print-config says
// which. The file, variables and flags are made from the flag set itself,
// so that a new setting is tested without a word here.
func TestServeSettingsFromFileEnvAndFlags(t *testing.T) {
	flags := serveSettings(t)
	values := [3]map[string]string{{}, {}, {}} // file, env, flags
	var env []string
	var args []string
	for _, f := range flags {
		for i := range values {
			values[i][f.Name] = sampleValue(t, f, i)
		}
		env = append(env, settingEnv(f.Name)+"="+values[1][f.Name])
		args = append(args, "--"+f.Name+"="+values[2][f.Name])
	}
	file, lines := configFile(t, flags, values[0])
	fromFile := func(f *pflag.Flag) printed {
		return printed{values[0][f.Name], fmt.Sprintf("file %s:%d", file, lines[f.Name])}
	}
	fromEnv := func(f *pflag.Flag) printed { return printed{values[1][f.Name], "env " + settingEnv(f.Name)} }
	fromFlag := func(f *pflag.Flag) printed { return printed{values[2][f.Name], "flag"} }

	t.Run("file", func(t *testing.T) {
		got, _ := printConfig(t, nil, "--config", file)
		checkPrinted(t, got, fromFile)
	})
	t.Run("FENCE_CONFIG", func(t *testing.T) {
		got, _ := printConfig(t, []string{"FENCE_CONFIG=" + file})
		checkPrinted(t, got, fromFile)
	})
	t.Run("env", func(t *testing.T) {
		got, stderr := printConfig(t, env)
		checkPrinted(t, got, fromEnv)
		if stderr != "" {
			t.Errorf("stderr: %s", stderr)
		}
	})
	t.Run("flags", func(t *testing.T) {
		got, _ := printConfig(t, nil, args...)
		checkPrinted(t, got, fromFlag)
	})
	// Each setting in the file; two of three also in the environment; one
	// of those also as a flag.
	t.Run("precedence", func(t *testing.T) {
		var someEnv, someArgs []string
		winner := map[string]func(*pflag.Flag) printed{}
		for i, f := range flags {
			winner[f.Name] = fromFile
			if i%3 > 0 {
				someEnv = append(someEnv, env[i])
				winner[f.Name] = fromEnv
			}
			if i%3 == 2 {
				someArgs = append(someArgs, args[i])
				winner[f.Name] = fromFlag
			}
		}
		got, _ := printConfig(t, someEnv, append(someArgs, "--config", file)...)
		checkPrinted(t, got, func(f *pflag.Flag) printed { return winner[f.Name](f) })
	})
}

// What --print-config prints, read back with --config, is the same
// configuration, every setting now from the file.
func TestPrintConfigRoundTrips(t *testing.T) {
	flags := serveSettings(t)
	values := map[string]string{}
	var inFile []*pflag.Flag
	var env, args []string
	for i, f := range flags {
		switch i % 3 {
		case 0:
			inFile = append(inFile, f)
			values[f.Name] = sampleValue(t, f, 0)
		case 1:
			env = append(env, settingEnv(f.Name)+"="+sampleValue(t, f, 1))
		case 2:
			args = append(args, "--"+f.Name+"="+sampleValue(t, f, 2))
		}
	}
	file, _ := configFile(t, inFile, values)
	roundTrip(t, cleanEnv(env...), append(args, "--config", file)...)

	// The defaults alone, the console's included (on: --listen is loopback).
	def := roundTrip(t, cleanEnv())
	if def["ui"] != (printed{"true", "default"}) {
		t.Errorf("ui on loopback: %+v, want true # default", def["ui"])
	}
	if def := roundTrip(t, cleanEnv("FENCE_LISTEN=0.0.0.0:7420")); def["ui"] != (printed{"false", "default"}) {
		t.Errorf("ui beyond loopback: %+v, want false # default", def["ui"])
	}
}

// roundTrip runs fence serve --print-config with env and args, reads what
// it printed back with --config alone, and fails unless that gives the same
// settings, each from the file. It returns the first settings.
func roundTrip(t *testing.T, env []string, args ...string) map[string]printed {
	t.Helper()
	cmd := exec.Command(fenceBin, append([]string{"serve", "--print-config"}, args...)...)
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("fence serve --print-config %s: %v\n%s", args, err, err.(*exec.ExitError).Stderr)
	}
	back := filepath.Join(t.TempDir(), "printed.yaml")
	if err := os.WriteFile(back, out, 0o644); err != nil {
		t.Fatal(err)
	}
	want := parsePrinted(t, out)
	got, _ := printConfig(t, nil, "--config", back)
	for name, g := range got {
		if g.value != want[name].value || !strings.HasPrefix(g.origin, "file "+back+":") {
			t.Errorf("%s read back: %q # %s, want %q from %s", name, g.value, g.origin, want[name].value, back)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d settings read back, %d printed", len(got), len(want))
	}
	return want
}

// badValue returns a value that f refuses in a config file, as YAML, and
// what the error then says; "" for a setting that takes any scalar.
func badValue(f *pflag.Flag) (yamlValue, says string) {
	switch f.Value.(type) {
	case *peerList:
		return "n1", `"n1" is not id=host:port`
	case *checked:
		return "loud", "want " + want(f)
	case *rateValue:
		return "fast", `"fast": not a rate of sessions`
	}
	switch f.Value.Type() {
	case "bool":
		return "yes", `"yes": want true or false`
	case "int":
		return "lots", `"lots": want an integer`
	case "uint64":
		return "-1", `"-1": want a whole number`
	case "float64":
		return "fast", `"fast": want a number`
	case "duration":
		return "10", `"10": want a duration`
	}
	return "[a, b]", "want a string, not a list"
}

// A config file's unknown key, repeated key and bad values are refused,
// each with its line and the key, and what the setting takes; so is a bad
// variable, by its name. fence serve then starts nothing.
func TestServeConfigRefusesBadKeysAndValues(t *testing.T) {
	var b strings.Builder
	b.WriteString("node-id: n1\nraft-listn: 127.0.0.1:7421\nnode-id: n2\n")
	wantErrs := []string{
		`fence.yaml:2: unknown key "raft-listn": fence serve has no flag --raft-listn`,
		`fence.yaml:3: node-id is set again (first on line 1)`,
		`env FENCE_MAX_SESSIONS "many": want an integer`,
	}
	line := 3
	for _, f := range serveSettings(t) {
		v, says := badValue(f)
		if f.Name == "node-id" {
			continue
		}
		line++
		fmt.Fprintf(&b, "%s: %s\n", f.Name, v)
		wantErrs = append(wantErrs, fmt.Sprintf("fence.yaml:%d: %s", line, f.Name), says)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "fence.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--print-config"}, {"--data-dir", "data"}} {
		cmd := exec.Command(fenceBin, append([]string{"serve", "--config", "fence.yaml"}, args...)...)
		cmd.Dir = dir
		cmd.Env = cleanEnv("FENCE_MAX_SESSIONS=many")
		out, err := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); err == nil || code != 1 {
			t.Fatalf("fence serve %s with a bad file: exit %d, want 1\n%s", args, code, out)
		}
		for _, w := range wantErrs {
			if !strings.Contains(string(out), w) {
				t.Errorf("fence serve %s: the error does not say %q:\n%s", args, w, out)
			}
		}
		if _, err := os.Stat(filepath.Join(dir, "data")); err == nil {
			t.Errorf("fence serve %s made its data dir", args)
		}
	}
}

// fence serve takes nothing from the variables of other fence commands,
// from those Kubernetes sets for a Service named fence-something, or from
// the test suite's; it warns of a FENCE_ variable it does not know (a
// misspelt setting).
func TestServeIgnoresOtherVariables(t *testing.T) {
	var env []string
	rootCommand(&globals{}).PersistentFlags().VisitAll(func(f *pflag.Flag) {
		env = append(env, settingEnv(f.Name)+"=x")
	})
	for _, name := range notServeEnv {
		env = append(env, name+"=x")
	}
	env = append(env,
		"FENCE_CLIENT_SERVICE_HOST=10.0.0.9", "FENCE_CLIENT_SERVICE_PORT=7420", "FENCE_CLIENT_SERVICE_PORT_API=7420",
		"FENCE_CLIENT_PORT=tcp://10.0.0.9:7420", "FENCE_CLIENT_PORT_7420_TCP=tcp://10.0.0.9:7420",
		"FENCE_CLIENT_PORT_7420_TCP_ADDR=10.0.0.9", "FENCE_CLIENT_PORT_7420_TCP_PORT=7420", "FENCE_CLIENT_PORT_7420_TCP_PROTO=tcp",
		"FENCE_PORT=tcp://10.0.0.8:7420", "FENCE_SERVICE_HOST=10.0.0.8",
		"FENCE_TEST_POSTGRES=postgres://x",
		"FENCE_RAFT_ADVERTIZE=10.0.0.1:7421",
	)
	env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "FENCE_CONFIG=") })
	got, stderr := printConfig(t, env)
	checkPrinted(t, got, func(f *pflag.Flag) printed {
		if f.Name == "ui" {
			return printed{"true", "default"}
		}
		return printed{f.DefValue, "default"}
	})
	if want := "fence serve: FENCE_RAFT_ADVERTIZE is set, but is no setting of fence serve; ignored\n"; stderr != want {
		t.Errorf("stderr %q, want %q", stderr, want)
	}
}

// No setting's variable is one that means something else: a variable of
// the client's global flags, one fence lock sets for its command, one that
// Kubernetes sets for a Service, or one of the test suite's.
func TestServeSettingVariablesCollideWithNothing(t *testing.T) {
	other := map[string]string{}
	for _, name := range notServeEnv {
		other[name] = "read or set by another command"
	}
	rootCommand(&globals{}).PersistentFlags().VisitAll(func(f *pflag.Flag) {
		other[settingEnv(f.Name)] = "the client's --" + f.Name
	})
	for _, f := range serveSettings(t) {
		name := settingEnv(f.Name)
		if why, ok := other[name]; ok {
			t.Errorf("--%s's variable %s is %s", f.Name, name, why)
		}
		if serviceLinkEnv.MatchString(name) || strings.HasPrefix(name, "FENCE_TEST_") {
			t.Errorf("--%s's variable %s is one that Kubernetes or the test suite sets", f.Name, name)
		}
	}
}

// A node started from a config file, variables and a flag serves with
// them: its data in the file's dir, JSON logs as the file says, on the
// addresses and with the node id of the variables, at the flag's level
// (info, where the variable says error).
func TestServeStartsFromFileAndEnv(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	file := filepath.Join(dir, "fence.yaml")
	if err := os.WriteFile(file, []byte("data-dir: "+data+"\nlog-format: json\nnode-id: from-file\nui: false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	log := runServeEnv(t, cleanEnv("FENCE_CONFIG="+file, "FENCE_NODE_ID=from-env",
		"FENCE_LISTEN=127.0.0.1:0", "FENCE_RAFT_LISTEN=127.0.0.1:0", "FENCE_LOG_LEVEL=error"), "--log-level", "info")
	var started bool
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not a JSON record (the file's log-format): %q", line)
		}
		started = started || rec["msg"] == "fence node started"
	}
	if !started {
		t.Errorf("no INFO record of the start (the flag's --log-level over the variable's error):\n%s", log)
	}
	if !strings.Contains(log, `"from-env"`) || strings.Contains(log, "from-file") {
		t.Errorf("the node id is not the variable's:\n%s", log)
	}
	if entries, err := os.ReadDir(data); err != nil || len(entries) == 0 {
		t.Errorf("the file's data dir %s: %v, %d entries", data, err, len(entries))
	}
}
