// Command lab is a deterministic simulator that runs the real admission strategies under a
// virtual clock: it reproduces the published backpressure comparison, runs a user's policy
// against a modelled workload, sweeps offered load, and compares its predictions with live runs.
// Run "lab help" for the subcommands.
package main

import "github.com/loadshed/loadshed/internal/cli"

func main() { cli.Main("lab", run) }
