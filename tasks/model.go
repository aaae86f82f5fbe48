package tasks

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"strings"
	"time"
)

// Status is the MCP task status.
type Status string

const (
	StatusWorking       Status = "working"
	StatusInputRequired Status = "input_required"
	StatusCompleted     Status = "completed"
	StatusFailed        Status = "failed"
	StatusCancelled     Status = "cancelled"
)

// Terminal reports whether s is a terminal status.
func (s Status) Terminal() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusCancelled
}

// Disposition is the approval outcome carried by a completed task (SEP-2848).
type Disposition string

const (
	ApprovedExecuted  Disposition = "approved-executed"
	DeniedNotExecuted Disposition = "denied-not-executed"
	ExecutionError    Disposition = "execution-error"
	OutcomeUnknown    Disposition = "outcome-unknown"
)

// The _meta keys under which the disposition is emitted: SEP-2848 revision B
// and revision A name it differently, and clients of either exist.
const (
	MetaDisposition        = "io.modelcontextprotocol/tool-approval-disposition"
	MetaDispositionAuthZEN = "net.openid.authzen/disposition"
	MetaRelatedTask        = "io.modelcontextprotocol/related-task"
	MetaImmediateResponse  = "io.modelcontextprotocol/model-immediate-response"
)

// Extension identifiers declared by the server.
const (
	ExtTasks               = "io.modelcontextprotocol/tasks"
	ExtToolApproval        = "io.modelcontextprotocol/tool-approval"
	ExtToolApprovalAuthZEN = "net.openid.authzen/tool-approval"
)

// Era is the MCP protocol era a task was created under; it decides the wire
// shape of its task objects.
type Era string

const (
	Era2026 Era = "2026-07-28"
	Era2025 Era = "2025-11-25"
)

// ApprovalState is the approver-facing state of a task's approval.
type ApprovalState string

const (
	ApprovalPending   ApprovalState = "pending"
	ApprovalApproved  ApprovalState = "approved" // quorum reached, re-evaluation and execution under way
	ApprovalExecuted  ApprovalState = "executed"
	ApprovalDenied    ApprovalState = "denied"
	ApprovalExpired   ApprovalState = "expired"
	ApprovalCancelled ApprovalState = "cancelled"
	ApprovalFailed    ApprovalState = "failed" // executed with an error, or outcome unknown
)

// Envelope is the immutable binding of a held call: what was asked, by whom,
// under which policy. The workflow executes exactly this and nothing else.
type Envelope struct {
	Version    int             `json:"version"`
	TaskID     string          `json:"taskId"`
	Tool       string          `json:"tool"`
	Arguments  json.RawMessage `json:"arguments"`
	ActionHash string          `json:"actionHash"` // hex, SEP-2672 §4.6
	Principal  string          `json:"principal"`
	// Subject is the principal's policy subject properties when the call
	// was made (pdp input.subject.properties: an OAuth caller's auth,
	// issuer, sub, client_id, scopes and configured claims); absent for a
	// static agent token. The re-evaluation after approval gives policy
	// these, not the token's state at that later time.
	Subject       map[string]any `json:"subject,omitempty"`
	Resource      string         `json:"resource"` // "tool:<name>"
	ServerID      string         `json:"serverId"`
	PolicyVersion string         `json:"policyVersion"`
	CreatedAt     time.Time      `json:"createdAt"`
	// InputResponses are the client's answers to the tool's input requests
	// (SEP-2322 MRTR), gathered before the task was created. Only an
	// unattended task (allowed by policy, no approvers) carries them: they
	// are not part of the action hash, so no approval ever covers them.
	InputResponses json.RawMessage `json:"inputResponses,omitempty"`
	// ToolPin identifies the tool as it was served when the call was made
	// (gateway.Tool.Pin): the execution refuses to run the call against a
	// tool that differs from it. Absent in an envelope made before pins
	// existed, whose call runs against the tool of that name, unchecked.
	// Not part of the action hash.
	ToolPin *ToolPin `json:"toolPin,omitempty"`
}

// ToolPin identifies a tool as served: who serves it, from where, and what
// it accepts. The digests are lowercase hex SHA-256 of JCS (RFC 8785)
// documents; see gateway.Tool.Pin for what they cover.
type ToolPin struct {
	// Source is the configured name of the upstream that serves the tool,
	// or "countersign" for Countersign's own tools.
	Source string `json:"source"`
	// Origin digests the source's identity: its name, its endpoint (an
	// HTTP upstream's URL without user info, a stdio upstream's command
	// line) and the tool's name there. Never headers or environment values.
	Origin string `json:"origin"`
	// Schema digests the tool's input schema.
	Schema string `json:"schema"`
}

// EnvelopeVersion is the current Envelope layout.
const EnvelopeVersion = 1

// Requirement is what policy demands before the call may run.
type Requirement struct {
	Group              string        `json:"group"`
	Quorum             int           `json:"quorum"`
	TTL                time.Duration `json:"ttl"`
	AuthenticatorClass string        `json:"authenticatorClass"`
	Reason             string        `json:"reason"`
	SlackChannel       string        `json:"slackChannel,omitempty"`
}

// ApprovalEntry is one accepted approver decision, as shown to approvers.
type ApprovalEntry struct {
	ApproverID   string    `json:"approverId"`
	ApproverName string    `json:"approverName"`
	CredentialID string    `json:"credentialId"`
	Decision     string    `json:"decision"` // "approve" or "deny"
	At           time.Time `json:"at"`
}

