// Package cli is the one convention every command of the project follows: main only calls
// Main with the command's run(ctx, args, stdout, stderr) function, and the exit status says how
// it ended: 0 for success (or --help), 2 for a usage error (a bad flag, argument or flag value:
// nothing was done), 1 for any other failure.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/loadshed/loadshed/internal/version"
)

// UsageError is a problem with the command line: the command did nothing and exits with 2.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }

func (e UsageError) Unwrap() error { return e.Err }

// Usagef returns a UsageError with the formatted message.
func Usagef(format string, args ...any) error {
	return UsageError{fmt.Errorf(format, args...)}
}

// Parse parses args with fs and refuses positional arguments: a bad flag or an argument is a
// UsageError (the flag package's own message and usage are not printed: ExitCode reports it),
// -h and --help print the usage to fs's output and return flag.ErrHelp, and --version (on a flag
// set of NewFlagSet) prints the version there and returns ErrDone.
func Parse(fs *flag.FlagSet, args []string) error {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.Usage = usage
	fs.SetOutput(out)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.Usage()
			return err
		}
		return UsageError{err}
	}
	if f := fs.Lookup("version"); f != nil {
		if v, ok := f.Value.(*versionFlag); ok && v.set {
			fmt.Fprintln(out, version.String(v.name))
			return ErrDone
		}
	}
	if fs.NArg() > 0 {
		return Usagef("unexpected arguments %q", fs.Args())
	}
	return nil
}

// ExitCode reports err on stderr, prefixed with the command's name, and returns the exit
// status: 0 for nil, flag.ErrHelp or ErrDone, 2 for a UsageError, 1 for anything else.
func ExitCode(name string, err error, stderr io.Writer) int {
	switch {
	case err == nil, Done(err):
		return 0
	case errors.As(err, new(UsageError)):
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for usage.\n", name, err, name)
		return 2
	default:
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
}

// Main runs a command: run gets a context that SIGINT or SIGTERM cancels, the arguments after
// the program name, and the standard streams; the process exits with ExitCode's status.
func Main(name string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(ExitCode(name, err, os.Stderr))
}

// Help is what a command's --help prints: its synopsis, how it is called and an example.
type Help struct {
	Name     string   // the command as typed, e.g. "proxy" or "lab run"
	Synopsis string   // one line: what the command does
	Usage    []string // ways to call it, each after the name, e.g. "--config FILE [flags]"
	Examples []string // whole command lines a user can paste
}

// Write prints h in the one help style of the project, then the flags of fs (when fs is not nil).
func (h Help) Write(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "%s - %s\n\nUsage:\n", h.Name, h.Synopsis)
	for _, u := range h.Usage {
		fmt.Fprintf(w, "  %s %s\n", h.Name, u)
	}
	if len(h.Examples) > 0 {
		fmt.Fprintln(w, "\nExample:")
		for _, e := range h.Examples {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
	if fs == nil {
		return
	}
	fmt.Fprintln(w, "\nFlags:")
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if len(f.Name) == 1 {
			line = "  -" + f.Name
		}
		if name != "" {
			line += " " + name
		}
		fmt.Fprintf(w, "%s\n        %s", line, usage)
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" && f.DefValue != "[]" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

// versionFlag is --version: set, Parse prints the build's version.
type versionFlag struct {
	name string
	set  bool
}

func (v *versionFlag) String() string     { return "false" }
func (v *versionFlag) IsBoolFlag() bool   { return true }
func (v *versionFlag) Set(s string) error { b, err := strconv.ParseBool(s); v.set = b; return err }

// NewFlagSet returns the command's flag set: --help prints h and the flags to stdout, --version
// prints the version to stdout (both through Parse, which then returns ErrDone), and a bad flag
// is a UsageError that names it, without the help.
func NewFlagSet(h Help, stdout io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(h.Name, flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Var(&versionFlag{name: h.Name}, "version", "print the version and exit")
	fs.Usage = func() { h.Write(fs.Output(), fs) }
	return fs
}

// ErrDone ends a command that printed what its command line asked for (--version): exit 0.
var ErrDone = errors.New("done")

// Done reports whether err ends the command without a failure: --help or --version was asked.
func Done(err error) bool { return errors.Is(err, flag.ErrHelp) || errors.Is(err, ErrDone) }
