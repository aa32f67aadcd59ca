// Command backend is the synthetic slow-tail backend: a service with a fixed number of workers,
// an unbounded queue inside and sampled service times, for showing the proxy in front of it.
// With --get URL it is instead a one-shot HTTP client for health checks (the image has no curl).
//
// Run `backend --help` for the flags; see package internal/backend for the behaviour.
package main

import "github.com/loadshed/loadshed/internal/cli"

func main() { cli.Main("backend", run) }
