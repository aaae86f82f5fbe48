// Package natsrv runs an embedded NATS server with JetStream, for
// `countersign dev` and for tests that need the real broker.
package natsrv

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options configures the embedded server.
type Options struct {
	// StoreDir is where JetStream keeps its files. Empty means a temporary
	// directory chosen by the server (tests only: data is not kept).
	StoreDir string
	// Host and Port to listen on. Zero Port picks a free port. Host defaults
	// to 127.0.0.1: the embedded server is never exposed beyond loopback.
	Host string
	Port int
}

// Server is a running embedded NATS server.
type Server struct {
	srv *server.Server
}

// Start starts the server and waits until it accepts connections.
func Start(opts Options) (*Server, error) {
	host := opts.Host
	if host == "" {
		host = "127.0.0.1"
	}
	port := opts.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	srv, err := server.NewServer(&server.Options{
		ServerName: "countersign-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   opts.StoreDir,
		NoLog:      true,
		NoSigs:     true,
		// Deny writes larger than any record we store; tool arguments are
		// capped well below this at the MCP edge.
		MaxPayload: 8 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("natsrv: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("natsrv: embedded NATS did not become ready within 10s")
	}
	return &Server{srv: srv}, nil
}

// URL is the client URL of the server.
func (s *Server) URL() string { return s.srv.ClientURL() }

// Shutdown stops the server and waits for it to exit. It is safe to call more
// than once.
func (s *Server) Shutdown() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}
