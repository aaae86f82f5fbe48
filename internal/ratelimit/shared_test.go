package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/internal/proccpu"
	"github.com/countersign/countersign/internal/testnats"
)

func openStore(t *testing.T, js jetstream.JetStream) *Store {
	t.Helper()
	s, err := Open(context.Background(), js, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// secondProcess connects to the same NATS as nc, as another replica would.
func secondProcess(t *testing.T, nc *nats.Conn) *Store {
	t.Helper()
	js2, _ := testnats.Connect(t, nc.ConnectedUrl())
	return openStore(t, js2)
}

func TestSharedAdmitsWhatLocalAdmits(t *testing.T) {
	js, _ := testnats.Start(t)
	// One a minute: a take's key lives a minute or two, so the steps do
	// not depend on how fast they run.
	l := openStore(t, js).shared("steps", 1, 2)
	checkSteps(t, time.Minute, func(key string, at time.Time) bool {
		ok, err := l.Allow(context.Background(), key, at)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	})
}

// Two processes sharing one NATS, 20 takes each, all at one instant: the
// burst is admitted once in all, not once per process. Repeated so that
// the rounds interleave differently.
func TestSharedCountsAcrossProcesses(t *testing.T) {
	js, nc := testnats.Start(t)
	stores := []*Store{openStore(t, js), secondProcess(t, nc)}
	const burst, perProcess = 5, 20
	for round := range 10 {
		now := time.Unix(2_000_000+int64(round)*3600, 0) // a fresh hour: full buckets
		if got := takeAtOnce(t, stores, "creations", burst, perProcess, now); got != burst {
			t.Fatalf("round %d: %d of %d takes admitted across two processes, want the burst, %d", round, got, 2*perProcess, burst)
		}
	}
}

// takeAtOnce makes perProcess takes of one key in each store at one
// instant (limiter name, one a minute, burst) and returns how many were
// admitted; an error fails the test.
func takeAtOnce(t *testing.T, stores []*Store, name string, burst, perProcess int, now time.Time) int {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, s := range stores {
		l := s.shared(name, 1, burst)
		for range perProcess {
			wg.Go(func() {
				<-start
				ok, err := l.Allow(context.Background(), "agent", now)
				if err != nil {
					t.Error(err)
				}
				if ok {
					admitted.Add(1)
				}
			})
		}
	}
	close(start)
	wg.Wait()
	return int(admitted.Load())
}

// Limiters of different names count apart, though their keys are equal.
func TestSharedNamesCountApart(t *testing.T) {
	js, _ := testnats.Start(t)
	s := openStore(t, js)
	now := time.Unix(3_000_000, 0)
	a, b := s.shared("a", 1, 1), s.shared("b", 1, 1)
	for _, l := range []*Shared{a, b} {
		if ok, err := l.Allow(context.Background(), "k", now); !ok || err != nil {
			t.Fatalf("%s: first take = %v, %v", l.name, ok, err)
		}
	}
	if ok, _ := a.Allow(context.Background(), "k", now); ok {
		t.Fatal("a second take within the burst of one was admitted")
	}
}

// A key that has refilled leaves the bucket: nothing grows with the number
// of keys ever limited.
func TestSharedKeysAgeOut(t *testing.T) {
	js, _ := testnats.Start(t)
	s := openStore(t, js)
	l := s.shared("ageout", 60, 1) // refilled one second after a take
	now := time.Now()
	if ok, err := l.Allow(context.Background(), "k", now); !ok || err != nil {
		t.Fatalf("take = %v, %v", ok, err)
	}
	if _, err := s.kv.Get(context.Background(), l.kvKey("k")); err != nil {
		t.Fatalf("the take was not stored: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := s.kv.Get(context.Background(), l.kvKey("k"))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the key is still stored 10 s after it refilled: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Aged out, it starts full again.
	if ok, err := l.Allow(context.Background(), "k", time.Now()); !ok || err != nil {
		t.Fatalf("take after aging out = %v, %v", ok, err)
	}
	// An update (the key stored) keeps a TTL too.
	slow := s.shared("ageout-update", 1, 2)
	t0 := time.Now()
	for _, at := range []time.Time{t0, t0.Add(time.Minute)} {
		if ok, err := slow.Allow(context.Background(), "k", at); !ok || err != nil {
			t.Fatalf("take at %v = %v, %v", at, ok, err)
		}
	}
	e, err := s.kv.Get(context.Background(), slow.kvKey("k"))
	if err != nil {
		t.Fatal(err)
	}
	if e.Revision() == 0 || e.Operation() != jetstream.KeyValuePut {
		t.Fatalf("entry %+v", e)
	}
	stream, err := s.js.Stream(context.Background(), "KV_"+Bucket)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.GetMsg(context.Background(), e.Revision())
	if err != nil {
		t.Fatal(err)
	}
	if ttl := msg.Header.Get("Nats-TTL"); ttl != "1m0s" && ttl != "60s" && ttl != "60" {
		t.Fatalf("an updated key's TTL is %q, want a minute (headers %v)", ttl, msg.Header)
	}
}

// A value that does not parse counts as not stored, and is overwritten.
func TestSharedOverwritesUnreadableValue(t *testing.T) {
	js, _ := testnats.Start(t)
	s := openStore(t, js)
	l := s.shared("garbled", 1, 1)
	if _, err := s.kv.Put(context.Background(), l.kvKey("k"), []byte("not a time")); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(4_000_000, 0)
	if ok, err := l.Allow(context.Background(), "k", now); !ok || err != nil {
		t.Fatalf("take over a garbled value = %v, %v", ok, err)
	}
	if ok, _ := l.Allow(context.Background(), "k", now); ok {
		t.Fatal("the take over a garbled value was not stored")
	}
}

// With NATS gone a take fails, and nothing is admitted.
func TestSharedRefusesWithoutNATS(t *testing.T) {
	js, nc := testnats.Start(t)
	l := openStore(t, js).shared("down", 60, 10)
	nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ok, err := l.Allow(ctx, "k", time.Now())
	if ok || err == nil {
		t.Fatalf("take with NATS closed = %v, %v; want refused with an error", ok, err)
	}
}

// BenchmarkSharedAllow: one take from a principal's rate, as a gated call
// makes it, in process with a file-backed NATS as `countersign dev` runs
// it; cpu-µs/op is the whole process's CPU (NATS included). "admit" writes
// (a read and a compare-and-set), "refuse" only reads.
func BenchmarkSharedAllow(b *testing.B) {
	js, _ := testnats.StartInProcess(b)
	s, err := Open(context.Background(), js, StoreOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name  string
		burst int
		admit bool
	}{{"admit", 1 << 30, true}, {"refuse", 1, false}} {
		b.Run(bc.name, func(b *testing.B) {
			l := s.shared("bench-"+bc.name, 1, bc.burst)
			now := time.Unix(5_000_000, 0)
			if !bc.admit {
				l.Allow(context.Background(), "agent", now) // spend the burst of one
			}
			start := proccpu.Used()
			b.ResetTimer()
			for b.Loop() {
				ok, err := l.Allow(context.Background(), "agent", now)
				if err != nil || ok != bc.admit {
					b.Fatalf("take = %v, %v", ok, err)
				}
			}
			b.ReportMetric(proccpu.PerOp(start, b.N), "cpu-µs/op")
		})
	}
}

// Extreme limits neither overflow nor refuse what they should admit.
func TestSharedExtremeLimits(t *testing.T) {
	js, _ := testnats.Start(t)
	s := openStore(t, js)
	now := time.Unix(6_000_000, 0)
	for _, c := range []struct{ perMinute, burst int }{{1, math.MaxInt}, {math.MaxInt, 3}, {1_000_000, 1_000_000}} {
		l := s.shared("extreme", c.perMinute, c.burst)
		for i := range 3 {
			if ok, err := l.Allow(context.Background(), fmt.Sprint(c), now); !ok || err != nil {
				t.Fatalf("%v: take %d = %v, %v", c, i, ok, err)
			}
		}
	}
	if got := keyTTL(time.Duration(math.MaxInt64)); got != maxKeyTTL {
		t.Fatalf("keyTTL(max) = %v", got)
	}
}

// On a three-node cluster with a replicated bucket, two processes
// connected to different nodes: takes within the budget are all admitted
// (a write not yet applied on the key makes a round lose, and the round is
// tried again), and takes beyond it are refused, exactly at the burst.
func TestSharedOnReplicatedBucket(t *testing.T) {
	urls := strings.Split(testnats.StartCluster(t, 3), ",")
	var stores []*Store
	for _, url := range urls[:2] {
		js, _ := testnats.Connect(t, url)
		s, err := Open(context.Background(), js, StoreOptions{Replicas: 3})
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	const perProcess = 10
	for round := range 20 {
		burst := 2 * perProcess // every take within the budget
		if round%2 == 1 {
			burst = 5
		}
		now := time.Unix(7_000_000+int64(round)*3600, 0)
		if got := takeAtOnce(t, stores, fmt.Sprint("replicated-", burst), burst, perProcess, now); got != burst {
			t.Fatalf("round %d: %d of %d takes admitted, want %d", round, got, 2*perProcess, burst)
		}
	}
}
