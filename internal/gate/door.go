package gate

import (
	"context"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"
)

// Door is a front door that serves on a listener of its own beside the HTTP data port, over the
// same Gate (Envoy's external processor): a reload reaches it through the gate, and the server
// that runs it drains it with the data port.
type Door interface {
	// Addr is the address the door listens on.
	Addr() net.Addr
	// Serve serves until Shutdown or Close, then returns nil.
	Serve() error
	// Shutdown stops accepting, lets every admitted exchange finish, and returns when they have
	// or when ctx ends (then it stops at once and returns ctx's error).
	Shutdown(ctx context.Context) error
	// Close stops at once.
	Close()
}

// OpenDoor opens the door a configuration asks for over g, listening at once; it returns nil
// (and no error) when the configuration does not ask for it. Adding a door to the sidecar is one
// package with one OpenDoor, named where the server is built.
type OpenDoor func(g *Gate, opts DoorOptions) (Door, error)

// DoorOptions are a door's collaborators.
type DoorOptions struct {
	// Registerer receives the door's own metrics (the gate's are shared).
	Registerer prometheus.Registerer
	// Logger receives operational logs.
	Logger *slog.Logger
}
