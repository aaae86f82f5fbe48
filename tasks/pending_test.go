package tasks

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/internal/proccpu"
	"github.com/countersign/countersign/internal/testnats"
)

// newStoreAt is a store on its own NATS whose clock is now+skew, so that
// Reconcile sees every existing key as older than its grace.
func newStoreAt(t testing.TB, js jetstream.JetStream, skew time.Duration) *Store {
	t.Helper()
	s, err := NewStore(context.Background(), js, StoreOptions{Now: func() time.Time { return time.Now().Add(skew) }})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func wantReserved(t *testing.T, s *Store, owner string, want int) {
	t.Helper()
	n, err := s.PendingReserved(context.Background(), owner)
	if err != nil || n != want {
		t.Fatalf("reserved(%s) = %d, %v; want %d", owner, n, err, want)
	}
}

// The load: 2,000 calls at concurrency 20 against a cap of 100
// created 103 tasks with the old count-then-create.
func TestReservePendingCapIsExact(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	const calls, workers, limit = 2000, 20, 100
	var ok, refused atomic.Int64
	jobs := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range jobs {
				err := s.ReservePending(ctx, "alice", NewID("tsk_"), limit)
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, ErrPendingCapReached):
					refused.Add(1)
				default:
					t.Error(err)
				}
			}
		})
	}
	for range calls {
		jobs <- struct{}{}
	}
	close(jobs)
	wg.Wait()
	t.Logf("%d reserved, %d refused", ok.Load(), refused.Load())
	if ok.Load() != limit || refused.Load() != calls-limit {
		t.Fatalf("%d reserved and %d refused, want %d and %d", ok.Load(), refused.Load(), limit, calls-limit)
	}
	wantReserved(t, s, "alice", limit)
	if n, _ := s.CountPending(ctx, "alice"); n != limit {
		t.Fatalf("%d pending keys, want %d (refused reservations must leave none)", n, limit)
	}
	wantReserved(t, s, "bob", 0) // the cap is per principal
	if err := s.ReservePending(ctx, "bob", NewID("tsk_"), limit); err != nil {
		t.Fatal(err)
	}
}

// Reservations and releases interleaved: the number held never passes the
// cap, and everything given back ends at zero.
func TestReserveReleaseInterleaved(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	const calls, workers, limit = 600, 20, 5
	var live, peak, ok atomic.Int64
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				id := NewID("tsk_")
				err := s.ReservePending(ctx, "alice", id, limit)
				if errors.Is(err, ErrPendingCapReached) {
					continue
				}
				if err != nil {
					t.Error(err)
					continue
				}
				ok.Add(1)
				// live counts reservations between ReservePending's return
				// and ReleasePending's call, so it is never above what the
				// store holds.
				n := live.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(time.Duration(5+i%10) * time.Millisecond)
				live.Add(-1)
				if err := s.ReleasePending(ctx, "alice", id); err != nil {
					t.Error(err)
				}
				// A second release gives nothing back.
				if err := s.ReleasePending(ctx, "alice", id); err != nil {
					t.Error(err)
				}
			}
		})
	}
	for i := range calls {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	t.Logf("%d reserved, peak %d held", ok.Load(), peak.Load())
	if peak.Load() > limit {
		t.Fatalf("peak %d held, cap %d", peak.Load(), limit)
	}
	if ok.Load() < limit {
		t.Fatalf("only %d reservations succeeded", ok.Load())
	}
	wantReserved(t, s, "alice", 0)
	if n, _ := s.CountPending(ctx, "alice"); n != 0 {
		t.Fatalf("%d pending keys left", n)
	}
}

