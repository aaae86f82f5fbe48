package ratelimit

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"regexp"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Bucket is the NATS KV bucket that holds the deployment-wide limits.
const Bucket = "countersign_rates"

// markerTTL is how long NATS keeps the marker it writes when a key ages
// out (KeyValueConfig.LimitMarkerTTL, which turns on per-key TTLs).
const markerTTL = time.Minute

// Takes of one key in one process queue on a lock, so only other processes'
// takes make a compare-and-set round lose; so does, on a replicated bucket,
// a write to the key that is not yet applied (NATS answers it at once with
// a wrong-last-sequence error). A lost round is tried again after a
// jittered backoff, from minBackoff doubling to maxBackoff, for at most
// contendedAfter.
const (
	minBackoff     = time.Millisecond
	maxBackoff     = 64 * time.Millisecond
	contendedAfter = 2 * time.Second
)

// ErrContended is returned when a key's compare-and-set kept losing for
// contendedAfter. Callers refuse, as for any error.
var ErrContended = errors.New("ratelimit: the key is written by other processes too often to take from it")

// Store opens limiters whose counts every process sharing one NATS
// deployment sees: N replicas admit what one would.
type Store struct {
	js jetstream.JetStream
	kv jetstream.KeyValue
	// locks serialize a process's takes of one key (by stripe); each is
	// a channel of one, so that waiting for it honours the context.
	locks [64]chan struct{}
}

// StoreOptions configures Open.
type StoreOptions struct {
	// Replicas is the bucket's replica count (0 means 1).
	Replicas int
}

// Open creates or opens the limits bucket. Its keys age out by per-key
// TTL, which needs NATS server 2.11 or later.
func Open(ctx context.Context, js jetstream.JetStream, opts StoreOptions) (*Store, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         Bucket,
		Description:    "Countersign rate limits (one theoretical arrival time per limited key)",
		History:        1,
		MaxValueSize:   256, // a value is ~19 bytes; NATS counts the headers too
		Storage:        jetstream.FileStorage,
		Replicas:       max(opts.Replicas, 1),
		LimitMarkerTTL: markerTTL,
	})
	if errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) {
		return nil, fmt.Errorf("ratelimit: bucket %s: limits age out by per-key TTL, which needs NATS server 2.11 or later; this one is %s: %w",
			Bucket, js.Conn().ConnectedServerVersion(), err)
	}
	if err != nil {
		return nil, fmt.Errorf("ratelimit: bucket %s: %w", Bucket, err)
	}
	s := &Store{js: js, kv: kv}
	for i := range s.locks {
		s.locks[i] = make(chan struct{}, 1)
	}
	return s, nil
}

var limiterName = regexp.MustCompile(`^[a-z0-9-]{1,32}$`)

// Limiter returns the limiter called name: perMinute takes a minute per
// key, burst at most at once, as [Local]. Every process must give one name
// the same rate; name is lowercase letters, digits and hyphens. A nil Store
// gives a [Local] limiter, which counts in this process alone.
func (s *Store) Limiter(name string, perMinute, burst int) Limiter {
	if s == nil {
		return New(perMinute, burst)
	}
	return s.shared(name, perMinute, burst)
}

func (s *Store) shared(name string, perMinute, burst int) *Shared {
	if !limiterName.MatchString(name) || perMinute <= 0 || burst <= 0 {
		panic(fmt.Sprintf("ratelimit: limiter %q of %d a minute, burst %d", name, perMinute, burst))
	}
	interval := max(time.Minute/time.Duration(perMinute), 1)
	tolerance := time.Duration(math.MaxInt64)
	if int64(burst) < math.MaxInt64/int64(interval) {
		tolerance = time.Duration(burst) * interval
	}
	return &Shared{store: s, name: name, interval: interval, tolerance: tolerance}
}

