package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/testutil/syncbuf"
)

// The binary is built as the Dockerfile builds it, once for every test.
var (
	buildOnce sync.Once
	built     string
	buildErr  error
	binDir    string
)

func TestMain(m *testing.M) {
	var err error
	binDir, err = os.MkdirTemp("", "fence-deploy-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(binDir)
	os.Exit(code)
}

const (
	testVersion  = "v0.0.0-deploy-test"
	testRevision = "0123456789abcdef0123456789abcdef01234567"
)

// dockerfile returns the Dockerfile's instructions, continuation lines joined.
func dockerfile(t *testing.T) [][2]string {
	t.Helper()
	data, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var out [][2]string
	var cur string
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur == "" && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur += strings.TrimSuffix(trimmed, "\\") + " "
			continue
		}
		cur += trimmed
		op, rest, _ := strings.Cut(cur, " ")
		out = append(out, [2]string{strings.ToUpper(op), strings.TrimSpace(rest)})
		cur = ""
	}
	return out
}

// fenceBinary builds cmd/fence with the Dockerfile's own go build command
// (its -o and build arguments replaced) and returns the binary.
func fenceBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		var run string
		for _, in := range dockerfile(t) {
			if in[0] == "RUN" && strings.Contains(in[1], "go build") {
				run = in[1]
			}
		}
		if run == "" {
			buildErr = errors.New("the Dockerfile has no RUN ... go build")
			return
		}
		built = filepath.Join(binDir, "fence")
		run = regexp.MustCompile(`-o \S+`).ReplaceAllString(run, "-o "+built)
		run = strings.NewReplacer("${VERSION}", testVersion, "${REVISION}", testRevision).Replace(run)
		cmd := exec.Command("sh", "-c", run)
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("%s: %v\n%s", run, err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

// acceptsFlags fails the test unless `fence ARGS --help` parses args: cobra
// refuses unknown flags and bad values before it prints help.
func acceptsFlags(t *testing.T, where string, args []string) {
	t.Helper()
	out, err := exec.Command(fenceBinary(t), append(args, "--help")...).CombinedOutput()
	if err != nil {
		t.Errorf("%s: fence %s: %v\n%s", where, strings.Join(args, " "), err, out)
	}
}

// setting is one line of fence serve --print-config.
type setting struct {
	value  string // a map of peers as id=host:port,...
	origin string // flag, env VARIABLE, file FILE:LINE or default
}

// printConfig runs `fence ARGS --print-config` (args start with serve) with
// env alone for its environment and returns the settings printed.
func printConfig(t *testing.T, where string, env, args []string) map[string]setting {
	t.Helper()
	cmd := exec.Command(fenceBinary(t), append(args, "--print-config")...)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || stderr.Len() > 0 {
		t.Fatalf("%s: fence %s --print-config with %q: %v\n%s", where, strings.Join(args, " "), env, err, stderr.String())
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(out, &doc); err != nil || len(doc.Content) != 1 {
		t.Fatalf("%s: --print-config printed no YAML (%v):\n%s", where, err, out)
	}
	settings := map[string]setting{}
	m := doc.Content[0].Content
	for i := 0; i+1 < len(m); i += 2 {
		key, val := m[i], m[i+1]
		s := setting{value: val.Value, origin: strings.TrimPrefix(key.LineComment+val.LineComment, "# ")}
		if val.Kind == yaml.MappingNode {
			var peers []string
			for j := 0; j+1 < len(val.Content); j += 2 {
				peers = append(peers, val.Content[j].Value+"="+val.Content[j+1].Value)
			}
			s.value = strings.Join(peers, ",")
		}
		settings[key.Value] = s
	}
	return settings
}

// port returns the port of host:port.
func port(t *testing.T, addr string) string {
	t.Helper()
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		t.Fatalf("%q is not host:port", addr)
	}
	return addr[i+1:]
}

// imageEnv returns the environment the Dockerfile's last stage sets (ENV).
func imageEnv(t *testing.T) []string {
	t.Helper()
	var env []string
	for _, in := range dockerfile(t) {
		if in[0] == "FROM" {
			env = nil
		}
		if in[0] == "ENV" {
			for _, kv := range strings.Fields(in[1]) {
				if !strings.Contains(kv, "=") {
					t.Fatalf("ENV %s: write KEY=VALUE", in[1])
				}
				env = append(env, kv)
			}
		}
	}
	return env
}

func TestDockerfile(t *testing.T) {
	ins := dockerfile(t)
	var froms int
	final := map[string][]string{}
	for _, in := range ins {
		if in[0] == "FROM" {
			froms++
			final = map[string][]string{} // what the last stage says
		}
		final[in[0]] = append(final[in[0]], in[1])
	}
	if froms < 2 {
		t.Errorf("%d stages; want a build stage and a small runtime stage", froms)
	}
	if user := final["USER"]; len(user) == 0 || strings.HasPrefix(user[len(user)-1], "root") || strings.HasPrefix(user[len(user)-1], "0") {
		t.Errorf("the image runs as %v; want a non-root user", user)
	}
	if len(final["VOLUME"]) == 0 {
		t.Error("no VOLUME for the data dir")
	}
	var entry, cmd []string
	if err := json.Unmarshal([]byte(strings.Join(final["ENTRYPOINT"], "")), &entry); err != nil || len(entry) != 1 {
		t.Fatalf("ENTRYPOINT %v: want the binary alone, in exec form", final["ENTRYPOINT"])
	}
	if err := json.Unmarshal([]byte(strings.Join(final["CMD"], "")), &cmd); err != nil {
		t.Fatalf("CMD %v: want exec form: %v", final["CMD"], err)
	}
	copied := false
	for _, c := range final["COPY"] {
		copied = copied || strings.HasPrefix(c, "--from=build ") && strings.HasSuffix(c, " "+entry[0])
	}
	if !copied {
		t.Errorf("the runtime stage does not COPY --from=build the binary its ENTRYPOINT names (%s)", entry[0])
	}
	if len(cmd) == 0 || cmd[0] != "serve" {
		t.Errorf("CMD %v: want serve", cmd)
	}
	// What the image runs with: its ENV, and flags of CMD.
	settings := printConfig(t, "Dockerfile ENV and CMD", imageEnv(t), cmd)
	for _, v := range final["VOLUME"] {
		if !strings.Contains(v, `"`+settings["data-dir"].value+`"`) && v != settings["data-dir"].value {
			t.Errorf("VOLUME %s is not the data dir %s", v, settings["data-dir"].value)
		}
	}
	exposed := strings.Fields(strings.Join(final["EXPOSE"], " "))
	for _, name := range []string{"listen", "raft-listen", "listen-metrics"} {
		s := settings[name]
		if !strings.HasPrefix(s.origin, "env ") || !slices.Contains(exposed, port(t, s.value)) {
			t.Errorf("%s %s (%s): want it set by ENV, on a port that EXPOSE %v names", name, s.value, s.origin, exposed)
		}
	}

	bin := fenceBinary(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary is dynamically linked (it has an interpreter); the image has no libc")
		}
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "fence "+testVersion+"\n") || !strings.Contains(string(out), "revision "+testRevision+"\n") {
		t.Errorf("fence version of the image's binary (built with VERSION and REVISION): %v\n%s", err, out)
	}
	acceptsFlags(t, "Dockerfile CMD", cmd)
}

