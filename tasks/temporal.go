package tasks

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
)

// Names shared by the workflow, its worker and its callers.
const (
	TaskQueue    = "countersign-approvals"
	WorkflowName = "Approval"
	UpdateDecide = "decide"
	UpdateCancel = "cancel"
	// UpdateRecordRejection records, in the timeline and the audit chain, a
	// decision whose evidence the edge rejected before it reached the
	// workflow. It changes nothing else.
	UpdateRecordRejection = "record-rejection"
)

// MaxRecordedRejections bounds the rejected decisions one task records in its
// timeline (event kind [EventRejectedDecision]) and audit chain. The workflow
// refuses more without writing history; the edge stops asking once the read
// model shows the quota reached.
const MaxRecordedRejections = 20

// RejectedDecision is a decision the edge rejected: its evidence failed the
// passkey check, so it never reached the workflow as a decision.
type RejectedDecision struct {
	ChallengeID string `json:"challengeId,omitempty"`
	Decision    string `json:"decision"`
	Reason      string `json:"reason"` // SEP-2672 reason name
}

// ApprovalInputVersion is the current [ApprovalInput] layout.
const ApprovalInputVersion = 1

// ApprovalInput starts the approval workflow. Workflow ID = task ID.
type ApprovalInput struct {
	Version     int         `json:"version"`
	Envelope    Envelope    `json:"envelope"`
	Requirement Requirement `json:"requirement"`
	ApprovalRef string      `json:"approvalRef"`
	DisplayText string      `json:"displayText"`
	// ExpiresAt is when an approval expires. An unattended task carries
	// its record's expiry here too, but starts at StartAt.
	ExpiresAt time.Time `json:"expiresAt"`
	// Mode says whether the call waits for approvers or runs without
	// them. Empty only in inputs written before it existed: see
	// [ApprovalInput.Normalized].
	Mode Mode `json:"mode,omitempty"`
	// StartAt is when an unattended task runs (after its input requests
	// are answered, it waits Requirement.TTL instead); zero for approvals.
	StartAt time.Time `json:"startAt,omitzero"`
	// InputRequests an unattended task asks its client before it runs
	// (see input.go); empty for approvals.
	InputRequests map[string]json.RawMessage `json:"inputRequests,omitempty"`
	// Verified is the in-band approval of a ModeVerified task; nil
	// otherwise.
	Verified *VerifiedApproval `json:"verified,omitempty"`
}

// VerifiedApproval is a SEP-2672 in-band approval: the caller's own passkey
// assertion over the call, verified and its challenge consumed by the MCP
// endpoint before the task started. It goes into the audit chain as the
// task's approving decision, with the assertion.
type VerifiedApproval struct {
	ApproverID        string    `json:"approverId"`
	ApproverName      string    `json:"approverName"`
	CredentialID      string    `json:"credentialId"`
	ChallengeID       string    `json:"challengeId"`
	PublicKey         []byte    `json:"publicKey"`
	AuthenticatorData []byte    `json:"authenticatorData"`
	ClientDataJSON    []byte    `json:"clientDataJson"`
	Signature         []byte    `json:"signature"`
	SignCount         uint32    `json:"signCount"`
	At                time.Time `json:"at"`
}

// Mode is how the approval workflow runs a task.
type Mode string

// Modes.
const (
	// ModeApproval: the call runs only once its quorum of approvers
	// approves it before ExpiresAt.
	ModeApproval Mode = "approval"
	// ModeUnattended: policy allowed the call on an asynchronous tool
	// (a conformance fixture); no one approves it. It waits, cancellably,
	// until StartAt, then runs exactly as after an approval. Its
	// requirement has no group and quorum 0, which policy can never ask
	// for (pdp rejects quorum 0).
	ModeUnattended Mode = "unattended"
	// ModeVerified: the caller approved its own call in-band (SEP-2672):
	// the endpoint verified the passkey assertion and consumed its challenge
	// before starting the task, which carries the approval (Verified) and
	// runs at once, exactly as after an approval: policy re-evaluated, the
	// execution claim, the tool once, the same audit records. Its
	// requirement has quorum 1 and no group.
	ModeVerified Mode = "verified"
)

// Normalized returns in with an explicit Mode and StartAt. An input written
// before they existed (no Mode) encoded an unattended task as a requirement
// with quorum 0 and no group, with ExpiresAt as its start time: it is read
// as ModeUnattended with StartAt = ExpiresAt. Any other input without a Mode
// is an approval. An input with a Mode is returned unchanged.
func (in ApprovalInput) Normalized() ApprovalInput {
	if in.Mode != "" {
		return in
	}
	if in.Requirement.Quorum == 0 && in.Requirement.Group == "" {
		in.Mode = ModeUnattended
		in.StartAt = in.ExpiresAt
		return in
	}
	in.Mode = ModeApproval
	return in
}

// Decision values.
const (
	DecisionApprove = "approve"
	DecisionDeny    = "deny"
)

