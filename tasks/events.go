package tasks

import (
	"fmt"
	"strings"
	"time"
)

// EventKind names a step of a task's timeline. The names are wire strings:
// they are stored in read-model records, returned by the approver API and
// read by the approval page's script, and most match an audit record kind.
type EventKind string

// The kinds of timeline events.
const (
	EventRequested        EventKind = "requested"         // Detail: the policy's reason
	EventNotified         EventKind = "notified"          // approvers were notified
	EventNotifyFailed     EventKind = "notify-failed"     // approvers could not be notified
	EventApproval         EventKind = "approval"          // Approver, Approved, Needed
	EventRejectedDecision EventKind = "rejected-decision" // Reason
	EventClaimed          EventKind = "claimed"           // PolicyVersion
	EventCancelRefused    EventKind = "cancel-refused"    // a cancel after the claim
	EventInput            EventKind = "input"             // Detail: answered and pending input requests

	// Terminal kinds; Detail is the task's status message.
	EventExecuted       EventKind = "executed"
	EventExecutionError EventKind = "execution-error"
	EventOutcomeUnknown EventKind = "outcome-unknown"
	EventDenied         EventKind = "denied"
	EventExpired        EventKind = "expired"
	EventCancelled      EventKind = "cancelled"
	EventFailed         EventKind = "failed"
)

// Error types of the workflow's update rejections, surfaced as
// [UpdateRejected.Reason], and the workflow's own rejection reason. The
// passkey package names the reasons of rejected evidence (SEP-2672 §4.10);
// these are the ones the workflow adds.
const (
	// ErrTypeMalformedDecision: the decision is not approve/deny, or lacks a
	// challenge ID or an assertion, or its comment is too long.
	ErrTypeMalformedDecision = "malformed_decision"
	// ErrTypeTaskNotPending: the task no longer takes decisions (decided,
	// claimed, cancelled, expired or ended).
	ErrTypeTaskNotPending = "task_not_pending"
	// ErrTypeTooManyDecisions: the task has taken as many decisions as it
	// verifies; more would only grow its history.
	ErrTypeTooManyDecisions = "too_many_decisions"
	// ErrTypeVerificationUnavailable: the assertion could not be verified
	// (infrastructure); nothing changed and the approver may try again.
	ErrTypeVerificationUnavailable = "verification_unavailable"
	// ErrTypeNotWaitingForInput: answers for a task that is not waiting for
	// them, or that name no pending request.
	ErrTypeNotWaitingForInput = "not_waiting_for_input"

	// ReasonAlreadyApproved is the DecisionResult.Reason (and a rejected
	// decision's recorded reason) when an approver who already approved
	// approves again.
	ReasonAlreadyApproved = "already_approved"
)

// Event is one step of a task's timeline. Its Kind decodes whatever a record
// of any age holds (a kind this code does not know is shown by name). The structured fields are
// set for the kinds that have them; Detail holds the event's words as
// written when the event was recorded (records written before the
// structured fields have only Detail). Read the words with [Event.Text].
type Event struct {
	At     time.Time `json:"at"`
	Kind   EventKind `json:"kind"`
	Detail string    `json:"detail,omitempty"`

	Approver      string `json:"approver,omitempty"`      // approval: the approver's name
	Approved      int    `json:"approved,omitempty"`      // approval: approvals so far
	Needed        int    `json:"needed,omitempty"`        // approval: the quorum
	Reason        string `json:"reason,omitempty"`        // rejected-decision: the reason name
	PolicyVersion string `json:"policyVersion,omitempty"` // claimed: the policy that allowed
}

// The constructors below leave At to the writer, which stamps its own
// clock (the workflow's, or the audit record's).

// NewEvent is an event of kind with detail as its words, for the kinds
// without structured fields. Kinds whose words are fixed get them whatever
// detail says.
func NewEvent(kind EventKind, detail string) Event {
	return Event{Kind: kind, Detail: detail}.described()
}

// ApprovalEvent is an accepted approval: approver's is the approved-th of
// needed.
func ApprovalEvent(approver string, approved, needed int) Event {
	return Event{Kind: EventApproval, Approver: approver, Approved: approved, Needed: needed}.described()
}

// RejectedDecisionEvent is a decision refused for reason (a passkey reason
// name or [ReasonAlreadyApproved]).
func RejectedDecisionEvent(reason string) Event {
	return Event{Kind: EventRejectedDecision, Reason: reason}.described()
}

// ClaimedEvent is the execution claim, after policyVersion allowed the call.
func ClaimedEvent(policyVersion string) Event {
	return Event{Kind: EventClaimed, PolicyVersion: policyVersion}.described()
}

// described returns e with Detail set to its words, so readers of the
// record that know only Detail read the same words as before.
func (e Event) described() Event {
	e.Detail = e.words()
	return e
}

// rejectedPrefix starts the words of a rejected decision.
const rejectedPrefix = "rejected decision: "

// Text is the event's words: the one renderer of timeline events, used by
// the read model, the approver API and the approval page. Events with
// structured fields are rendered from them; others, and records written
// before the fields existed, by their Detail.
func (e Event) Text() string {
	if e.Approved > 0 || e.Reason != "" || e.PolicyVersion != "" {
		return e.words()
	}
	return e.Detail
}

// words renders e from its kind and structured fields; kinds whose words
// are not made of fields keep Detail.
func (e Event) words() string {
	switch e.Kind {
	case EventApproval:
		return fmt.Sprintf("approved by %s (%d of %d)", e.Approver, e.Approved, e.Needed)
	case EventRejectedDecision:
		return rejectedPrefix + e.Reason
	case EventClaimed:
		return "policy allowed (" + e.PolicyVersion + ")"
	case EventNotifyFailed:
		return "approvers could not be notified"
	case EventCancelRefused:
		return "cancel refused: the call was already claimed for execution"
	}
	return e.Detail
}

// RejectionReason is the reason name of a rejected-decision event, "" for
// other kinds.
func (e Event) RejectionReason() string {
	if e.Kind != EventRejectedDecision {
		return ""
	}
	if e.Reason != "" {
		return e.Reason
	}
	// Records written before events carried a Reason have it only in their
	// words. This is the one place that reads a reason back from prose.
	return strings.TrimPrefix(e.Detail, rejectedPrefix)
}

// OutcomeText is the status message of a task that ended with kind after
// tool was called (executed, execution-error, outcome-unknown, or failed
// with a protocol error), or without it (cancelled, expired). attended is
// false for a task that ran without approval: nothing was approved. It is ""
// for other kinds, whose words depend on more than the tool.
func OutcomeText(kind EventKind, tool string, attended bool) string {
	approved := ""
	if attended {
		approved = "Approved; "
	}
	switch kind {
	case EventExecuted:
		return approved + tool + " ran once"
	case EventExecutionError:
		return approved + tool + " ran and returned an error"
	case EventOutcomeUnknown:
		return "Outcome unknown: " + tool + " was started but did not report back"
	case EventFailed:
		return "Failed: " + tool + " reported a protocol error"
	case EventCancelled:
		return "Cancelled before execution"
	case EventExpired:
		return "Approval expired"
	}
	return ""
}
