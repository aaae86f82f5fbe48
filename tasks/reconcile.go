package tasks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"go.temporal.io/api/serviceerror"
)

// Running reports whether the task's workflow exists in Temporal (running or
// closed). It is false only when Temporal has never heard of it.
func (o *Orchestrator) Running(ctx context.Context, taskID string) (bool, error) {
	_, err := o.c.DescribeWorkflowExecution(ctx, taskID, "")
	if err == nil {
		return true, nil
	}
	var notFound *serviceerror.NotFound
	if errors.As(err, &notFound) {
		return false, nil
	}
	return false, fmt.Errorf("tasks: describe %s: %w", taskID, err)
}

// StartMayLand reports whether a workflow start that returned err may still
// take effect on the server: the client gave up on it (a deadline, a
// cancel) or lost its connection while the request may already have
// reached Temporal. A definite refusal (an invalid request, a workflow
// that exists already) is not one.
func StartMayLand(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	var (
		deadline    *serviceerror.DeadlineExceeded
		canceled    *serviceerror.Canceled
		unavailable *serviceerror.Unavailable
	)
	return errors.As(err, &deadline) || errors.As(err, &canceled) || errors.As(err, &unavailable)
}

// WorkflowProbe tells whether a task's workflow exists: [*Orchestrator],
// or an in-memory engine in tests.
type WorkflowProbe interface {
	Running(ctx context.Context, taskID string) (bool, error)
}

// Reconcile fails the orphans of a crash: records that were created but
// whose workflow was never started (the process died between the two steps
// of task creation). Only records no workflow has written to (Seq 0) are
// checked with Temporal. Without this, such a record would stay "working" and
// its dedup slot would hand the dead task to identical calls until its TTL.
// It then repairs the pending cap with [Store.ReconcilePending]. Only
// records and reservations older than grace are considered, so a creation
// in flight is never touched. It returns how many records it failed.
func Reconcile(ctx context.Context, s *Store, o WorkflowProbe, grace time.Duration, log *slog.Logger) (int, error) {
	return ReconcileResuming(ctx, s, o, grace, nil, log)
}

// Resumer starts the workflow of an unconfirmed record, the orphan of a
// crash or a start still under way, when it can: it reports true when the
// record is not to be failed now (started, being started, or too young to
// judge).
type Resumer func(ctx context.Context, r Record) bool

// ReconcileResuming is [Reconcile] that first offers every unconfirmed
// record, whatever its age, to resume; only those it declines are failed
// once older than grace.
func ReconcileResuming(ctx context.Context, s *Store, o WorkflowProbe, grace time.Duration, resume Resumer, log *slog.Logger) (int, error) {
	n, seen, err := reconcileOrphans(ctx, s, o, grace, resume, log)
	if err != nil {
		return n, err
	}
	if _, err := s.reconcilePending(ctx, grace, seen); err != nil {
		return n, err
	}
	return n, nil
}

// alive is what a scan of the pending index learnt of the tasks whose
// records it read: whether each was not terminal. Terminal is final; a
// record read as alive may have ended since, which only keeps its
// reservation until the next round. A task whose record was missing is not
// in it: its record may have been written since (a reservation comes
// before its record), so it is read again.
type alive map[string]bool

// errNotOrphan stops reconcileOrphans' update of a record that turned out
// not to be an orphan.
var errNotOrphan = errors.New("tasks: not an orphan")

