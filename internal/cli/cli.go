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
	"syscall"
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
// UsageError, -h and --help return flag.ErrHelp (fs has printed the usage).
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return UsageError{err}
	}
	if fs.NArg() > 0 {
		return Usagef("unexpected arguments %q", fs.Args())
	}
	return nil
}

// ExitCode reports err on stderr, prefixed with the command's name, and returns the exit
// status: 0 for nil or flag.ErrHelp, 2 for a UsageError, 1 for anything else.
func ExitCode(name string, err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
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
