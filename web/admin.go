package web

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/approverapi"
	"github.com/countersign/countersign/internal/authn"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// admin guards an endpoint with the admin bearer token. A missing, unknown
// or non-admin token is 401; a token store failure is a 500, not a 401, so
// an outage is not mistaken for a revoked token.
func (h *Handler) admin(fn apiFunc) apiFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		err := h.tokens.AuthorizeAdmin(r)
		switch {
		case errors.Is(err, authn.ErrMissingToken):
			return errUnauthorized
		case errors.Is(err, authn.ErrInvalidToken):
			return errInvalidAdminToken
		case err != nil:
			return fmt.Errorf("web: check admin token: %w", err)
		}
		return fn(w, r)
	}
}

type addApproverRequest struct {
	Name   string   `json:"name"`
	Groups []string `json:"groups"`
	// Principals are the agent identities the approver acts as, who may
	// not approve their own calls; omitted, the approver's name.
	Principals []string `json:"principals,omitempty"`
}

type addApproverResponse struct {
	ApproverID string `json:"approverId"`
	EnrollURL  string `json:"enrollUrl"`
}

// addApprover: POST /admin/v1/approvers {name, groups, principals?} → 201
// {approverId, enrollUrl}. A name or principal that mixes scripts like a
// look-alike ("аlice" with a Cyrillic "а") is a 400.
func (h *Handler) addApprover(w http.ResponseWriter, r *http.Request) error {
	if err := h.canRecord(); err != nil {
		return err
	}
	var req addApproverRequest
	if err := h.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	ctx := passkey.WithActor(r.Context(), h.actor(r))
	a, token, err := h.passkeys.AddApprover(ctx, req.Name, req.Groups, passkey.WithPrincipals(req.Principals...))
	if err != nil {
		return invalidArgument(err)
	}
	writeJSON(w, http.StatusCreated, addApproverResponse{ApproverID: a.ID, EnrollURL: h.enrollURL(token)})
	return nil
}

type approverView struct {
	ID         string                `json:"id"`
	Name       string                `json:"name"`
	Groups     []string              `json:"groups"`
	Principals []string              `json:"principals"`
	CreatedAt  time.Time             `json:"createdAt"`
	Status     string                `json:"status"` // active, disabled or revoked (manage.go)
	DisabledAt time.Time             `json:"disabledAt,omitzero"`
	RevokedAt  time.Time             `json:"revokedAt,omitzero"`
	AuditChain string                `json:"auditChain"`
	Passkeys   []passkey.PasskeyInfo `json:"passkeys"`
}

// approverView is a as admins see it, with their passkeys (an error
// wrapping passkey.ErrNotFound when a was removed meanwhile).
func (h *Handler) approverView(r *http.Request, a passkey.Approver) (approverView, error) {
	pks, err := h.passkeys.Passkeys(r.Context(), a.ID)
	if err != nil {
		return approverView{}, err
	}
	principals := a.Principals
	if principals == nil {
		principals = []string{}
	}
	return approverView{ID: a.ID, Name: a.Name, Groups: a.Groups, Principals: principals, CreatedAt: a.CreatedAt,
		Status: a.Status(), DisabledAt: a.DisabledAt, RevokedAt: a.RevokedAt,
		AuditChain: audit.AdminChainID(audit.AdminTarget{Type: audit.TargetApprover, ID: a.ID}), Passkeys: pks}, nil
}

