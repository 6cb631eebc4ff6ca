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
	for _, want := range []string{"serve", "--listen-metrics", "--data-dir"} {
		if !slices.Contains(cmd, want) {
			t.Errorf("CMD %v lacks %s", cmd, want)
		}
	}
	for _, v := range final["VOLUME"] {
		if !strings.Contains(v, cmd[slices.Index(cmd, "--data-dir")+1]) {
			t.Errorf("VOLUME %s is not the --data-dir of CMD %v", v, cmd)
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
	var args []string
	for _, a := range exec0[1:] {
		switch a {
		case "$FENCE_OPTS":
		case "${STATE_DIRECTORY}":
			args = append(args, t.TempDir())
		default:
			args = append(args, a)
		}
	}
	acceptsFlags(t, "ExecStart", args)

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
				Containers []struct {
					Args           []string   `yaml:"args"`
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
	c := sp.Template.Spec.Containers[0]
	flags := map[string]string{}
	for _, a := range c.Args[1:] {
		k, v, _ := strings.Cut(a, "=")
		flags[k] = v
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		mounted = mounted || m.Name == sp.VolumeClaimTemplates[0].Metadata.Name && m.MountPath == flags["--data-dir"]
	}
	if !mounted {
		t.Errorf("--data-dir %q is not the claim template's mount", flags["--data-dir"])
	}
	metricsPort := ""
	for _, p := range c.Ports {
		if strings.HasSuffix(flags["--listen-metrics"], fmt.Sprintf(":%d", p.ContainerPort)) {
			metricsPort = p.Name
		}
	}
	if metricsPort == "" {
		t.Errorf("no container port for --listen-metrics %q", flags["--listen-metrics"])
	}
	for name, pr := range map[string]struct {
		p    *httpProbe
		path string
	}{"liveness": {c.LivenessProbe, "/livez"}, "readiness": {c.ReadinessProbe, "/readyz"}} {
		if pr.p == nil || pr.p.HTTPGet.Path != pr.path || pr.p.HTTPGet.Port != metricsPort {
			t.Errorf("%s probe %+v: want GET %s on the metrics port %q", name, pr.p, pr.path, metricsPort)
		}
	}
	var ids []string
	for _, peer := range strings.Split(flags["--peers"], ",") {
		id, addr, _ := strings.Cut(peer, "=")
		ids = append(ids, id)
		if !strings.HasPrefix(addr, id+"."+sp.ServiceName+".") {
			t.Errorf("peer %s at %s: want the pod's name under the headless service %s", id, addr, sp.ServiceName)
		}
	}
	if want := []string{set.Metadata.Name + "-0", set.Metadata.Name + "-1", set.Metadata.Name + "-2"}; !slices.Equal(ids, want) {
		t.Errorf("--peers ids %v, want the pods %v", ids, want)
	}
	if flags["--node-id"] != "$(POD_NAME)" {
		t.Errorf("--node-id %q: want $(POD_NAME)", flags["--node-id"])
	}
	expand := strings.NewReplacer("$(POD_NAME)", "fence-0", "$(POD_NAMESPACE)", "default", "$(POD_IP)", "10.0.0.1")
	var args []string
	for _, a := range c.Args {
		args = append(args, expand.Replace(a))
	}
	acceptsFlags(t, "StatefulSet args", args)
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
	var log syncBuffer
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

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
