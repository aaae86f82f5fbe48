package ratelimit

import (
	"testing"
	"time"
)

// limiterSteps is what a limiter of one take per unit u, burst 2, admits;
// Local and Shared must agree on it. Times are in units.
var limiterSteps = []struct {
	at   float64
	key  string
	want bool
}{
	{0, "a", true},
	{0, "a", true},
	{0, "a", false}, // burst spent
	{0, "b", true},  // per key
	{0.5, "a", false},
	{1, "a", true},
	{1, "a", false},
	{3600, "a", true}, // refills to the burst, not beyond
	{3600, "a", true},
	{3600, "a", false},
	{3540, "a", false}, // clock going back refills nothing
}

func checkSteps(t *testing.T, u time.Duration, allow func(key string, at time.Time) bool) {
	t.Helper()
	t0 := time.Unix(1_000_000, 0)
	for i, s := range limiterSteps {
		if got := allow(s.key, t0.Add(time.Duration(s.at*float64(u)))); got != s.want {
			t.Fatalf("step %d (%v units, %s): allow = %v, want %v", i, s.at, s.key, got, s.want)
		}
	}
}

func TestLimiter(t *testing.T) {
	checkSteps(t, time.Second, New(60, 2).allow) // one token a second, two saved up
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
