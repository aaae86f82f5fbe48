package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-webauthn/webauthn/protocol"

	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

const (
	maxTokenLen       = 128
	maxChallengeIDLen = 128
	maxCommentRunes   = 500  // the page's textarea has the same maxlength
	maxCommentBytes   = 1000 // the workflow's bound (workflows.MaxCommentLen)
)

// errNoEnrollment answers an enrollment token that cannot be one, without
// asking the store.
var errNoEnrollment = &apiError{status: http.StatusNotFound, code: passkey.ReasonNoPendingEnrollment,
	message: "No pending enrollment: the invite is unknown, used or expired"}

type beginEnrollmentResponse struct {
	Options *protocol.CredentialCreation `json:"options"`
}

// beginEnrollment: POST /approver/v1/enrollments/{token}/begin → 200
// {options}: the navigator.credentials.create() options, user verification
// required.
func (h *Handler) beginEnrollment(w http.ResponseWriter, r *http.Request) error {
	token := r.PathValue("token")
	if !validKey(token, maxTokenLen) {
		return errNoEnrollment
	}
	if err := h.decodeJSON(w, r, &struct{}{}, false); err != nil {
		return err
	}
	opts, err := h.passkeys.BeginEnrollment(r.Context(), token)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, beginEnrollmentResponse{Options: opts})
	return nil
}

type finishEnrollmentRequest struct {
	Response json.RawMessage `json:"response"`
}

type finishEnrollmentResponse struct {
	CredentialID string `json:"credentialId"`
}

// finishEnrollment: POST /approver/v1/enrollments/{token}/finish {response}
// → 201 {credentialId}. The invite is single-use.
func (h *Handler) finishEnrollment(w http.ResponseWriter, r *http.Request) error {
	token := r.PathValue("token")
	if !validKey(token, maxTokenLen) {
		return errNoEnrollment
	}
	var req finishEnrollmentRequest
	if err := h.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	if !isJSONObject(req.Response) {
		return badRequest("response must be the PublicKeyCredential JSON object")
	}
	id, err := h.passkeys.FinishEnrollment(r.Context(), token, req.Response)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, finishEnrollmentResponse{CredentialID: id})
	return nil
}

// approvalView is what an approver may see of a task. It never carries the
// task ID: the approval reference is the only handle approvers get.
type approvalView struct {
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
	Approvals   []approvalEntry     `json:"approvals"`
	Timeline    []timelineEvent     `json:"timeline"`
}

type approvalEntry struct {
	ApproverName string    `json:"approverName"`
	Decision     string    `json:"decision"`
	At           time.Time `json:"at"`
}

type timelineEvent struct {
	At     time.Time `json:"at"`
	Kind   string    `json:"kind"`
	Detail string    `json:"detail,omitempty"`
}

func newApprovalView(rec tasks.Record) approvalView {
	args := rec.Arguments
	if len(bytes.TrimSpace(args)) == 0 {
		args = json.RawMessage("{}")
	}
	v := approvalView{
		Ref:         rec.ApprovalRef,
		Tool:        rec.Tool,
		Arguments:   args,
		DisplayText: rec.DisplayText,
		Requester:   rec.Owner,
		Reason:      rec.Requirement.Reason,
		Status:      rec.ApprovalState,
		ExpiresAt:   rec.ExpiresAt,
		Approved:    approvedCount(rec),
		Needed:      rec.Requirement.Quorum,
		ActionHash:  rec.ActionHash,
		Approvals:   make([]approvalEntry, 0, len(rec.Approvals)),
		Timeline:    make([]timelineEvent, 0, len(rec.Timeline)),
	}
	for _, a := range rec.Approvals {
		v.Approvals = append(v.Approvals, approvalEntry{ApproverName: a.ApproverName, Decision: a.Decision, At: a.At})
	}
	for _, e := range rec.Timeline {
		// Keep the task ID out of the words should they ever mention it.
		detail := strings.ReplaceAll(e.Text(), rec.TaskID, "[task]")
		v.Timeline = append(v.Timeline, timelineEvent{At: e.At, Kind: e.Kind, Detail: detail})
	}
	return v
}