func reconcileOrphans(ctx context.Context, s *Store, o WorkflowProbe, grace time.Duration, resume Resumer, log *slog.Logger) (int, alive, error) {
	pending, err := s.pendingRecords(ctx)
	if err != nil {
		return 0, nil, err
	}
	seen := make(alive, len(pending))
	for _, r := range pending {
		seen[r.TaskID] = !r.Status.Terminal()
	}
	now := s.now()
	n := 0
	for _, r := range pending {
		if r.Status.Terminal() {
			continue
		}
		if _, ok := r.Unconfirmed(now); ok && resume != nil && resume(ctx, r) {
			continue
		}
		if age, ok := r.Unconfirmed(now); !ok || age < grace {
			// Too young to judge, or its workflow has written to it
			// (its first step publishes within milliseconds of the
			// start): the start is confirmed, and asking Temporal about
			// it would load the workflow for nothing. Only unconfirmed
			// starts are described: at 10,000 pending tasks, describing
			// every one cost ~73 s of CPU at every startup.
			continue
		}
		ok, err := o.Running(ctx, r.TaskID)
		if err != nil {
			return n, nil, err
		}
		if ok {
			continue
		}
		_, err = s.Update(ctx, r.TaskID, func(r *Record) error {
			// Judged on what was read before asking Temporal: a workflow
			// that has written since, or a resume that set out to start
			// it meanwhile (approvals: StartAttemptAt, written before its
			// start), means it is not an orphan, or no longer is.
			if age, ok := r.Unconfirmed(now); r.Status.Terminal() || !ok || age < grace {
				return errNotOrphan
			}
			FailUnstarted(r, now, "workflow was never started")
			return nil
		})
		if errors.Is(err, errNotOrphan) {
			continue
		}
		if err != nil && !errors.Is(err, ErrTerminal) {
			return n, nil, err
		}
		if log != nil {
			log.Warn("tasks: failed an orphaned task whose workflow never started", "task_id", r.TaskID)
		}
		seen[r.TaskID] = false
		n++
	}
	return n, seen, nil
}

// FailUnstarted ends r, a task whose workflow never started, as failed:
// nothing was decided and the tool did not run. detail goes on the
// timeline.
func FailUnstarted(r *Record, now time.Time, detail string) {
	r.Status = StatusFailed
	r.StatusMessage = "The task could not be started; the tool did not run."
	r.Error = &RPCError{Code: -32603, Message: "task could not be started"}
	r.ApprovalState = ApprovalFailed
	ev := NewEvent(EventFailed, detail)
	ev.At = now.UTC()
	r.Timeline = append(r.Timeline, ev)
}

// ReconcilePending repairs the pending cap after a crash (see doc.go,
// "Pending cap"). It scans, so it runs at startup and then rarely:
//
//  1. A p key older than grace is dropped when its task will never release
//     it: the record was never created (the process died between the
//     reservation and the creation), the record is terminal (it died
//     before retire gave the reservation back), or the key has been
//     "releasing" that long (it died during the release).
//  2. Each owner's counter is recounted from its keys. It is lowered to the
//     number of "held" and "releasing" keys when above it, which gives back
//     what the dropped keys held; and raised to the number of "held" keys
//     older than grace when below it (which no crash causes, but a
//     hand-edited bucket can). Young keys never raise it: they are
//     reservations in flight, and some of them will be refused.
//
// Both steps write by compare-and-set on what they read, so reservations and
// releases running meanwhile are never undone: the counter can only err on
// the high side, which makes the cap stricter, never looser. It returns how
// many counters it changed.
func (s *Store) ReconcilePending(ctx context.Context, grace time.Duration) (int, error) {
	return s.reconcilePending(ctx, grace, nil)
}

