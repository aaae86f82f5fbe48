package txtoken

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/audit"
)

// faultyKV is a real bucket whose writes of one key can be made to fail,
// as a store under load fails: onWrite wraps every Create and Update of
// key, and write makes the store's write and returns its answer.
type faultyKV struct {
	jetstream.KeyValue
	key     string
	onWrite func(write func() (uint64, error)) (uint64, error)
}

func (k *faultyKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	write := func() (uint64, error) { return k.KeyValue.Create(ctx, key, value, opts...) }
	if key != k.key || k.onWrite == nil {
		return write()
	}
	return k.onWrite(write)
}

func (k *faultyKV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	write := func() (uint64, error) { return k.KeyValue.Update(ctx, key, value, revision) }
	if key != k.key || k.onWrite == nil {
		return write()
	}
	return k.onWrite(write)
}

// timeoutBefore fails a write with a timeout before it reaches the store.
func timeoutBefore(func() (uint64, error)) (uint64, error) { return 0, context.DeadlineExceeded }

// timeoutAfter makes the write, then answers a timeout (the answer lost).
func timeoutAfter(write func() (uint64, error)) (uint64, error) {
	if _, err := write(); err != nil {
		return 0, err
	}
	return 0, context.DeadlineExceeded
}

func joined(kinds []string) string { return strings.Join(kinds, ",") }

// TestRedeemOutlivesCancellation: the caller cancels (hangs up, or sends
// notifications/cancelled) right after its token is consumed, and again
// before the result is recorded. The consumption and the result are
// recorded all the same: a spent token always has its record.
func TestRedeemOutlivesCancellation(t *testing.T) {
	f := newFixture(t)
	is := f.issue(t)
	ctx, cancel := context.WithCancel(context.Background())
	f.svc.used = &faultyKV{KeyValue: f.svc.used, key: is.JTI, onWrite: func(write func() (uint64, error)) (uint64, error) {
		rev, err := write()
		cancel() // the caller goes away just after the consume
		return rev, err
	}}
	r, err := f.svc.Redeem(ctx, is.Token, expect(t))
	if err != nil {
		t.Fatalf("redeem: %v", err)
	}
	r.Finish(ctx, "executed", map[string]any{"content": []any{}})
	if got := joined(f.chain(t, is.JTI)); got != "token-issued,token-consumed,token-result" {
		t.Fatalf("chain %s", got)
	}
}

// TestConsumeAnswerLost: the consume's write lands but its answer is a
// timeout. The request learns that the write was its own and goes on as
// consumed, recorded; a replay is already_used.
func TestConsumeAnswerLost(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	is := f.issue(t)
	f.svc.used = &faultyKV{KeyValue: f.svc.used, key: is.JTI, onWrite: timeoutAfter}
	r, err := f.svc.Redeem(ctx, is.Token, expect(t))
	if err != nil {
		t.Fatalf("redeem: %v", err)
	}
	r.Finish(ctx, "executed", map[string]any{"content": []any{}})
	_, err = f.svc.Redeem(ctx, is.Token, expect(t))
	if !errors.Is(err, &Error{Reason: ReasonAlreadyUsed}) {
		t.Fatalf("replay: %v", err)
	}
	if got := joined(f.chain(t, is.JTI)); got != "token-issued,token-consumed,token-result,token-rejected" {
		t.Fatalf("chain %s", got)
	}
}

// TestConsumeNotWritten: the consume fails before its write lands. The
// call does not run, the failure is recorded in the token's chain (type
// internal_error), and the token, unspent, still runs its call.
func TestConsumeNotWritten(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	is := f.issue(t)
	used := f.svc.used
	f.svc.used = &faultyKV{KeyValue: used, key: is.JTI, onWrite: timeoutBefore}
	_, err := f.svc.Redeem(ctx, is.Token, expect(t))
	var rej *Error
	if err == nil || errors.As(err, &rej) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("redeem with a failing store: %v", err)
	}
	if f.consumed(t, is.JTI) {
		t.Fatal("consumed")
	}
	f.svc.used = used
	if _, err := f.svc.Redeem(ctx, is.Token, expect(t)); err != nil {
		t.Fatalf("redeem after the store recovered: %v", err)
	}
	lines, err := f.log.Chain(ctx, is.JTI)
	if err != nil {
		t.Fatal(err)
	}
	_, recs, err := audit.CheckChain(is.JTI, lines, audit.CheckOptions{Keys: f.keys.PublicKeys()})
	if err != nil || len(recs) != 3 || recs[1].Kind != audit.KindTokenRejected || recs[2].Kind != audit.KindTokenConsumed {
		t.Fatalf("chain: %v %d records", err, len(recs))
	}
	if body := string(recs[1].Body); !strings.Contains(body, `"errorType":"`+TypeInternal+`"`) || !strings.Contains(body, `"jti":"`+is.JTI+`"`) {
		t.Fatalf("rejection %s", body)
	}
}

// TestRedeemStoreReadFailures: a key store that cannot be read, to resolve
// the token's key or its retirement, stops the call, and the failure is a
// one-record "token-rejected" chain of type internal_error (naming the
// jti once the token verified).
func TestRedeemStoreReadFailures(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  func(is Issued) string
		jti  bool
	}{
		{"key", func(is Issued) string { return "pub." + is.KeyID }, false},
		{"retirement", func(is Issued) string { return "retired." + is.KeyID }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			// Another replica's token: this one has not seen its key.
			other := newFixtureOn(t, f.js, serverID)
			if _, err := other.svc.Rotate(context.Background()); err != nil {
				t.Fatal(err)
			}
			is := other.issue(t)
			f.svc.keys = &failingGet{KeyValue: f.svc.keys, key: tc.key(is)}
			_, err := f.svc.Redeem(context.Background(), is.Token, expect(t))
			var rej *Error
			if err == nil || errors.As(err, &rej) {
				t.Fatalf("got %v, want a store error", err)
			}
			recs := f.rejections(t)
			if len(recs) != 1 || recs[0].ErrorType != TypeInternal || recs[0].Reason != ReasonInternal || (recs[0].JTI == is.JTI) != tc.jti {
				t.Fatalf("rejections %+v", recs)
			}
		})
	}
}

// failingGet is a bucket whose reads of one key time out.
type failingGet struct {
	jetstream.KeyValue
	key string
}

func (k *failingGet) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if key == k.key {
		return nil, context.DeadlineExceeded
	}
	return k.KeyValue.Get(ctx, key)
}

// rejections reads the bodies of the one-record rejection chains (txr_…).
func (f *fixture) rejections(t *testing.T) []audit.TokenRejected {
	t.Helper()
	var out []audit.TokenRejected
	err := f.log.Export(context.Background(), time.Time{}, func(line []byte) error {
		var r audit.Record
		if err := json.Unmarshal(line, &r); err != nil {
			return err
		}
		if !strings.HasPrefix(r.TaskID, "txr_") {
			return nil
		}
		var rj audit.TokenRejected
		if err := json.Unmarshal(r.Body, &rj); err != nil {
			return err
		}
		out = append(out, rj)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
