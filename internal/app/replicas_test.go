package app

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/internal/authn"
	"github.com/countersign/countersign/internal/ratelimit"
	"github.com/countersign/countersign/notify"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// natsCluster runs a JetStream cluster of n in-process NATS servers, as a
// production deployment would, and returns the client URLs of its nodes.
func natsCluster(t *testing.T, n int) string {
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
	deadline := time.Now().Add(30 * time.Second)
	for !slices.ContainsFunc(servers, (*server.Server).JetStreamIsLeader) {
		if time.Now().After(deadline) {
			t.Fatal("the JetStream cluster elected no leader within 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return strings.Join(urls, ",")
}

// TestNATSReplicasReachEveryBucketAndStream: against a three-node cluster,
// with --nats-replicas 3 and every optional part on (Slack, interactivity),
// every bucket and stream the app creates has three replicas.
func TestNATSReplicasReachEveryBucketAndStream(t *testing.T) {
	url := natsCluster(t, 3)
	ctx := context.Background()
	a, err := New(ctx, Config{DataDir: t.TempDir(), Addr: freeAddr(t), NATSURL: url, SQLiteSync: "NORMAL",
		NATSReplicas: 3, SlackToken: "xoxb-test", SlackChannel: "#approvals", SlackSigningSecret: "secret",
		SlackAPIURL: "http://127.0.0.1:1/"}, ModeDev, nil, io.Discard)
	if err != nil {
		t.Fatalf("start against the cluster: %v", err)
	}
	defer a.Shutdown(ctx)

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	streams := js.ListStreams(ctx)
	for info := range streams.Info() {
		names = append(names, info.Config.Name)
		if info.Config.Replicas != 3 {
			t.Errorf("stream %s has %d replicas, want 3", info.Config.Name, info.Config.Replicas)
		}
	}
	if err := streams.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{audit.StreamName, notify.EventsStream}
	for _, b := range []string{tasks.Bucket, authn.Bucket, gateway.LedgerBucket,
		passkey.BucketApprovers, passkey.BucketInvites, passkey.BucketCredentials, passkey.BucketChallenges,
		notify.SlackMessagesBucket, notify.SlackUsersBucket, notify.SlackReplayBucket, ratelimit.Bucket} {
		want = append(want, "KV_"+b)
	}
	for _, w := range want {
		if !slices.Contains(names, w) {
			t.Errorf("no stream %s among %v", w, names)
		}
	}
}

// TestEmbeddedNATSTakesOneReplica: dev's embedded NATS is a single node, so
// more replicas are refused with a message that says what to do.
func TestEmbeddedNATSTakesOneReplica(t *testing.T) {
	_, err := New(context.Background(), Config{DataDir: t.TempDir(), Addr: freeAddr(t), NATSReplicas: 3}, ModeDev, nil, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--nats-replicas 3 needs a NATS cluster (--nats-url)") {
		t.Fatalf("got %v, want the embedded NATS to refuse 3 replicas", err)
	}
}