// reconcilePending is [Store.ReconcilePending] that takes from seen, what
// an earlier scan (reconcileOrphans) read of the tasks' records, and reads
// only the records of the others, after its own scan of the keys. Reading
// a record before the key's scan is safe for what seen keeps: a terminal
// record stays terminal, and a record read alive only keeps its key until
// the next round. A missing record is not in seen: it may have been
// written since, and is read again here, after the scan, as before.
func (s *Store) reconcilePending(ctx context.Context, grace time.Duration, seen alive) (int, error) {
	now := s.now()
	keys, err := s.entries(ctx, "p.>")
	if err != nil {
		return 0, err
	}
	if seen == nil {
		seen = alive{}
	}
	var aged []jetstream.KeyValueEntry
	var unknown []string
	for _, e := range keys {
		_, taskID, ok := splitPendingKey(e.Key())
		if !ok || now.Sub(e.Created()) < grace {
			continue
		}
		aged = append(aged, e)
		if _, known := seen[taskID]; !known && string(e.Value()) != pendingReleasing {
			unknown = append(unknown, taskID)
		}
	}
	got, errs := s.getMany(ctx, unknown)
	for i, err := range errs {
		switch {
		case errors.Is(err, ErrTaskNotFound):
			seen[unknown[i]] = false
		case err != nil:
			return 0, err
		default:
			seen[unknown[i]] = !got[i].Status.Terminal()
		}
	}
	for _, e := range aged {
		_, taskID, _ := splitPendingKey(e.Key())
		dead := string(e.Value()) == pendingReleasing || !seen[taskID]
		if !dead {
			continue
		}
		if err := s.kv.Delete(ctx, e.Key(), jetstream.LastRevision(e.Revision())); err != nil && !isCASConflict(err) && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return 0, fmt.Errorf("tasks: drop dead reservation %s: %w", taskID, err)
		}
		s.log.Warn("tasks: dropped a pending reservation left by a crash", "task_id", taskID, "state", string(e.Value()))
	}
	// Find the owners whose counter looks off, from one scan of the
	// counters and then one of the keys; recountPending checks each
	// exactly. An owner busy enough to hide a drift here is seen next time.
	counters, err := s.entries(ctx, "n.>")
	if err != nil {
		return 0, err
	}
	have := map[string]int{}
	for _, e := range counters {
		owner := strings.TrimPrefix(e.Key(), "n.")
		n, err := strconv.Atoi(string(e.Value()))
		if err != nil || n < 0 {
			n = math.MaxInt // corrupt: recount
		}
		have[owner] = n
	}
	if keys, err = s.entries(ctx, "p.>"); err != nil {
		return 0, err
	}
	counted, old := map[string]int{}, map[string]int{}
	for _, e := range keys {
		owner, _, ok := splitPendingKey(e.Key())
		if !ok {
			continue
		}
		c, o := classifyPending(e, grace, now)
		counted[owner] += c
		old[owner] += o
	}
	for owner := range old {
		if _, ok := have[owner]; !ok {
			have[owner] = 0 // no counter yet
		}
	}
	fixed := 0
	for owner, n := range have {
		if n <= counted[owner] && n >= old[owner] {
			continue
		}
		changed, err := s.recountPending(ctx, owner, grace, now)
		if err != nil {
			return fixed, err
		}
		if changed {
			fixed++
		}
	}
	return fixed, nil
}

// recountPending applies step 2 of [Store.ReconcilePending] to one owner.
// The counter is read before the keys are listed, and written by
// compare-and-set on that read. Every reservation counted at that read has
// its key, "held" or "releasing", throughout the listing: a key is written
// before its increment, and deleted only after its decrement, which would
// fail the write. So the count written is never below the reservations the
// counter holds.
func (s *Store) recountPending(ctx context.Context, owner string, grace time.Duration, now time.Time) (bool, error) {
	for range casRetries {
		have, rev, err := s.pendingCounter(ctx, owner)
		if errors.Is(err, errCorruptCounter) {
			have = math.MaxInt // replaced by the count below
		} else if err != nil {
			return false, err
		}
		keys, err := s.entries(ctx, "p."+owner+".>")
		if err != nil {
			return false, err
		}
		counted, old := 0, 0
		for _, e := range keys {
			c, o := classifyPending(e, grace, now)
			counted += c
			old += o
		}
		want := have
		switch {
		case have > counted:
			want = counted
		case have < old:
			want = old
		}
		if want == have {
			return false, nil
		}
		err = s.setPendingCounter(ctx, owner, want, rev)
		if isCASConflict(err) {
			continue // a reservation or release ran meanwhile: read again
		}
		if err != nil {
			return false, fmt.Errorf("tasks: recount pending: %w", err)
		}
		s.log.Warn("tasks: recounted pending reservations", "owner", owner, "was", have, "now", want)
		return true, nil
	}
	return false, fmt.Errorf("tasks: recount pending: too much contention")
}

// classifyPending says how a p key bounds its owner's counter. counted (1
// for "held" and "releasing", whose decrement may still come) bounds it from
// above; old (1 for "held" older than grace, too old to be a reservation in
// flight) from below.
func classifyPending(e jetstream.KeyValueEntry, grace time.Duration, now time.Time) (counted, old int) {
	switch string(e.Value()) {
	case pendingHeld:
		if now.Sub(e.Created()) >= grace {
			return 1, 1
		}
		return 1, 0
	case pendingReleasing:
		return 1, 0
	}
	return 0, 0
}

// splitPendingKey parses p.<owner>.<taskID>.
func splitPendingKey(k string) (owner, taskID string, ok bool) {
	rest, ok := strings.CutPrefix(k, "p.")
	if !ok {
		return "", "", false
	}
	owner, taskID, ok = strings.Cut(rest, ".")
	return owner, taskID, ok && ValidID(taskID)
}
