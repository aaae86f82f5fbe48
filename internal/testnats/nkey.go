package testnats

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// StartNKeyUser runs a NATS server with JetStream that admits one user, by
// nkey, as a production NATS admits Countersign's, for the duration of t.
// It returns the server and the user's seed (what --nats-nkey's file
// holds).
func StartNKeyUser(t testing.TB) (srv *server.Server, seed []byte) {
	t.Helper()
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ = user.Seed()
	pub, _ := user.PublicKey()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true, Nkeys: []*server.NkeyUser{{Nkey: pub}}})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS not ready")
	}
	return ns, seed
}