// lookupRef resolves an approval reference from the path. A reference that
// cannot be one is 404 without touching the store.
func (h *Handler) lookupRef(ctx context.Context, ref string) (tasks.Record, error) {
	if !tasks.ValidID(ref) {
		return tasks.Record{}, errApprovalNotFound
	}
	rec, err := h.store.ByRef(ctx, ref)
	if errors.Is(err, tasks.ErrTaskNotFound) {
		return tasks.Record{}, errApprovalNotFound
	}
	return rec, err
}

// getApproval: GET /approver/v1/approvals/{ref} → 200 approvalView. Its
// timeline is read from the task's audit chain when there is one.
func (h *Handler) getApproval(w http.ResponseWriter, r *http.Request) error {
	rec, err := h.lookupRef(r.Context(), r.PathValue("ref"))
	if err != nil {
		return err
	}
	rec = h.withAuditTimeline(r.Context(), rec) // see timeline.go
	writeJSON(w, http.StatusOK, newApprovalView(rec))
	return nil
}

// pending reports whether an approval can still take a decision, as far as
// the read model knows; the workflow has the last word.
func (h *Handler) pending(rec tasks.Record) bool {
	return rec.AwaitsApproval() && h.now().Before(rec.ExpiresAt)
}

type challengeRequest struct {
	Decision string `json:"decision"`
}

type challengeResponse struct {
	ChallengeID    string                                     `json:"challengeId"`
	Decision       string                                     `json:"decision"`
	DisplayText    string                                     `json:"displayText"`
	ExpiresAt      time.Time                                  `json:"expiresAt"`
	RequestOptions protocol.PublicKeyCredentialRequestOptions `json:"requestOptions"`
}

// challenge: POST /approver/v1/approvals/{ref}/challenge {decision} → 200
// {challengeId, decision, displayText, expiresAt, requestOptions}: a fresh
// single-use SEP-2672 challenge (nonce ‖ action hash) for
// navigator.credentials.get(), bound to one decision, so that an assertion
// signed to deny can never be submitted as an approval.
func (h *Handler) challenge(w http.ResponseWriter, r *http.Request) error {
	rec, err := h.lookupRef(r.Context(), r.PathValue("ref"))
	if err != nil {
		return err
	}
	var req challengeRequest
	if err := h.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	if err := validDecision(req.Decision); err != nil {
		return err
	}
	if !h.pending(rec) {
		return errTaskNotPending
	}
	if !h.challenges.Allow("ref:"+rec.ApprovalRef, h.now()) {
		return errTooManyChallenges
	}
	hash, err := canon.ParseActionHash(rec.ActionHash)
	if err != nil {
		return fmt.Errorf("web: record of approval %s: %w", rec.ApprovalRef, err)
	}
	ch, err := h.passkeys.IssueChallenge(r.Context(), passkey.ChallengeRequest{
		TaskID:             rec.TaskID,
		Tool:               rec.Tool,
		ActionHash:         hash,
		Group:              rec.Requirement.Group,
		AuthenticatorClass: rec.Requirement.AuthenticatorClass,
		DisplayText:        rec.DisplayText,
		Decision:           req.Decision,
	})
	if err != nil {
		if passkey.ReasonOf(err) == "" {
			// Invalid arguments here come from our own record: a 500.
			return fmt.Errorf("web: issue challenge: %w", err)
		}
		return err
	}
	writeJSON(w, http.StatusOK, challengeResponse{
		ChallengeID:    ch.ID,
		Decision:       req.Decision,
		DisplayText:    ch.DisplayText,
		ExpiresAt:      ch.ExpiresAt,
		RequestOptions: ch.RequestOptions,
	})
	return nil
}

func validDecision(d string) error {
	if d != tasks.DecisionApprove && d != tasks.DecisionDeny {
		return badRequest("decision must be %q or %q", tasks.DecisionApprove, tasks.DecisionDeny)
	}
	return nil
}

type decisionRequest struct {
	ChallengeID string          `json:"challengeId"`
	Decision    string          `json:"decision"`
	Comment     string          `json:"comment,omitempty"`
	Response    json.RawMessage `json:"response"`
}

