// Package approverapi is the approver API's wire contract, shared by its two
// edges: HTTP (package web) and NATS request/reply (the decision service of
// package notify, whose subjects mirror the HTTP endpoints: same request
// bodies, same reply bodies, the HTTP status in a header).
//
// It holds the JSON bodies and their builders, the checks of what approvers
// send that belong to the wire (the shape of a decision request), and the
// one mapping of what the approvals service answers, a verdict or an error,
// to a status and a body ([ViewReply], [ChallengeReply], [DecisionReply],
// [ErrorReply]). Neither edge maps them on its own, so both answer alike.
// The service itself (package approvals) is where a task changes; this
// package only speaks its wire.
package approverapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-webauthn/webauthn/protocol"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// Limits of what approvers send.
const (
	// DefaultMaxBodyBytes caps a request body unless an edge is told
	// otherwise.
	DefaultMaxBodyBytes = 256 << 10
	// MaxChallengeIDLen bounds a challenge ID.
	MaxChallengeIDLen = 128
	// MaxCommentRunes is the page's textarea maxlength.
	MaxCommentRunes = 500
	// MaxCommentBytes is the workflow's bound (workflows.MaxCommentLen).
	MaxCommentBytes = 1000
)

// DecideTimeout bounds one decision round trip through the approvals
// service (evidence check, then the workflow's update, which verifies again
// in an activity). Past it the answer is decision_in_progress.
const DecideTimeout = 30 * time.Second

// Approval is what an approver may see of a task: GET
// /approver/v1/approvals/{ref}. It never carries the task ID: the approval
// reference is the only handle approvers get.
type Approval struct {
	Ref         string              `json:"ref"`
	Tool        string              `json:"tool"`
	Arguments   json.RawMessage     `json:"arguments"`
	DisplayText string              `json:"displayText"`
	Requester   string              `json:"requester"`
	Reason      string              `json:"reason"`
	Status      tasks.ApprovalState `json:"status"`
	ExpiresAt   time.Time           `json:"expiresAt"`
	Approved    int                 `json:"approved"`
	Needed      int                 `json:"needed"`
	ActionHash  string              `json:"actionHash"`
	Approvals   []ApprovalEntry     `json:"approvals"`
	Timeline    []TimelineEvent     `json:"timeline"`
	// IdenticalCalls are the requester's other calls of this same call,
	// looked up when the approval is read.
	IdenticalCalls IdenticalCalls `json:"identicalCalls"`
}

// IdenticalCalls is what an approval shows of its requester's identical
// calls (tasks.IdenticalCalls): the other tasks of the same requester with
// the same tool and action hash that are pending or ended in the last 24
// hours, newest first, at most 10. The NATS approval events carry it too.
type IdenticalCalls struct {
	// Checked is false when the look-up failed: Calls then says nothing,
	// and Warning says so.
	Checked bool `json:"checked"`
	// Warning is set when one of the calls ran or may have run, or when
	// the look-up failed.
	Warning string          `json:"warning,omitempty"`
	Calls   []IdenticalCall `json:"calls"`
}

// IdenticalCall is one of an approval's [IdenticalCalls], named by its
// approval reference.
type IdenticalCall struct {
	Ref           string              `json:"ref"`
	Status        tasks.Status        `json:"status"`
	Disposition   tasks.Disposition   `json:"disposition,omitempty"`
	ApprovalState tasks.ApprovalState `json:"approvalState"`
	MayHaveRun    bool                `json:"mayHaveRun"`
	CreatedAt     time.Time           `json:"createdAt"`
	EndedAt       time.Time           `json:"endedAt,omitzero"`
}

// NewIdenticalCalls is the wire form of ic.
func NewIdenticalCalls(ic tasks.IdenticalCalls) IdenticalCalls {
	out := IdenticalCalls{Checked: !ic.Unknown, Warning: ic.Warning(), Calls: make([]IdenticalCall, 0, len(ic.Calls))}
	for _, c := range ic.Calls {
		out.Calls = append(out.Calls, IdenticalCall{Ref: c.Ref, Status: c.Status, Disposition: c.Disposition,
			ApprovalState: c.ApprovalState, MayHaveRun: c.MayHaveRun, CreatedAt: c.CreatedAt, EndedAt: c.EndedAt})
	}
	return out
}

