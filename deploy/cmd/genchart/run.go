package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/loadshed/loadshed/deploy/internal/chartgen"
	"github.com/loadshed/loadshed/internal/cli"
)

// run generates (or with -check, verifies) the chart's derived files under the
// deploy directory given by -root.
func run(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("genchart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	root := fs.String("root", ".", "the deploy directory")
	check := fs.Bool("check", false, "only check that the generated files are up to date")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *check {
		stale, err := chartgen.Stale(*root)
		if err != nil {
			return err
		}
		if len(stale) > 0 {
			return errors.New("out of date (run go generate in deploy/): " + strings.Join(stale, ", "))
		}
		fmt.Fprintln(stdout, "genchart: generated files are up to date")
		return nil
	}
	written, err := chartgen.Write(*root)
	if err != nil {
		return err
	}
	for _, w := range written {
		fmt.Fprintln(stdout, "genchart: wrote", w)
	}
	return nil
}
