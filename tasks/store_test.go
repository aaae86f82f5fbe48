package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/countersign/countersign/internal/testnats"
)

func newStore(t *testing.T) *Store {
	t.Helper()
	js, _ := testnats.Start(t)
	s, err := NewStore(context.Background(), js, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newRecord(owner string) Record {
	now := time.Now().UTC()
	return Record{
		TaskID: NewID("tsk_"), Owner: owner, Era: Era2026, Status: StatusWorking,
		CreatedAt: now, LastUpdatedAt: now, TTL: time.Hour, PollInterval: 2 * time.Second,
		Tool: "transfer_funds", Arguments: json.RawMessage(`{"amount":5000}`),
		ApprovalRef: NewID("apr_"), ApprovalState: ApprovalPending,
	}
}

func TestCreateGetOwnership(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	r := newRecord("alice")
	if err := s.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(ctx, r); !errors.Is(err, ErrTaskExists) {
		t.Fatalf("second create: got %v, want ErrTaskExists", err)
	}
	got, err := s.GetOwned(ctx, r.TaskID, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(r.TaskID, got.TaskID); diff != "" {
		t.Fatal(diff)
	}
	// Someone else's task is indistinguishable from an unknown one.
	if _, err := s.GetOwned(ctx, r.TaskID, "mallory"); !errors.Is(err, ErrTaskNotFound) {
		t.Fatalf("foreign owner: got %v", err)
	}
	if _, err := s.GetOwned(ctx, NewID("tsk_"), "alice"); !errors.Is(err, ErrTaskNotFound) {
		t.Fatalf("unknown: got %v", err)
	}
	for _, bad := range []string{"", "tsk_", "../etc", "tsk_*", "t.>"} {
		if _, err := s.Get(ctx, bad); !errors.Is(err, ErrTaskNotFound) {
			t.Fatalf("malformed id %q: got %v", bad, err)
		}
	}
	byRef, err := s.ByRef(ctx, r.ApprovalRef)
	if err != nil || byRef.TaskID != r.TaskID {
		t.Fatalf("by ref: %v %v", byRef.TaskID, err)
	}
}

// Create writes the record and its indexes at once; when the ID turns out
// to be taken, the index entries it wrote for the loser are gone again and
// the holder's stay: the loser's list, pending index and approval
// reference show nothing, and the admin's pending view lists the task once.
func TestCreateTakenIDLeavesNoIndex(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	r := newRecord("alice")
	if err := s.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	for _, owner := range []string{"alice", "bob"} {
		again := r
		again.Owner, again.ApprovalRef = owner, NewID("apr_")
		if err := s.Create(ctx, again); !errors.Is(err, ErrTaskExists) {
			t.Fatalf("%s: got %v, want ErrTaskExists", owner, err)
		}
		if _, err := s.ByRef(ctx, again.ApprovalRef); !errors.Is(err, ErrTaskNotFound) {
			t.Fatalf("%s: the loser's approval reference resolves: %v", owner, err)
		}
	}
	if page, _, err := s.List(ctx, "bob", "", 10); err != nil || len(page) != 0 {
		t.Fatalf("bob lists %d tasks, %v", len(page), err)
	}
	if n, err := s.CountPending(ctx, "bob"); err != nil || n != 0 {
		t.Fatalf("bob has %d pending keys, %v", n, err)
	}
	if keys, err := s.keys(ctx, "o."+OwnerKey("bob")+".>"); err != nil || len(keys) != 0 {
		t.Fatalf("bob's owner index: %v, %v", keys, err)
	}
	if page, _, err := s.List(ctx, "alice", "", 10); err != nil || len(page) != 1 {
		t.Fatalf("alice lists %d tasks, %v", len(page), err)
	}
	if n, err := s.CountPending(ctx, "alice"); err != nil || n != 1 {
		t.Fatalf("alice has %d pending keys, %v", n, err)
	}
	if got, err := s.ByRef(ctx, r.ApprovalRef); err != nil || got.TaskID != r.TaskID {
		t.Fatalf("the holder's reference: %v %v", got.TaskID, err)
	}
	if all, err := s.nonTerminal(ctx, func(Record) bool { return true }); err != nil || len(all) != 1 {
		t.Fatalf("pending view: %d tasks, %v", len(all), err)
	}
}

func TestUpdateRefusesLeavingTerminal(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	r := newRecord("alice")
	if err := s.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.CountPending(ctx, "alice"); n != 1 {
		t.Fatalf("pending = %d, want 1", n)
	}
	if _, err := s.Update(ctx, r.TaskID, func(r *Record) error { r.Status = StatusCancelled; return nil }); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.CountPending(ctx, "alice"); n != 0 {
		t.Fatalf("pending after terminal = %d, want 0", n)
	}
	_, err := s.Update(ctx, r.TaskID, func(r *Record) error { r.Status = StatusCompleted; return nil })
	if !errors.Is(err, ErrTerminal) {
		t.Fatalf("got %v, want ErrTerminal", err)
	}
	// A write that keeps the terminal status (an idempotent retry) is fine.
	if _, err := s.Update(ctx, r.TaskID, func(r *Record) error { r.StatusMessage = "again"; return nil }); err != nil {
		t.Fatal(err)
	}
	got, _ := s.Get(ctx, r.TaskID)
	if got.Status != StatusCancelled {
		t.Fatalf("status = %s", got.Status)
	}
}

func TestUpdateConcurrentWritersLoseNothing(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	r := newRecord("alice")
	if err := s.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			_, err := s.Update(ctx, r.TaskID, func(r *Record) error {
				r.Timeline = append(r.Timeline, Event{Kind: "e", Detail: string(rune('a' + i))})
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	got, _ := s.Get(ctx, r.TaskID)
	if len(got.Timeline) != 8 {
		t.Fatalf("timeline has %d events, want 8", len(got.Timeline))
	}
}

func TestDedup(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	a := newRecord("alice")
	a.DedupKey = DedupKey("alice", "hash")
	if other, err := s.ClaimDedup(ctx, a.DedupKey, a.TaskID); err != nil || other != "" {
		t.Fatalf("first claim: %q %v", other, err)
	}
	if err := s.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	b := NewID("tsk_")
	if other, err := s.ClaimDedup(ctx, a.DedupKey, b); err != nil || other != a.TaskID {
		t.Fatalf("identical pending call: got %q %v, want %s", other, err, a.TaskID)
	}
	if DedupKey("bob", "hash") == a.DedupKey {
		t.Fatal("dedup key ignores the principal")
	}
	// Once the first task ends, the same call makes a new task.
	if _, err := s.Update(ctx, a.TaskID, func(r *Record) error { r.Status = StatusCompleted; return nil }); err != nil {
		t.Fatal(err)
	}
	if other, err := s.ClaimDedup(ctx, a.DedupKey, b); err != nil || other != "" {
		t.Fatalf("after terminal: got %q %v", other, err)
	}
}

func TestListIsScopedAndPaged(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	for i := range 5 {
		r := newRecord("alice")
		r.CreatedAt = r.CreatedAt.Add(time.Duration(i) * time.Second)
		if err := s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Create(ctx, newRecord("bob")); err != nil {
		t.Fatal(err)
	}
	var all []Record
	cursor := ""
	for {
		page, next, err := s.List(ctx, "alice", cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page...)
		if next == "" {
			break
		}
		cursor = next
	}
	if len(all) != 5 {
		t.Fatalf("listed %d, want 5", len(all))
	}
	for i := 1; i < len(all); i++ {
		if all[i].CreatedAt.After(all[i-1].CreatedAt) {
			t.Fatal("not newest first")
		}
		if all[i].Owner != "alice" {
			t.Fatal("foreign task listed")
		}
	}
	if _, _, err := s.List(ctx, "alice", "tsk_bogus", 2); err == nil {
		t.Fatal("bogus cursor accepted")
	}
}

func TestWaitTerminal(t *testing.T) {
	s := newStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := newRecord("alice")
	if err := s.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		s.Update(ctx, r.TaskID, func(r *Record) error { r.StatusMessage = "still working"; return nil })
		s.Update(ctx, r.TaskID, func(r *Record) error { r.Status = StatusCompleted; r.Disposition = ApprovedExecuted; return nil })
	}()
	got, err := s.WaitTerminal(ctx, r.TaskID, "alice")
	if err != nil || got.Status != StatusCompleted {
		t.Fatalf("got %v %v", got.Status, err)
	}
	if _, err := s.WaitTerminal(ctx, r.TaskID, "mallory"); !errors.Is(err, ErrTaskNotFound) {
		t.Fatalf("foreign wait: %v", err)
	}
}

func TestOutcomeStatesDispositionInBodyAndMeta(t *testing.T) {
	for _, d := range []Disposition{ApprovedExecuted, DeniedNotExecuted, ExecutionError, OutcomeUnknown} {
		res := Outcome(d, "transfer_funds", "", nil)
		b, _ := json.Marshal(res)
		if DispositionOf(b) != d {
			t.Fatalf("%s: _meta disposition missing", d)
		}
		if res.Meta[MetaDispositionAuthZEN] != string(d) {
			t.Fatalf("%s: authzen key missing", d)
		}
		var c Content
		json.Unmarshal(res.Content[0], &c)
		if !json.Valid(res.Content[0]) || c.Type != "text" || !strings.Contains(c.Text, string(d)) {
			t.Fatalf("%s: body does not state the disposition: %q", d, c.Text)
		}
		if res.IsError != (d != ApprovedExecuted) {
			t.Fatalf("%s: isError = %v", d, res.IsError)
		}
	}
}

func TestWireShapes(t *testing.T) {
	r := newRecord("alice")
	r.Status = StatusCompleted
	r.Result = json.RawMessage(`{"content":[],"isError":false}`)
	b, _ := json.Marshal(r.WireDetailed())
	var m map[string]any
	json.Unmarshal(b, &m)
	for _, k := range []string{"taskId", "status", "createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs", "result"} {
		if _, ok := m[k]; !ok {
			t.Errorf("2026 detailed task lacks %s: %s", k, b)
		}
	}
	b, _ = json.Marshal(r.Legacy())
	m = nil
	json.Unmarshal(b, &m)
	for _, k := range []string{"taskId", "status", "createdAt", "lastUpdatedAt", "ttl", "pollInterval"} {
		if _, ok := m[k]; !ok {
			t.Errorf("legacy task lacks %s: %s", k, b)
		}
	}
	if _, ok := m["result"]; ok {
		t.Error("legacy task carries result")
	}
}

func TestNewIDShape(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := NewID("tsk_")
		if !ValidID(id) || seen[id] {
			t.Fatalf("bad or repeated id %q", id)
		}
		seen[id] = true
	}
}

// TestClaimExecutionExcludesTheStartJudgement: a workflow's execution fence
// and the judgement of a start that failed (fail the task, or, for a
// verified call, delete its record) race on the same record, many times at
// the same instant. Exactly one wins each round, and the record says which:
// a claimed task is never failed or deleted, a failed or deleted one is
// never claimed (its tool does not run).
func TestClaimExecutionExcludesTheStartJudgement(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	const rounds = 50
	wins := map[string]int{}
	for i := range rounds {
		r := newRecord("alice")
		if err := s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		deleting := i%2 == 1
		var claimErr, judgeErr error
		var deleted bool
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			claimErr = s.ClaimExecution(ctx, r.TaskID, "exe_a")
		}()
		go func() {
			defer wg.Done()
			<-start
			if deleting {
				deleted, judgeErr = s.DeleteUnstarted(ctx, r)
				return
			}
			_, judgeErr = s.Update(ctx, r.TaskID, func(cur *Record) error {
				if _, unconfirmed := cur.Unconfirmed(time.Now()); cur.Status.Terminal() || !unconfirmed {
					return errors.New("confirmed")
				}
				FailUnstarted(cur, time.Now(), "workflow start failed")
				return nil
			})
		}()
		close(start)
		wg.Wait()

		judged := (deleting && deleted) || (!deleting && judgeErr == nil)
		if deleting && judgeErr != nil {
			t.Fatalf("round %d: DeleteUnstarted: %v", i, judgeErr)
		}
		if (claimErr == nil) == judged {
			t.Fatalf("round %d (delete %v): claim err %v, judged %v: want exactly one to win", i, deleting, claimErr, judged)
		}
		got, err := s.Get(ctx, r.TaskID)
		switch {
		case claimErr == nil:
			wins["claim"]++
			if err != nil || got.Status.Terminal() || got.ExecutionClaimedAt.IsZero() {
				t.Fatalf("round %d: claimed, but the record is %s, claimed at %v (%v)", i, got.Status, got.ExecutionClaimedAt, err)
			}
			if _, unconfirmed := got.Unconfirmed(time.Now()); unconfirmed {
				t.Fatalf("round %d: a claimed record is unconfirmed", i)
			}
		case deleting:
			wins["delete"]++
			if !errors.Is(err, ErrTaskNotFound) || !errors.Is(claimErr, ErrTaskNotFound) {
				t.Fatalf("round %d: deleted, but Get = %v and the claim = %v", i, err, claimErr)
			}
		default:
			wins["fail"]++
			if err != nil || got.Status != StatusFailed || !got.ExecutionClaimedAt.IsZero() || !errors.Is(claimErr, ErrTerminal) {
				t.Fatalf("round %d: failed, but the record is %s, claimed at %v (%v), claim %v", i, got.Status, got.ExecutionClaimedAt, err, claimErr)
			}
		}
		// The fence is taken once: another attempt is refused, the same
		// one (retrying a write whose answer it lost) finds it its own.
		if claimErr == nil {
			if err := s.ClaimExecution(ctx, r.TaskID, "exe_b"); !errors.Is(err, ErrExecutionClaimed) {
				t.Fatalf("round %d: another attempt's claim = %v, want ErrExecutionClaimed", i, err)
			}
			if err := s.ClaimExecution(ctx, r.TaskID, "exe_a"); err != nil {
				t.Fatalf("round %d: the same attempt's claim again = %v, want nil", i, err)
			}
			if got, err := s.Get(ctx, r.TaskID); err != nil || got.ExecutionClaim != "exe_a" {
				t.Fatalf("round %d: the fence is %q (%v), want exe_a's", i, got.ExecutionClaim, err)
			}
		}
	}
	t.Logf("wins over %d rounds: %v", rounds, wins)
}

// Recent reads at most MaxRecentReads records, newest first.
func TestRecentReadsABoundedNumberOfRecords(t *testing.T) {
	if testing.Short() {
		t.Skip("creates over a thousand records")
	}
	s := newStore(t)
	ctx := context.Background()
	base := time.Now().UTC()
	for i := range MaxRecentReads + 10 {
		r := newRecord("alice")
		r.CreatedAt = base.Add(-time.Duration(i) * time.Second)
		r.TTL = 2 * time.Hour
		if err := s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	visited := 0
	last := base.Add(time.Hour)
	err := s.Recent(ctx, "alice", base.Add(-time.Hour), func(r Record) bool {
		if r.CreatedAt.After(last) {
			t.Fatalf("not newest first: %v after %v", r.CreatedAt, last)
		}
		last = r.CreatedAt
		visited++
		return true
	})
	if err != nil || visited != MaxRecentReads {
		t.Errorf("visited %d, %v; want %d", visited, err, MaxRecentReads)
	}
}