// ApprovalEntry is one accepted decision of an [Approval].
type ApprovalEntry struct {
	ApproverName string    `json:"approverName"`
	Decision     string    `json:"decision"`
	At           time.Time `json:"at"`
}

// TimelineEvent is one step of an [Approval]'s timeline.
type TimelineEvent struct {
	At     time.Time `json:"at"`
	Kind   string    `json:"kind"`
	Detail string    `json:"detail,omitempty"`
}

// NewApproval is the approver's view of a, as approvals.Service.View
// returns it.
func NewApproval(a approvals.Approval) Approval {
	rec := a.Record
	args := rec.Arguments
	if len(bytes.TrimSpace(args)) == 0 {
		args = json.RawMessage("{}")
	}
	v := Approval{
		Ref:         rec.ApprovalRef,
		Tool:        rec.Tool,
		Arguments:   args,
		DisplayText: rec.DisplayText,
		Requester:   rec.Owner,
		Reason:      rec.Requirement.Reason,
		Status:      rec.ApprovalState,
		ExpiresAt:   rec.ExpiresAt,
		Approved:    rec.Approved(),
		Needed:      rec.Requirement.Quorum,
		ActionHash:  rec.ActionHash,
		Approvals:   make([]ApprovalEntry, 0, len(rec.Approvals)),
		Timeline:    make([]TimelineEvent, 0, len(rec.Timeline)),

		IdenticalCalls: NewIdenticalCalls(a.Identical),
	}
	for _, a := range rec.Approvals {
		v.Approvals = append(v.Approvals, ApprovalEntry{ApproverName: a.ApproverName, Decision: a.Decision, At: a.At})
	}
	for _, e := range rec.Timeline {
		// Keep the task ID out of the words should they ever mention it.
		detail := strings.ReplaceAll(e.Text(), rec.TaskID, "[task]")
		v.Timeline = append(v.Timeline, TimelineEvent{At: e.At, Kind: string(e.Kind), Detail: detail})
	}
	return v
}

// ChallengeRequest is the body of POST /approver/v1/approvals/{ref}/challenge.
// Its decision is checked by the approvals service (ErrInvalidDecision),
// after the reference.
type ChallengeRequest struct {
	Decision string `json:"decision"`
}

// Challenge answers a [ChallengeRequest]: a fresh single-use SEP-2672
// challenge for navigator.credentials.get(), bound to one decision.
type Challenge struct {
	ChallengeID    string                                     `json:"challengeId"`
	Decision       string                                     `json:"decision"`
	DisplayText    string                                     `json:"displayText"`
	ExpiresAt      time.Time                                  `json:"expiresAt"`
	RequestOptions protocol.PublicKeyCredentialRequestOptions `json:"requestOptions"`
}

// NewChallenge is the answer carrying ch, issued for decision.
func NewChallenge(ch passkey.Challenge, decision string) Challenge {
	return Challenge{
		ChallengeID:    ch.ID,
		Decision:       decision,
		DisplayText:    ch.DisplayText,
		ExpiresAt:      ch.ExpiresAt,
		RequestOptions: ch.RequestOptions,
	}
}

// DecisionRequest is the body of POST /approver/v1/approvals/{ref}/decision:
// one passkey-signed decision. The comment is not signed.
type DecisionRequest struct {
	ChallengeID string          `json:"challengeId"`
	Decision    string          `json:"decision"`
	Comment     string          `json:"comment,omitempty"`
	Response    json.RawMessage `json:"response"`
}

// Validate checks the request's shape; the first rule broken is a 400
// (*Error). The evidence itself is the approvals service's to check.
func (req *DecisionRequest) Validate() error {
	switch {
	case req.ChallengeID == "":
		return BadRequest("challengeId is required")
	case !ValidKey(req.ChallengeID, MaxChallengeIDLen):
		return BadRequest("challengeId is malformed")
	case req.Decision != tasks.DecisionApprove && req.Decision != tasks.DecisionDeny:
		return errBadDecision
	case !utf8.ValidString(req.Comment) || utf8.RuneCountInString(req.Comment) > MaxCommentRunes || len(req.Comment) > MaxCommentBytes:
		return BadRequest("comment must be at most %d characters (%d bytes) of UTF-8", MaxCommentRunes, MaxCommentBytes)
	case strings.IndexFunc(req.Comment, isDisallowedControl) >= 0:
		return BadRequest("comment contains control characters")
	case !IsJSONObject(req.Response):
		return BadRequest("response must be the PublicKeyCredential JSON object")
	}
	return nil
}

