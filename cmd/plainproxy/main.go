// Command plainproxy is the benchmark's baseline: a net/http/httputil reverse proxy with a
// Rewrite hook and a sized upstream transport, and nothing else (no admission, no metrics).
// It shows what a Go proxy costs before loadshed adds anything.
//
//	plainproxy [--listen ADDR] [--upstream URL] [--max-idle-conns-per-host N] [--version]
package main

import "github.com/loadshed/loadshed/internal/cli"

func main() { cli.Main("plainproxy", run) }
