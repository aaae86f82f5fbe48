package tasks

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// The turn behind tasks.Orchestrator's updates (internal/e2e
// TestOrchestratorOneUpdateAtATime runs it against a real Temporal server).
func TestKeyedLock(t *testing.T) {
	var k keyedLock
	ctx := context.Background()

	// One holder per key; waiters in arrival order; keys independent.
	unlockA, err := k.lock(ctx, "a", 0)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Go(func() {
			unlock, err := k.lock(ctx, "a", 0)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			unlock()
		})
		waitRefs(t, &k, "a", i+2) // each one in line before the next comes
	}
	unlockB, err := k.lock(ctx, "b", 0)
	if err != nil {
		t.Fatalf("another key waited: %v", err)
	}
	unlockB()

	// A deadline in line: given up, and the line is as it was.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	_, err = k.lock(short, "a", 0)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a deadline in line: %v", err)
	}
	waitRefs(t, &k, "a", 6)

	// Callers with a limit: at most limit of them hold or await the key.
	const limit = 3
	var limitedDone sync.WaitGroup
	for range limit {
		limitedDone.Go(func() {
			unlock, err := k.lock(ctx, "a", limit)
			if err != nil {
				t.Error(err)
				return
			}
			unlock()
		})
	}
	waitRefs(t, &k, "a", 6+limit)
	if _, err := k.lock(ctx, "a", limit); !errors.Is(err, errLineFull) {
		t.Fatalf("past the limit: %v, want errLineFull", err)
	}

	unlockA()
	wg.Wait()
	limitedDone.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("served in order %v, want arrival order", order)
		}
	}
	// Once everyone is done the key leaves no trace.
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.held) != 0 {
		t.Fatalf("%d keys left behind", len(k.held))
	}
}

// waitRefs waits until n callers hold or await key.
func waitRefs(t *testing.T, k *keyedLock, key string, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		k.mu.Lock()
		refs := 0
		if e := k.held[key]; e != nil {
			refs = e.refs
		}
		k.mu.Unlock()
		if refs == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d callers on %q, want %d", refs, key, n)
		}
	}
}
