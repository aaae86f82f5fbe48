package activities

import (
	"encoding/json"
	"time"

	"github.com/countersign/countersign/tasks"
)

// Version is the current layout of every activity input and output below. An
// activity refuses an input of another version with a non-retryable
// [ErrTypeUnsupportedVersion] error, so a workflow and a worker of different
// releases fail loudly instead of misreading each other.
const Version = 1

// Error types of the non-retryable application errors the activities return.
// The workflow branches on them with errors.As(err, &appErr) and appErr.Type().
const (
	// ErrTypeUnsupportedVersion: the input's Version is not [Version].
	ErrTypeUnsupportedVersion = "unsupported_version"
	// ErrTypeInvalidInput: the input breaks the activity's contract.
	ErrTypeInvalidInput = "invalid_input"
	// ErrTypeEnvelopeMismatch: the envelope's action hash does not match its
	// tool, arguments and server ID (or cannot be computed). Nothing ran.
	ErrTypeEnvelopeMismatch = "envelope_mismatch"
	// ErrTypeUnknownTool: the tool is not in the registry, or the tool it
	// serves under the call's name is not the one the envelope pins
	// (tasks.Envelope.ToolPin). Nothing ran. For a changed tool, the
	// error's one detail is a sentence saying what changed, for the task's
	// end (gateway.ToolChangedError); a tool that is gone has no details.
	ErrTypeUnknownTool = "unknown_tool"
	// ErrTypeToolProtocolError: the tool failed with a protocol error
	// (gateway.ProtocolError) and did not act; details: the JSON-RPC code.
	ErrTypeToolProtocolError = "tool_protocol_error"
	// ErrTypeInvalidVerification: the verification request itself is invalid
	// (not the evidence: evidence problems are a rejected output).
	ErrTypeInvalidVerification = "invalid_verification_request"
	// ErrTypePolicyInput: the policy cannot be given this input.
	ErrTypePolicyInput = "policy_input"
	// ErrTypeTaskNotFound: the task's record does not exist.
	ErrTypeTaskNotFound = "task_not_found"
	// ErrTypeTaskTerminal: the record already ended with another status.
	ErrTypeTaskTerminal = "task_terminal"
	// ErrTypeExecutionNotClaimed: ExecuteTool could not take the task
	// record's execution fence (tasks.Store.ClaimExecution): the task had
	// ended or its record was gone (a start judged failed that landed
	// late), its execution was claimed before, or the store could not be
	// written. Nothing ran.
	ErrTypeExecutionNotClaimed = "execution_not_claimed"
)

// RecordStateInput writes one non-terminal transition to the read model.
// Approvals replaces the record's list; Event is appended to the timeline
// unless an identical event is already there.
type RecordStateInput struct {
	Version       int                   `json:"version"`
	TaskID        string                `json:"taskId"`
	Seq           int64                 `json:"seq,omitempty"` // outbox sequence; see Projection
	StatusMessage string                `json:"statusMessage"`
	ApprovalState tasks.ApprovalState   `json:"approvalState"`
	Approvals     []tasks.ApprovalEntry `json:"approvals,omitempty"`
	Event         tasks.Event           `json:"event"`

	// Status, when set, is the task's non-terminal status (an unattended
	// task moves between input_required and working); InputRequests are
	// then its unanswered input requests. Empty leaves both unchanged.
	Status        tasks.Status               `json:"status,omitempty"`
	InputRequests map[string]json.RawMessage `json:"inputRequests,omitempty"`
}

// NotifyInput asks for the approvers to be told about a pending task.
type NotifyInput struct {
	Version int    `json:"version"`
	TaskID  string `json:"taskId"`
}

// VerifyDecisionInput is one approver's passkey assertion to verify against
// the task's envelope and requirement.
type VerifyDecisionInput struct {
	Version     int               `json:"version"`
	Envelope    tasks.Envelope    `json:"envelope"`
	Requirement tasks.Requirement `json:"requirement"`
	ChallengeID string            `json:"challengeId"`
	Decision    string            `json:"decision"`
	Method      string            `json:"method,omitempty"`
	Response    json.RawMessage   `json:"response"`
	// ConsumerKey makes consuming the challenge idempotent: a retried
	// activity with the same key gets the same answer. The workflow uses the
	// Temporal update ID.
	ConsumerKey string `json:"consumerKey"`
}