type decisionResponse struct {
	Accepted bool                `json:"accepted"`
	Reason   string              `json:"reason,omitempty"`
	Status   tasks.ApprovalState `json:"status"`
	Approved int                 `json:"approved"`
	Needed   int                 `json:"needed"`
}

func (req *decisionRequest) validate() error {
	switch {
	case req.ChallengeID == "":
		return badRequest("challengeId is required")
	case !validKey(req.ChallengeID, maxChallengeIDLen):
		return badRequest("challengeId is malformed")
	case validDecision(req.Decision) != nil:
		return validDecision(req.Decision)
	case !utf8.ValidString(req.Comment) || utf8.RuneCountInString(req.Comment) > maxCommentRunes || len(req.Comment) > maxCommentBytes:
		return badRequest("comment must be at most %d characters (%d bytes) of UTF-8", maxCommentRunes, maxCommentBytes)
	case strings.IndexFunc(req.Comment, isDisallowedControl) >= 0:
		return badRequest("comment contains control characters")
	case !isJSONObject(req.Response):
		return badRequest("response must be the PublicKeyCredential JSON object")
	}
	return nil
}

func isDisallowedControl(r rune) bool { return unicode.IsControl(r) && r != '\n' && r != '\t' }

// decide: POST /approver/v1/approvals/{ref}/decision → the workflow's
// verdict on one passkey-signed decision, always in the decision shape:
//
//	200 {accepted: true, status, approved, needed}
//	422 {accepted: false, reason, …}  evidence rejected (reason: SEP-2672 name,
//	                                  or challenge_wrong_decision, approver_not_eligible,
//	                                  self_approval, already_approved…)
//	409 {accepted: false, reason, …}  the workflow refused the update without
//	                                  looking at the evidence (task_not_pending, …)
//	400 / 503                         the workflow's malformed_decision /
//	                                  verification_unavailable (try again)
func (h *Handler) decide(w http.ResponseWriter, r *http.Request) error {
	rec, err := h.lookupRef(r.Context(), r.PathValue("ref"))
	if err != nil {
		return err
	}
	var req decisionRequest
	if err := h.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	if err := req.validate(); err != nil {
		return err
	}
	current := decisionResponse{Status: rec.ApprovalState, Approved: approvedCount(rec), Needed: rec.Requirement.Quorum}
	ctx, cancel := context.WithTimeout(r.Context(), decideTimeout)
	defer cancel()
	d := tasks.DecisionUpdate{
		ChallengeID: req.ChallengeID,
		Decision:    req.Decision,
		Comment:     req.Comment,
		Method:      passkey.MethodWebAuthn,
		Response:    req.Response,
	}
	// Invalid evidence is turned away here, before it reaches the task's
	// workflow: it spends no budget valid decisions share, and the workflow
	// records a bounded number of such rejections.
	reason, err := h.checkEvidence(ctx, rec, d)
	if err != nil {
		return err
	}
	if !h.pending(rec) && reason != "" {
		// Nothing to record on a task that takes no more decisions.
		current.Reason = codeTaskNotPending
		writeJSON(w, http.StatusConflict, current)
		return nil
	}
	// Valid evidence on a task that looks decided goes on to the workflow
	// too: if it is the retry of a decision the workflow took (the answer
	// was lost, or the server died right after), the update has the same ID
	// and Temporal answers with its verdict; otherwise the workflow's
	// validator says the task is no longer pending.
	if reason != "" {
		h.recordRejection(ctx, rec, d, reason)
		current.Reason = reason
		h.log.InfoContext(r.Context(), "web: decision rejected", "approval_ref", rec.ApprovalRef, "reason", reason)
		writeJSON(w, http.StatusUnprocessableEntity, current)
		return nil
	}
	res, err := h.orch.Decide(ctx, rec.TaskID, d)
	var rejected *tasks.UpdateRejected
	switch {
	case errors.As(err, &rejected):
		current.Reason = rejected.Reason
		h.log.InfoContext(r.Context(), "web: decision refused", "approval_ref", rec.ApprovalRef, "reason", rejected.Reason)
		writeJSON(w, rejectedStatus(rejected.Reason), current)
		return nil
	case errors.Is(err, tasks.ErrWorkflowGone):
		current.Reason = codeTaskNotPending
		writeJSON(w, http.StatusConflict, current)
		return nil
	case errors.Is(err, tasks.ErrUpdateInProgress):
		// The workflow may still count it: the same request again is the
		// same decision and gets its outcome.
		w.Header().Set("Retry-After", "2")
		return &apiError{status: http.StatusServiceUnavailable, code: "decision_in_progress",
			message: "the decision is still being processed; send the same request again for its outcome", cause: err}
	case err != nil:
		return fmt.Errorf("web: decide: %w", err)
	}
	out := decisionResponse{Accepted: res.Accepted, Reason: res.Reason, Status: res.Status, Approved: res.Approved, Needed: res.Needed}
	status := http.StatusOK
	if !res.Accepted {
		status = http.StatusUnprocessableEntity
		h.log.InfoContext(r.Context(), "web: decision rejected", "approval_ref", rec.ApprovalRef, "reason", res.Reason)
	} else {
		h.log.InfoContext(r.Context(), "web: decision accepted", "approval_ref", rec.ApprovalRef, "decision", req.Decision)
	}
	writeJSON(w, status, out)
	return nil
}

