package approvals_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
)

// The service's own rules, over the in-memory engine (approvalstest): task
// creation and its compensation, the limits, ownership and the errors the
// adapters map.

func TestOpenCompensatesAFailedStart(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	// A cap of one: a reservation left behind would refuse the retry.
	svc := f.service(t, func(o *approvals.Options) { o.MaxPendingPerPrincipal = 1 })
	boom := errors.New("temporal unavailable")

	t.Run("not started", func(t *testing.T) {
		// The task is answered before its workflow starts; the start
		// fails and Temporal has never heard of it: the task fails, saying
		// the tool did not run, and gives its slots back.
		c := f.call(t, "agent-nostart", "transfer_funds", transfer(5000, "no start"), 0)
		f.mem.FailNextStart(boom, false)
		o, err := svc.Open(ctx, c)
		if err != nil || o.Joined {
			t.Fatalf("Open = %+v, %v; want the task", o, err)
		}
		if err := svc.WaitStart(ctx, o.Task.TaskID); err != nil {
			t.Fatal(err)
		}
		got, err := svc.Get(ctx, c.Principal, o.Task.TaskID)
		if err != nil || got.Status != tasks.StatusFailed || got.ApprovalState != tasks.ApprovalFailed ||
			got.StatusMessage != "The task could not be started; the tool did not run." || got.Error == nil {
			t.Fatalf("task after the failed start: %+v, %v", got, err)
		}
		if ok, _ := f.engine.Running(ctx, o.Task.TaskID); ok {
			t.Error("a workflow runs for the failed task")
		}
		if n, err := f.store.PendingReserved(ctx, c.Principal); err != nil || n != 0 {
			t.Errorf("pending reservations left: %d (%v)", n, err)
		}
		// The same call again is a fresh task: no dedup slot, no
		// reservation was left behind.
		retry, err := svc.Open(ctx, c)
		if err != nil || retry.Joined || retry.Task.TaskID == o.Task.TaskID {
			t.Fatalf("retry: %+v, %v", retry, err)
		}
		if err := svc.WaitStart(ctx, retry.Task.TaskID); err != nil {
			t.Fatal(err)
		}
		if ok, _ := f.engine.Running(ctx, retry.Task.TaskID); !ok {
			t.Error("the retry's workflow is not running")
		}
	})
	t.Run("started all the same", func(t *testing.T) {
		// The start took effect but its answer was lost: the workflow
		// exists, so the task stands.
		c := f.call(t, "agent-lostanswer", "transfer_funds", transfer(5000, "lost answer"), 0)
		f.mem.FailNextStart(boom, true)
		o, err := svc.Open(ctx, c)
		if err != nil || o.Joined {
			t.Fatalf("Open = %+v, %v; want the task", o, err)
		}
		if page, _, err := f.store.List(ctx, c.Principal, "", 10); err != nil || len(page) != 1 || page[0].TaskID != o.Task.TaskID {
			t.Errorf("records: %d (%v), want the task's", len(page), err)
		}
		if again, err := svc.Open(ctx, c); err != nil || !again.Joined || again.Task.TaskID != o.Task.TaskID {
			t.Errorf("identical call: %+v, %v; want to join %s", again, err, o.Task.TaskID)
		}
	})
}

func TestOpenJoinsAnIdenticalPendingCall(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	c := f.call(t, "agent-dedup", "transfer_funds", transfer(5000, "dedup"), 0)
	first := f.open(t, c)
	o, err := f.svc.Open(ctx, c)
	if err != nil || !o.Joined || o.Task.TaskID != first.TaskID {
		t.Fatalf("identical call: %+v, %v; want to join %s", o, err, first.TaskID)
	}
	// Another principal's identical call is its own.
	other := c
	other.Principal = "agent-dedup-2"
	if o, err := f.svc.Open(ctx, other); err != nil || o.Joined {
		t.Errorf("another principal: %+v, %v", o, err)
	}
	// Once the task has ended, the call is a new task.
	if _, _, err := f.svc.Cancel(ctx, first.Owner, first.TaskID); err != nil {
		t.Fatal(err)
	}
	if o, err := f.svc.Open(ctx, c); err != nil || o.Joined || o.Task.TaskID == first.TaskID {
		t.Errorf("after the end: %+v, %v", o, err)
	}
	// Two identical unattended calls are two jobs.
	job := f.call(t, "agent-dedup", "transfer_funds", transfer(10, "job"), time.Hour)
	a, b := f.open(t, job), f.open(t, job)
	if a.TaskID == b.TaskID {
		t.Error("identical unattended calls share a task")
	}
}

