// Package ratelimit is a per-key token bucket, kept in process memory.
package ratelimit

import (
	"sync"
	"time"
)

// Limiter is a token bucket per key: rate tokens a minute, at most burst
// saved up. It lives in one process; with N replicas a key may spend up to N
// times the rate.
type Limiter struct {
	mu      sync.Mutex
	perSec  float64
	burst   float64
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

// maxBuckets triggers pruning of idle buckets, bounding memory.
const maxBuckets = 10_000

// New returns a limiter of perMinute tokens a minute per key, burst at most.
func New(perMinute, burst int) *Limiter {
	return &Limiter{perSec: float64(perMinute) / 60, burst: float64(burst), buckets: map[string]*bucket{}}
}

// Allow takes a token for key if one is available at now.
func (l *Limiter) Allow(key string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[key]
	if !ok {
		if len(l.buckets) >= maxBuckets {
			l.pruneLocked(now)
		}
		b = &bucket{tokens: l.burst, last: now}
		l.buckets[key] = b
	}
	l.refillLocked(b, now)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

func (l *Limiter) refillLocked(b *bucket, now time.Time) {
	if now.After(b.last) {
		b.tokens = min(l.burst, b.tokens+now.Sub(b.last).Seconds()*l.perSec)
		b.last = now
	}
}

// pruneLocked drops buckets that have refilled: forgetting them changes
// nothing.
func (l *Limiter) pruneLocked(now time.Time) {
	for k, b := range l.buckets {
		l.refillLocked(b, now)
		if b.tokens >= l.burst {
			delete(l.buckets, k)
		}
	}
}