// checkEvidence runs every passkey check on a decision without consuming
// its challenge and returns the rejection reason, or "" when the evidence
// holds. The workflow verifies again and consumes, under the decision's
// update ID (a retry of the same request passes here too).
func (h *Handler) checkEvidence(ctx context.Context, rec tasks.Record, d tasks.DecisionUpdate) (string, error) {
	hash, err := canon.ParseActionHash(rec.ActionHash)
	if err != nil {
		return "", fmt.Errorf("web: task %s: action hash: %w", rec.TaskID, err)
	}
	_, err = h.passkeys.Verify(ctx, passkey.VerifyRequest{
		ChallengeID:        d.ChallengeID,
		TaskID:             rec.TaskID,
		Tool:               rec.Tool,
		ActionHash:         hash,
		Group:              rec.Requirement.Group,
		AuthenticatorClass: rec.Requirement.AuthenticatorClass,
		Requester:          rec.Owner,
		ConsumerKey:        tasks.DecisionUpdateID(d),
		Decision:           d.Decision,
		Method:             d.Method,
		Response:           d.Response,
		CheckOnly:          true,
	})
	if reason := passkey.ReasonOf(err); reason != "" {
		return reason, nil
	}
	if err != nil {
		return "", &apiError{status: http.StatusServiceUnavailable, code: tasks.ErrTypeVerificationUnavailable,
			message: "the decision could not be verified; try again", cause: err}
	}
	return "", nil
}

// recordRejection asks the task's workflow to record a rejected decision in
// its timeline and audit chain. The workflow records a bounded number per
// task and refuses the rest without writing anything; either way the
// approver's answer is the same, so failures are only logged.
func (h *Handler) recordRejection(ctx context.Context, rec tasks.Record, d tasks.DecisionUpdate, reason string) {
	recorded := 0
	for _, ev := range rec.Timeline {
		if tasks.EventKind(ev.Kind) == tasks.EventRejectedDecision {
			recorded++
		}
	}
	if recorded >= tasks.MaxRecordedRejections {
		return // the workflow would refuse it: spare Temporal the round trip
	}
	err := h.orch.RecordRejection(ctx, rec.TaskID, tasks.RejectedDecision{
		ChallengeID: clipID(d.ChallengeID), Decision: d.Decision, Reason: reason})
	if err != nil {
		h.log.DebugContext(ctx, "web: rejection not recorded", "task_id", rec.TaskID, "reason", reason, "error", err)
	}
}

// clipID keeps a client-chosen challenge ID short enough to record.
func clipID(id string) string {
	const maxLen = 64
	if len(id) > maxLen || !utf8.ValidString(id) {
		return "(invalid)"
	}
	return id
}

// rejectedStatus is the HTTP status of a decision the workflow refused:
// a conflict with the task's state unless the reason says otherwise.
func rejectedStatus(reason string) int {
	switch reason {
	case tasks.ErrTypeMalformedDecision:
		return http.StatusBadRequest
	case tasks.ErrTypeVerificationUnavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusConflict
}

func isJSONObject(b json.RawMessage) bool {
	b = bytes.TrimSpace(b)
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}
