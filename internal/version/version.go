// Package version holds the build's version, stamped at link time with
// -ldflags "-X github.com/loadshed/loadshed/internal/version.Version=v1.2.3".
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the release version; "dev" for an unstamped build.
var Version = "dev"

// String returns a one-line description of the build for --version.
func String(binary string) string {
	rev := ""
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = " " + s.Value[:12]
			}
		}
	}
	return fmt.Sprintf("%s %s%s %s %s/%s", binary, Version, rev, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
