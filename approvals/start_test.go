package approvals_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/approvals/approvalstest"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
)

// The workflow starts after the answer (start.go): what a task's doors do
// while its start is in flight, in this process and in another.

// gatedEngine holds every workflow start until its gate opens.
type gatedEngine struct {
	approvals.Engine
	gate chan struct{}
}

func (g gatedEngine) Start(ctx context.Context, in tasks.ApprovalInput) error {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.Engine.Start(ctx, in)
}

func TestOpenAnswersBeforeTheStart(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	gate := make(chan struct{})
	opened := false
	open := func() {
		if !opened {
			opened = true
			close(gate)
		}
	}
	t.Cleanup(open)
	// A: the process whose start is held; B: another, on the same
	// stores and Temporal, with no start of its own in flight.
	a := f.service(t, func(o *approvals.Options) {
		o.Engine = gatedEngine{Engine: f.engine, gate: gate}
		o.RatePerMinute, o.Burst = 1000, 1000
	})
	b := f.service(t, nil)

	local := f.call(t, "agent-local", "transfer_funds", transfer(5000, "cancelled in A"), 0)
	remote := f.call(t, "agent-remote", "transfer_funds", transfer(5000, "cancelled in B"), 0)
	var recs []tasks.Record
	for _, c := range []approvals.Call{local, remote} {
		o, err := a.Open(ctx, c)
		if err != nil || o.Joined {
			t.Fatalf("Open = %+v, %v", o, err)
		}
		recs = append(recs, o.Task)
		// Answered while the start is held: the record is there, the
		// workflow is not.
		if got, err := a.Get(ctx, c.Principal, o.Task.TaskID); err != nil || got.Status != tasks.StatusWorking {
			t.Fatalf("tasks/get before the start: %+v, %v", got, err)
		}
		if ok, _ := f.engine.Running(ctx, o.Task.TaskID); ok {
			t.Fatal("the workflow started before the gate opened")
		}
	}

	// Both cancels arrive before the workflows exist: A's waits for its
	// own start, B's for the workflow to appear. Neither answers first.
	type answer struct {
		rec       tasks.Record
		cancelled bool
		err       error
	}
	answers := make(chan answer, 2)
	for i, svc := range []*approvals.Service{a, b} {
		go func() {
			rec, cancelled, err := svc.Cancel(ctx, recs[i].Owner, recs[i].TaskID)
			answers <- answer{rec, cancelled, err}
		}()
	}
	select {
	case got := <-answers:
		t.Fatalf("a cancel answered before its task's workflow started: %+v", got)
	case <-time.After(200 * time.Millisecond):
	}
	// Drain waits for the starts in flight.
	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := a.Drain(dctx); err == nil {
		t.Error("Drain returned with starts in flight")
	}
	open()
	for range 2 {
		got := <-answers
		if got.err != nil || !got.cancelled || got.rec.Status != tasks.StatusCancelled {
			t.Errorf("cancel: %+v", got)
		}
	}
	for _, r := range recs {
		final := f.await(t, r)
		if final.Status != tasks.StatusCancelled {
			t.Errorf("task %s ended %s, want cancelled", r.TaskID, final.Status)
		}
	}
	if err := a.Drain(ctx); err != nil {
		t.Errorf("Drain after the starts: %v", err)
	}
}

