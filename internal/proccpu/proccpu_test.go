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
	sum := sha256.Sum256(nil)
	for deadline := time.Now().Add(100 * time.Millisecond); time.Now().Before(deadline); {
		for range 1000 {
			sum = sha256.Sum256(sum[:])
		}
	}
	if spent := Used() - start; spent < 50*time.Millisecond {
		t.Errorf("100 ms of hashing counted as %v", spent)
	}
	if got := PerOp(start, 0); got != 0 {
		t.Errorf("PerOp over 0 ops = %v", got)
	}
	if got := PerOp(Used()-10*time.Millisecond, 10); got < 1000 {
		t.Errorf("PerOp(10 ms ago, 10) = %v µs, want at least 1000", got)
	}
}
