// Command bench runs loadshed side by side with nginx, HAProxy, a plain Go reverse proxy and no
// proxy, in front of the same synthetic backend, under the k6 scripts in loadtest/k6, and
// writes a markdown report, CSV files and PNG charts.
//
//	go run ./bench/cmd/bench [--quick] [--out DIR] [--repeats N] [--loads 0.5,1,2,5,10] ...
//
// See bench/README.md.
package main

import "github.com/loadshed/loadshed/internal/cli"

func main() { cli.Main("bench", run) }