// Concurrent releases of one reservation lower the counter once.
func TestReleasePendingOnce(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	a, b := NewID("tsk_"), NewID("tsk_")
	for _, id := range []string{a, b} {
		if err := s.ReservePending(ctx, "alice", id, 10); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			if err := s.ReleasePending(ctx, "alice", a); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	wantReserved(t, s, "alice", 1)
	// Releasing what was never reserved changes nothing.
	if err := s.ReleasePending(ctx, "alice", NewID("tsk_")); err != nil {
		t.Fatal(err)
	}
	wantReserved(t, s, "alice", 1)
	if err := s.ReservePending(ctx, "alice", b, 10); err == nil {
		t.Fatal("a task reserved twice")
	}
	wantReserved(t, s, "alice", 1)
}

// The record's life gives the reservation back exactly once: on the
// transition to terminal, or when an unstarted task is deleted.
func TestPendingFollowsTheRecord(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	r := newRecord("alice")
	if err := s.ReservePending(ctx, "alice", r.TaskID, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	wantReserved(t, s, "alice", 1)
	if n, _ := s.CountPending(ctx, "alice"); n != 1 {
		t.Fatalf("%d pending keys, want 1", n)
	}
	if _, err := s.Update(ctx, r.TaskID, func(r *Record) error { r.StatusMessage = "still working"; return nil }); err != nil {
		t.Fatal(err)
	}
	wantReserved(t, s, "alice", 1)
	if _, err := s.Update(ctx, r.TaskID, func(r *Record) error { r.Status = StatusCompleted; return nil }); err != nil {
		t.Fatal(err)
	}
	wantReserved(t, s, "alice", 0)
	if _, err := s.Update(ctx, r.TaskID, func(r *Record) error { r.StatusMessage = "again"; return nil }); err != nil {
		t.Fatal(err)
	}
	wantReserved(t, s, "alice", 0)

	d := newRecord("alice")
	if err := s.ReservePending(ctx, "alice", d.TaskID, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	wantReserved(t, s, "alice", 0)

	// A record created without a reservation (tests, tools) is indexed but
	// gives nothing back when it ends.
	u := newRecord("alice")
	if err := s.ReservePending(ctx, "alice", NewID("tsk_"), 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(ctx, u); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(ctx, u.TaskID, func(r *Record) error { r.Status = StatusCancelled; return nil }); err != nil {
		t.Fatal(err)
	}
	wantReserved(t, s, "alice", 1)
}

// Reconcile repairs what a crash leaves: a reservation whose record was
// never created, a terminal task never released, a release cut short, and a
// counter that drifted either way. Young reservations are left alone.
func TestReconcilePendingFixesDrift(t *testing.T) {
	js, _ := testnats.Start(t)
	ctx := context.Background()
	s := newStoreAt(t, js, 0)

	// Two live tasks, reserved and created.
	for range 2 {
		r := newRecord("alice")
		if err := s.ReservePending(ctx, "alice", r.TaskID, 100); err != nil {
			t.Fatal(err)
		}
		if err := s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	// Crash between reservation and creation.
	if err := s.ReservePending(ctx, "alice", NewID("tsk_"), 100); err != nil {
		t.Fatal(err)
	}
	// Crash after the terminal write, before retire: the record is terminal
	// but its key still "held".
	done := newRecord("alice")
	if err := s.ReservePending(ctx, "alice", done.TaskID, 100); err != nil {
		t.Fatal(err)
	}
	done.Status = StatusCompleted
	if err := s.Create(ctx, done); err != nil {
		t.Fatal(err)
	}
	// Crash in the middle of a release, after the decrement.
	cut := newRecord("alice")
	if err := s.ReservePending(ctx, "alice", cut.TaskID, 100); err != nil {
		t.Fatal(err)
	}
	if err := s.addPending(ctx, OwnerKey("alice"), -1, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.kv.Put(ctx, pendingKey(OwnerKey("alice"), cut.TaskID), []byte(pendingReleasing)); err != nil {
		t.Fatal(err)
	}
	wantReserved(t, s, "alice", 4) // 2 live + 2 leaked

	// Within the grace period nothing is touched.
	if n, err := s.ReconcilePending(ctx, time.Hour); err != nil || n != 0 {
		t.Fatalf("young: fixed %d, %v", n, err)
	}
	wantReserved(t, s, "alice", 4)

	// An hour later the leaks go; the live tasks stay counted.
	later := newStoreAt(t, js, 2*time.Hour)
	if n, err := later.ReconcilePending(ctx, time.Hour); err != nil || n != 1 {
		t.Fatalf("fixed %d counters, %v; want 1", n, err)
	}
	wantReserved(t, s, "alice", 2)
	if n, _ := s.CountPending(ctx, "alice"); n != 2 {
		t.Fatalf("%d pending keys, want 2", n)
	}
	if n, err := later.ReconcilePending(ctx, time.Hour); err != nil || n != 0 {
		t.Fatalf("second pass: fixed %d, %v", n, err)
	}

	// A counter that drifted low is raised to the old reservations.
	if err := s.setCounterForTest(ctx, "alice", 0); err != nil {
		t.Fatal(err)
	}
	if n, err := later.ReconcilePending(ctx, time.Hour); err != nil || n != 1 {
		t.Fatalf("low: fixed %d, %v", n, err)
	}
	wantReserved(t, s, "alice", 2)
	// ... but not for reservations young enough to be in flight.
	if err := s.setCounterForTest(ctx, "alice", 0); err != nil {
		t.Fatal(err)
	}
	if n, err := s.ReconcilePending(ctx, time.Hour); err != nil || n != 0 {
		t.Fatalf("low, young: fixed %d, %v", n, err)
	}
	wantReserved(t, s, "alice", 0)
	// A counter that drifted high comes down, young or not.
	if err := s.setCounterForTest(ctx, "alice", 7); err != nil {
		t.Fatal(err)
	}
	if n, err := s.ReconcilePending(ctx, time.Hour); err != nil || n != 1 {
		t.Fatalf("high: fixed %d, %v", n, err)
	}
	wantReserved(t, s, "alice", 2)
	// A corrupt counter fails reservations closed until it is recounted.
	if _, err := s.kv.Put(ctx, "n."+OwnerKey("alice"), []byte("many")); err != nil {
		t.Fatal(err)
	}
	if err := s.ReservePending(ctx, "alice", NewID("tsk_"), 100); err == nil || errors.Is(err, ErrPendingCapReached) {
		t.Fatalf("reserve on a corrupt counter: %v", err)
	}
	if n, err := s.ReconcilePending(ctx, time.Hour); err != nil || n != 1 {
		t.Fatalf("corrupt: fixed %d, %v", n, err)
	}
	wantReserved(t, s, "alice", 2)
	// An owner with live reservations but no counter at all gets one.
	if err := s.kv.Delete(ctx, "n."+OwnerKey("alice")); err != nil {
		t.Fatal(err)
	}
	if n, err := later.ReconcilePending(ctx, time.Hour); err != nil || n != 1 {
		t.Fatalf("missing: fixed %d, %v", n, err)
	}
	wantReserved(t, s, "alice", 2)
}

// Reconcile recounting while reservations and releases go on never lets the
// cap be passed, and leaves the counter exact once they stop.
func TestReconcilePendingUnderLoad(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	const limit = 5
	var live, peak atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := NewID("tsk_")
				err := s.ReservePending(ctx, "alice", id, limit)
				if errors.Is(err, ErrPendingCapReached) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				n := live.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				live.Add(-1)
				if err := s.ReleasePending(ctx, "alice", id); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	fixed := 0
	for range 20 {
		// A leak: the counter three too high, with no keys behind it.
		if err := s.addPending(ctx, OwnerKey("alice"), +3, 1<<30); err != nil {
			t.Fatal(err)
		}
		n, err := s.ReconcilePending(ctx, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		fixed += n
	}
	t.Logf("%d of 20 leaks fixed under load", fixed)
	close(stop)
	wg.Wait()
	if peak.Load() > limit {
		t.Fatalf("peak %d held, cap %d", peak.Load(), limit)
	}
	if _, err := s.ReconcilePending(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	wantReserved(t, s, "alice", 0)
}

func (s *Store) setCounterForTest(ctx context.Context, owner string, n int) error {
	_, err := s.kv.Put(ctx, "n."+OwnerKey(owner), fmt.Appendf(nil, "%d", n))
	return err
}

// BenchmarkPendingCap compares the old admission check (list the owner's
// pending keys) with a reservation and its release, at 10,000 pending tasks.
func BenchmarkPendingCap(b *testing.B) {
	js, _ := testnats.Start(b)
	ctx := context.Background()
	s, err := NewStore(ctx, js, StoreOptions{})
	if err != nil {
		b.Fatal(err)
	}
	const pending = 10_000
	for range pending {
		if err := s.ReservePending(ctx, "alice", NewID("tsk_"), pending+1); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("CountPending", func(b *testing.B) {
		for b.Loop() {
			if n, err := s.CountPending(ctx, "alice"); err != nil || n != pending {
				b.Fatal(n, err)
			}
		}
	})
	b.Run("ReserveRelease", func(b *testing.B) {
		for b.Loop() {
			id := NewID("tsk_")
			if err := s.ReservePending(ctx, "alice", id, pending+1); err != nil {
				b.Fatal(err)
			}
			if err := s.ReleasePending(ctx, "alice", id); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// probe is a WorkflowProbe that knows no workflow and counts its calls.
type probe struct{ calls atomic.Int64 }

func (p *probe) Running(context.Context, string) (bool, error) {
	p.calls.Add(1)
	return false, nil
}

// Reconcile asks Temporal only about starts that are not confirmed: a record
// its workflow has written to (Seq > 0) has a workflow, however old.
func TestReconcileDescribesOnlyUnconfirmedStarts(t *testing.T) {
	js, _ := testnats.Start(t)
	s := newStoreAt(t, js, 0)
	ctx := context.Background()
	confirmed, unconfirmed := newRecord("alice"), newRecord("alice")
	confirmed.Seq = 3
	for _, r := range []Record{confirmed, unconfirmed} {
		if err := s.ReservePending(ctx, r.Owner, r.TaskID, 10); err != nil {
			t.Fatal(err)
		}
		if err := s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	later := newStoreAt(t, js, time.Hour)
	var p probe
	n, err := Reconcile(ctx, later, &p, time.Minute, nil)
	if err != nil || n != 1 {
		t.Fatalf("Reconcile = %d, %v; want 1", n, err)
	}
	if c := p.calls.Load(); c != 1 {
		t.Fatalf("described %d workflows, want 1 (the unconfirmed start)", c)
	}
	if r, err := later.Get(ctx, confirmed.TaskID); err != nil || r.Status.Terminal() {
		t.Fatalf("confirmed task: %v, %v", r.Status, err)
	}
	if r, err := later.Get(ctx, unconfirmed.TaskID); err != nil || r.Status != StatusFailed {
		t.Fatalf("orphan: %v, %v", r.Status, err)
	}
}

// BenchmarkReconcile times one Reconcile (as at every startup, then every
// few minutes) over 10,000 pending tasks whose workflows have written to
// them and 5,000 finished ones: nothing to fix, everything to read.
func BenchmarkReconcile(b *testing.B) {
	js, _ := testnats.Start(b)
	ctx := context.Background()
	s := newStoreAt(b, js, 0)
	const pending, finished = 10_000, 5_000
	for i := range pending + finished {
		r := newRecord(fmt.Sprintf("agent-%d", i%20))
		r.Seq = 2
		r.DisplayText = strings.Repeat("Transfer 5,000 EUR to DE89 3704 0044 0532 0130 00. ", 8)
		if i >= pending {
			r.Status, r.Disposition = StatusCompleted, ApprovedExecuted
		} else if err := s.ReservePending(ctx, r.Owner, r.TaskID, pending); err != nil {
			b.Fatal(err)
		}
		if err := s.Create(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
	later := newStoreAt(b, js, time.Hour)
	var p probe
	// CPU of the whole process: the store's NATS server runs in it too.
	start := proccpu.Used()
	for b.Loop() {
		if n, err := Reconcile(ctx, later, &p, time.Minute, nil); err != nil || n != 0 {
			b.Fatal(n, err)
		}
	}
	b.ReportMetric(float64(proccpu.Used()-start)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
	if c := p.calls.Load(); c != 0 {
		b.Fatalf("described %d workflows", c)
	}
}

// PendingTotal sums every owner's pending counter: reservations held, less
// those given back.
func TestPendingTotal(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	if n, err := s.PendingTotal(ctx); err != nil || n != 0 {
		t.Fatalf("PendingTotal of an empty store = %d, %v; want 0", n, err)
	}
	var alice []string
	for range 3 {
		id := NewID("tsk_")
		if err := s.ReservePending(ctx, "alice", id, 10); err != nil {
			t.Fatal(err)
		}
		alice = append(alice, id)
	}
	for range 2 {
		if err := s.ReservePending(ctx, "bob", NewID("tsk_"), 10); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.ReleasePending(ctx, "alice", alice[0]); err != nil {
		t.Fatal(err)
	}
	if n, err := s.PendingTotal(ctx); err != nil || n != 4 {
		t.Fatalf("PendingTotal = %d, %v; want 4", n, err)
	}
}