func TestOpenLimits(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	tests := []struct {
		name   string
		limits func(*approvals.Options)
	}{
		{"pending cap", func(o *approvals.Options) { o.MaxPendingPerPrincipal = 1 }},
		{"creation rate", func(o *approvals.Options) { o.RatePerMinute, o.Burst = 1, 1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := f.service(t, tt.limits)
			p := "agent-" + t.Name()
			if _, err := svc.Open(ctx, f.call(t, p, "transfer_funds", transfer(5000, "first"), 0)); err != nil {
				t.Fatal(err)
			}
			_, err := svc.Open(ctx, f.call(t, p, "transfer_funds", transfer(5000, "second"), 0))
			var refused *approvals.Refused
			if !errors.As(err, &refused) || refused.Reason == "" {
				t.Fatalf("second call: %v, want *Refused", err)
			}
			if page, _, err := f.store.List(ctx, p, "", 10); err != nil || len(page) != 1 {
				t.Errorf("records: %d (%v), want only the first", len(page), err)
			}
			if n, err := f.store.PendingReserved(ctx, p); err != nil || n != 1 {
				t.Errorf("pending reservations: %d (%v), want 1", n, err)
			}
		})
	}
}

func TestOpenChecksThePolicyDecision(t *testing.T) {
	f := newFixture(t, nil)
	approval := f.call(t, "agent-mode", "transfer_funds", transfer(5000, "mode"), 0)
	job := f.call(t, "agent-mode", "transfer_funds", transfer(10, "mode"), time.Second)
	approval.Policy.Effect, job.Policy.Effect = pdp.EffectAllow, pdp.EffectRequestable
	unknown := job
	unknown.Mode = "sometime"
	for _, c := range []approvals.Call{approval, job, unknown} {
		if _, err := f.svc.Open(context.Background(), c); err == nil {
			t.Errorf("%s call with effect %s opened", c.Mode, c.Policy.Effect)
		}
	}
	if page, _, _ := f.store.List(context.Background(), "agent-mode", "", 10); len(page) != 0 {
		t.Errorf("%d records stored", len(page))
	}
}

func TestCompleted(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	c := f.call(t, "agent-completed", "transfer_funds", transfer(10, "done"), 0)
	result := tasks.Outcome(tasks.DeniedNotExecuted, c.Tool, "Denied by policy.", nil)
	rec, err := f.svc.Completed(ctx, c, result)
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.svc.Await(ctx, c.Principal, rec.TaskID)
	if err != nil || got.Status != tasks.StatusCompleted || got.Disposition != tasks.DeniedNotExecuted {
		t.Fatalf("task: %s %s (%v)", got.Status, got.Disposition, err)
	}
	var stored tasks.CallToolResult
	if err := json.Unmarshal(got.Result, &stored); err != nil || !stored.IsError {
		t.Errorf("result %s (%v)", got.Result, err)
	}
	if n, _ := f.store.PendingReserved(ctx, c.Principal); n != 0 {
		t.Errorf("a completed task holds %d pending reservations", n)
	}
}

