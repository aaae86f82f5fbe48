package tasks

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/countersign/countersign/internal/proccpu"
	"github.com/countersign/countersign/internal/testnats"
)

// identicalTo is a record of the same call as r (owner, tool, action
// hash), created ago before now.
func identicalTo(r Record, ago time.Duration) Record {
	o := newRecord(r.Owner)
	o.Tool, o.Arguments, o.ActionHash = r.Tool, r.Arguments, r.ActionHash
	o.CreatedAt = r.CreatedAt.Add(-ago)
	o.LastUpdatedAt = o.CreatedAt
	o.TTL = 8 * 24 * time.Hour
	return o
}

// ended makes r a task that ended at end with disposition d.
func ended(r Record, d Disposition, state ApprovalState, end time.Time) Record {
	r.Status, r.Disposition, r.ApprovalState, r.LastUpdatedAt = StatusCompleted, d, state, end
	return r
}

// The requester's identical calls: their other tasks with the same tool and
// action hash, pending or ended within IdenticalWindow, newest first; not
// the task itself, not another call, not another principal's, not one that
// ended longer ago.
func TestIdenticalCalls(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	now := time.Now().UTC()
	asked := newRecord("alice")
	asked.ActionHash = strings.Repeat("ab", 32)

	ran := ended(identicalTo(asked, 10*time.Minute), ApprovedExecuted, ApprovalExecuted, now.Add(-3*time.Minute))
	unknown := ended(identicalTo(asked, 20*time.Minute), OutcomeUnknown, ApprovalFailed, now.Add(-15*time.Minute))
	denied := ended(identicalTo(asked, 30*time.Minute), DeniedNotExecuted, ApprovalDenied, now.Add(-25*time.Minute))
	running := identicalTo(asked, 40*time.Minute)
	running.ApprovalState = ApprovalApproved
	waiting := identicalTo(asked, 50*time.Minute)
	waiting.Requirement.Quorum = 1
	// Created long ago, ended within the window: listed.
	lateEnd := ended(identicalTo(asked, 3*24*time.Hour), ExecutionError, ApprovalFailed, now.Add(-time.Hour))
	// Ended before the window: not listed.
	old := ended(identicalTo(asked, 2*24*time.Hour), ApprovedExecuted, ApprovalExecuted, now.Add(-IdenticalWindow-time.Hour))
	otherArgs := identicalTo(asked, time.Minute)
	otherArgs.ActionHash = strings.Repeat("cd", 32)
	otherTool := identicalTo(asked, time.Minute)
	otherTool.Tool = "delete_records"
	otherOwner := identicalTo(asked, time.Minute)
	otherOwner.Owner = "bob"
	for _, r := range []Record{asked, ran, unknown, denied, running, waiting, lateEnd, old, otherArgs, otherTool, otherOwner} {
		if err := s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}

	got, err := s.IdenticalCalls(ctx, asked)
	if err != nil {
		t.Fatal(err)
	}
	call := func(r Record, mayHaveRun bool) IdenticalCall {
		c := IdenticalCall{Ref: r.ApprovalRef, Status: r.Status, Disposition: r.Disposition, ApprovalState: r.ApprovalState,
			CreatedAt: r.CreatedAt, MayHaveRun: mayHaveRun}
		if r.Status.Terminal() {
			c.EndedAt = r.LastUpdatedAt
		}
		return c
	}
	want := IdenticalCalls{Calls: []IdenticalCall{
		call(ran, true), call(unknown, true), call(denied, false), call(running, true), call(waiting, false), call(lateEnd, true),
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("identical calls (-want +got):\n%s", diff)
	}
	if !got.MayHaveRun() || !strings.Contains(got.Warning(), "ran or may have run") {
		t.Errorf("warning = %q", got.Warning())
	}

	// Only calls that did not run: listed, without a warning.
	quiet, err := s.IdenticalCalls(ctx, otherOwner)
	if err != nil {
		t.Fatal(err)
	}
	if len(quiet.Calls) != 0 || quiet.Warning() != "" {
		t.Errorf("bob's call: %+v, warning %q", quiet, quiet.Warning())
	}
	if w := (IdenticalCalls{Calls: []IdenticalCall{call(waiting, false)}}).Warning(); w != "" {
		t.Errorf("warning for a waiting call: %q", w)
	}
}

// The list stops at MaxIdenticalCalls, the newest ones.
func TestIdenticalCallsCapped(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	asked := newRecord("alice")
	asked.ActionHash = strings.Repeat("ab", 32)
	if err := s.Create(ctx, asked); err != nil {
		t.Fatal(err)
	}
	var refs []string
	for i := range MaxIdenticalCalls + 5 {
		r := ended(identicalTo(asked, time.Duration(i+1)*time.Minute), DeniedNotExecuted, ApprovalDenied, time.Now())
		if err := s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, r.ApprovalRef)
	}
	got, err := s.IdenticalCalls(ctx, asked)
	if err != nil {
		t.Fatal(err)
	}
	var gotRefs []string
	for _, c := range got.Calls {
		gotRefs = append(gotRefs, c.Ref)
	}
	if diff := cmp.Diff(refs[:MaxIdenticalCalls], gotRefs); diff != "" {
		t.Errorf("refs (-want +got):\n%s", diff)
	}
}

