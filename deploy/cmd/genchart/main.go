// Command genchart regenerates the Helm chart's derived files from their
// sources (see package chartgen): run `go generate` in deploy/, or
// `go run ./cmd/genchart -check` to fail when a generated file is out of date.
package main

import "github.com/loadshed/loadshed/internal/cli"

func main() { cli.Main("genchart", run) }