func TestOwnership(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	mine := f.open(t, f.call(t, "agent-owner", "transfer_funds", transfer(5000, "mine"), 0))
	theirs := f.open(t, f.call(t, "agent-other", "transfer_funds", transfer(5000, "theirs"), 0))

	for _, id := range []string{theirs.TaskID, tasks.NewID("tsk_"), "not-an-id"} {
		if _, err := f.svc.Get(ctx, mine.Owner, id); !errors.Is(err, approvals.ErrNotFound) {
			t.Errorf("Get(%s) = %v, want ErrNotFound", id, err)
		}
		if _, _, err := f.svc.Cancel(ctx, mine.Owner, id); !errors.Is(err, approvals.ErrNotFound) {
			t.Errorf("Cancel(%s) = %v, want ErrNotFound", id, err)
		}
		if err := f.svc.ProvideInput(ctx, mine.Owner, id, map[string]json.RawMessage{"a": json.RawMessage(`1`)}); !errors.Is(err, approvals.ErrNotFound) {
			t.Errorf("ProvideInput(%s) = %v, want ErrNotFound", id, err)
		}
	}
	if got, err := f.svc.Get(ctx, theirs.Owner, theirs.TaskID); err != nil || got.Status.Terminal() {
		t.Errorf("their task after my attempts: %s (%v)", got.Status, err)
	}

	for _, cursor := range []string{theirs.TaskID, tasks.NewID("tsk_")} {
		if _, _, err := f.svc.List(ctx, mine.Owner, cursor, 10); !errors.Is(err, approvals.ErrUnknownCursor) {
			t.Errorf("List after %s = %v, want ErrUnknownCursor", cursor, err)
		}
	}
	page, next, err := f.svc.List(ctx, mine.Owner, "", 10)
	if err != nil || len(page) != 1 || page[0].TaskID != mine.TaskID || next != "" {
		t.Errorf("List = %d records, next %q (%v)", len(page), next, err)
	}
	if page, _, err := f.svc.List(ctx, mine.Owner, mine.TaskID, 10); err != nil || len(page) != 0 {
		t.Errorf("List after my last task = %d records (%v)", len(page), err)
	}
}