// DecisionUpdate is one approver's passkey-signed decision.
type DecisionUpdate struct {
	ChallengeID string          `json:"challengeId"`
	Decision    string          `json:"decision"`
	Comment     string          `json:"comment,omitempty"`
	Method      string          `json:"method,omitempty"` // "webauthn" (default)
	Response    json.RawMessage `json:"response"`         // WebAuthn AuthenticationResponseJSON
}

// DecisionResult answers a [DecisionUpdate].
type DecisionResult struct {
	Accepted bool          `json:"accepted"`
	Reason   string        `json:"reason,omitempty"` // SEP-2672 reason name when rejected
	Status   ApprovalState `json:"status"`
	Approved int           `json:"approved"`
	Needed   int           `json:"needed"`
}

// CancelResult answers a cancel request.
type CancelResult struct {
	// Cancelled is true when this request (or an earlier one) cancelled the
	// task; false when it was too late (execution claimed or task ended).
	Cancelled bool   `json:"cancelled"`
	Status    Status `json:"status"`
}

// ApprovalOutcome is the workflow's result.
type ApprovalOutcome struct {
	Status      Status      `json:"status"`
	Disposition Disposition `json:"disposition,omitempty"`
}

// ErrUpdateInProgress is returned when an update's outcome did not arrive in
// time (the caller's deadline passed, or the server aborted the wait): the
// workflow may still take it. It is also returned when the caller's context
// ended while the update waited for the task's turn, unsent (see
// [Orchestrator]). Sending the same decision again is safe and gets its
// outcome (see [Orchestrator.Decide]).
var ErrUpdateInProgress = errors.New("tasks: the update's outcome is not known yet")

// ErrWorkflowGone is returned when the task's workflow no longer runs, so it
// cannot take a decision or a cancel; the read model says how it ended.
var ErrWorkflowGone = errors.New("tasks: task is no longer running")

// Orchestrator drives approval workflows through a Temporal client.
//
// It sends one update at a time to each workflow; the others wait their
// turn, in arrival order, each within its own deadline. The workflow takes
// decisions one at a time anyway (a workflow lock), so this changes no
// verdict. What it avoids: Temporal admits at most 10 updates in flight per
// workflow (history.maxInFlightUpdates, the default of every cluster), and
// a burst past it (internal/e2e TestRace: 20 decisions, 15 invalid ones and
// a cancel at once) made Temporal refuse, abort and retry updates and fail
// the worker's workflow task completions ("Workflow task not found", about
// 430 times in 200 rounds). Each round took ~0.5 s, and in one run of three
// to six a task stalled 30 to 60 seconds, its approvers answered 503. One
// update at a time, the same rounds meet none and run about five times
// faster (docs/benchmarks.md, "Concurrent decisions on one task"). The turn
// is per process, so up to ten replicas deciding one task at the same
// instant stay within the limit.
type Orchestrator struct {
	c       client.Client
	updates keyedLock // per workflow ID: one update in flight
}

// NewOrchestrator wraps a connected Temporal client.
func NewOrchestrator(c client.Client) *Orchestrator { return &Orchestrator{c: c} }

// Start starts the approval workflow for a task and returns once the start is
// durable in Temporal. The workflow ID is the task ID; a second start for the
// same ID fails.
func (o *Orchestrator) Start(ctx context.Context, in ApprovalInput) error {
	_, err := o.c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       in.Envelope.TaskID,
		TaskQueue:                TaskQueue,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
		EnableEagerStart:         true,
		// No WorkflowExecutionTimeout: the workflow bounds every wait
		// itself (approval expiry, input wait, one tool attempt), and a
		// server-side timeout would end it without running any code, leaving
		// the read model stuck and, mid-execution, an outcome nobody records.
	}, WorkflowName, in)
	if err != nil {
		return fmt.Errorf("tasks: start workflow %s: %w", in.Envelope.TaskID, err)
	}
	return nil
}

// Decide delivers an approver's decision and waits for the workflow's verdict.
//
// The update's ID is [DecisionUpdateID] of the decision, and the workflow
// consumes the passkey challenge under that ID: the same request sent again
// (a retry after a timeout, or after the process died right after posting)
// is the same update, so it is either the same verdict or, if the first
// never committed, verified again by the consumer that holds the challenge.
// A decision is counted once or cleanly rejected, never lost half-way.
func (o *Orchestrator) Decide(ctx context.Context, taskID string, d DecisionUpdate) (DecisionResult, error) {
	var res DecisionResult
	err := o.send(ctx, taskID, UpdateDecide, DecisionUpdateID(d), d, &res, 0)
	return res, err
}

// DecisionUpdateID is the workflow update ID of a decision: a digest of
// everything the approver sent. Two different requests never share it, so a
// rejected forgery that names a real challenge cannot stand in for the
// approver's own answer.
func DecisionUpdateID(d DecisionUpdate) string {
	h := sha256.New()
	for _, part := range []string{d.ChallengeID, d.Decision, d.Comment, d.Method, string(d.Response)} {
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(part))))
		h.Write([]byte(part))
	}
	return "decide-" + hex.EncodeToString(h.Sum(nil))
}