// The look-up reads the tasks of that one call, not the owner's: an
// identical call is found behind more of the owner's newer tasks than any
// walk of the owner's index would read, and the ones a test or crash left
// half made (an index entry without its record, a record of another
// owner under a colliding key) are skipped.
func TestIdenticalCallsBehindManyTasks(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	now := time.Now().UTC()
	asked := newRecord("alice")
	asked.ActionHash = strings.Repeat("ab", 32)
	if err := s.Create(ctx, asked); err != nil {
		t.Fatal(err)
	}
	ran := ended(identicalTo(asked, 2*time.Hour), ApprovedExecuted, ApprovalExecuted, now.Add(-time.Hour))
	if err := s.Create(ctx, ran); err != nil {
		t.Fatal(err)
	}
	// More newer tasks of other calls than MaxRecentReads.
	for i := range MaxRecentReads + 100 {
		o := identicalTo(asked, time.Hour-time.Duration(i)*time.Millisecond)
		o.ActionHash = fmt.Sprintf("%064x", i)
		if err := s.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// An index entry whose record is gone, newer than ran.
	orphan := identicalTo(asked, time.Minute)
	if _, err := s.kv.Put(ctx, callIndexKey(orphan), []byte(indexStamp(orphan.CreatedAt))); err != nil {
		t.Fatal(err)
	}
	got, err := s.IdenticalCalls(ctx, asked)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Calls) != 1 || got.Calls[0].Ref != ran.ApprovalRef || !got.MayHaveRun() {
		t.Fatalf("identical calls: %+v", got)
	}
	// Deleting a task takes it out of the index.
	if err := s.Delete(ctx, ran); err != nil {
		t.Fatal(err)
	}
	if _, err := s.kv.Get(ctx, callIndexKey(ran)); err == nil {
		t.Error("the deleted task is still in the index of identical calls")
	}
}

// A failed look-up is an error and Unknown, whose warning says so.
func TestIdenticalCallsUnknown(t *testing.T) {
	s := newStore(t)
	r := newRecord("alice")
	r.ActionHash = strings.Repeat("ab", 32)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	got, err := s.IdenticalCalls(ctx, r)
	if err == nil || !got.Unknown || !strings.Contains(got.Warning(), "could not check") {
		t.Errorf("cancelled look-up: %+v, %v, warning %q", got, err, got.Warning())
	}
}

// BenchmarkIdenticalCalls times the look-up for an approval whose requester
// has 3,000 tasks in the index, all ended within the window: none
// identical (the walk reads its bound of records), or the newest ten
// identical (it stops at the cap).
func BenchmarkIdenticalCalls(b *testing.B) {
	for _, matching := range []bool{false, true} {
		name := "none"
		if matching {
			name = "capped"
		}
		b.Run(name, func(b *testing.B) {
			js, _ := testnats.Start(b)
			ctx := context.Background()
			s := newStoreAt(b, js, 0)
			asked := newRecord("agent")
			asked.ActionHash = strings.Repeat("ab", 32)
			const n = 3_000
			for i := range n {
				r := ended(identicalTo(asked, time.Duration(i+1)*time.Second), ApprovedExecuted, ApprovalExecuted, time.Now())
				if !matching || i >= MaxIdenticalCalls {
					r.ActionHash = fmt.Sprintf("%064x", i)
				}
				if err := s.Create(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
			start := proccpu.Used()
			for b.Loop() {
				got, err := s.IdenticalCalls(ctx, asked)
				if err != nil {
					b.Fatal(err)
				}
				if want := map[bool]int{false: 0, true: MaxIdenticalCalls}[matching]; len(got.Calls) != want {
					b.Fatalf("%d identical calls, want %d", len(got.Calls), want)
				}
			}
			b.ReportMetric(float64(proccpu.Used()-start)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
		})
	}
}
