package ratelimit

import (
	"math"
	"sync"
	"time"
)

// Budget is a per-key request budget: a token bucket (perSecond tokens a
// second, at most burst saved up) and a cap on the key's concurrent
// requests. Like [Local] it lives in one process.
//
// Memory is bounded: once maxBuckets keys are tracked, keys with nothing in
// flight and a full bucket are forgotten (which changes nothing), and if
// that is not enough, every key with nothing in flight is (each may then
// spend one extra burst). Keys with requests in flight number at most the
// requests in flight.
type Budget struct {
	mu          sync.Mutex
	perSec      float64
	burst       float64
	maxInFlight int
	keys        map[string]*budgetKey
}

type budgetKey struct {
	tokens   float64
	last     time.Time
	inFlight int
}

// NewBudget returns a budget of perSecond requests a second per key, burst
// at most at once, and maxInFlight concurrent requests per key. All three
// must be positive.
func NewBudget(perSecond float64, burst, maxInFlight int) *Budget {
	return &Budget{
		perSec:      perSecond,
		burst:       float64(burst),
		maxInFlight: maxInFlight,
		keys:        map[string]*budgetKey{},
	}
}

// Acquire admits one request of key at now: it takes a token and an
// in-flight slot, and release gives the slot back when the request ends
// (call it exactly once). Refused, it returns ok false and how long the
// caller should wait before retrying (at least a second; a refusal for
// concurrency does not spend a token).
func (b *Budget) Acquire(key string, now time.Time) (release func(), retryAfter time.Duration, ok bool) {
	return b.admit(key, now, true)
}

// Spend takes a token for key without an in-flight slot, for requests that
// wait by design (a long poll) and would otherwise sit on the concurrency
// cap.
func (b *Budget) Spend(key string, now time.Time) (retryAfter time.Duration, ok bool) {
	_, retryAfter, ok = b.admit(key, now, false)
	return retryAfter, ok
}

// Exhausted reports whether key's next request would be refused for want
// of a token or an in-flight slot, without charging anything: a cheap
// pre-check before [Budget.Refuses] or [Budget.Acquire].
func (b *Budget) Exhausted(key string, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.keys[key]
	if !ok {
		return false
	}
	b.refillLocked(k, now)
	return k.tokens < 1 || k.inFlight >= b.maxInFlight
}

// Refuses reports whether a request of key would be refused now, and the
// Retry-After if so, without charging anything. slot says whether the
// request would need an in-flight slot (as [Budget.Acquire]) or not (as
// [Budget.Spend]).
func (b *Budget) Refuses(key string, slot bool, now time.Time) (retryAfter time.Duration, refused bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.keys[key]
	if !ok {
		return 0, false
	}
	b.refillLocked(k, now)
	return b.refusalLocked(k, slot)
}

// refusalLocked is the refusal rule: concurrency first (it costs no token),
// then the bucket.
func (b *Budget) refusalLocked(k *budgetKey, slot bool) (time.Duration, bool) {
	if slot && k.inFlight >= b.maxInFlight {
		return time.Second, true
	}
	if k.tokens < 1 {
		wait := time.Duration(math.Ceil((1-k.tokens)/b.perSec)) * time.Second
		return max(wait, time.Second), true
	}
	return 0, false
}

func (b *Budget) admit(key string, now time.Time, slot bool) (func(), time.Duration, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k, found := b.keys[key]
	if !found {
		if len(b.keys) >= maxBuckets {
			b.pruneLocked(now)
		}
		k = &budgetKey{tokens: b.burst, last: now}
		b.keys[key] = k
	}
	b.refillLocked(k, now)
	if retry, refused := b.refusalLocked(k, slot); refused {
		return nil, retry, false
	}
	k.tokens--
	if !slot {
		return nil, 0, true
	}
	k.inFlight++
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			k.inFlight--
			b.mu.Unlock()
		})
	}, 0, true
}

func (b *Budget) refillLocked(k *budgetKey, now time.Time) {
	if now.After(k.last) {
		k.tokens = min(b.burst, k.tokens+now.Sub(k.last).Seconds()*b.perSec)
		k.last = now
	}
}

// pruneLocked forgets idle keys with a full bucket; if the map is still at
// its bound, it forgets every idle key.
func (b *Budget) pruneLocked(now time.Time) {
	for name, k := range b.keys {
		b.refillLocked(k, now)
		if k.inFlight == 0 && k.tokens >= b.burst {
			delete(b.keys, name)
		}
	}
	if len(b.keys) < maxBuckets {
		return
	}
	for name, k := range b.keys {
		if k.inFlight == 0 {
			delete(b.keys, name)
		}
	}
}

// Keys is the number of keys the budget tracks.
func (b *Budget) Keys() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.keys)
}
