package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name      string
		bi        debug.BuildInfo
		version   string
		short     string
		revInText string
	}{
		{
			name:    "go install of a release",
			bi:      debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.4.0"}},
			version: "v1.4.0", short: "v1.4.0", revInText: "revision unknown",
		},
		{
			name:    "go build without VCS",
			bi:      debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			version: "devel", short: "devel", revInText: "revision unknown",
		},
		{
			name:    "no main module (a test binary)",
			bi:      debug.BuildInfo{GoVersion: "go1.26.8"},
			version: "devel", short: "devel", revInText: "revision unknown",
		},
		{
			name: "go build of a dirty checkout",
			bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
			}},
			version: "devel", short: "devel (0123456789ab+dirty)", revInText: "revision 0123456789abcdef0123 (modified)",
		},
		{
			name: "a pseudo-version that names the revision",
			bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20260102030405-0123456789ab"}, Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "0123456789abcdef0123"},
			}},
			version: "v0.0.0-20260102030405-0123456789ab", short: "v0.0.0-20260102030405-0123456789ab", revInText: "revision 0123456789abcdef0123\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info := fromBuildInfo(&tc.bi)
			if info.Version != tc.version {
				t.Errorf("Version = %q, want %q", info.Version, tc.version)
			}
			if got := info.Short(); got != tc.short {
				t.Errorf("Short() = %q, want %q", got, tc.short)
			}
			text := info.String()
			if !strings.HasPrefix(text, "fence "+tc.version+"\n") || !strings.Contains(text, tc.revInText) || !strings.Contains(text, "go go1.26.8 ") {
				t.Errorf("String() =\n%s\nwant the version %q, %q and the Go version", text, tc.version, tc.revInText)
			}
		})
	}
}
