package ratelimit

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestBudgetRate(t *testing.T) {
	b := NewBudget(2, 2, 100) // two tokens a second, two saved up
	t0 := time.Unix(1_000_000, 0)
	steps := []struct {
		name      string
		at        time.Duration
		key       string
		want      bool
		wantRetry time.Duration
	}{
		{name: "first", key: "a", want: true},
		{name: "burst", key: "a", want: true},
		{name: "burst spent", key: "a", want: false, wantRetry: time.Second},
		{name: "per key", key: "b", want: true},
		{name: "half a second refills one", at: 500 * time.Millisecond, key: "a", want: true},
		{name: "and only one", at: 500 * time.Millisecond, key: "a", want: false, wantRetry: time.Second},
		{name: "refills to the burst only", at: time.Hour, key: "a", want: true},
		{name: "second of the burst", at: time.Hour, key: "a", want: true},
		{name: "then refused", at: time.Hour, key: "a", want: false, wantRetry: time.Second},
	}
	for _, s := range steps {
		release, retry, ok := b.Acquire(s.key, t0.Add(s.at))
		if ok != s.want || retry != s.wantRetry {
			t.Fatalf("%s: ok = %v, retry %v; want %v, %v", s.name, ok, retry, s.want, s.wantRetry)
		}
		if ok {
			release()
		}
	}
}

func TestBudgetRetryAfterSlowRate(t *testing.T) {
	b := NewBudget(0.1, 1, 1) // one every ten seconds
	t0 := time.Unix(1_000_000, 0)
	if _, ok := b.Spend("a", t0); !ok {
		t.Fatal("the first request was refused")
	}
	if retry, ok := b.Spend("a", t0.Add(time.Second)); ok || retry != 9*time.Second {
		t.Fatalf("Spend = %v, %v; want refused, retry 9s", ok, retry)
	}
}

func TestBudgetInFlight(t *testing.T) {
	b := NewBudget(1000, 1000, 2)
	now := time.Unix(1_000_000, 0)
	r1, _, ok1 := b.Acquire("a", now)
	r2, _, ok2 := b.Acquire("a", now)
	_, retry, ok3 := b.Acquire("a", now)
	if !ok1 || !ok2 || ok3 || retry != time.Second {
		t.Fatalf("acquires = %v %v %v (retry %v); want true true false (1s)", ok1, ok2, ok3, retry)
	}
	if _, ok := b.Spend("a", now); !ok {
		t.Error("Spend was refused for concurrency; it takes no slot")
	}
	if _, _, ok := b.Acquire("b", now); !ok {
		t.Error("another key was refused")
	}
	r1()
	r1() // idempotent
	if _, _, ok := b.Acquire("a", now); !ok {
		t.Error("a released slot was not reusable")
	}
	_, _, ok := b.Acquire("a", now)
	if ok {
		t.Error("a double release freed two slots")
	}
	r2()
}

func TestBudgetBoundedKeys(t *testing.T) {
	b := NewBudget(1, 1, 1)
	t0 := time.Unix(1_000_000, 0)
	held, _, _ := b.Acquire("busy", t0)
	for i := range 3 * maxBuckets {
		// Every key spends its token, so none refills before the bound is
		// hit: the second pruning pass must forget them.
		if _, ok := b.Spend(fmt.Sprint("k", i), t0); !ok {
			t.Fatalf("key %d refused", i)
		}
	}
	if n := b.Keys(); n > maxBuckets {
		t.Errorf("%d keys tracked, bound %d", n, maxBuckets)
	}
	if _, _, ok := b.Acquire("busy", t0); ok {
		t.Error("a key with a request in flight was forgotten")
	}
	held()
}

func TestBudgetConcurrent(t *testing.T) {
	b := NewBudget(1e9, 1e9, 3)
	var mu sync.Mutex
	inFlight, peak := 0, 0
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			for range 200 {
				release, _, ok := b.Acquire("a", time.Now())
				if !ok {
					continue
				}
				mu.Lock()
				inFlight++
				peak = max(peak, inFlight)
				mu.Unlock()
				mu.Lock()
				inFlight--
				mu.Unlock()
				release()
			}
		})
	}
	wg.Wait()
	if peak > 3 {
		t.Errorf("peak in flight %d, cap 3", peak)
	}
}
