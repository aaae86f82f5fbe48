package natsrv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/internal/proccpu"
)

func TestKeyValueSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	put := func(s *Server) {
		nc, err := nats.Connect(s.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b", Storage: jetstream.FileStorage})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Start(Options{StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	put(s)
	s.Shutdown()

	s, err = Start(Options{StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	nc, err := nats.Connect(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "k")
	if err != nil || string(e.Value()) != "v" {
		t.Fatalf("value lost across restart: %v", err)
	}
}

// clientsOptions is the shape `countersign dev` uses: one service, one
// stream copied for clients.
func clientsOptions(dir string) Options {
	return Options{StoreDir: dir, Clients: &Clients{
		User:     "client",
		Services: []string{"svc.>"},
		Streams:  []jetstream.StreamConfig{{Name: "EV", Subjects: []string{"ev.>"}, Storage: jetstream.FileStorage, Duplicates: time.Hour}},
	}}
}

// TestClientsCannotReachTheOwnAccount: with Clients set, nothing connects
// without credentials, the own user's password works only in process, and
// the client user can use the services and read the stream copy but cannot
// write into the own account: not by publishing, not as the reply subject of
// a request, not as the deliver subject of a consumer.
func TestClientsCannotReachTheOwnAccount(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Start(clientsOptions(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if s.URL() != "" {
		t.Fatalf("URL with Clients set = %q, want empty", s.URL())
	}

	own, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	ojs, _ := jetstream.New(own)
	kv, err := ojs.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "tokens"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ojs.CreateStream(ctx, jetstream.StreamConfig{Name: "EV", Subjects: []string{"ev.>"}, Duplicates: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := own.Subscribe("svc.echo", func(m *nats.Msg) { _ = m.Respond(append([]byte("echo:"), m.Data...)) }); err != nil {
		t.Fatal(err)
	}
	_ = own.Flush()

	// No credentials, wrong credentials, the own user over TCP: refused.
	for name, opts := range map[string][]nats.Option{
		"anonymous":       nil,
		"wrong password":  {nats.UserInfo("client", "guess")},
		"own user on TCP": {nats.UserInfo(OwnUser, s.ownPass)},
		"admin on TCP":    {nats.UserInfo(clientsAdmin, s.admPass)},
	} {
		if nc, err := nats.Connect(s.Addr(), append(opts, nats.NoReconnect())...); err == nil {
			nc.Close()
			t.Errorf("%s: connected over TCP", name)
		} else if !errors.Is(err, nats.ErrAuthorization) {
			t.Errorf("%s: %v, want an authorization violation", name, err)
		}
	}

	// The client's permission errors are expected: keep them off stderr.
	cli, err := nats.Connect(s.ClientURL(), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	m, err := cli.Request("svc.echo", []byte("hi"), 5*time.Second)
	if err != nil || string(m.Data) != "echo:hi" {
		t.Fatalf("service over the import: %v", err)
	}

	// Events published in the own account reach the clients' copy.
	if _, err := ojs.Publish(ctx, "ev.one", []byte("1"), jetstream.WithMsgID("one")); err != nil {
		t.Fatal(err)
	}
	cjs, _ := jetstream.New(cli)
	cons, err := cjs.OrderedConsumer(ctx, "EV", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil || msg.Subject() != "ev.one" || string(msg.Data()) != "1" {
		t.Fatalf("client read of the stream copy: %v", err)
	}

	// Attempts to write into the own account's token bucket.
	_ = cli.Publish("$KV.tokens.published", []byte("x"))
	_ = cli.PublishRequest("svc.echo", "$KV.tokens.replied", []byte("x"))
	_ = cli.Publish("ev.forged", []byte("x"))
	if _, err := cjs.CreateOrUpdateConsumer(ctx, "EV", jetstream.ConsumerConfig{Name: "push", DeliverSubject: "$KV.tokens.pushed"}); err != nil {
		t.Logf("push consumer: %v", err)
	}
	pull, err := cjs.CreateOrUpdateConsumer(ctx, "EV", jetstream.ConsumerConfig{Name: "pull"})
	if err != nil {
		t.Fatal(err)
	}
	_ = cli.PublishRequest("$JS.API.CONSUMER.MSG.NEXT.EV."+pull.CachedInfo().Name, "$KV.tokens.pulled", []byte(`{"batch":1}`))
	_ = cli.Flush()
	time.Sleep(200 * time.Millisecond)
	if keys, err := kv.ListKeys(ctx); err == nil {
		for k := range keys.Keys() {
			t.Errorf("a client wrote %q into the own account's bucket", k)
		}
	}
	if _, err := cjs.KeyValue(ctx, "tokens"); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Errorf("client opened the own account's bucket: %v", err)
	}
	// Denied requests get no answer: give them a short deadline.
	short, cancelShort := context.WithTimeout(ctx, time.Second)
	defer cancelShort()
	if _, err := cjs.CreateStream(short, jetstream.StreamConfig{Name: "MINE", Subjects: []string{"mine.>"}}); err == nil {
		t.Errorf("client created a stream")
	}
	if err := cjs.DeleteStream(short, "EV"); err == nil {
		t.Errorf("client deleted the stream copy")
	}
	if _, err := cli.Subscribe("svc.>", func(*nats.Msg) {}); err == nil {
		_ = cli.Flush()
		if !strings.Contains(fmt.Sprint(cli.LastError()), "Permissions Violation") {
			t.Errorf("client subscribed to the service subjects: %v", cli.LastError())
		}
	}
	// The forged event is not in the copy: only ev.one is.
	info, err := cjs.Stream(ctx, "EV")
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("clients' copy holds %d messages, want 1", n)
	}
}

// TestOwnDataKeptAcrossModes: the own account is the global account, so data
// written by a server without Clients (older data dirs) is there with
// Clients, and the other way round.
func TestOwnDataKeptAcrossModes(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := Start(Options{StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b", Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	s.Shutdown()

	for range 2 { // and again, as a restart in the same mode
		s, err = Start(clientsOptions(dir))
		if err != nil {
			t.Fatal(err)
		}
		nc, err = s.Connect()
		if err != nil {
			t.Fatal(err)
		}
		js, _ = jetstream.New(nc)
		kv, err = js.KeyValue(ctx, "b")
		if err != nil {
			t.Fatal(err)
		}
		if e, err := kv.Get(ctx, "k"); err != nil || string(e.Value()) != "v" {
			t.Fatalf("value lost across the switch to Clients: %v", err)
		}
		nc.Close()
		s.Shutdown()
	}
}

// BenchmarkDurableWrite is the cost of one durable write of the kind
// Countersign's state is made of, on the embedded server with a file store
// and the in-process connection `countersign dev` uses: a KV create
// (a challenge, a task record, a consumed jti), a KV compare-and-set (a
// challenge's consume, a record's update) and a stream publish guarded by
// the subject's last sequence (an audit record). cpu-µs/op is the whole
// process's CPU (client and server) per write: the floor under any
// request that must leave durable state behind (docs/benchmarks.md,
// "Server CPU per SEP-2672 ceremony").
func BenchmarkDurableWrite(b *testing.B) {
	s, err := Start(Options{StoreDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Shutdown()
	nc, err := s.Connect()
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "bench", Storage: jetstream.FileStorage})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.>"}, Storage: jetstream.FileStorage}); err != nil {
		b.Fatal(err)
	}
	value := []byte(strings.Repeat("x", 600)) // about a challenge record's size
	round := 0                                // -count runs a sub-benchmark again: fresh keys and subjects
	run := func(b *testing.B, write func(i int) error) {
		round++
		start := proccpu.Used()
		i := 0
		for b.Loop() {
			if err := write(i); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.ReportMetric(proccpu.PerOp(start, i), "cpu-µs/op")
	}
	b.Run("kv-create", func(b *testing.B) {
		run(b, func(i int) error { _, err := kv.Create(ctx, fmt.Sprintf("c.%d.%d", round, i), value); return err })
	})
	b.Run("kv-update", func(b *testing.B) {
		rev, err := kv.Put(ctx, "u", value)
		if err != nil {
			b.Fatal(err)
		}
		run(b, func(int) error { rev, err = kv.Update(ctx, "u", value, rev); return err })
	})
	var last uint64
	b.Run("stream-publish-expected-seq", func(b *testing.B) {
		run(b, func(i int) error {
			subject := fmt.Sprintf("bench.chain.%d", round)
			if i == 0 {
				last = 0
			}
			ack, err := js.Publish(ctx, subject, value, jetstream.WithExpectLastSequencePerSubject(last), jetstream.WithMsgID(fmt.Sprint("m", round, ".", i)))
			if err == nil {
				last = ack.Sequence
			}
			return err
		})
	})
}
