// Package buildinfo says which build of fence is running: the module
// version and the VCS revision the Go toolchain records in the binary
// (runtime/debug.ReadBuildInfo), for `fence version`, Status and the
// fence_build_info metric.
//
// It stands on the ground floor, shared by package server and the fence
// command. Release builds set the version with
// -ldflags "-X github.com/fencelock/fence/internal/buildinfo.version=...".
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// version and revision, when set at link time, override what the build
// info says: a build without the repository's .git (a container image built
// from a source archive) has neither, so its Dockerfile passes them with
//
//	-ldflags "-X github.com/fencelock/fence/internal/buildinfo.version=v1.2.3
//	          -X github.com/fencelock/fence/internal/buildinfo.revision=abc123"
var version, revision string

// Info describes one build of fence.
type Info struct {
	// Version is the module version: a release tag (v1.2.3) for `go install
	// ...@v1.2.3`, a pseudo-version for a build of a checkout, or "devel"
	// when the toolchain recorded none.
	Version string
	// Revision is the VCS commit the binary was built from, "" when not
	// recorded (`go install` of a module version records none).
	Revision string
	// Modified is set when the work tree had uncommitted changes.
	Modified bool
	// Time is the commit's time (RFC 3339), "" when not recorded.
	Time string
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

// Read returns the running binary's build info. It never fails: what the
// binary does not record is left empty (Version "devel").
func Read() Info {
	info := Info{Version: "devel", GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		info = fromBuildInfo(bi)
	}
	if version != "" {
		info.Version = version
	}
	if revision != "" {
		info.Revision, info.Modified = revision, false
	}
	return info
}

func fromBuildInfo(bi *debug.BuildInfo) Info {
	info := Info{Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if info.Version == "" || info.Version == "(devel)" {
		info.Version = "devel"
	}
	if info.GoVersion == "" {
		info.GoVersion = runtime.Version()
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		case "vcs.time":
			info.Time = s.Value
		}
	}
	return info
}

// Short is one line for a log or a Status: the version, and the first 12
// digits of the revision when known, "+dirty" when the tree was modified.
func (i Info) Short() string {
	rev := i.Revision
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev == "" || strings.Contains(i.Version, rev) {
		// A pseudo-version (v0.0.0-20250101000000-abcdef123456) names it already.
		return i.Version + dirty(i.Modified && !strings.HasSuffix(i.Version, "+dirty"))
	}
	return fmt.Sprintf("%s (%s%s)", i.Version, rev, dirty(i.Modified))
}

func dirty(modified bool) string {
	if modified {
		return "+dirty"
	}
	return ""
}

// String is what `fence version` prints: one field a line.
func (i Info) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "fence %s\n", i.Version)
	rev := i.Revision
	if rev == "" {
		rev = "unknown (not recorded in this build)"
	} else if i.Modified {
		rev += " (modified)"
	}
	fmt.Fprintf(&b, "revision %s\n", rev)
	if i.Time != "" {
		fmt.Fprintf(&b, "committed %s\n", i.Time)
	}
	fmt.Fprintf(&b, "go %s %s/%s\n", i.GoVersion, runtime.GOOS, runtime.GOARCH)
	return b.String()
}
