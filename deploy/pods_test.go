package deploy_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
)

// pod is one replica of statefulset.yaml run as a process on loopback: the
// container's args and environment as written, with the pod's fields filled
// in and its addresses (DNS names, 0.0.0.0 ports) mapped to loopback ports.
type pod struct {
	name    string
	dataDir string // its volume
	api     string
	args    []string
	env     []string
	cmd     *exec.Cmd
	stderr  *strings.Builder
}

// statefulSetPods prepares the manifest's replicas, each with a volume.
func statefulSetPods(t *testing.T) []*pod {
	t.Helper()
	var set *statefulSetObject
	for _, o := range statefulSetObjects(t) {
		if o.Kind == "StatefulSet" {
			set = &o
		}
	}
	if set == nil {
		t.Fatal("no StatefulSet")
	}
	c := set.Spec.Template.Spec.Containers[0]
	name, svc := set.Metadata.Name, set.Spec.ServiceName
	n := set.Spec.Replicas
	ports := freePorts(t, 3*n) // api, raft, metrics of each
	var pods []*pod
	for i := range n {
		p := &pod{name: fmt.Sprintf("%s-%d", name, i), dataDir: t.TempDir(), api: fmt.Sprintf("127.0.0.1:%d", ports[3*i])}
		var addrs []string // then each address, as the pod's environment made it
		for j := range n {
			host := fmt.Sprintf("%s-%d.%s.default.svc.cluster.local", name, j, svc)
			addrs = append(addrs, host+":7420", fmt.Sprintf("127.0.0.1:%d", ports[3*j]), host+":7421", fmt.Sprintf("127.0.0.1:%d", ports[3*j+1]))
		}
		addrs = append(addrs,
			"0.0.0.0:7420", p.api, "0.0.0.0:7421", fmt.Sprintf("127.0.0.1:%d", ports[3*i+1]),
			"0.0.0.0:9420", fmt.Sprintf("127.0.0.1:%d", ports[3*i+2]), "127.0.0.1:7421", fmt.Sprintf("127.0.0.1:%d", ports[3*i+1]))
		for _, m := range c.VolumeMounts {
			addrs = append(addrs, m.MountPath, p.dataDir)
		}
		local := strings.NewReplacer(addrs...)
		for _, a := range c.Args {
			p.args = append(p.args, local.Replace(a))
		}
		for _, kv := range podEnv(t, c.Env, p.name, "default", "127.0.0.1") {
			p.env = append(p.env, local.Replace(kv))
		}
		pods = append(pods, p)
	}
	t.Cleanup(func() {
		for _, p := range pods {
			p.kill()
		}
	})
	return pods
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var out []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return out
}

func (p *pod) start(t *testing.T) {
	t.Helper()
	p.stderr = &strings.Builder{}
	p.cmd = exec.Command(fenceBinary(t), p.args...)
	p.cmd.Env = p.env
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
}

func (p *pod) kill() {
	if p.cmd != nil && p.cmd.ProcessState == nil {
		p.cmd.Process.Signal(syscall.SIGKILL)
		p.cmd.Wait()
	}
}

// wipe gives the pod an empty volume.
func (p *pod) wipe(t *testing.T) {
	t.Helper()
	if err := os.RemoveAll(p.dataDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(p.dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
}

// within polls cond every 50 ms for up to d.
func within(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out after %v waiting for %s", d, what)
}

// TestStatefulSetPodsOnEmptyVolumes runs the manifest's three replicas as
// processes with their args as written. A pod restarted on an empty volume
// rejoins the group and tokens go on above the last one; with two of three
// volumes emptied, the two pods found no second group (which used to hand
// out token 1 again) and nobody leads.
func TestStatefulSetPodsOnEmptyVolumes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three nodes")
	}
	pods := statefulSetPods(t)
	var apis []string
	for _, p := range pods {
		p.start(t)
		apis = append(apis, p.api)
	}
	cl, err := client.New(client.WithEndpoints(apis...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	lockOnce := func() uint64 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s, err := cl.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		g, err := client.NewMutex(s, "orders").Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return g.Token()
	}
	first := lockOnce()
	group := statusOf(t, cl, pods[0].api).GetClusterId()

	// One pod on an empty volume: it rejoins as a new member.
	pods[1].kill()
	pods[1].wipe(t)
	pods[1].start(t)
	within(t, 60*time.Second, pods[1].name+" to rejoin the group", func() bool {
		st, err := cl.StatusOf(context.Background(), pods[1].api)
		return err == nil && st.GetClusterId() == group && st.GetLastToken() >= first && len(st.GetProblems()) == 0
	})
	if second := lockOnce(); second <= first {
		t.Fatalf("token %d after the rejoin, not above %d", second, first)
	}

	// Two of three volumes emptied: no pod founds a group.
	for _, p := range pods {
		p.kill()
	}
	pods[1].wipe(t)
	pods[2].wipe(t)
	pods[1].start(t)
	pods[2].start(t)
	time.Sleep(2 * time.Second)
	pods[0].start(t)
	within(t, 30*time.Second, "the wiped pods to say why they wait", func() bool {
		st, err := cl.StatusOf(context.Background(), pods[2].api)
		return err == nil && strings.Contains(strings.Join(st.GetProblems(), " "), "lost or replaced")
	})
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		for _, p := range pods {
			if st, err := cl.StatusOf(context.Background(), p.api); err == nil && (st.GetState() == "Leader" || (st.GetClusterId() != "" && st.GetClusterId() != group)) {
				t.Fatalf("%s is %s of group %q with two of three volumes empty (the group is %q)", p.name, st.GetState(), st.GetClusterId(), group)
			}
		}
	}
}

func statusOf(t *testing.T, cl *client.Client, addr string) *fencev1.StatusResponse {
	t.Helper()
	st, err := cl.StatusOf(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