// RecordRejection records a decision the edge rejected (see
// [UpdateRecordRejection]). The workflow refuses it, writing nothing, once
// the task has recorded its quota of rejections or no longer takes
// decisions: *UpdateRejected or ErrWorkflowGone.
//
// It is not sent, and ErrRejectionsQueued is returned, when
// [MaxRecordedRejections] rejections of the task already hold or await the
// task's turn in this process: the workflow would record no more than that,
// and a flood of forged decisions must not queue ahead of the approvers'.
func (o *Orchestrator) RecordRejection(ctx context.Context, taskID string, r RejectedDecision) error {
	return o.send(ctx, taskID, UpdateRecordRejection, "", r, nil, MaxRecordedRejections)
}

// ErrRejectionsQueued is RecordRejection's answer when the task's line
// already holds its quota of rejections.
var ErrRejectionsQueued = errors.New("tasks: rejection not recorded: the task's quota of rejections is already in line")

// Cancel asks the workflow to cancel the task; it is honoured only before the
// execution claim.
func (o *Orchestrator) Cancel(ctx context.Context, taskID string) (CancelResult, error) {
	var res CancelResult
	err := o.update(ctx, taskID, UpdateCancel, struct{}{}, &res)
	return res, err
}

// update sends an update under an ID the client picks.
func (o *Orchestrator) update(ctx context.Context, taskID, name string, arg, out any) error {
	return o.send(ctx, taskID, name, "", arg, out, 0)
}

// send sends an update in the task's turn; an empty id lets the client
// pick a fresh one. With a limit, the update is dropped
// (ErrRejectionsQueued) when limit updates of its kind already hold or
// await the turn.
func (o *Orchestrator) send(ctx context.Context, taskID, name, id string, arg, out any, limit int) error {
	unlock, err := o.updates.lock(ctx, taskID, limit)
	if errors.Is(err, errLineFull) {
		return ErrRejectionsQueued
	}
	if err != nil {
		// The caller's context ended while another update to the task was
		// in flight: this one was never sent, and sending it again is safe.
		return fmt.Errorf("%w: %s %s: not sent, the task's previous update still in flight: %w", ErrUpdateInProgress, name, taskID, err)
	}
	defer unlock()
	h, err := o.c.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
		UpdateID:     id,
		WorkflowID:   taskID,
		UpdateName:   name,
		Args:         []any{arg},
		WaitForStage: client.WorkflowUpdateStageCompleted,
	})
	if err == nil {
		err = h.Get(ctx, out)
	}
	if err == nil {
		return nil
	}
	var notFound *serviceerror.NotFound
	if errors.As(err, &notFound) {
		return ErrWorkflowGone
	}
	var deadline *serviceerror.DeadlineExceeded
	var unavailable *serviceerror.Unavailable
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &deadline) || errors.As(err, &unavailable) {
		return fmt.Errorf("%w: %s %s: %w", ErrUpdateInProgress, name, taskID, err)
	}
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		return &UpdateRejected{Reason: appErr.Type(), Message: appErr.Message()}
	}
	return fmt.Errorf("tasks: %s %s: %w", name, taskID, err)
}

// UpdateRejected is a decision or cancel the workflow's validator refused
// without recording anything (for example, a decision on a task that is no
// longer pending). Reason is a stable machine-readable name.
type UpdateRejected struct {
	Reason  string
	Message string
}

func (e *UpdateRejected) Error() string { return "tasks: rejected: " + e.Reason + ": " + e.Message }

// Is matches another *UpdateRejected with the same Reason.
func (e *UpdateRejected) Is(target error) bool {
	t, ok := target.(*UpdateRejected)
	return ok && t.Reason == e.Reason
}

// keyedLock is one lock per key; a key's entry exists only while someone
// holds or awaits it. Waiters are served in arrival order.
type keyedLock struct {
	mu   sync.Mutex
	held map[string]*keyedEntry
}

type keyedEntry struct {
	sem     chan struct{}
	refs    int // holding or awaiting
	limited int // of those, the callers that came with a limit
}

var errLineFull = errors.New("tasks: line full")

// lock takes key's lock, or gives up when ctx ends. A caller with a limit
// (> 0) does not queue, and gets errLineFull, when limit such callers
// already hold or await the key.
func (k *keyedLock) lock(ctx context.Context, key string, limit int) (unlock func(), err error) {
	k.mu.Lock()
	if k.held == nil {
		k.held = map[string]*keyedEntry{}
	}
	e := k.held[key]
	if e == nil {
		e = &keyedEntry{sem: make(chan struct{}, 1)}
		k.held[key] = e
	}
	if limit > 0 && e.limited >= limit {
		k.mu.Unlock()
		return nil, errLineFull
	}
	e.refs++
	if limit > 0 {
		e.limited++
	}
	k.mu.Unlock()
	release := func() {
		k.mu.Lock()
		if limit > 0 {
			e.limited--
		}
		if e.refs--; e.refs == 0 {
			delete(k.held, key)
		}
		k.mu.Unlock()
	}
	select {
	case e.sem <- struct{}{}:
		return func() { <-e.sem; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}