// listApprovers: GET /admin/v1/approvers → 200 [...] by id: every approver
// with their groups, principals, status, admin audit chain and passkeys
// (id, transports, counter, dates, status), including the passkeys agents enrolled in-band (SEP-2672), which
// belong to an approver mapped to the agent's principal.
func (h *Handler) listApprovers(w http.ResponseWriter, r *http.Request) error {
	as, err := h.passkeys.Approvers(r.Context())
	if err != nil {
		return err
	}
	out := make([]approverView, 0, len(as))
	for _, a := range as {
		v, err := h.approverView(r, a)
		if errors.Is(err, passkey.ErrNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return err
		}
		out = append(out, v)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

type inviteResponse struct {
	EnrollURL string `json:"enrollUrl"`
}

// newInvite: POST /admin/v1/approvers/{id}/invites → 201 {enrollUrl}, to
// enroll another device.
func (h *Handler) newInvite(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if !approverapi.ValidKey(id, 64) {
		return notFound("no such approver")
	}
	if err := h.canRecord(); err != nil {
		return err
	}
	if err := h.decodeJSON(w, r, &struct{}{}, false); err != nil {
		return err
	}
	token, err := h.passkeys.NewInvite(passkey.WithActor(r.Context(), h.actor(r)), id)
	switch {
	case errors.Is(err, passkey.ErrNotFound):
		return notFound("no such approver")
	case errors.Is(err, passkey.ErrRevoked):
		return &apiError{Status: http.StatusConflict, Code: codeRevoked, Message: "the approver is revoked; a revocation is permanent"}
	case err != nil:
		return invalidArgument(err)
	}
	writeJSON(w, http.StatusCreated, inviteResponse{EnrollURL: h.enrollURL(token)})
	return nil
}

type addAgentRequest struct {
	Name string `json:"name"`
}

type addAgentResponse struct {
	Name        string `json:"name"`
	Token       string `json:"token"`
	AuditChain  string `json:"auditChain"`
	AuditRecord string `json:"auditRecord"`
}

var errAgentNameTaken = &apiError{Status: http.StatusConflict, Code: codeNameTaken, Message: "an agent with that name already exists"}

// addAgent: POST /admin/v1/agents {name} → 201 {name, token, auditChain,
// auditRecord}. The token is shown once. The agent's creation is recorded
// in its admin chain before its token is stored, so a server that cannot
// sign refuses (503) and every agent token has its record.
func (h *Handler) addAgent(w http.ResponseWriter, r *http.Request) error {
	if err := h.canRecord(); err != nil {
		return err
	}
	var req addAgentRequest
	if err := h.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	if !authn.ValidName(req.Name) {
		return badRequest("%s", strings.TrimPrefix(authn.ErrInvalidName.Error(), "authn: "))
	}
	taken, err := h.tokens.NameTaken(r.Context(), req.Name, authn.KindAgent)
	if err != nil {
		return err
	}
	if taken {
		return errAgentNameTaken
	}
	chain, rec, err := RecordAgentCreated(r.Context(), h.audit, req.Name, h.actor(r))
	if err != nil {
		return err
	}
	token, err := h.tokens.Issue(r.Context(), req.Name, authn.KindAgent)
	switch {
	case errors.Is(err, authn.ErrNameTaken):
		// Added by another request since the check: its record is
		// the one just returned (a create is recorded once).
		return errAgentNameTaken
	case err != nil:
		return err
	}
	writeJSON(w, http.StatusCreated, addAgentResponse{Name: req.Name, Token: token, AuditChain: chain, AuditRecord: rec.RecordRef})
	return nil
}

type pendingApproval struct {
	Ref         string              `json:"ref"`
	TaskID      string              `json:"taskId"`
	Tool        string              `json:"tool"`
	Status      tasks.ApprovalState `json:"status"`
	ApproveURL  string              `json:"approveUrl"`
	DisplayText string              `json:"displayText"`
	Requester   string              `json:"requester"`
	ExpiresAt   time.Time           `json:"expiresAt"`
	Approved    int                 `json:"approved"`
	Needed      int                 `json:"needed"`
}

// listApprovals: GET /admin/v1/approvals?status=pending → 200 [...], oldest
// first. "pending" is the only status (and the default).
func (h *Handler) listApprovals(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	for k := range q {
		if k != "status" {
			return badRequest("unknown query parameter %q", approverapi.Clip(k))
		}
	}
	if st := q["status"]; len(st) > 1 || (len(st) == 1 && st[0] != string(tasks.ApprovalPending)) {
		return badRequest("status must be %q", tasks.ApprovalPending)
	}
	recs, err := h.approvals.Pending(r.Context())
	if err != nil {
		return err
	}
	out := make([]pendingApproval, 0, len(recs))
	for _, rec := range recs {
		out = append(out, pendingApproval{
			Ref:         rec.ApprovalRef,
			TaskID:      rec.TaskID,
			Tool:        rec.Tool,
			Status:      rec.ApprovalState,
			ApproveURL:  h.approveURL(rec.ApprovalRef),
			DisplayText: rec.DisplayText,
			Requester:   rec.Owner,
			ExpiresAt:   rec.ExpiresAt,
			Approved:    rec.Approved(),
			Needed:      rec.Requirement.Quorum,
		})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// invalidArgument turns a passkey validation failure into a 400 carrying
// its description, which names the rule broken and nothing internal.
func invalidArgument(err error) error {
	if errors.Is(err, passkey.ErrInvalidArgument) {
		return badRequest("%s", strings.TrimPrefix(err.Error(), "passkey: "))
	}
	return err
}

func (h *Handler) enrollURL(token string) string { return h.publicURL + "/enroll/" + token }
func (h *Handler) approveURL(ref string) string  { return h.publicURL + "/approve/" + ref }
