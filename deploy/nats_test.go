package deploy

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/notify"
	"github.com/countersign/countersign/passkey"
)

const (
	testNATSPassword       = "countersign-pw-0123456789"
	testNATSClientPassword = "client-pw-9876543210"
)

// startComposeNATS starts deploy/nats/nats.conf as the compose file's NATS
// runs it (its passwords from the environment), on a free port and a
// temporary store.
func startComposeNATS(t *testing.T) *server.Server {
	t.Helper()
	t.Setenv("COUNTERSIGN_NATS_PASSWORD", testNATSPassword)
	t.Setenv("COUNTERSIGN_NATS_CLIENT_PASSWORD", testNATSClientPassword)
	opts, err := server.ProcessConfigFile("nats/nats.conf")
	if err != nil {
		t.Fatalf("deploy/nats/nats.conf: %v", err)
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.StoreDir = t.TempDir()
	opts.NoSigs, opts.NoLog = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS did not start")
	}
	t.Cleanup(s.Shutdown)
	return s
}

// TestNATSConfigRequiresPasswords: without its passwords in the
// environment the server does not start, rather than run without them
// (compose also refuses an empty one: docker-compose.yml's ${…:?}).
func TestNATSConfigRequiresPasswords(t *testing.T) {
	for _, v := range []string{"COUNTERSIGN_NATS_PASSWORD", "COUNTERSIGN_NATS_CLIENT_PASSWORD"} {
		t.Run(v, func(t *testing.T) {
			t.Setenv("COUNTERSIGN_NATS_PASSWORD", testNATSPassword)
			t.Setenv("COUNTERSIGN_NATS_CLIENT_PASSWORD", testNATSClientPassword)
			os.Unsetenv(v) // t.Setenv restores it
			if _, err := server.ProcessConfigFile("nats/nats.conf"); err == nil || !strings.Contains(err.Error(), v) {
				t.Fatalf("without %s: %v", v, err)
			}
		})
	}
}

// TestNATSConfigSeparatesCountersign: with deploy/nats/nats.conf,
// Countersign's user has JetStream in an account of its own (its buckets
// and streams work: passkeys, the events stream); the client user gets the
// approval events and the decision service and nothing else: it cannot
// read or write a bucket or stream of Countersign's, publish an event, or
// make a stream; no one gets in without a password.
func TestNATSConfigSeparatesCountersign(t *testing.T) {
	s := startComposeNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := s.ClientURL()

	for name, opts := range map[string][]nats.Option{
		"anonymous":                 nil,
		"countersign, bad password": {nats.UserInfo("countersign", "guess")},
		"client, bad password":      {nats.UserInfo("countersign-client", "guess")},
	} {
		if nc, err := nats.Connect(url, append(opts, nats.NoReconnect())...); err == nil {
			nc.Close()
			t.Errorf("%s: connected", name)
		} else if !errors.Is(err, nats.ErrAuthorization) {
			t.Errorf("%s: %v, want an authorization violation", name, err)
		}
	}

	own, err := nats.Connect(url, nats.UserInfo("countersign", testNATSPassword))
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	// A finished task's record (its tool's result up to 1 MiB, and more)
	// must fit in one message.
	if got := own.MaxPayload(); got < 8<<20 {
		t.Errorf("max_payload %d, want 8 MiB", got)
	}
	ojs, err := jetstream.New(own)
	if err != nil {
		t.Fatal(err)
	}
	// Countersign's state, as it makes it: the passkey buckets (the
	// challenges bucket with per-key TTLs) and the events stream.
	if _, err := passkey.New(ctx, ojs, passkey.Options{RPID: "localhost", RPOrigins: []string{"http://localhost:8080"}}); err != nil {
		t.Fatalf("passkey buckets: %v", err)
	}
	if _, err := notify.NewEvents(ctx, ojs, notify.EventsOptions{}); err != nil {
		t.Fatalf("events stream: %v", err)
	}
	creds, err := ojs.KeyValue(ctx, passkey.BucketCredentials)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := own.Subscribe(notify.SubjectDecision, func(m *nats.Msg) { _ = m.Respond([]byte(`{"ok":true}`)) }); err != nil {
		t.Fatal(err)
	}
	_ = own.Flush()

	cli, err := nats.Connect(url, nats.UserInfo("countersign-client", testNATSClientPassword),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // its violations are expected
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	// What it may do: the decision service and the events.
	if m, err := cli.Request(notify.SubjectDecision, []byte(`{}`), 5*time.Second); err != nil || string(m.Data) != `{"ok":true}` {
		t.Fatalf("the decision service: %v", err)
	}
	got := make(chan *nats.Msg, 4)
	if _, err := cli.ChanSubscribe(notify.SubjectRequested+".>", got); err != nil {
		t.Fatal(err)
	}
	_ = cli.Flush()
	if _, err := ojs.Publish(ctx, notify.SubjectRequested+".transfer_funds", []byte(`{"type":"requested"}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if m.Subject != notify.SubjectRequested+".transfer_funds" {
			t.Fatalf("event on %s", m.Subject)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the client got no event")
	}

	// What it may not: write a passkey credential, forge an event, reach
	// Countersign's JetStream at all.
	_ = cli.Publish("$KV."+passkey.BucketCredentials+".forged", []byte(`{}`))
	_ = cli.PublishRequest(notify.SubjectDecision, "$KV."+passkey.BucketCredentials+".replied", []byte(`{}`))
	_ = cli.Publish(notify.SubjectRequested+".forged", []byte(`{"type":"requested"}`))
	_ = cli.Flush()
	time.Sleep(200 * time.Millisecond)
	if keys, err := creds.ListKeys(ctx); err == nil {
		for k := range keys.Keys() {
			t.Errorf("the client wrote %q into Countersign's credentials bucket", k)
		}
	}
	for len(got) > 0 {
		if m := <-got; strings.HasSuffix(m.Subject, ".forged") {
			t.Errorf("a client's forged event reached the clients")
		}
	}
	st, err := ojs.Stream(ctx, notify.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("the events stream holds %d messages, want 1 (Countersign's)", n)
	}
	cjs, err := jetstream.New(cli)
	if err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	if _, err := cjs.KeyValue(short, passkey.BucketCredentials); err == nil {
		t.Error("the client opened Countersign's credentials bucket")
	}
	if _, err := cjs.Stream(short, notify.EventsStream); err == nil {
		t.Error("the client reached Countersign's events stream through JetStream")
	}
	if _, err := cjs.CreateStream(short, jetstream.StreamConfig{Name: "MINE", Subjects: []string{"mine.>"}}); err == nil {
		t.Error("the client made a stream")
	}
}
