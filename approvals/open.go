package approvals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/countersign/countersign/internal/telemetry"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
)

// startTimeout bounds the creation of a task: the record write, and the
// durable workflow start (in the background for all but verified calls,
// see start.go), so that an unreachable Temporal fails the task instead of
// leaving it pending.
const startTimeout = 30 * time.Second

// Texts of a [Refused] call. They state plainly that nothing ran.
const (
	reasonRateLimited      = "Too many approval requests from this caller; try again later. No approval was requested."
	reasonTaskRate         = "Too many task requests from this caller; try again later."
	reasonTaskLimitUnknown = "The task request limits could not be checked, so the call did not run; try again later."
	reasonPendingCap       = "This caller has too many approval requests waiting; wait for them to finish. No approval was requested."
	reasonLimitUnknown     = "The approval request limits could not be checked, so the call is denied. No approval was requested."
)

// Call is one tools/call that becomes a task: the exact call, who made it,
// and what policy decided. The action hash, arguments and display text are
// the edge's (the MCP endpoint computes them from the bytes it received).
type Call struct {
	Principal string
	// Subject is the principal's policy subject properties (an OAuth
	// caller's scopes and claims, as authenticated for this call; nil for
	// a static agent token). The envelope carries them, so the
	// re-evaluation after approval sees the subject the first evaluation
	// saw.
	Subject     map[string]any
	Era         tasks.Era
	Tool        string
	Arguments   json.RawMessage
	ActionHash  string
	ServerID    string
	DisplayText string
	// Policy is the decision on the call: requestable for an approval;
	// allow for an unattended task, whose policy version it records.
	Policy pdp.Decision
	// Mode is tasks.ModeApproval (the call waits for Policy's approvers)
	// or tasks.ModeUnattended (policy allowed a call on an asynchronous
	// tool: it runs after Delay, without approvers).
	Mode tasks.Mode
	// Delay is how long an unattended task waits before it runs (after its
	// InputRequests, if any, are answered, it waits Delay again).
	Delay time.Duration
	// Inputs are the client's answers gathered before the task (unattended
	// only: answers are not in the action hash).
	Inputs json.RawMessage
	// InputRequests are asked of the client before an unattended task runs.
	InputRequests map[string]json.RawMessage
	// Verified is the caller's own in-band approval of a tasks.ModeVerified
	// call (SEP-2672), already verified and its challenge consumed.
	Verified *tasks.VerifiedApproval
	// TaskID, for ModeVerified only, is the task's ID, derived by the
	// caller from the challenge: a challenge opens at most one task, and a
	// second Open of the same ID fails with tasks.ErrTaskExists, having
	// changed nothing. Empty (every other mode): a fresh ID.
	TaskID string
	// ToolPin identifies the tool as served when the call arrived
	// (gateway.Tool.Pin); the envelope carries it so the execution runs
	// the call only against that tool. Nil leaves the call unpinned.
	ToolPin *tasks.ToolPin
	// At is when the call arrived.
	At time.Time
}

// resumeAfter is how old a task's last start attempt must be, with no
// workflow having written to its record, before a call that finds the
// record asks Temporal about it and resumes it (resume): an Open writes the
// record and starts the workflow within milliseconds, so an older record
// without one is most likely a crash's leftover. Even a slower start is
// safe: the workflow ID admits one workflow.
const resumeAfter = 2 * time.Second

// verifiedTTL is the record expiry of a verified task: it runs at once, so
// this only bounds a task whose tool hangs.
const verifiedTTL = time.Hour

// Opened is the task a call became. Joined is true when an identical
// pending call by the same principal already had one (SEP-2848 dedup): the
// call joined it and nothing new was created.
type Opened struct {
	Task   tasks.Record
	Joined bool
}

