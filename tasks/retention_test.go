package tasks

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/internal/proccpu"
	"github.com/countersign/countersign/internal/testnats"
)

// BenchmarkList times one tasks/list page (50 tasks) of an owner with 3,000
// tasks in the index: all live, or all finished and past their TTL (the
// review's case: 30 days past it, not yet swept).
func BenchmarkList(b *testing.B) {
	for _, expired := range []bool{false, true} {
		name := "live"
		if expired {
			name = "expired"
		}
		b.Run(name, func(b *testing.B) {
			js, _ := testnats.Start(b)
			ctx := context.Background()
			s := newStoreAt(b, js, 0)
			const n = 3_000
			for i := range n {
				r := newRecord("agent")
				r.CreatedAt = r.CreatedAt.Add(-time.Duration(i) * time.Second)
				r.Status, r.Disposition = StatusCompleted, ApprovedExecuted
				r.TTL = 8 * 24 * time.Hour
				if expired {
					r.CreatedAt = r.CreatedAt.Add(-38 * 24 * time.Hour)
				}
				if err := s.Create(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
			start := proccpu.Used()
			for b.Loop() {
				page, _, err := s.List(ctx, "agent", "", 50)
				if err != nil {
					b.Fatal(err)
				}
				if !expired && len(page) != 50 {
					b.Fatalf("page of %d", len(page))
				}
			}
			b.ReportMetric(float64(proccpu.Used()-start)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
		})
	}
}

// sweepSkew puts a sweeper's clock far enough ahead that every message
// written now is older than RetentionGrace.
const sweepSkew = RetentionGrace + time.Hour

// finished is a completed record of owner whose retention (CreatedAt+TTL)
// ends at end, last written an hour after its creation.
func finished(owner string, end time.Time) Record {
	r := newRecord(owner)
	r.TTL = 8 * 24 * time.Hour
	r.CreatedAt = end.Add(-r.TTL)
	r.LastUpdatedAt = r.CreatedAt.Add(time.Hour)
	r.Status, r.Disposition, r.ApprovalState = StatusCompleted, ApprovedExecuted, ApprovalExecuted
	return r
}

// taskKeys are the keys a task may have in the bucket.
func taskKeys(r Record) []string {
	owner := OwnerKey(r.Owner)
	keys := []string{"t." + r.TaskID, "o." + owner + "." + r.TaskID, pendingKey(owner, r.TaskID), "r." + r.ApprovalRef}
	if r.DedupKey != "" {
		keys = append(keys, "d."+r.DedupKey)
	}
	if r.ActionHash != "" {
		keys = append(keys, callIndexKey(r))
	}
	return keys
}

// wantGone fails unless no key of r holds any message, not even a delete
// marker.
func wantGone(t *testing.T, s *Store, r Record) {
	t.Helper()
	for _, k := range taskKeys(r) {
		if m, err := s.stream.GetLastMsgForSubject(context.Background(), kvPrefix+k); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Errorf("task %s: key %s left: %v (%v)", r.TaskID, k, m, err)
		}
	}
}

// wantKept fails unless r's record and owner index are there.
func wantKept(t *testing.T, s *Store, r Record) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.Get(ctx, r.TaskID); err != nil {
		t.Errorf("task %s: record: %v", r.TaskID, err)
	}
	if _, err := s.kv.Get(ctx, "o."+OwnerKey(r.Owner)+"."+r.TaskID); err != nil {
		t.Errorf("task %s: owner index: %v", r.TaskID, err)
	}
	if k := callIndexKey(r); k != "" {
		if _, err := s.kv.Get(ctx, k); err != nil {
			t.Errorf("task %s: index of identical calls: %v", r.TaskID, err)
		}
	}
}

// sweepAll runs rounds of at most limit records until a pass is done.
func sweepAll(t *testing.T, s *Store, limit int) (deleted int) {
	t.Helper()
	var from uint64
	for range 1000 {
		round, err := s.Sweep(context.Background(), from, limit)
		if err != nil {
			t.Fatal(err)
		}
		if round.Read > limit {
			t.Fatalf("round read %d records, limit %d", round.Read, limit)
		}
		deleted += round.Deleted
		if from = round.Next; from == 0 {
			return deleted
		}
	}
	t.Fatal("the pass never ended")
	return 0
}

func TestSweepDeletesFinishedTasksPastRetention(t *testing.T) {
	js, _ := testnats.Start(t)
	ctx := context.Background()
	s := newStoreAt(t, js, 0)
	now := time.Now().Add(sweepSkew) // the sweeper's
	sweeper := newStoreAt(t, js, sweepSkew)

	create := func(r Record) Record {
		t.Helper()
		if err := s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	var gone, kept, listed []Record
	for i := range 25 {
		r := finished("alice", now.Add(-RetentionGrace-time.Duration(i+1)*time.Hour))
		if i%2 == 0 {
			r.ActionHash = fmt.Sprintf("%064x", i) // in the index of identical calls
		}
		switch i % 5 {
		case 0: // retired normally: dedup slot and reservation released (markers)
			r.DedupKey = DedupKey(r.Owner, NewID("act_"))
			if _, err := s.ClaimDedup(ctx, r.DedupKey, r.TaskID); err != nil {
				t.Fatal(err)
			}
			s.ReleaseDedup(ctx, r.DedupKey, r.TaskID)
			if err := s.ReservePending(ctx, r.Owner, r.TaskID, 100); err != nil {
				t.Fatal(err)
			}
			if err := s.ReleasePending(ctx, r.Owner, r.TaskID); err != nil {
				t.Fatal(err)
			}
		case 1: // a crash before retire: the slot and the reservation stay
			r.DedupKey = DedupKey(r.Owner, NewID("act_"))
			if _, err := s.ClaimDedup(ctx, r.DedupKey, r.TaskID); err != nil {
				t.Fatal(err)
			}
			if err := s.ReservePending(ctx, r.Owner, r.TaskID, 100); err != nil {
				t.Fatal(err)
			}
		case 2: // cancelled or failed ends are deleted alike
			r.Status, r.Disposition = StatusCancelled, ""
		case 3:
			r.Status, r.Disposition = StatusFailed, ""
		}
		gone = append(gone, create(r))
	}
	// The dedup slot of a deleted task that a later task took over stays.
	taken := gone[0]
	if _, err := s.ClaimDedup(ctx, taken.DedupKey, NewID("tsk_")); err != nil {
		t.Fatal(err)
	}
	gone = append(gone, create(finished("bob", now.Add(-RetentionGrace-time.Hour))))

	// Not ended, past their TTL: never deleted, with or without the claim.
	for _, claimed := range []bool{false, true} {
		r := finished("alice", now.Add(-RetentionGrace-time.Hour))
		r.ActionHash = fmt.Sprintf("%064x", 999)
		r.Status, r.Disposition, r.ApprovalState = StatusWorking, "", ApprovalApproved
		if claimed {
			r.ExecutionClaimedAt, r.ExecutionClaim = r.CreatedAt, "claim"
		}
		kept = append(kept, create(r))
	}
	// Expired, but within the grace: past the end of retention, or
	// written recently.
	kept = append(kept, create(finished("alice", now.Add(-RetentionGrace+time.Hour))))
	recent := finished("alice", now.Add(-RetentionGrace-time.Hour))
	recent.LastUpdatedAt = now.Add(-time.Hour)
	kept = append(kept, create(recent))
	// No TTL: never expires.
	forever := finished("alice", now.Add(-RetentionGrace-time.Hour))
	forever.TTL = 0
	kept = append(kept, create(forever))
	// Live.
	for i := range 3 {
		r := create(finished("alice", now.Add(time.Duration(i+1)*time.Hour)))
		kept, listed = append(kept, r), append(listed, r)
	}
	listed = append(listed, forever)

	if n := sweepAll(t, sweeper, 4); n != len(gone) {
		t.Fatalf("deleted %d, want %d", n, len(gone))
	}
	for _, r := range gone {
		if _, err := sweeper.Get(ctx, r.TaskID); !errors.Is(err, ErrTaskNotFound) {
			t.Errorf("task %s: got %v, want ErrTaskNotFound", r.TaskID, err)
		}
		if r.TaskID == taken.TaskID {
			r.DedupKey = "" // another task's now
		}
		wantGone(t, sweeper, r)
	}
	if e, err := s.kv.Get(ctx, "d."+taken.DedupKey); err != nil || string(e.Value()) == taken.TaskID {
		t.Errorf("the taken-over dedup slot: %v, %v", e, err)
	}
	for _, r := range kept {
		wantKept(t, sweeper, r)
	}
	// The reservations a crash left are given back.
	wantReserved(t, sweeper, "alice", 0)
	// A second pass finds nothing to do.
	if n := sweepAll(t, sweeper, 100); n != 0 {
		t.Fatalf("second pass deleted %d", n)
	}
	page, next, err := sweeper.List(ctx, "alice", "", 50)
	if err != nil || next != "" {
		t.Fatal(next, err)
	}
	got := map[string]bool{}
	for _, r := range page {
		got[r.TaskID] = true
	}
	if len(page) != len(listed) {
		t.Errorf("listed %d, want %d", len(page), len(listed))
	}
	for _, r := range listed {
		if !got[r.TaskID] {
			t.Errorf("task %s not listed", r.TaskID)
		}
	}
}

// A pass reads only the records written RetentionGrace ago or earlier.
func TestSweepStopsAtYoungRecords(t *testing.T) {
	js, _ := testnats.Start(t)
	ctx := context.Background()
	s := newStoreAt(t, js, 0)
	for range 5 {
		if err := s.Create(ctx, finished("alice", time.Now().Add(-30*24*time.Hour))); err != nil {
			t.Fatal(err)
		}
	}
	round, err := s.Sweep(ctx, 0, 100)
	if err != nil || round != (Sweep{}) {
		t.Fatalf("round %+v, %v; want nothing read", round, err)
	}
	if _, err := s.Sweep(ctx, 0, 0); err == nil {
		t.Fatal("a limit of 0 accepted")
	}
}

// Two sweepers at once, and a writer racing them: every record the writer
// updated survives with its index, every other one is deleted with all its
// keys, and nothing fails.
func TestSweepConcurrent(t *testing.T) {
	js, _ := testnats.Start(t)
	ctx := context.Background()
	s := newStoreAt(t, js, 0)
	now := time.Now().Add(sweepSkew)
	const n = 120
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = finished(fmt.Sprintf("agent-%d", i%3), now.Add(-RetentionGrace-time.Hour))
		if err := s.Create(ctx, recs[i]); err != nil {
			t.Fatal(err)
		}
	}
	// The writer's clock is the sweepers': its writes restart the grace.
	writer := newStoreAt(t, js, sweepSkew)
	updated := make([]bool, n)
	var wg sync.WaitGroup
	for range 2 {
		sweeper := newStoreAt(t, js, sweepSkew)
		wg.Go(func() { sweepAll(t, sweeper, 16) })
	}
	wg.Go(func() {
		for i := n - 1; i >= 0; i -= 2 {
			_, err := writer.Update(ctx, recs[i].TaskID, func(r *Record) error {
				r.StatusMessage = "written again"
				return nil
			})
			switch {
			case err == nil:
				updated[i] = true
			case !errors.Is(err, ErrTaskNotFound):
				t.Error(err)
			}
		}
	})
	wg.Wait()
	survived := 0
	for i, r := range recs {
		if updated[i] {
			survived++
			wantKept(t, writer, r)
		} else {
			wantGone(t, writer, r)
		}
	}
	t.Logf("%d of %d records were updated before their deletion and survived", survived, n)
}

// An update between the sweep's read of a record and its delete: the
// record stays, indexed again.
func TestSweepLeavesARecordWrittenSinceItsRead(t *testing.T) {
	js, _ := testnats.Start(t)
	ctx := context.Background()
	s := newStoreAt(t, js, 0)
	r := finished("alice", time.Now().Add(-30*24*time.Hour))
	if err := s.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	sweeper := newStoreAt(t, js, sweepSkew)
	sweeper.beforeRecordPurge = func(Record) {
		if _, err := s.Update(ctx, r.TaskID, func(r *Record) error {
			r.StatusMessage = "written again"
			return nil
		}); err != nil {
			t.Error(err)
		}
	}
	if n := sweepAll(t, sweeper, 10); n != 0 {
		t.Fatalf("deleted %d", n)
	}
	wantKept(t, sweeper, r)
	if got, err := sweeper.ByRef(ctx, r.ApprovalRef); err != nil || got.StatusMessage != "written again" {
		t.Fatalf("by ref: %+v, %v", got, err)
	}
}

func TestListLeavesOutExpired(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	now := time.Now()
	var live []string
	for i := range 6 {
		r := finished("alice", now.Add(time.Hour))
		r.CreatedAt = r.CreatedAt.Add(-time.Duration(i) * time.Minute)
		if i%2 == 1 {
			r.TTL = time.Minute // expired
		} else {
			live = append(live, r.TaskID)
		}
		if err := s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	// An index entry written before the index held the creation time.
	old := finished("alice", now.Add(time.Hour))
	old.CreatedAt = old.CreatedAt.Add(-90 * time.Second) // between the 2nd and 3rd
	if err := s.Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := s.kv.Put(ctx, "o."+OwnerKey("alice")+"."+old.TaskID, nil); err != nil {
		t.Fatal(err)
	}
	live = append(live[:1], append([]string{old.TaskID}, live[1:]...)...)
	var got []string
	cursor := ""
	for {
		page, next, err := s.List(ctx, "alice", cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page {
			got = append(got, r.TaskID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if diff := cmp.Diff(live, got); diff != "" {
		t.Fatalf("listed (-want +got):\n%s", diff)
	}
	if _, _, err := s.List(ctx, "alice", NewID("tsk_"), 2); !errors.Is(err, ErrInvalidCursor) {
		t.Fatalf("unknown cursor: %v", err)
	}
}

// A page reads at most limit+listReadSlack records: behind more expired
// ones than that, it ends short, and the next page goes on.
func TestListPageReadsABoundedNumberOfRecords(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	end := time.Now().Add(-time.Hour)
	for range listReadSlack + 5 {
		if err := s.Create(ctx, finished("alice", end)); err != nil {
			t.Fatal(err)
		}
	}
	live := finished("alice", time.Now().Add(time.Hour))
	live.CreatedAt, live.TTL = end.Add(-9*24*time.Hour), 10*24*time.Hour // older than every expired one
	if err := s.Create(ctx, live); err != nil {
		t.Fatal(err)
	}
	page, next, err := s.List(ctx, "alice", "", 2)
	if err != nil || len(page) != 0 || next == "" {
		t.Fatalf("first page: %d tasks, next %q, %v; want none and a cursor", len(page), next, err)
	}
	page, next, err = s.List(ctx, "alice", next, 2)
	if err != nil || len(page) != 1 || page[0].TaskID != live.TaskID || next != "" {
		t.Fatalf("second page: %d tasks, next %q, %v; want the live task", len(page), next, err)
	}
}
