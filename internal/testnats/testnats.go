// Package testnats starts a real embedded NATS server with JetStream for a
// test and connects to it.
package testnats

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/internal/natsrv"
)

// Start runs an embedded NATS server for the duration of t and returns a
// JetStream context connected to it.
func Start(t testing.TB) (jetstream.JetStream, *nats.Conn) {
	t.Helper()
	return start(t, func(srv *natsrv.Server) (*nats.Conn, error) { return nats.Connect(srv.URL()) })
}

// StartInProcess is Start connected in process (no socket), as
// `countersign dev` connects to its embedded NATS: for benchmarks that
// report the figures of that setup.
func StartInProcess(t testing.TB) (jetstream.JetStream, *nats.Conn) {
	t.Helper()
	return start(t, func(srv *natsrv.Server) (*nats.Conn, error) { return srv.Connect() })
}

func start(t testing.TB, connect func(*natsrv.Server) (*nats.Conn, error)) (jetstream.JetStream, *nats.Conn) {
	t.Helper()
	srv, err := natsrv.Start(natsrv.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := connect(srv)
	if err != nil {
		t.Fatal(err)
	}
	return jetStream(t, nc), nc
}

// Connect opens another connection to the NATS at url (a server's or a
// cluster's URLs), as another process would, for the duration of t.
func Connect(t testing.TB, url string) (jetstream.JetStream, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	return jetStream(t, nc), nc
}

func jetStream(t testing.TB, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
