// Package ratelimit limits how often a key (a principal, an approval) may do
// something: [Shared] counts in a NATS KV bucket, so every replica of a
// deployment shares one count; [Local] and [Budget] count in process memory.
package ratelimit

import (
	"context"
	"sync"
	"time"
)

// Limiter admits perMinute takes a minute per key, burst at most at once.
type Limiter interface {
	// Allow takes one from key's budget at now if it has one. An error
	// means nothing was taken; callers refuse.
	Allow(ctx context.Context, key string, now time.Time) (bool, error)
}

// Local is a token bucket per key: rate tokens a minute, at most burst
// saved up. It lives in one process; with N replicas a key may spend up to N
// times the rate. It never errs.
type Local struct {
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
func New(perMinute, burst int) *Local {
	return &Local{perSec: float64(perMinute) / 60, burst: float64(burst), buckets: map[string]*bucket{}}
}

// Allow takes a token for key if one is available at now.
func (l *Local) Allow(_ context.Context, key string, now time.Time) (bool, error) {
	return l.allow(key, now), nil
}

func (l *Local) allow(key string, now time.Time) bool {
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

func (l *Local) refillLocked(b *bucket, now time.Time) {
	if now.After(b.last) {
		b.tokens = min(l.burst, b.tokens+now.Sub(b.last).Seconds()*l.perSec)
		b.last = now
	}
}

// pruneLocked drops buckets that have refilled: forgetting them changes
// nothing.
func (l *Local) pruneLocked(now time.Time) {
	for k, b := range l.buckets {
		l.refillLocked(b, now)
		if b.tokens >= l.burst {
			delete(l.buckets, k)
		}
	}
}
