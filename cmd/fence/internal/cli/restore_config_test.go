package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencelock/fence/fencetest"
)

// fence snapshot restore takes the node's settings from fence serve's
// config file (--config), as serve will start it, where its own flags do
// not give them: a restore that used its defaults made a data dir naming
// another node than the one serve then started.
func TestRestoreReadsServesConfig(t *testing.T) {
	node := fencetest.Start(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "backup.fence")
	if code, _, stderr := runFence(t, "--endpoints", node.Endpoint(), "snapshot", "save", file); code != 0 {
		t.Fatalf("snapshot save: exit %d, %s", code, stderr)
	}
	dataDir := filepath.Join(dir, "restored")
	config := filepath.Join(dir, "serve.yaml")
	yaml := "node-id: n7\nraft-listen: 127.0.0.1:17777\ndata-dir: " + dataDir + "\n"
	if err := os.WriteFile(config, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("FENCE_CONFIG", "")
	code, stdout, stderr := runFence(t, "snapshot", "restore", file, "--config", config)
	if code != 0 {
		t.Fatalf("snapshot restore --config: exit %d, %s", code, stderr)
	}
	for _, want := range []string{"into " + dataDir + ":", "members [n7=127.0.0.1:17777]", "--node-id n7"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("snapshot restore --config said\n%s\nwant %q in it", stdout, want)
		}
	}
	// Its own flags win over the file.
	other := filepath.Join(dir, "other")
	code, stdout, stderr = runFence(t, "snapshot", "restore", file, "--config", config, "--data-dir", other, "--node-id", "n8")
	if code != 0 || !strings.Contains(stdout, "into "+other+":") || !strings.Contains(stdout, "members [n8=127.0.0.1:17777]") {
		t.Errorf("snapshot restore --config with flags: exit %d, stdout %s, stderr %s", code, stdout, stderr)
	}
}