func TestGetExpired(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	svc := f.service(t, func(o *approvals.Options) { o.ResultRetention = time.Minute })
	c := f.call(t, "agent-expired", "transfer_funds", transfer(5000, "expired"), 0)
	o, err := svc.Open(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	// A day and a minute later (the approval's TTL and the retention).
	later := f.service(t, func(o *approvals.Options) {
		o.Now = func() time.Time { return time.Now().Add(c.Policy.ApprovalTTL + 2*time.Minute) }
	})
	if _, err := later.Get(ctx, c.Principal, o.Task.TaskID); !errors.Is(err, approvals.ErrExpired) {
		t.Errorf("Get = %v, want ErrExpired", err)
	}
	if _, err := svc.Get(ctx, c.Principal, o.Task.TaskID); err != nil {
		t.Errorf("Get before it expired = %v", err)
	}
}

func TestDecisionErrors(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	ann := f.enroll(t, "ann", "approvers")
	rec := f.open(t, f.call(t, "agent-decide", "transfer_funds", transfer(5000, "decide"), 0))

	if _, err := f.svc.Challenge(ctx, rec.ApprovalRef, "maybe"); !errors.Is(err, approvals.ErrInvalidDecision) {
		t.Errorf("Challenge(maybe) = %v, want ErrInvalidDecision", err)
	}
	d := f.sign(t, ann, rec.ApprovalRef, tasks.DecisionApprove)
	d.Decision = "maybe"
	if _, err := f.svc.Decide(ctx, rec.ApprovalRef, d); !errors.Is(err, approvals.ErrInvalidDecision) {
		t.Errorf("Decide(maybe) = %v, want ErrInvalidDecision", err)
	}
	for _, ref := range []string{tasks.NewID("apr_"), "../etc"} {
		if _, err := f.svc.Decide(ctx, ref, d); !errors.Is(err, approvals.ErrNotFound) {
			t.Errorf("Decide(%s) = %v, want ErrNotFound", ref, err)
		}
		if _, err := f.svc.Challenge(ctx, ref, tasks.DecisionApprove); !errors.Is(err, approvals.ErrNotFound) {
			t.Errorf("Challenge(%s) = %v, want ErrNotFound", ref, err)
		}
		if _, err := f.svc.View(ctx, ref); !errors.Is(err, approvals.ErrNotFound) {
			t.Errorf("View(%s) = %v, want ErrNotFound", ref, err)
		}
	}
	if _, _, err := f.svc.Cancel(ctx, rec.Owner, rec.TaskID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Challenge(ctx, rec.ApprovalRef, tasks.DecisionApprove); !errors.Is(err, approvals.ErrNotPending) {
		t.Errorf("Challenge on a cancelled task = %v, want ErrNotPending", err)
	}
	if err := f.svc.DenyUnsigned(ctx, rec.ApprovalRef, ann.id, "slack:U1", time.Now()); !errors.Is(err, approvals.ErrNotPending) {
		t.Errorf("DenyUnsigned on a cancelled task = %v, want ErrNotPending", err)
	}
}

// TestLongDisplayTextIsDecidable: a record whose display text is longer
// than a challenge takes (stored before new calls' texts were cut) can still
// be decided: the challenge carries the text cut, and the approval counts.
func TestLongDisplayTextIsDecidable(t *testing.T) {
	f := newFixture(t, nil)
	ann := f.enroll(t, "ann", "approvers")
	c := f.call(t, "agent-long", "transfer_funds", transfer(5000, "long"), 0)
	c.DisplayText = "Transfer " + strings.Repeat("€", 3000) // 9,009 bytes
	rec := f.open(t, c)
	ch, err := f.svc.Challenge(context.Background(), rec.ApprovalRef, tasks.DecisionApprove)
	if err != nil {
		t.Fatalf("challenge: %v", err)
	}
	if n := len(ch.DisplayText); n > 4096 || !utf8.ValidString(ch.DisplayText) || !strings.HasSuffix(ch.DisplayText, "…") {
		t.Fatalf("the challenge's display text: %d bytes, valid UTF-8 %t", n, utf8.ValidString(ch.DisplayText))
	}
	v, err := f.svc.Decide(context.Background(), rec.ApprovalRef, f.sign(t, ann, rec.ApprovalRef, tasks.DecisionApprove))
	if err != nil || !v.Accepted {
		t.Fatalf("decide: %+v %v", v, err)
	}
	if final := f.await(t, rec); final.Disposition != tasks.ApprovedExecuted {
		t.Fatalf("end: %s %s", final.Status, final.Disposition)
	}
}

func TestReconcileFailsOrphans(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	running := f.open(t, f.call(t, "agent-reconcile", "transfer_funds", transfer(5000, "running"), 0))
	// Orphans: their records were written, then the process died before
	// the workflow started. One holds what its start needs (every record
	// Open writes now): it is resumed. The other does not (a record written
	// before tasks.Record.Start): it is failed.
	orphan := running
	orphan.TaskID, orphan.ApprovalRef, orphan.DedupKey = tasks.NewID("tsk_"), tasks.NewID("apr_"), ""
	orphan.CreatedAt = time.Now().Add(-time.Hour)
	orphan.Timeline = nil
	resumable := orphan
	resumable.TaskID, resumable.ApprovalRef = tasks.NewID("tsk_"), tasks.NewID("apr_")
	orphan.Start = nil
	if running.Start == nil {
		t.Fatal("Open wrote a record without its start facts")
	}
	for _, r := range []tasks.Record{orphan, resumable} {
		if err := f.store.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	n, err := f.svc.Reconcile(ctx, time.Minute)
	if err != nil || n != 1 {
		t.Fatalf("Reconcile = %d, %v; want 1", n, err)
	}
	if ok, _ := f.engine.Running(ctx, resumable.TaskID); !ok {
		t.Error("the resumable orphan's workflow does not run")
	}
	if got, err := f.svc.Get(ctx, resumable.Owner, resumable.TaskID); err != nil || got.Status.Terminal() {
		t.Errorf("resumable orphan: %s (%v)", got.Status, err)
	}
	got, err := f.svc.Get(ctx, orphan.Owner, orphan.TaskID)
	if err != nil || got.Status != tasks.StatusFailed || got.ApprovalState != tasks.ApprovalFailed {
		t.Errorf("orphan: %s %s (%v)", got.Status, got.ApprovalState, err)
	}
	// A task whose workflow runs is left alone, however old.
	if got, err := f.svc.Get(ctx, running.Owner, running.TaskID); err != nil || got.Status.Terminal() {
		t.Errorf("running task: %s (%v)", got.Status, err)
	}
	if n, err := f.svc.Reconcile(ctx, 0); err != nil || n != 0 {
		t.Errorf("second Reconcile = %d, %v; want 0", n, err)
	}
}

// orphan writes what a crash between Open's two steps leaves: the record of
// c's task, created age ago, holding c's dedup slot, with no workflow. With
// noRef the crash also came before the record's approval-reference index.
func (f *fixture) orphan(t *testing.T, c approvals.Call, age time.Duration, noRef bool) tasks.Record {
	t.Helper()
	ctx := context.Background()
	rec := tasks.Record{
		TaskID: tasks.NewID("tsk_"), Owner: c.Principal, Era: c.Era, Status: tasks.StatusWorking,
		StatusMessage: "Awaiting approval", CreatedAt: time.Now().Add(-age).UTC(), LastUpdatedAt: time.Now().Add(-age).UTC(),
		TTL: time.Hour, PollInterval: time.Second, Tool: c.Tool, Arguments: c.Arguments, ActionHash: c.ActionHash,
		DisplayText: c.DisplayText, ApprovalRef: tasks.NewID("apr_"), ApprovalState: tasks.ApprovalPending,
		Requirement: tasks.Requirement{Group: c.Policy.ApproverGroup, Quorum: c.Policy.Quorum, TTL: c.Policy.ApprovalTTL, AuthenticatorClass: c.Policy.AuthenticatorClass},
		ExpiresAt:   time.Now().Add(-age + c.Policy.ApprovalTTL).UTC(),
		DedupKey:    tasks.DedupKey(c.Principal, c.ActionHash),
	}
	if other, err := f.store.ClaimDedup(ctx, rec.DedupKey, rec.TaskID); err != nil || other != "" {
		t.Fatalf("ClaimDedup = %q, %v", other, err)
	}
	if err := f.store.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if noRef {
		kv, err := f.js.KeyValue(ctx, tasks.Bucket)
		if err != nil {
			t.Fatal(err)
		}
		if err := kv.Delete(ctx, "r."+rec.ApprovalRef); err != nil {
			t.Fatal(err)
		}
		if _, err := f.store.ByRef(ctx, rec.ApprovalRef); !errors.Is(err, tasks.ErrTaskNotFound) {
			t.Fatalf("ByRef of an orphan without its index = %v", err)
		}
	}
	return rec
}

// An identical call that joins the orphan of a crash (a record whose
// workflow never started, the approval-reference index missing too) starts
// its workflow: the task becomes approvable instead of sitting "working"
// until the reconciler fails it. It waits until the record is old enough
// to judge; a confirmed task is joined as it is.
func TestJoinResumesOrphan(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	c := f.call(t, "agent-resume", "transfer_funds", transfer(5000, "orphan"), 0)
	orphan := f.orphan(t, c, 0, true)
	t0 := time.Now()
	o, err := f.svc.Open(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Joined || o.Task.TaskID != orphan.TaskID {
		t.Fatalf("Open = %s (joined %v), want to join the orphan %s", o.Task.TaskID, o.Joined, orphan.TaskID)
	}
	if waited := time.Since(t0); waited < time.Second {
		t.Errorf("a young orphan was resumed after %v: its own Open may still be starting it", waited)
	}
	if running, _ := f.mem.Running(ctx, orphan.TaskID); !running {
		t.Fatal("the joined orphan's workflow was not started")
	}
	got, err := f.store.ByRef(ctx, orphan.ApprovalRef)
	if err != nil {
		t.Fatalf("approval page of the resumed task: %v", err)
	}
	if got.StartAttemptAt.IsZero() {
		t.Error("resume did not mark its start attempt")
	}
	if _, err := f.svc.View(ctx, orphan.ApprovalRef); err != nil {
		t.Errorf("View: %v", err)
	}
	// The reconciler leaves it alone, and a later identical call joins it.
	if n, err := f.svc.Reconcile(ctx, 0); err != nil || n != 0 {
		t.Errorf("Reconcile = %d, %v; want 0", n, err)
	}
	if o, err := f.svc.Open(ctx, c); err != nil || !o.Joined || o.Task.TaskID != orphan.TaskID {
		t.Errorf("second identical call: %s joined %v, %v", o.Task.TaskID, o.Joined, err)
	}
	// The approval runs it once.
	ann := f.enroll(t, "ann", "approvers")
	if v, err := f.svc.Decide(ctx, got.ApprovalRef, f.sign(t, ann, got.ApprovalRef, tasks.DecisionApprove)); err != nil || !v.Accepted {
		t.Fatalf("approve the resumed task: %+v, %v", v, err)
	}
	final := f.await(t, got)
	if final.Disposition != tasks.ApprovedExecuted {
		t.Errorf("resumed task ended %s/%s", final.Status, final.Disposition)
	}
}

// Resume and the reconciler judge the same orphan at the same instant, many
// times: 20 identical calls join an orphan older than the reconciler's grace
// while it runs. Either the reconciler failed the record and no workflow
// exists, or the record lives and exactly one workflow runs it; never a
// failed task whose workflow goes on (a tool that could run under a
// "failed" task).
func TestResumeRacesReconcile(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	outcomes := map[string]int{}
	for round := range 50 {
		c := f.call(t, "agent-race", "transfer_funds", transfer(5000, fmt.Sprintf("race-%d", round)), 0)
		orphan := f.orphan(t, c, 2*time.Minute, false)
		if round%2 == 1 {
			// Every other round the record holds its start facts, as
			// Open writes them: the reconciler resumes it too.
			if _, err := f.store.Update(ctx, orphan.TaskID, func(r *tasks.Record) error {
				r.Start = &tasks.StartFacts{Mode: tasks.ModeApproval, ServerID: c.ServerID, PolicyVersion: c.Policy.PolicyVersion}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		joined := make([]string, 20)
		errs := make([]error, 20)
		for i := range joined {
			wg.Go(func() {
				<-start
				o, err := f.svc.Open(ctx, c)
				joined[i], errs[i] = o.Task.TaskID, err
			})
		}
		wg.Go(func() {
			<-start
			if _, err := f.svc.Reconcile(ctx, time.Minute); err != nil {
				t.Errorf("round %d: Reconcile: %v", round, err)
			}
		})
		close(start)
		wg.Wait()
		rec, err := f.store.Get(ctx, orphan.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		running, _ := f.mem.Running(ctx, orphan.TaskID)
		switch {
		case rec.Status == tasks.StatusFailed && !running:
			outcomes["failed by the reconciler"]++
		case !rec.Status.Terminal() && running:
			outcomes["resumed"]++
		default:
			t.Errorf("round %d: record %s, workflow running %v", round, rec.Status, running)
		}
		for i, id := range joined {
			if errs[i] == nil && id != orphan.TaskID && !rec.Status.Terminal() {
				t.Errorf("round %d: a call opened %s beside the live task %s", round, id, orphan.TaskID)
			}
		}
	}
	t.Logf("50 rounds: %v", outcomes)
}
