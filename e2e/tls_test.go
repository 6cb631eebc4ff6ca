package e2e

import (
	"crypto/tls"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/testutil/testtls"
)

// `fence serve` with TLS and client certificate authentication serves the
// CLI that presents a certificate of the trusted CA (--cacert, --cert,
// --key), and refuses the one without a certificate and plain HTTP.
func TestTLSProcesses(t *testing.T) {
	ca := testtls.NewCA(t, "fence e2e CA")
	dir := t.TempDir()
	node := ca.WriteFiles(t, dir, "node")
	app := ca.WriteFiles(t, dir, "app")
	cert, err := tls.LoadX509KeyPair(app.Cert, app.Key)
	if err != nil {
		t.Fatal(err)
	}
	web := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{cert}}}}
	srv := startServerWith(t, web, "--cert-file", node.Cert, "--key-file", node.Key, "--trusted-ca-file", node.CA, "--client-cert-auth")

	tlsFlags := []string{"--cacert", app.CA, "--cert", app.Cert, "--key", app.Key}
	out, stderr, code := runFence(t, append(append(srv.endpoints(), tlsFlags...), "lock", "tls/job", "--", "sh", "-c", "echo token $FENCE_TOKEN")...)
	if code != 0 || !strings.HasPrefix(out, "token ") {
		t.Fatalf("fence lock over TLS: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no TLS flags", append(srv.endpoints(), "status"), "serves TLS, and fence called it without: give --cacert"},
		// The alert may surface in the handshake or on the first read.
		{"no client certificate", append(append(srv.endpoints(), "--cacert", app.CA), "status"), "requires a client certificate: give --cert FILE and --key FILE"},
	} {
		if _, stderr, code := runFence(t, tc.args...); code == 0 || !strings.Contains(stderr, tc.want) {
			t.Errorf("fence status with %s: exit %d, stderr %q; want it refused, saying %q", tc.name, code, stderr, tc.want)
		}
	}
	if resp, err := httpClient.Get("http://" + srv.addr + "/healthz"); err == nil && resp.StatusCode == http.StatusOK {
		resp.Body.Close()
		t.Error("plain HTTP was served")
	}
}
