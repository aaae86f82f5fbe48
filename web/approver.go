package web

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/go-webauthn/webauthn/protocol"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/internal/approverapi"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

const maxTokenLen = 128

// errNoEnrollment answers an enrollment token that cannot be one, without
// asking the store.
var errNoEnrollment = &apiError{Status: http.StatusNotFound, Code: passkey.ReasonNoPendingEnrollment,
	Message: "No pending enrollment: the invite is unknown, used or expired"}

type beginEnrollmentResponse struct {
	Options *protocol.CredentialCreation `json:"options"`
}

// beginEnrollment: POST /approver/v1/enrollments/{token}/begin → 200
// {options}: the navigator.credentials.create() options, user verification
// required.
func (h *Handler) beginEnrollment(w http.ResponseWriter, r *http.Request) error {
	token := r.PathValue("token")
	if !approverapi.ValidKey(token, maxTokenLen) {
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
	if !approverapi.ValidKey(token, maxTokenLen) {
		return errNoEnrollment
	}
	if err := h.canRecord(); err != nil {
		return err // enrollments are recorded
	}
	var req finishEnrollmentRequest
	if err := h.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	if !approverapi.IsJSONObject(req.Response) {
		return badRequest("response must be the PublicKeyCredential JSON object")
	}
	id, err := h.passkeys.FinishEnrollment(r.Context(), token, req.Response)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, finishEnrollmentResponse{CredentialID: id})
	return nil
}

// The approval endpoints are a thin adapter over the approvals service:
// each checks what belongs to the wire (the reference's shape, the JSON
// body), calls the service and answers with approverapi's mapping of its
// verdict or error, as the NATS decision service does.

// validRef refuses a reference that cannot be one before the body is read,
// as the service refuses it before touching the store (both 404).
func validRef(ref string) error {
	if !tasks.ValidID(ref) {
		return approvals.ErrNotFound
	}
	return nil
}

// getApproval: GET /approver/v1/approvals/{ref} → 200 approverapi.Approval.
// Its timeline is read from the task's audit chain when there is one, and
// its identical calls are looked up now.
func (h *Handler) getApproval(w http.ResponseWriter, r *http.Request) error {
	a, err := h.approvals.View(r.Context(), r.PathValue("ref"))
	h.send(w, r, approverapi.ViewReply(a, err), err)
	return nil
}

// challenge: POST /approver/v1/approvals/{ref}/challenge {decision} → 200
// {challengeId, decision, displayText, expiresAt, requestOptions}: a fresh
// single-use SEP-2672 challenge (nonce ‖ action hash) for
// navigator.credentials.get(), bound to one decision, so that an assertion
// signed to deny can never be submitted as an approval.
func (h *Handler) challenge(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("ref")
	if err := validRef(ref); err != nil {
		return err
	}
	var req approverapi.ChallengeRequest
	if err := h.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	ch, err := h.approvals.Challenge(r.Context(), ref, req.Decision)
	h.send(w, r, approverapi.ChallengeReply(ch, req.Decision, err), err)
	return nil
}

// decide: POST /approver/v1/approvals/{ref}/decision → the verdict on one
// passkey-signed decision, always in the decision shape (see
// approverapi.DecisionReply):
//
//	200 {accepted: true, status, approved, needed}
//	422 {accepted: false, reason, …}  evidence rejected (reason: SEP-2672 name,
//	                                  or challenge_wrong_decision, approver_not_eligible,
//	                                  self_approval, already_approved…)
//	409 {accepted: false, reason, …}  the workflow refused the update without
//	                                  looking at the evidence (task_not_pending, …)
//	400 / 503                         the workflow's malformed_decision /
//	                                  verification_unavailable (try again)
//
// and 503 decision_in_progress (Retry-After: 2) when the outcome did not
// arrive in time: the same request again is the same decision.
func (h *Handler) decide(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("ref")
	if err := validRef(ref); err != nil {
		return err
	}
	var req approverapi.DecisionRequest
	if err := h.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	if err := req.Validate(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), approverapi.DecideTimeout)
	defer cancel()
	v, err := h.approvals.Decide(ctx, ref, req.Update())
	h.send(w, r, approverapi.DecisionReply(v, err), err)
	return nil
}
