package app

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/internal/authn"
	"github.com/countersign/countersign/internal/ratelimit"
	"github.com/countersign/countersign/internal/testnats"
	"github.com/countersign/countersign/notify"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// TestNATSReplicasReachEveryBucketAndStream: against a three-node cluster,
// with --nats-replicas 3 and every optional part on (Slack, interactivity),
// every bucket and stream the app creates has three replicas.
func TestNATSReplicasReachEveryBucketAndStream(t *testing.T) {
	url := testnats.StartCluster(t, 3)
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
