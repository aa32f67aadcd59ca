// Command soak runs the proxy as its own process at 10x overload, in front of a backend whose
// workers and latency change on a schedule, records its memory, goroutines, open descriptors and
// in-flight every second, and fails if any crosses its ceiling, if the last third's mean exceeds
// the middle third's by more than 10%, or if any admitted request fails.
//
//	go run ./cmd/soak                   # the 10-minute soak
//	go run ./cmd/soak --duration 45s    # the short version CI runs
//
// Run `soak --help` for the flags; see package internal/soak for what is judged.
package main

import "github.com/loadshed/loadshed/internal/cli"

func main() { cli.Main("soak", run) }