// VerifyDecisionOutput is the verdict on an assertion. When Accepted is
// false, Reason is the SEP-2672 reason and the approver fields are empty.
type VerifyDecisionOutput struct {
	Version      int    `json:"version"`
	Accepted     bool   `json:"accepted"`
	Reason       string `json:"reason,omitempty"`
	ApproverID   string `json:"approverId,omitempty"`
	ApproverName string `json:"approverName,omitempty"`
	CredentialID string `json:"credentialId,omitempty"`
	// Assertion is the accepted evidence, for the audit record.
	Assertion *Assertion `json:"assertion,omitempty"`
}

// ReevaluateInput re-evaluates the held call under the current policy with
// the approvals gathered. At is the evaluation time (the workflow's clock,
// so a retry evaluates the same input).
type ReevaluateInput struct {
	Version   int                   `json:"version"`
	Envelope  tasks.Envelope        `json:"envelope"`
	Approvals []tasks.ApprovalEntry `json:"approvals"`
	At        time.Time             `json:"at"`
	// Verified: the call was approved in-band by its caller's passkey
	// (tasks.ModeVerified), so a "verify" decision is what it satisfied
	// and counts as allow.
	Verified bool `json:"verified,omitempty"`
}

// ReevaluateOutput is the policy's answer. Allow is true only for an allow
// effect; a deny, or a requestable decision that the approvals do not meet,
// is Allow false with the policy's reason.
type ReevaluateOutput struct {
	Version       int    `json:"version"`
	Allow         bool   `json:"allow"`
	Effect        string `json:"effect"`
	Reason        string `json:"reason"`
	PolicyVersion string `json:"policyVersion"`
}

// ExecuteToolInput runs the held call exactly as bound in the envelope.
type ExecuteToolInput struct {
	Version  int            `json:"version"`
	Envelope tasks.Envelope `json:"envelope"`
}

// ExecuteToolOutput is the tool's own result; Result.IsError reports a
// tool-level failure (the tool ran and said it failed).
type ExecuteToolOutput struct {
	Version int                  `json:"version"`
	Result  tasks.CallToolResult `json:"result"`
}

// CompleteInput writes a task's terminal state. For status completed, the
// stored result is tasks.Outcome(Disposition, Tool, Detail, ToolResult); for
// failed, the record's error carries Detail; cancelled has neither.
type CompleteInput struct {
	Version       int                   `json:"version"`
	TaskID        string                `json:"taskId"`
	Seq           int64                 `json:"seq,omitempty"` // outbox sequence; see Projection
	Tool          string                `json:"tool"`
	Status        tasks.Status          `json:"status"`
	Disposition   tasks.Disposition     `json:"disposition,omitempty"`
	Detail        string                `json:"detail,omitempty"`
	ToolResult    *tasks.CallToolResult `json:"toolResult,omitempty"`
	StatusMessage string                `json:"statusMessage"`
	ApprovalState tasks.ApprovalState   `json:"approvalState"`
	Approvals     []tasks.ApprovalEntry `json:"approvals,omitempty"`
	Event         tasks.Event           `json:"event"`
	// Audit seals the task's audit chain (Event.Kind is the terminal step)
	// and puts the outcome record's receipt in the result's _meta.
	Audit bool `json:"audit,omitempty"`
}

// Projection is one entry of a task workflow's outbox: a fact the workflow
// has decided, to be written to the read model or the audit chain. Exactly
// one of State, Audit and End is set. Seq numbers a workflow's entries from
// 1 in the order it decided them.
type Projection struct {
	Seq   int64             `json:"seq"`
	State *RecordStateInput `json:"state,omitempty"`
	Audit *RecordAuditInput `json:"audit,omitempty"`
	End   *CompleteInput    `json:"end,omitempty"`
}

// PublishInput is a batch of one task's outbox entries, in order.
type PublishInput struct {
	Version int          `json:"version"`
	TaskID  string       `json:"taskId"`
	Entries []Projection `json:"entries"`
}
