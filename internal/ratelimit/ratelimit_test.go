package ratelimit

import (
	"testing"
	"time"
)

// limiterSteps is what a limiter of 60 a minute, burst 2, admits; Local
// and Shared must agree on it.
var limiterSteps = []struct {
	at   time.Duration
	key  string
	want bool
}{
	{0, "a", true},
	{0, "a", true},
	{0, "a", false}, // burst spent
	{0, "b", true},  // per key
	{500 * time.Millisecond, "a", false},
	{time.Second, "a", true},
	{time.Second, "a", false},
	{time.Hour, "a", true}, // refills to the burst, not beyond
	{time.Hour, "a", true},
	{time.Hour, "a", false},
	{time.Hour - time.Minute, "a", false}, // clock going back refills nothing
}

func checkSteps(t *testing.T, allow func(key string, at time.Time) bool) {
	t.Helper()
	t0 := time.Unix(1_000_000, 0)
	for i, s := range limiterSteps {
		if got := allow(s.key, t0.Add(s.at)); got != s.want {
			t.Fatalf("step %d (%v, %s): allow = %v, want %v", i, s.at, s.key, got, s.want)
		}
	}
}

func TestLimiter(t *testing.T) {
	checkSteps(t, New(60, 2).allow) // one token a second, two saved up
}

func TestLimiterPrunesFullBuckets(t *testing.T) {
	l := New(60, 1)
	t0 := time.Unix(1_000_000, 0)
	for i := range maxBuckets {
		l.allow(string(rune(i)), t0)
	}
	if !l.allow("late", t0.Add(time.Minute)) {
		t.Fatal("a new key was refused")
	}
	if len(l.buckets) > 2 {
		t.Errorf("%d buckets kept after pruning", len(l.buckets))
	}
}