// Shared is a limiter whose counts live in the store's bucket. It keeps
// one value per key: the theoretical arrival time of the key's next take
// (the generic cell rate algorithm), which admits exactly what a token
// bucket of the same rate and burst admits. A take writes that time with
// compare-and-set and a TTL that ends when the key has refilled, so a key
// left alone disappears; a refusal writes nothing.
//
// Processes must keep their clocks in step: a process whose clock runs
// ahead by D makes the others stricter by D, one whose clock runs behind
// lets the others admit up to D's worth of takes more.
type Shared struct {
	store     *Store
	name      string
	interval  time.Duration // time per take
	tolerance time.Duration // burst × interval
}

// Allow takes one from key's budget at now if it has one. An error (NATS
// unreachable, ErrContended) means nothing was taken; callers refuse.
func (l *Shared) Allow(ctx context.Context, key string, now time.Time) (bool, error) {
	k := l.kvKey(key)
	lock := l.store.lock(k)
	select {
	case lock <- struct{}{}:
		defer func() { <-lock }()
	case <-ctx.Done():
		return false, fmt.Errorf("ratelimit: %s: %w", l.name, ctx.Err())
	}
	giveUp := time.Now().Add(contendedAfter)
	backoff := minBackoff
	for {
		tat, rev, err := l.read(ctx, k)
		if err != nil {
			return false, err
		}
		next := maxTime(tat, now).Add(l.interval)
		if next.Sub(now) > l.tolerance {
			return false, nil
		}
		err = l.write(ctx, k, next, rev, keyTTL(next.Sub(now)))
		if err == nil {
			return true, nil
		}
		if !isConflict(err) {
			return false, fmt.Errorf("ratelimit: %s: %w", l.name, err)
		}
		if time.Now().After(giveUp) {
			return false, ErrContended
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, maxBackoff)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return false, fmt.Errorf("ratelimit: %s: %w", l.name, ctx.Err())
		}
	}
}

// read returns key's stored arrival time and revision; zero for a key not
// stored (never taken from, or aged out). A value that does not parse
// counts as not stored, and the next take overwrites it.
func (l *Shared) read(ctx context.Context, k string) (time.Time, uint64, error) {
	e, err := l.store.kv.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return time.Time{}, 0, nil
	}
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("ratelimit: %s: read: %w", l.name, err)
	}
	ns, perr := strconv.ParseInt(string(e.Value()), 10, 64)
	if perr != nil {
		return time.Time{}, e.Revision(), nil
	}
	return time.Unix(0, ns), e.Revision(), nil
}

// write stores next for key, if key is still at rev (0: not stored), to
// age out after ttl. KeyValue.Update takes no TTL, so an update is the
// publish it makes, with the TTL header added.
func (l *Shared) write(ctx context.Context, k string, next time.Time, rev uint64, ttl time.Duration) error {
	v := []byte(strconv.FormatInt(next.UnixNano(), 10))
	if rev == 0 {
		_, err := l.store.kv.Create(ctx, k, v, jetstream.KeyTTL(ttl))
		return err
	}
	msg := &nats.Msg{Subject: "$KV." + Bucket + "." + k, Data: v}
	_, err := l.store.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(ttl))
	return err
}

// kvKey is name.<digest of key>: keys (principals, approval refs) may hold
// any characters, KV keys only a few.
func (l *Shared) kvKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return l.name + "." + base64.RawURLEncoding.EncodeToString(sum[:])
}

func (s *Store) lock(k string) chan struct{} {
	h := fnv.New32a()
	h.Write([]byte(k))
	return s.locks[h.Sum32()%uint32(len(s.locks))]
}

// maxKeyTTL bounds a key's TTL. Only a limit that takes longer than this
// to refill (a burst of over 43,200 at one a minute) would be reached: its
// key ages out early and starts full again.
const maxKeyTTL = 30 * 24 * time.Hour

// keyTTL is d rounded up to whole seconds (NATS TTLs are whole seconds),
// at least one, at most maxKeyTTL.
func keyTTL(d time.Duration) time.Duration {
	if d >= maxKeyTTL {
		return maxKeyTTL
	}
	return time.Duration(max(math.Ceil(d.Seconds()), 1)) * time.Second
}

// isConflict reports whether err is a lost compare-and-set: the key was
// created or changed since it was read.
func isConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
