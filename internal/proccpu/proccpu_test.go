package proccpu

import (
	"crypto/sha256"
	"testing"
	"time"
)

func TestUsedCountsThisProcessesWork(t *testing.T) {
	start := Used()
	if start <= 0 {
		t.Fatalf("Used = %v", start)
	}
	// Asleep, the process uses next to no CPU: a Used that counted wall
	// time would count the 100 ms.
	before := Used()
	time.Sleep(100 * time.Millisecond)
	if idle := Used() - before; idle >= 50*time.Millisecond {
		t.Errorf("100 ms asleep counted as %v", idle)
	}
	// Working, it gets to 50 ms of CPU, however loaded the machine (a
	// deadline in wall time would fail when other processes take the
	// cores): a Used that did not count this process's work never would.
	sum := sha256.Sum256(nil)
	start = Used()
	for deadline := time.Now().Add(30 * time.Second); Used()-start < 50*time.Millisecond; {
		if time.Now().After(deadline) {
			t.Fatalf("30 s of hashing counted as %v", Used()-start)
		}
		for range 1000 {
			sum = sha256.Sum256(sum[:])
		}
	}
	if got := PerOp(start, 0); got != 0 {
		t.Errorf("PerOp over 0 ops = %v", got)
	}
	if got := PerOp(Used()-10*time.Millisecond, 10); got < 1000 {
		t.Errorf("PerOp(10 ms ago, 10) = %v µs, want at least 1000", got)
	}
}