func TestSystemdUnit(t *testing.T) {
	data, err := os.ReadFile("fence.service")
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			keys[k] = v
		}
	}
	for k, want := range map[string]string{
		"DynamicUser": "yes", "StateDirectory": "fence", "Restart": "on-failure", "KillSignal": "SIGTERM",
		"TimeoutStopSec": "", "LimitNOFILE": "", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
	} {
		if v, ok := keys[k]; !ok || want != "" && v != want {
			t.Errorf("%s=%q, want %q", k, v, want)
		}
	}
	exec0 := strings.Fields(keys["ExecStart"])
	if len(exec0) < 2 || exec0[0] != "/usr/local/bin/fence" || exec0[1] != "serve" {
		t.Fatalf("ExecStart=%s: want /usr/local/bin/fence serve ...", keys["ExecStart"])
	}
	if keys["EnvironmentFile"] != "-/etc/default/fence" || !slices.Contains(exec0, "$FENCE_OPTS") {
		t.Errorf("EnvironmentFile=%s, ExecStart=%s: want -/etc/default/fence, and its $FENCE_OPTS as flags", keys["EnvironmentFile"], keys["ExecStart"])
	}
	// The unit as it runs: the settings file the unit names, as deploy/
	// ships it, and an /etc/default/fence with a variable and FENCE_OPTS
	// (unquoted in ExecStart: systemd splits it into words).
	environmentFile := map[string]string{"FENCE_NODE_ID": "n2", "FENCE_OPTS": "--raft-advertise 10.0.0.2:7421 --max-sessions 5000"}
	var args []string
	for i := 1; i < len(exec0); i++ {
		switch a := exec0[i]; {
		case a == "$FENCE_OPTS":
			args = append(args, strings.Fields(environmentFile["FENCE_OPTS"])...)
		case a == "--config" && i+1 < len(exec0):
			if exec0[i+1] != "/etc/fence/fence.yaml" {
				t.Errorf("ExecStart=%s: want --config /etc/fence/fence.yaml, which deploy/fence.yaml is", keys["ExecStart"])
			}
			args = append(args, a, "fence.yaml")
			i++
		default:
			args = append(args, a)
		}
	}
	acceptsFlags(t, "ExecStart", args)
	var env []string
	for k, v := range environmentFile {
		env = append(env, k+"="+v)
	}
	settings := printConfig(t, "ExecStart", env, args)
	for name, want := range map[string]setting{
		"data-dir":       {"/var/lib/" + keys["StateDirectory"], "file fence.yaml:"},
		"listen-metrics": {"127.0.0.1:9420", "file fence.yaml:"},
		"log-format":     {"json", "file fence.yaml:"},
		"node-id":        {"n2", "env FENCE_NODE_ID"},
		"raft-advertise": {"10.0.0.2:7421", "flag"},
		"max-sessions":   {"5000", "flag"},
	} {
		if got := settings[name]; got.value != want.value || !strings.HasPrefix(got.origin, want.origin) {
			t.Errorf("%s: %q from %s, want %q from %s", name, got.value, got.origin, want.value, want.origin)
		}
	}
	// The file's commented example of a group's node, uncommented, is read.
	example := filepath.Join(t.TempDir(), "group.yaml")
	conf, _ := os.ReadFile("fence.yaml")
	_, group, ok := strings.Cut(string(conf), "\n#\n")
	if !ok {
		t.Fatal("fence.yaml has no commented example after a line \"#\"")
	}
	group = strings.ReplaceAll(strings.ReplaceAll(group, "\n#   ", "\n  "), "# ", "")
	if err := os.WriteFile(example, append(conf, group...), 0o644); err != nil {
		t.Fatal(err)
	}
	if ex := printConfig(t, "fence.yaml's example", nil, []string{"serve", "--config", example}); ex["peers"].value != "n1=10.0.0.1:7421,n2=10.0.0.2:7421,n3=10.0.0.3:7421" || ex["node-id"].value != "n1" {
		t.Errorf("fence.yaml's example, uncommented: peers %q, node-id %q", ex["peers"].value, ex["node-id"].value)
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("systemd-analyze is missing, and CI checks the unit with it (Debian's systemd package)")
		}
		t.Skip("systemd-analyze is missing: the unit is not verified (install Debian's systemd)")
	}
	// verify needs the binary ExecStart names to exist.
	unit := filepath.Join(t.TempDir(), "fence.service")
	if err := os.WriteFile(unit, bytes.ReplaceAll(data, []byte("/usr/local/bin/fence"), []byte(fenceBinary(t))), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", unit).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		// verify exits 0 on settings it ignores; any word from it is a fault.
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// statefulSetObject is what the tests read of the manifest's objects.
type statefulSetObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		ClusterIP                string `yaml:"clusterIP"`
		PublishNotReadyAddresses bool   `yaml:"publishNotReadyAddresses"`
		ServiceName              string `yaml:"serviceName"`
		Replicas                 int    `yaml:"replicas"`
		PodManagementPolicy      string `yaml:"podManagementPolicy"`
		Template                 struct {
			Spec struct {
				EnableServiceLinks *bool `yaml:"enableServiceLinks"`
				Containers         []struct {
					Args           []string   `yaml:"args"`
					Env            []envVar   `yaml:"env"`
					Ports          []podPort  `yaml:"ports"`
					LivenessProbe  *httpProbe `yaml:"livenessProbe"`
					ReadinessProbe *httpProbe `yaml:"readinessProbe"`
					VolumeMounts   []struct {
						Name      string `yaml:"name"`
						MountPath string `yaml:"mountPath"`
					} `yaml:"volumeMounts"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
		VolumeClaimTemplates []struct {
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
		} `yaml:"volumeClaimTemplates"`
	} `yaml:"spec"`
}

// envVar is a container's variable: a value, or one of the pod's fields.
type envVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		FieldRef *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
	} `yaml:"valueFrom"`
}

// podEnv returns the environment of the pod name of a StatefulSet whose
// container has vars: the image's ENV, then vars with the pod's fields and
// $(VAR) references to the vars before them filled in, as the kubelet does.
func podEnv(t *testing.T, vars []envVar, name, namespace, ip string) []string {
	t.Helper()
	fields := map[string]string{"metadata.name": name, "metadata.namespace": namespace, "status.podIP": ip}
	defined := map[string]string{}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	env := imageEnv(t)
	for _, v := range vars {
		value := ref.ReplaceAllStringFunc(v.Value, func(r string) string {
			if d, ok := defined[r[2:len(r)-1]]; ok {
				return d
			}
			return r // the kubelet leaves an unknown reference as it is
		})
		if v.ValueFrom != nil {
			var f string
			if ref := v.ValueFrom.FieldRef; ref != nil {
				f = fields[ref.FieldPath]
			}
			if f == "" {
				t.Fatalf("env %s: valueFrom %+v: want a fieldRef of %v", v.Name, v.ValueFrom, fields)
			}
			value = f
		}
		defined[v.Name] = value
		env = append(env, v.Name+"="+value)
	}
	return env
}

type podPort struct {
	Name          string `yaml:"name"`
	ContainerPort int    `yaml:"containerPort"`
}

type httpProbe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

// statefulSetObjects reads statefulset.yaml's objects.
func statefulSetObjects(t *testing.T) []statefulSetObject {
	t.Helper()
	data, err := os.ReadFile("statefulset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var objs []statefulSetObject
	for {
		var o statefulSetObject
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("statefulset.yaml: %v", err)
		}
		objs = append(objs, o)
	}
}

func TestStatefulSet(t *testing.T) {
	objs := statefulSetObjects(t)
	headless := map[string]bool{}
	var set *statefulSetObject
	for i, o := range objs {
		switch o.Kind {
		case "Service":
			if o.Spec.ClusterIP == "None" && o.Spec.PublishNotReadyAddresses {
				headless[o.Metadata.Name] = true
			}
		case "StatefulSet":
			set = &objs[i]
		}
	}
	if set == nil {
		t.Fatal("no StatefulSet")
	}
	sp := set.Spec
	if !headless[sp.ServiceName] {
		t.Errorf("serviceName %q is not a headless Service that publishes not-ready addresses (peers must resolve before a leader exists)", sp.ServiceName)
	}
	if sp.Replicas != 3 || sp.PodManagementPolicy != "Parallel" {
		t.Errorf("replicas %d, podManagementPolicy %q: want 3, Parallel (OrderedReady waits for a ready pod, which needs a quorum)", sp.Replicas, sp.PodManagementPolicy)
	}
	if len(sp.Template.Spec.Containers) != 1 || len(sp.VolumeClaimTemplates) != 1 {
		t.Fatal("want one container and one volume claim template")
	}
	if links := sp.Template.Spec.EnableServiceLinks; links == nil || *links {
		t.Error("enableServiceLinks is not false: the pods get FENCE_CLIENT_SERVICE_HOST... for the Service fence-client")
	}
	c := sp.Template.Spec.Containers[0]
	acceptsFlags(t, "StatefulSet args", c.Args)
	// What fence-1 runs with: the image's ENV, the container's env and args.
	pod := set.Metadata.Name + "-1"
	settings := printConfig(t, "StatefulSet", podEnv(t, c.Env, pod, "default", "10.0.0.1"), c.Args)
	for _, name := range []string{"node-id", "data-dir", "listen", "advertise", "raft-listen", "raft-advertise", "listen-metrics", "peers"} {
		if !strings.HasPrefix(settings[name].origin, "env ") {
			t.Errorf("%s %q comes from %s, not from the container's env", name, settings[name].value, settings[name].origin)
		}
	}
	if got := settings["node-id"].value; got != pod {
		t.Errorf("node-id %q on %s: want the pod's name", got, pod)
	}
	if got, want := settings["raft-advertise"].value, "10.0.0.1:"+port(t, settings["raft-listen"].value); got != want {
		t.Errorf("raft-advertise %q: want the pod's IP and raft port, %s", got, want)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		mounted = mounted || m.Name == sp.VolumeClaimTemplates[0].Metadata.Name && m.MountPath == settings["data-dir"].value
	}
	if !mounted {
		t.Errorf("data-dir %q is not the claim template's mount", settings["data-dir"].value)
	}
	portNames := map[string]string{}
	for _, p := range c.Ports {
		portNames[fmt.Sprint(p.ContainerPort)] = p.Name
	}
	for name, want := range map[string]string{"listen": "api", "raft-listen": "raft", "listen-metrics": "metrics"} {
		if got := portNames[port(t, settings[name].value)]; got != want {
			t.Errorf("%s %q is on the container port %q, want %q", name, settings[name].value, got, want)
		}
	}
	for name, pr := range map[string]struct {
		p    *httpProbe
		path string
	}{"liveness": {c.LivenessProbe, "/livez"}, "readiness": {c.ReadinessProbe, "/readyz"}} {
		if pr.p == nil || pr.p.HTTPGet.Path != pr.path || pr.p.HTTPGet.Port != "metrics" {
			t.Errorf("%s probe %+v: want GET %s on the metrics port", name, pr.p, pr.path)
		}
	}
	var ids []string
	for _, peer := range strings.Split(settings["peers"].value, ",") {
		id, addr, _ := strings.Cut(peer, "=")
		ids = append(ids, id)
		if want := id + "." + sp.ServiceName + ".default.svc.cluster.local:" + port(t, settings["raft-listen"].value); addr != want {
			t.Errorf("peer %s at %s: want the pod's name under the headless service, %s", id, addr, want)
		}
	}
	if want := []string{set.Metadata.Name + "-0", set.Metadata.Name + "-1", set.Metadata.Name + "-2"}; !slices.Equal(ids, want) {
		t.Errorf("peers %v, want the pods %v", ids, want)
	}
	if want := pod + "." + sp.ServiceName + ".default.svc.cluster.local:" + port(t, settings["listen"].value); settings["advertise"].value != want {
		t.Errorf("advertise %q: want %s", settings["advertise"].value, want)
	}
}

// Every metric the dashboard's queries name is on a running node's
// /metrics, once the node has done what the metrics count.
func TestDashboardMetricsExist(t *testing.T) {
	data, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	names := map[string]bool{}
	metric := regexp.MustCompile(`\b(fence|go|process)_[A-Za-z0-9_]+`)
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if s, ok := e.(string); ok && (k == "expr" || k == "query") {
					for _, n := range metric.FindAllString(s, -1) {
						names[n] = true
					}
				}
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(dash)
	if len(names) < 10 {
		t.Fatalf("found only %d metric names in the dashboard: %v", len(names), names)
	}

	metricsAddr, apiAddr := startNode(t)
	exercise(t, apiAddr)
	var missing []string
	deadline := time.Now().Add(20 * time.Second)
	for {
		have := scrapeNames(t, "http://"+metricsAddr+"/metrics")
		missing = missing[:0]
		for n := range names {
			if !have[n] {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	slices.Sort(missing)
	for _, n := range missing {
		t.Errorf("the dashboard queries %s, which the node does not export", n)
	}
}

// startNode runs the binary with snapshots due at every entry, and returns
// its metrics and API addresses.
func startNode(t *testing.T) (metrics, api string) {
	t.Helper()
	var log syncbuf.Buffer
	cmd := exec.Command(fenceBinary(t), "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--raft-listen", "127.0.0.1:0",
		"--listen-metrics", "127.0.0.1:0", "--log-format", "json", "--snapshot-threshold", "1", "--snapshot-interval", "100ms")
	cmd.Stderr = &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		sc := bufio.NewScanner(strings.NewReader(log.String()))
		for sc.Scan() {
			var rec struct{ Msg, Metrics, Listen string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "fence node started" {
				return rec.Metrics, rec.Listen
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("fence serve did not start:\n%s", log.String())
	return "", ""
}

// exercise takes a lock and writes a key.
func exercise(t *testing.T, api string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	c, err := client.New(client.WithEndpoints(api))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.NewMutex(s, "dashboard").Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.KV().Put(ctx, "dashboard/key", []byte("v")); err != nil {
		t.Fatal(err)
	}
}

func scrapeNames(t *testing.T, url string) map[string]bool {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		names[name] = true
	}
	return names
}