func TestOpenBoundsStartsInFlight(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	gate := make(chan struct{})
	svc := f.service(t, func(o *approvals.Options) {
		o.Engine = gatedEngine{Engine: f.engine, gate: gate}
		o.RatePerMinute, o.Burst = 1000, 1000
	})
	const bound = 32 // maxStartsInFlight
	for i := range bound {
		if _, err := svc.Open(ctx, f.call(t, fmt.Sprintf("agent-%d", i), "transfer_funds", transfer(5000, "held"), 0)); err != nil {
			t.Fatal(err)
		}
	}
	// One more waits for a slot, and leaves nothing behind if its caller
	// gives up first.
	c := f.call(t, "agent-late", "transfer_funds", transfer(5000, "late"), 0)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := svc.Open(short, c); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Open past the bound: %v, want to wait for a slot until its deadline", err)
	}
	if page, _, err := f.store.List(ctx, c.Principal, "", 10); err != nil || len(page) != 0 {
		t.Errorf("records left by the call that gave up: %d (%v)", len(page), err)
	}
	// The next one waits, and goes through once a start ends.
	done := make(chan error, 1)
	go func() {
		_, err := svc.Open(ctx, c)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("Open past the bound answered at once: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := svc.Drain(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestReconcileResumesAnOrphanFromItsRecord(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	// A answers the call, then its start hangs: as if A died before it.
	gate := make(chan struct{})
	t.Cleanup(func() { close(gate) })
	a := f.service(t, func(o *approvals.Options) { o.Engine = gatedEngine{Engine: f.engine, gate: gate} })
	c := f.call(t, "agent-orphan", "transfer_funds", transfer(5000, "orphan"), 0)
	c.Subject = map[string]any{"auth": "oauth", "scopes": []any{"payments"}}
	o, err := a.Open(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	// B, another process, reconciles. Too young: left alone.
	rec := &approvalstest.Recording{Engine: f.engine}
	clock := time.Now()
	b := f.service(t, func(o *approvals.Options) {
		o.Engine = rec
		o.Now = func() time.Time { return clock }
	})
	// It says so, so the app runs a second round soon; A, whose start is
	// in flight, has nothing left for later.
	if r, err := b.ReconcileRound(ctx, time.Minute); err != nil || r != (approvals.Round{Young: 1}) {
		t.Fatalf("reconcile: %+v, %v; want one young record", r, err)
	}
	if r, err := a.ReconcileRound(ctx, time.Minute); err != nil || r != (approvals.Round{}) {
		t.Fatalf("reconcile in the starting process: %+v, %v; want nothing", r, err)
	}
	if len(rec.Inputs()) != 0 {
		t.Fatal("a record 0 s old was resumed")
	}
	// 3 s later it is resumed, from its record alone, as A would have
	// started it; a second round changes nothing.
	clock = clock.Add(3 * time.Second)
	for range 2 {
		if r, err := b.ReconcileRound(ctx, time.Minute); err != nil || r != (approvals.Round{}) {
			t.Fatalf("reconcile: %+v, %v", r, err)
		}
	}
	inputs := rec.Inputs()
	if len(inputs) != 1 {
		t.Fatalf("%d starts, want 1", len(inputs))
	}
	in, task := inputs[0], o.Task
	env := in.Envelope
	if env.TaskID != task.TaskID || env.Principal != c.Principal || env.Tool != c.Tool || string(env.Arguments) != string(c.Arguments) ||
		env.ActionHash != c.ActionHash || env.ServerID != c.ServerID || env.PolicyVersion != c.Policy.PolicyVersion ||
		!env.CreatedAt.Equal(c.At) || fmt.Sprint(env.Subject) != fmt.Sprint(c.Subject) {
		t.Errorf("envelope %+v, want the call's %+v", env, c)
	}
	if in.Mode != tasks.ModeApproval || in.ApprovalRef != task.ApprovalRef || in.Requirement != task.Requirement || !in.ExpiresAt.Equal(task.ExpiresAt) {
		t.Errorf("input %+v, want the record's approval", in)
	}
	if ok, _ := f.engine.Running(ctx, task.TaskID); !ok {
		t.Fatal("the orphan's workflow does not run")
	}
	// The task is an approval like any other: a cancel ends it.
	if got, cancelled, err := b.Cancel(ctx, c.Principal, task.TaskID); err != nil || !cancelled || got.Status != tasks.StatusCancelled {
		t.Errorf("cancel: %+v %v %v", got.Status, cancelled, err)
	}
}

// TestDoorResumesAnOrphan: a door in another process that finds an orphan
// (its record 40 s old, no workflow, its own start hung) resumes it and
// sends the update to it. Answering from the record instead ("not
// cancelled") would be false: the reconciler would resume the task a
// moment later and it would run.
func TestDoorResumesAnOrphan(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	gate := make(chan struct{})
	t.Cleanup(func() { close(gate) })
	a := f.service(t, func(o *approvals.Options) { o.Engine = gatedEngine{Engine: f.engine, gate: gate} })
	clock := time.Now().Add(40 * time.Second)
	b := f.service(t, func(o *approvals.Options) { o.Now = func() time.Time { return clock } })
	for _, tc := range []struct {
		name  string
		args  string
		delay time.Duration
	}{
		{"approval", transfer(5000, "orphan cancel"), 0},
		{"unattended", transfer(10, "orphan job"), time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := f.call(t, "agent-orphan-"+tc.name, "transfer_funds", tc.args, tc.delay)
			o, err := a.Open(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			got, cancelled, err := b.Cancel(ctx, c.Principal, o.Task.TaskID)
			if err != nil || !cancelled || got.Status != tasks.StatusCancelled {
				t.Fatalf("cancel of an orphan: %s, cancelled %v, %v; want it cancelled", got.Status, cancelled, err)
			}
			if r, err := b.ReconcileRound(ctx, time.Minute); err != nil || r.Failed != 0 {
				t.Fatalf("reconcile: %+v, %v", r, err)
			}
			final := f.await(t, o.Task)
			if final.Status != tasks.StatusCancelled || f.effects(t, o.Task.TaskID) != 0 {
				t.Errorf("after the cancel: %s, %d effects; want cancelled, none", final.Status, f.effects(t, o.Task.TaskID))
			}
		})
	}
}

// failedStart holds every workflow start until its gate opens, then fails
// it without starting anything.
type failedStart struct {
	approvals.Engine
	gate chan struct{}
	err  error
}

func (g failedStart) Start(ctx context.Context, in tasks.ApprovalInput) error {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.err
}

// TestVerifiedFailedStartSparesAResumedRecord: a verified call's start
// fails in process A while the call's signed retry, in process B, has
// already resumed the record and is starting its workflow. A's undo must
// leave the record alone: deleting it would hide a task whose workflow
// runs the call.
func TestVerifiedFailedStartSparesAResumedRecord(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	gateA, gateB := make(chan struct{}), make(chan struct{})
	a := f.service(t, func(o *approvals.Options) {
		o.Engine = failedStart{Engine: f.engine, gate: gateA, err: errors.New("temporal unavailable")}
	})
	clock := time.Now().Add(3 * time.Second) // B sees the record old enough to resume
	b := f.service(t, func(o *approvals.Options) {
		o.Engine = gatedEngine{Engine: f.engine, gate: gateB}
		o.Now = func() time.Time { return clock }
	})
	c := f.call(t, "agent-verified", "transfer_funds", transfer(5000, "verified"), 0)
	c.Mode, c.TaskID = tasks.ModeVerified, tasks.NewID("tsk_")
	c.Policy.Effect = pdp.EffectVerify
	c.Verified = &tasks.VerifiedApproval{ApproverID: "apv_1", ApproverName: "alice", CredentialID: "cred", ChallengeID: "ch", At: c.At}

	aDone := make(chan error, 1)
	go func() { _, err := a.Open(ctx, c); aDone <- err }()
	task := tasks.Record{TaskID: c.TaskID, Owner: c.Principal}
	f.waitFor(t, task, "A's record", func(tasks.Record) bool { return true })
	bDone := make(chan error, 1)
	go func() { _, err := b.Open(ctx, c); bDone <- err }()
	f.waitFor(t, task, "B's resume mark", func(r tasks.Record) bool { return !r.StartAttemptAt.IsZero() })
	close(gateA)
	if err := <-aDone; err == nil {
		t.Fatal("A's Open succeeded; its start failed")
	}
	if _, err := f.store.Get(ctx, c.TaskID); err != nil {
		t.Fatalf("A's failed start took the resumed record with it: %v", err)
	}
	close(gateB)
	if err := <-bDone; err != nil {
		t.Fatalf("B's resume: %v", err)
	}
	if final := f.await(t, task); !final.Status.Terminal() {
		t.Errorf("the resumed task: %s", final.Status)
	}
}

// lateStart gives up on every workflow start (a deadline) while the start
// lands on the server a moment later all the same.
type lateStart struct{ approvals.Engine }

func (g lateStart) Start(ctx context.Context, in tasks.ApprovalInput) error {
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = g.Engine.Start(context.WithoutCancel(ctx), in)
	}()
	return fmt.Errorf("start: %w", context.DeadlineExceeded)
}

// TestStartThatLandsLate: a start the client gave up on lands after the
// error. The task must not be failed ("the tool did not run") while its
// workflow runs.
func TestStartThatLandsLate(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	svc := f.service(t, func(o *approvals.Options) { o.Engine = lateStart{Engine: f.engine} })
	c := f.call(t, "agent-late", "transfer_funds", transfer(5000, "late start"), 0)
	o, err := svc.Open(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.WaitStart(ctx, o.Task.TaskID); err != nil {
		t.Fatal(err)
	}
	got, err := svc.Get(ctx, c.Principal, o.Task.TaskID)
	if err != nil || got.Status.Terminal() {
		t.Fatalf("task whose start landed late: %s (%v); want it pending", got.Status, err)
	}
	if ok, _ := f.engine.Running(ctx, o.Task.TaskID); !ok {
		t.Fatal("no workflow")
	}
}

// landsAfterFailure gives up on every workflow start (a deadline), and the
// start reaches the engine all the same, but only once the task has been
// judged never started and failed: a start later than any settle.
type landsAfterFailure struct {
	approvals.Engine
	store  *tasks.Store
	landed chan error
}

func (g landsAfterFailure) Start(ctx context.Context, in tasks.ApprovalInput) error {
	go func() {
		ctx := context.WithoutCancel(ctx)
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if r, err := g.store.Get(ctx, in.Envelope.TaskID); err == nil && r.Status.Terminal() {
				break
			}
		}
		g.landed <- g.Engine.Start(ctx, in)
	}()
	return fmt.Errorf("start: %w", context.DeadlineExceeded)
}

// TestStartThatLandsAfterItsTaskFailed: a task whose start was judged
// failed ("the tool did not run") and whose workflow reaches the engine
// later all the same never runs its tool: the workflow finds the record's
// execution fence refused (tasks.Store.ClaimExecution) and ends, as the
// record says, failed and not run. An unattended call, which runs at once,
// is the sharp case; on both engines.
func TestStartThatLandsAfterItsTaskFailed(t *testing.T) {
	for _, eng := range []struct {
		name  string
		start func(*testing.T, *activities.Activities) approvals.Engine
	}{{"temporal", temporalEngine}, {"memory", nil}} {
		t.Run(eng.name, func(t *testing.T) {
			f := newFixture(t, eng.start)
			ctx := context.Background()
			landed := make(chan error, 1)
			svc := f.service(t, func(o *approvals.Options) {
				o.Engine = landsAfterFailure{Engine: f.engine, store: f.store, landed: landed}
			})
			c := f.call(t, "agent-very-late", "transfer_funds", transfer(10, "very late start"), 0)
			o, err := svc.Open(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			if err := svc.WaitStart(ctx, o.Task.TaskID); err != nil {
				t.Fatal(err)
			}
			failed, err := svc.Get(ctx, c.Principal, o.Task.TaskID)
			if err != nil || failed.Status != tasks.StatusFailed {
				t.Fatalf("task whose start failed: %s (%v); want failed", failed.Status, err)
			}
			if err := <-landed; err != nil {
				t.Fatalf("the late start did not land: %v", err)
			}
			// The late workflow's end: its own failed event, or the tool's
			// effect (whose end the terminal record refuses).
			final := f.waitFor(t, o.Task, "the late workflow's end", func(r tasks.Record) bool {
				return count(r, tasks.EventFailed) == 2 || f.effects(t, o.Task.TaskID) > 0
			})
			if n := f.effects(t, o.Task.TaskID); n != 0 {
				t.Fatalf("the tool ran %d time(s) for a task that says it did not run", n)
			}
			if final.Status != tasks.StatusFailed || !strings.Contains(final.StatusMessage, "did not run") || !final.ExecutionClaimedAt.IsZero() {
				t.Fatalf("final record: %s %q, claimed at %v; want failed, not run, never claimed", final.Status, final.StatusMessage, final.ExecutionClaimedAt)
			}
		})
	}
}