// Open turns a call into a task: for an approval, an identical pending call
// of the same principal is joined (dedup); then the per-principal pending cap
// and creation rate apply (*Refused past them, nothing stored); then the
// read-model record is written and the workflow started, in that order, so a
// tasks/get for the returned ID always resolves.
//
// An approval or unattended task is returned once its record is durable;
// its workflow starts in the background (start.go), and a start that fails
// without taking effect fails the task. A verified task is returned once
// its workflow has started; its failed start is compensated: the record and
// the pending reservation are released unless the workflow may exist after
// all (see startOutcome).
func (s *Service) Open(ctx context.Context, c Call) (Opened, error) {
	switch c.Mode {
	case tasks.ModeApproval:
		if c.Policy.Effect != pdp.EffectRequestable {
			return Opened{}, fmt.Errorf("approvals: an approval needs a requestable decision, not %q", c.Policy.Effect)
		}
	case tasks.ModeUnattended:
		if c.Policy.Effect != pdp.EffectAllow {
			return Opened{}, fmt.Errorf("approvals: an unattended task needs an allowed call, not %q", c.Policy.Effect)
		}
	case tasks.ModeVerified:
		if c.Policy.Effect != pdp.EffectVerify || c.Verified == nil {
			return Opened{}, fmt.Errorf("approvals: a verified task needs a verify decision and its approval, not %q", c.Policy.Effect)
		}
	default:
		return Opened{}, fmt.Errorf("approvals: unknown mode %q", c.Mode)
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	background := c.Mode != tasks.ModeVerified
	handedOver := false // the start slot, to startLater
	if background {
		// A slot for its start before anything is written: past the
		// bound, calls wait here rather than leave records behind.
		if err := s.starts.acquire(ctx); err != nil {
			return Opened{}, fmt.Errorf("approvals: too many workflow starts in flight: %w", err)
		}
		defer func() {
			if !handedOver {
				s.starts.release()
			}
		}()
	}
	taskID := tasks.NewID("tsk_")
	if c.TaskID != "" {
		if c.Mode != tasks.ModeVerified || !tasks.ValidID(c.TaskID) {
			return Opened{}, fmt.Errorf("approvals: a task ID %q is only given for a verified call", c.TaskID)
		}
		taskID = c.TaskID
		if existing, err := s.store.Get(ctx, taskID); err == nil {
			return s.resumeVerified(ctx, c, existing)
		} else if !errors.Is(err, tasks.ErrTaskNotFound) {
			return Opened{}, err
		}
	}
	dedupKey := ""
	var counted tasks.PendingCount
	if c.Mode == tasks.ModeApproval {
		// Two identical jobs are two jobs; two identical approval requests
		// are one.
		dedupKey = tasks.DedupKey(c.Principal, c.ActionHash)
		// The pending counter is read while the slot is claimed: the
		// reservation below starts from it, one round trip fewer.
		var wg sync.WaitGroup
		wg.Go(func() { counted = s.store.ReadPending(ctx, c.Principal) })
		existing, err := s.store.ClaimDedup(ctx, dedupKey, taskID)
		wg.Wait()
		if err != nil {
			return Opened{}, err
		}
		if existing != "" {
			rec, err := s.store.GetOwned(ctx, existing, c.Principal)
			if err != nil {
				return Opened{}, fmt.Errorf("approvals: dedup slot names task %s: %w", existing, err)
			}
			// A task joined before its workflow has written to it may be
			// the orphan of a crash (its server died between the record
			// and the start): this identical call starts it.
			if rec, _, err = s.resume(ctx, c, rec); err != nil {
				return Opened{}, err
			}
			s.log.InfoContext(ctx, "approvals: identical call joined pending task", "task_id", rec.TaskID, "tool", c.Tool)
			return Opened{Task: rec, Joined: true}, nil
		}
	}
	if c.Mode != tasks.ModeApproval {
		counted = s.store.ReadPending(ctx, c.Principal)
	}
	if err := s.admit(ctx, c.Principal, taskID, c.At, counted); errors.Is(err, tasks.ErrTaskExists) && c.TaskID != "" {
		// A verified task's ID is derived from its challenge, and its
		// record does not exist (above): the reservation is an earlier
		// attempt's of this same signed call, which died before the
		// record. The record takes it over; should a concurrent attempt
		// create the record first, Create below says so.
		s.log.WarnContext(ctx, "approvals: verified task's reservation found without its record; taking it over", "task_id", taskID)
	} else if err != nil {
		if dedupKey != "" {
			s.store.ReleaseDedup(ctx, dedupKey, taskID)
		}
		return Opened{}, err
	}
	rec, in := s.newTask(c, taskID, dedupKey)
	ctx = telemetry.ForTask(ctx, taskID)
	rec.TraceParent = telemetry.TraceParent(ctx)
	if err := s.store.Create(ctx, rec); err != nil {
		if errors.Is(err, tasks.ErrTaskExists) {
			// A verified task opened concurrently by the same signed call:
			// its record holds the reservation now.
			return Opened{}, err
		}
		// Not created, or not known to be (an answer lost in transit):
		// undo it all, the indexes written alongside included. Deleting
		// gives back the reservation and the dedup slot.
		if derr := s.store.Delete(context.WithoutCancel(ctx), rec); derr != nil {
			s.log.ErrorContext(ctx, "approvals: could not undo a task record that failed", "task_id", taskID, "err", derr)
		}
		return Opened{}, err
	}
	s.metrics.TaskTransition(string(rec.Status))
	if background {
		s.startLater(ctx, rec, in)
		handedOver = true
	} else if err := s.engine.Start(ctx, in); err != nil {
		switch s.startOutcome(ctx, taskID, err) {
		case startedNot:
			// Deleting the record gives back its dedup slot and pending
			// reservation, so the same signed call can open it again;
			// unless the call's retry, in another process, has resumed
			// the record meanwhile: then its workflow owns it.
			if _, derr := s.store.DeleteUnstarted(context.WithoutCancel(ctx), rec); derr != nil {
				s.log.ErrorContext(ctx, "approvals: could not undo task record after failed start", "task_id", taskID, "err", derr)
			}
			return Opened{}, err
		case startedUnknown:
			return Opened{}, err // the record stays; see startOutcome
		}
	}
	s.log.InfoContext(ctx, "approvals: task opened", "task_id", taskID, "mode", c.Mode, "tool", c.Tool,
		"principal", c.Principal, "action_hash", c.ActionHash, "approver_group", in.Requirement.Group, "quorum", in.Requirement.Quorum)
	return Opened{Task: rec}, nil
}

// newTask builds the task's three views of one call: the read-model record
// and the workflow input, which carries the envelope.
func (s *Service) newTask(c Call, taskID, dedupKey string) (tasks.Record, tasks.ApprovalInput) {
	d := c.Policy
	var req tasks.Requirement
	var msg string
	switch c.Mode {
	case tasks.ModeApproval:
		req = tasks.Requirement{
			Group:              d.ApproverGroup,
			Quorum:             d.Quorum,
			TTL:                d.ApprovalTTL,
			AuthenticatorClass: d.AuthenticatorClass,
			Reason:             d.Reason,
			SlackChannel:       d.SlackChannel,
		}
		msg = "Awaiting approval: " + d.Reason
	case tasks.ModeVerified:
		// Approved already, by the caller's own passkey: it runs at once.
		req = tasks.Requirement{Quorum: 1, TTL: verifiedTTL, AuthenticatorClass: d.AuthenticatorClass, Reason: d.Reason}
		msg = "Verified in-band; running " + c.Tool
	default:
		// No approver group and quorum 0, which policy can never ask for
		// (pdp rejects quorum 0): the workflow waits until its start,
		// cancellably, then re-evaluates policy and runs the call.
		req = tasks.Requirement{TTL: c.Delay, Reason: "allowed by policy; runs asynchronously without approval"}
		msg = "Running: " + c.Tool + " starts in " + c.Delay.String()
		if len(c.InputRequests) > 0 {
			msg = fmt.Sprintf("Waiting for the client's input (%d request(s))", len(c.InputRequests))
		}
	}
	status := tasks.StatusWorking
	if len(c.InputRequests) > 0 {
		status = tasks.StatusInputRequired
	}
	rec := tasks.Record{
		InputRequests: c.InputRequests,
		TaskID:        taskID,
		Owner:         c.Principal,
		Era:           c.Era,
		Status:        status,
		StatusMessage: msg,
		CreatedAt:     c.At,
		LastUpdatedAt: c.At,
		TTL:           req.TTL + s.opts.ResultRetention,
		PollInterval:  s.opts.PollInterval,
		Tool:          c.Tool,
		Arguments:     c.Arguments,
		ActionHash:    c.ActionHash,
		DisplayText:   c.DisplayText,
		ApprovalRef:   tasks.NewID("apr_"),
		Requirement:   req,
		ExpiresAt:     c.At.Add(req.TTL),
		ApprovalState: tasks.ApprovalPending,
		// The timeline starts with the workflow's first step ("requested"),
		// written with its audit record.
		DedupKey: dedupKey,
	}
	in := tasks.ApprovalInput{
		Version: tasks.ApprovalInputVersion,
		Envelope: tasks.Envelope{
			Version:        tasks.EnvelopeVersion,
			TaskID:         taskID,
			Tool:           c.Tool,
			Arguments:      c.Arguments,
			ActionHash:     c.ActionHash,
			Principal:      c.Principal,
			Subject:        c.Subject,
			Resource:       "tool:" + c.Tool,
			ServerID:       c.ServerID,
			PolicyVersion:  d.PolicyVersion,
			CreatedAt:      c.At,
			InputResponses: c.Inputs,
			ToolPin:        c.ToolPin,
		},
		Requirement:   req,
		ApprovalRef:   rec.ApprovalRef,
		DisplayText:   rec.DisplayText,
		ExpiresAt:     rec.ExpiresAt,
		Mode:          c.Mode,
		InputRequests: c.InputRequests,
		Verified:      c.Verified,
	}
	if c.Mode == tasks.ModeUnattended {
		in.StartAt = rec.ExpiresAt
	}
	if c.Mode != tasks.ModeVerified {
		// Its workflow starts after the answer (start.go): the record
		// alone must be enough to start it should this process die first.
		rec.Start = &tasks.StartFacts{Mode: c.Mode, Subject: c.Subject, ServerID: c.ServerID,
			PolicyVersion: d.PolicyVersion, Inputs: c.Inputs, ToolPin: c.ToolPin}
	}
	return rec, in
}

// callFromRecord is the call a task was opened for, rebuilt from its record
// for resume; false when the record does not hold enough (a verified task,
// whose caller's signed retry resumes it, or a record written before
// tasks.Record.Start existed).
func callFromRecord(r tasks.Record) (Call, bool) {
	f := r.Start
	if f == nil || (f.Mode != tasks.ModeApproval && f.Mode != tasks.ModeUnattended) {
		return Call{}, false
	}
	return Call{
		Principal: r.Owner, Subject: f.Subject, Era: r.Era, Tool: r.Tool, Arguments: r.Arguments,
		ActionHash: r.ActionHash, ServerID: f.ServerID, DisplayText: r.DisplayText,
		Policy: pdp.Decision{PolicyVersion: f.PolicyVersion}, Mode: f.Mode, Delay: r.Requirement.TTL,
		Inputs: f.Inputs, InputRequests: r.InputRequests, ToolPin: f.ToolPin, At: r.CreatedAt,
	}, true
}

// admit applies the per-principal pending cap and creation rate, starting
// from counted, the principal's pending counter as just read. The cap is
// a reservation for taskID (tasks.Store.ReservePending), exact under
// concurrency; once admitted, the task's record holds it until the task
// ends, and Open gives it back if the record is never written. An error
// checking the cap refuses: the limits exist to protect the service.
func (s *Service) admit(ctx context.Context, principal, taskID string, now time.Time, counted tasks.PendingCount) error {
	err := s.store.ReservePendingFrom(ctx, principal, taskID, s.opts.MaxPendingPerPrincipal, counted)
	if errors.Is(err, tasks.ErrTaskExists) {
		return err // the same task, opened concurrently: its reservation is not ours
	}
	if errors.Is(err, tasks.ErrPendingCapReached) {
		s.log.WarnContext(ctx, "approvals: pending task cap reached", "principal", principal, "cap", s.opts.MaxPendingPerPrincipal)
		return &Refused{Reason: reasonPendingCap}
	}
	if err != nil {
		s.log.ErrorContext(ctx, "approvals: reserve a pending task", "err", err)
		return &Refused{Reason: reasonLimitUnknown}
	}
	ok, err := s.creations.Allow(ctx, principal, now)
	if err != nil {
		s.log.ErrorContext(ctx, "approvals: check the task creation rate", "principal", principal, "err", err)
		s.releasePending(ctx, principal, taskID)
		return &Refused{Reason: reasonLimitUnknown}
	}
	if !ok {
		s.log.WarnContext(ctx, "approvals: task creation rate limit reached", "principal", principal)
		s.releasePending(ctx, principal, taskID)
		return &Refused{Reason: reasonRateLimited}
	}
	return nil
}

// Charge spends one task creation of principal's rate for a call decided at
// once that its client asked to receive as a task (a 2025-11-25 client that
// sent params.task): *Refused when the rate is spent or cannot be checked.
// Charge before running the call; then [Service.Completed] stores its
// result.
func (s *Service) Charge(ctx context.Context, principal string, at time.Time) error {
	ok, err := s.creations.Allow(ctx, principal, at)
	if err != nil {
		s.log.ErrorContext(ctx, "approvals: check the task creation rate", "principal", principal, "err", err)
		return &Refused{Reason: reasonTaskLimitUnknown}
	}
	if !ok {
		s.log.WarnContext(ctx, "approvals: task creation rate limit reached", "principal", principal)
		return &Refused{Reason: reasonTaskRate}
	}
	return nil
}

// Completed stores a call that has already been decided (and may have run)
// as a completed task holding result. The caller answers with result itself
// if this fails: the call has been decided, and saying so beats an error
// that invites a retry.
func (s *Service) Completed(ctx context.Context, c Call, result tasks.CallToolResult) (tasks.Record, error) {
	raw, err := json.Marshal(result)
	if err != nil {
		return tasks.Record{}, fmt.Errorf("approvals: encode tool result: %w", err)
	}
	msg := "The call ran; the task holds its result."
	if result.IsError {
		msg = "The call ended with an error or was denied; the task holds the result."
	}
	rec := tasks.Record{
		TaskID:        tasks.NewID("tsk_"),
		Owner:         c.Principal,
		Era:           c.Era,
		Status:        tasks.StatusCompleted,
		StatusMessage: msg,
		CreatedAt:     c.At,
		LastUpdatedAt: s.now().UTC(),
		TTL:           s.opts.ResultRetention,
		PollInterval:  s.opts.PollInterval,
		Result:        raw,
		Disposition:   tasks.DispositionOf(raw),
		Tool:          c.Tool,
		Arguments:     c.Arguments,
		ActionHash:    c.ActionHash,
		DisplayText:   c.DisplayText,
	}
	if err := s.store.Create(context.WithoutCancel(ctx), rec); err != nil {
		return tasks.Record{}, err
	}
	return rec, nil
}

// What became of a workflow start that returned an error.
const (
	startedNot     = iota // the engine has never heard of the workflow
	startedAnyway         // the start took effect (a timeout or lost answer after the commit)
	startedUnknown        // the engine cannot tell right now
)

// startOutcome finds out whether a failed workflow start took effect all the
// same. Only a workflow the engine has never heard of may have its record
// deleted: deleting the record of a running workflow would hide a task that
// can still run its tool. When the engine cannot tell, the record stays and
// the caller gets an error: an identical retry joins the task through the
// dedup slot, and Reconcile fails the record later if the workflow really
// never started.
func (s *Service) startOutcome(ctx context.Context, taskID string, startErr error) int {
	if tasks.StartMayLand(startErr) {
		// The request may still be committing on the server, past the
		// deadline the client gave up at: give it time to land before
		// asking, or a task would be failed (or its record deleted)
		// while its workflow starts after all.
		time.Sleep(startSettle)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	running, err := s.engine.Running(cctx, taskID)
	switch {
	case err != nil:
		s.log.ErrorContext(ctx, "approvals: workflow start failed and its state is unknown; keeping the task record", "task_id", taskID, "start_err", startErr, "err", err)
		s.metrics.StartFailed(telemetry.StartUnknown)
		return startedUnknown
	case running:
		s.log.WarnContext(ctx, "approvals: workflow start reported an error but the workflow exists", "task_id", taskID, "start_err", startErr)
		s.metrics.StartFailed(telemetry.StartStartedAnyway)
		return startedAnyway
	}
	s.metrics.StartFailed(telemetry.StartNotStarted)
	return startedNot
}

// resumeVerified answers an Open of a verified task whose record exists:
// tasks.ErrTaskExists (SEP-2672 answers challenge_consumed), unless the
// task is an orphan that this call, the same signed call sent again, has
// just started (resume).
func (s *Service) resumeVerified(ctx context.Context, c Call, existing tasks.Record) (Opened, error) {
	if existing.Owner != c.Principal {
		return Opened{}, tasks.ErrTaskExists
	}
	rec, resumed, err := s.resume(ctx, c, existing)
	if err != nil {
		return Opened{}, err
	}
	if !resumed {
		return Opened{}, tasks.ErrTaskExists
	}
	return Opened{Task: rec}, nil
}

// startSettle is how long startOutcome waits before asking Temporal about a
// start the client gave up on (tasks.StartMayLand). It spares tasks that
// would have started: a start that lands later than this finds its task
// failed (or, verified, deleted) and does not run the tool, because
// ExecuteTool's execution fence (tasks.Store.ClaimExecution) is refused.
const startSettle = 3 * time.Second

// resume starts the workflow of a task whose record exists without one:
// the orphan of a crash between Open's two steps (the record, then the
// start). c is the same call again: a verified call's signed retry, or an
// identical approval call that joined the task through its dedup slot.
// Without this the task would sit "working" (an approval page nobody can
// act on, a dedup slot that hands the dead task to every identical call)
// until the reconciler failed it.
//
// A record a workflow has written to (Seq > 0), or whose execution it has
// claimed, is confirmed and left as it is. An unconfirmed one is waited on
// until its last start attempt is resumeAfter old (its own Open may still
// be starting it), then Temporal is asked; a workflow it has never heard
// of is started from the record (its
// approval reference, creation time, requirement and expiry; the rest of
// the input from c). Before the start the record is marked, by
// compare-and-set (tasks.Record.StartAttemptAt), and the reconciler fails
// only records whose last start attempt is older than its grace (longer
// than startTimeout): so either the reconciler failed it first and nothing
// starts, or the mark came first and the reconciler leaves it alone. Two
// resumes at once, or a resume and a late original start, are one
// workflow: its ID admits one.
//
// It returns the record as it stands and whether this call started the
// workflow.
func (s *Service) resume(ctx context.Context, c Call, r tasks.Record) (tasks.Record, bool, error) {
	for {
		age, unconfirmed := r.Unconfirmed(s.now())
		if r.Status.Terminal() || !unconfirmed {
			return r, false, nil
		}
		if age >= resumeAfter {
			break
		}
		select {
		case <-ctx.Done():
			return r, false, ctx.Err()
		case <-time.After(min(resumeAfter-age, resumePoll)):
		}
		var err error
		if r, err = s.store.Get(ctx, r.TaskID); err != nil {
			return r, false, err
		}
	}
	known, err := s.engine.Running(ctx, r.TaskID)
	if err != nil || known {
		return r, false, err
	}
	attempt := s.now().UTC()
	marked, err := s.store.Update(ctx, r.TaskID, func(cur *tasks.Record) error {
		if _, unconfirmed := cur.Unconfirmed(attempt); cur.Status.Terminal() || !unconfirmed || !cur.StartAttemptAt.Equal(r.StartAttemptAt) {
			return errNotResumable // failed, confirmed or resumed meanwhile
		}
		cur.StartAttemptAt = attempt
		return nil
	})
	if errors.Is(err, errNotResumable) {
		return marked, false, nil
	}
	if err != nil {
		return r, false, err
	}
	// A crash right after the record may have left its indexes out (the
	// approval page and tasks/list would not find it).
	if err := s.store.Index(ctx, marked); err != nil {
		return marked, false, err
	}
	c.At = r.CreatedAt
	_, in := s.newTask(c, r.TaskID, r.DedupKey)
	in.ApprovalRef, in.DisplayText, in.Requirement, in.ExpiresAt = r.ApprovalRef, r.DisplayText, r.Requirement, r.ExpiresAt
	if c.Mode == tasks.ModeUnattended {
		in.StartAt = r.ExpiresAt
	}
	if err := s.engine.Start(ctx, in); err != nil {
		if s.startOutcome(ctx, r.TaskID, err) == startedAnyway {
			return marked, false, nil
		}
		// The mark stays: the reconciler fails the record once the
		// attempt is older than its grace, unless a retry resumes it.
		return marked, false, err
	}
	s.log.WarnContext(ctx, "approvals: task resumed: its workflow had not started", "task_id", r.TaskID, "mode", c.Mode, "tool", c.Tool)
	return marked, true, nil
}

// resumePoll is how often resume re-reads a young unconfirmed record.
const resumePoll = 100 * time.Millisecond

// errNotResumable stops resume's mark of a record that is no orphan.
var errNotResumable = errors.New("approvals: task is not an orphan")

// releasePending gives back a pending reservation whose task was not
// created; the caller may have hung up, the release must still happen.
func (s *Service) releasePending(ctx context.Context, principal, taskID string) {
	if err := s.store.ReleasePending(context.WithoutCancel(ctx), principal, taskID); err != nil {
		s.log.ErrorContext(ctx, "approvals: release pending reservation", "task_id", taskID, "err", err)
	}
}

// Reconcile resumes the orphans of a crash (records whose workflow never
// started) that their records can start, fails the others once older than
// grace, and repairs the pending cap; see tasks.ReconcileResuming. It
// returns how many records it failed.
func (s *Service) Reconcile(ctx context.Context, grace time.Duration) (int, error) {
	r, err := s.ReconcileRound(ctx, grace)
	return r.Failed, err
}

// Round is what one reconcile round did.
type Round struct {
	// Failed counts the orphans it failed.
	Failed int
	// Young counts the records it would resume but left alone only
	// because they were too young to judge (younger than resumeAfter, and
	// no start of theirs in flight in this process): a crash's orphans of
	// a moment ago, or another process's starts under way. A round a few
	// seconds later settles them.
	Young int
}

// ReconcileRound is [Service.Reconcile], reporting what the round left for
// a later one.
func (s *Service) ReconcileRound(ctx context.Context, grace time.Duration) (Round, error) {
	var young, resumed int
	n, err := tasks.ReconcileResuming(ctx, s.store, s.engine, grace, func(ctx context.Context, r tasks.Record) bool {
		keep, tooYoung, started := s.resumeOrphan(ctx, r)
		if tooYoung {
			young++
		}
		if started {
			resumed++
		}
		return keep
	}, s.log)
	s.metrics.Orphans(telemetry.OrphanResumed, resumed)
	s.metrics.Orphans(telemetry.OrphanFailed, n)
	return Round{Failed: n, Young: young}, err
}

// resumeOrphan is a reconcile round's tasks.Resumer: keep reports that r
// is not to be failed now, tooYoung that it was left alone only for its
// age, resumed that it started r's workflow. It resumes a record once: a record some resume has already marked
// (StartAttemptAt) is left to the reconciler's judgement, so a start
// Temporal keeps refusing ends the task instead of being tried every
// round.
func (s *Service) resumeOrphan(ctx context.Context, r tasks.Record) (keep, tooYoung, resumed bool) {
	c, ok := callFromRecord(r)
	if !ok || !r.StartAttemptAt.IsZero() {
		return false, false, false
	}
	if s.starts.inFlight(r.TaskID) {
		return true, false, false // its own start is under way
	}
	if age, _ := r.Unconfirmed(s.now()); age < resumeAfter {
		return true, true, false // its start may still be under way elsewhere
	}
	_, resumed, err := s.resume(ctx, c, r)
	if err != nil {
		s.log.WarnContext(ctx, "approvals: could not resume an orphaned task", "task_id", r.TaskID, "err", err)
		return false, false, false
	}
	// Resumed (resume logs it), or not an orphan after all: its workflow
	// exists, or the record was confirmed, ended or resumed meanwhile.
	return true, false, resumed
}
