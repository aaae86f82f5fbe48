package testnats

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// StartCluster runs a JetStream cluster of n in-process NATS servers for
// the duration of t, as a production deployment would, and returns the
// client URLs of its nodes, comma-separated (a URL nats.Connect takes).
// It returns once the cluster's JetStream leader sees all n nodes.
func StartCluster(t testing.TB, n int) string {
	t.Helper()
	routePorts := make([]int, n)
	for i := range routePorts {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		routePorts[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	var routes []string
	for _, p := range routePorts {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	var servers []*server.Server
	var urls []string
	for i := range n {
		srv, err := server.NewServer(&server.Options{
			ServerName: fmt.Sprintf("countersign-test-%d", i),
			Host:       "127.0.0.1", Port: server.RANDOM_PORT,
			JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
			Cluster: server.ClusterOpts{Name: "countersign-test", Host: "127.0.0.1", Port: routePorts[i]},
			Routes:  server.RoutesFromStr(strings.Join(routes, ",")),
		})
		if err != nil {
			t.Fatal(err)
		}
		go srv.Start()
		t.Cleanup(srv.Shutdown)
		if !srv.ReadyForConnections(10 * time.Second) {
			t.Fatalf("cluster node %d not ready", i)
		}
		servers = append(servers, srv)
		urls = append(urls, srv.ClientURL())
	}
	// Ready when the meta leader sees every node online with JetStream:
	// before that, a replicated stream may find no place to go.
	ready := func(srv *server.Server) bool {
		return srv.JetStreamIsLeader() && len(srv.JetStreamClusterPeers()) == n
	}
	deadline := time.Now().Add(30 * time.Second)
	for !slices.ContainsFunc(servers, ready) {
		if time.Now().After(deadline) {
			t.Fatalf("the JetStream cluster of %d did not come up within 30s", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return strings.Join(urls, ",")
}