func isDisallowedControl(r rune) bool { return unicode.IsControl(r) && r != '\n' && r != '\t' }

// Update is the decision the request asks the approvals service for.
func (req *DecisionRequest) Update() tasks.DecisionUpdate {
	return tasks.DecisionUpdate{
		ChallengeID: req.ChallengeID,
		Decision:    req.Decision,
		Comment:     req.Comment,
		Method:      passkey.MethodWebAuthn,
		Response:    req.Response,
	}
}

// Decision answers a [DecisionRequest], in every outcome the approval
// reaches: the verdict and the approval's standing.
type Decision struct {
	Accepted bool                `json:"accepted"`
	Reason   string              `json:"reason,omitempty"`
	Status   tasks.ApprovalState `json:"status"`
	Approved int                 `json:"approved"`
	Needed   int                 `json:"needed"`
}

// Reply is one answer of the approver API: the status (HTTP's; the NATS
// decision service sends it in a header) and the body, sent as JSON.
type Reply struct {
	Status int
	Body   any
	// RetryAfter is HTTP's Retry-After, in seconds, when the same request
	// may be sent again for its outcome; "" otherwise.
	RetryAfter string
}

// ViewReply answers GET /approver/v1/approvals/{ref} with what
// approvals.Service.View returned.
func ViewReply(a approvals.Approval, err error) Reply {
	if err != nil {
		return ErrorReply(err)
	}
	return Reply{Status: http.StatusOK, Body: NewApproval(a)}
}

// ChallengeReply answers a [ChallengeRequest] for decision with what
// approvals.Service.Challenge returned.
func ChallengeReply(ch passkey.Challenge, decision string, err error) Reply {
	if err != nil {
		return ErrorReply(err)
	}
	return Reply{Status: http.StatusOK, Body: NewChallenge(ch, decision)}
}

// DecisionReply answers a [DecisionRequest] with what
// approvals.Service.Decide returned. A verdict is always in the [Decision]
// shape:
//
//	200 accepted
//	422 not accepted: the evidence was rejected (reason: a SEP-2672 name, or
//	    challenge_wrong_decision, approver_not_eligible, self_approval,
//	    already_approved…); 422 rather than 200 so that every accepted:false
//	    is a non-2xx
//	409 refused without weighing the evidence (task_not_pending, …), 400 for
//	    malformed_decision, 503 for verification_unavailable: [RejectedStatus]
//
// An error is [ErrorReply]'s.
func DecisionReply(v approvals.Verdict, err error) Reply {
	if err != nil {
		return ErrorReply(err)
	}
	status := http.StatusOK
	switch {
	case v.Refused:
		status = RejectedStatus(v.Reason)
	case !v.Accepted:
		status = http.StatusUnprocessableEntity
	}
	return Reply{Status: status, Body: Decision{Accepted: v.Accepted, Reason: v.Reason, Status: v.Status, Approved: v.Approved, Needed: v.Needed}}
}

// RejectedStatus is the status of a decision the task refused without
// weighing its evidence: a conflict with the task's state unless the reason
// says otherwise.
func RejectedStatus(reason string) int {
	switch reason {
	case tasks.ErrTypeMalformedDecision:
		return http.StatusBadRequest
	case tasks.ErrTypeVerificationUnavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusConflict
}

// IsJSONObject reports whether b is one JSON object.
func IsJSONObject(b json.RawMessage) bool {
	b = bytes.TrimSpace(b)
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}

// ValidKey reports whether s is 1..max characters of [A-Za-z0-9_-]: the
// shape of every identifier and token the API takes. Anything else is
// refused before it reaches a store.
func ValidKey(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