// RPCError is a JSON-RPC error object, for failed tasks.
type RPCError struct {
	Code    int64  `json:"code"`
	Message string `json:"message"`
}

// Record is the read model of a task.
type Record struct {
	TaskID        string    `json:"taskId"`
	Owner         string    `json:"owner"`
	Era           Era       `json:"era"`
	Status        Status    `json:"status"`
	StatusMessage string    `json:"statusMessage,omitempty"`
	CreatedAt     time.Time `json:"createdAt"`
	LastUpdatedAt time.Time `json:"lastUpdatedAt"`
	// Seq is the workflow outbox sequence of the last projection written
	// (activities.Publish): a write with a sequence at or below it is a
	// retry or a late duplicate and changes nothing.
	Seq int64 `json:"seq,omitempty"`
	// StartAttemptAt is when a request last set out to start the task's
	// workflow again because its record had none (approvals resumes the
	// orphan of a crash between the record and the start). With
	// CreatedAt it dates the last start attempt; see [Record.Unconfirmed].
	StartAttemptAt time.Time `json:"startAttemptAt,omitzero"`
	// ExecutionClaimedAt is when the task's workflow took the record's
	// execution fence ([Store.ClaimExecution]), right before it ran the
	// tool. A record that has it is confirmed: no judgement of a start
	// that failed or was lost fails, deletes or resumes it, and no second
	// execution of the task is ever let through.
	ExecutionClaimedAt time.Time `json:"executionClaimedAt,omitzero"`
	// ExecutionClaim identifies the execution attempt that took the fence
	// (a token of its own), so that attempt taking it again, after a write
	// whose answer was lost, finds it its own.
	ExecutionClaim string `json:"executionClaim,omitempty"`
	// TraceParent is the W3C traceparent of the request that created the
	// task (its tools/call span), when tracing was on: an approver's
	// decision, a request of its own, links its span to it.
	TraceParent string `json:"traceParent,omitempty"`
	// TTL is the task's lifetime from creation; it covers the approval
	// window plus result retention (DefaultResultRetention unless
	// configured) and is extended when the task ends.
	TTL          time.Duration `json:"ttl"`
	PollInterval time.Duration `json:"pollInterval"`

	Result      json.RawMessage `json:"result,omitempty"` // the CallToolResult, when completed
	Error       *RPCError       `json:"error,omitempty"`  // when failed
	Disposition Disposition     `json:"disposition,omitempty"`

	// The approval, as shown to approvers.
	Tool          string          `json:"tool"`
	Arguments     json.RawMessage `json:"arguments"`
	ActionHash    string          `json:"actionHash"`
	DisplayText   string          `json:"displayText"`
	ApprovalRef   string          `json:"approvalRef"`
	Requirement   Requirement     `json:"requirement"`
	ExpiresAt     time.Time       `json:"expiresAt"`
	ApprovalState ApprovalState   `json:"approvalState"`
	Approvals     []ApprovalEntry `json:"approvals,omitempty"`
	Timeline      []Event         `json:"timeline,omitempty"`

	// DedupKey releases the dedup slot when the task ends.
	DedupKey string `json:"dedupKey,omitempty"`

	// InputRequests are the unanswered input requests of an input_required
	// task (SEP-2663 + SEP-2322), keyed by request ID; see input.go.
	InputRequests map[string]json.RawMessage `json:"inputRequests,omitempty"`

	// Start is what its workflow's start needs beyond the fields above,
	// kept for a task whose workflow starts after the call was answered
	// (approvals): should the process die before the start, the task is
	// resumed from its record. Never shown to anyone.
	Start *StartFacts `json:"start,omitempty"`
}

// StartFacts are the parts of a task's [ApprovalInput] its [Record] does
// not otherwise hold.
type StartFacts struct {
	Mode          Mode            `json:"mode"`
	Subject       map[string]any  `json:"subject,omitempty"`
	ServerID      string          `json:"serverId"`
	PolicyVersion string          `json:"policyVersion"`
	Inputs        json.RawMessage `json:"inputs,omitempty"`
	ToolPin       *ToolPin        `json:"toolPin,omitempty"`
}

// NewID returns a fresh unguessable identifier with the given prefix: 160
// random bits, base32 without padding, lowercase.
func NewID(prefix string) string {
	var b [20]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("tasks: crypto/rand failed: " + err.Error()) // the runtime guarantees it does not
	}
	return prefix + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// ValidID reports whether s has the shape of an ID made by [NewID] with one of
// our prefixes. It guards KV keys against arbitrary client input.
func ValidID(s string) bool {
	i := strings.IndexByte(s, '_')
	if i < 1 || i > 8 || len(s)-i-1 != 32 {
		return false
	}
	for _, c := range s[i+1:] {
		if !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return false
		}
	}
	for _, c := range s[:i] {
		if c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

// Unconfirmed reports whether no workflow has written to the record yet
// (Seq 0) nor claimed its execution (ExecutionClaimedAt zero) and, if so,
// how long ago the last start of its workflow was attempted (the creation,
// or a later resume). A start takes at most a bounded time (approvals'
// start timeout), so an unconfirmed record older than that, whose workflow
// Temporal does not know, is an orphan.
func (r Record) Unconfirmed(now time.Time) (age time.Duration, ok bool) {
	if r.Seq > 0 || !r.ExecutionClaimedAt.IsZero() {
		return 0, false
	}
	return now.Sub(later(r.CreatedAt, r.StartAttemptAt)), true
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
