package web

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/internal/approverapi"
	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// The approver inbox lists the pending approvals an approver may decide,
// without a login session: each listing is a passkey ceremony of its own.
//
//	GET  /inbox/{approver}                                    the page (the link the enrollment page gives out)
//	POST /approver/v1/inbox/{approver}/challenge              → 200 {challengeId, expiresAt, requestOptions}
//	POST /approver/v1/inbox/{approver}/list {challengeId, response}
//	                                                          → 200 {approver, approvals: [...]}
//
// The approver ID in the link is not a secret and grants nothing: it only
// picks which passkeys the browser is offered. The list goes to whoever's
// passkey signs the single-use challenge, and is that approver's list.
// The challenge is an ordinary SEP-2672 challenge whose "call" is the
// inbox itself: task "inbox-<approver id>", tool inboxTool and an action
// hash over a fixed label and the approver ID. It cannot be mistaken for an
// approval: a decision verifies against its real task ID, which never
// starts with "inbox-", and an approval challenge fails here with
// challenge_wrong_task.
//
// The list's text (the approver's name and each approval's tool, display
// text, requester and reason) has its invisible and bidirectional control
// characters made visible, by the reveal the approval page applies.

// inboxTool is the tool name of inbox challenges. What keeps them apart from
// approval challenges is the task ID: real ones are tasks.NewID("tsk_")
// IDs, and "inbox-…" is never one.
const inboxTool = "countersign/inbox"

// inboxClass accepts every passkey: reading the list needs no more than
// the weakest class an approval may ask for.
const inboxClass = "platform"

func inboxTaskID(approverID string) string { return "inbox-" + approverID }

func inboxHash(approverID string) canon.ActionHash {
	return canon.ActionHash(sha256.Sum256([]byte("countersign inbox v1\x00" + approverID)))
}

var errApproverNotFound = notFound("no such approver")

// inboxGroup is the group an inbox's challenges name: the approver's first
// group that decides tasks, "" when they have none. The in-band group
// decides none (passkey.InBandGroup), and the passkey service refuses a
// challenge for it.
func inboxGroup(a passkey.Approver) string {
	for _, g := range a.Groups {
		if g != passkey.InBandGroup {
			return g
		}
	}
	return ""
}

// inboxApprover resolves the approver in the path. One in no group that
// decides tasks (such as an agent's in-band approver) has no inbox.
func (h *Handler) inboxApprover(r *http.Request) (passkey.Approver, error) {
	a, err := h.passkeys.Approver(r.Context(), r.PathValue("approver"))
	if errors.Is(err, passkey.ErrNotFound) {
		return passkey.Approver{}, errApproverNotFound
	}
	if err == nil && inboxGroup(a) == "" {
		return passkey.Approver{}, errApproverNotFound
	}
	if err == nil && !a.Active() {
		return passkey.Approver{}, &apiError{Status: http.StatusForbidden, Code: passkey.ReasonApproverDisabled,
			Message: "this approver is " + a.Status() + " by an admin"}
	}
	return a, err
}

type inboxChallengeResponse struct {
	ChallengeID    string    `json:"challengeId"`
	ExpiresAt      time.Time `json:"expiresAt"`
	RequestOptions any       `json:"requestOptions"`
}

// inboxChallenge: POST /approver/v1/inbox/{approver}/challenge → a
// single-use challenge for "list my approvals".
func (h *Handler) inboxChallenge(w http.ResponseWriter, r *http.Request) error {
	a, err := h.inboxApprover(r)
	if err != nil {
		return err
	}
	if err := h.decodeJSON(w, r, &struct{}{}, false); err != nil {
		return err
	}
	ok, err := h.inboxChallenges.Allow(r.Context(), "inbox:"+a.ID, h.now())
	if err != nil {
		return fmt.Errorf("%w: inbox of %s: %w", approvals.ErrLimitUnavailable, a.ID, err)
	}
	if !ok {
		return errTooManyInboxChallenges
	}
	ch, err := h.passkeys.IssueChallenge(r.Context(), passkey.ChallengeRequest{
		TaskID:             inboxTaskID(a.ID),
		Tool:               inboxTool,
		ActionHash:         inboxHash(a.ID),
		Group:              inboxGroup(a),
		AuthenticatorClass: inboxClass,
		DisplayText:        "Show the pending approvals of " + a.Name,
		Asker:              passkey.AskerApprover,
	})
	if err != nil {
		if passkey.ReasonOf(err) == "" {
			return fmt.Errorf("web: issue inbox challenge: %w", err)
		}
		return err
	}
	writeJSON(w, http.StatusOK, inboxChallengeResponse{ChallengeID: ch.ID, ExpiresAt: ch.ExpiresAt, RequestOptions: ch.RequestOptions})
	return nil
}

type inboxListRequest struct {
	ChallengeID string          `json:"challengeId"`
	Response    json.RawMessage `json:"response"`
}

type inboxItem struct {
	Ref         string    `json:"ref"`
	URL         string    `json:"url"`
	Tool        string    `json:"tool"`
	DisplayText string    `json:"displayText"`
	Requester   string    `json:"requester"`
	Reason      string    `json:"reason"`
	ExpiresAt   time.Time `json:"expiresAt"`
	Approved    int       `json:"approved"`
	Needed      int       `json:"needed"`
}

type inboxListResponse struct {
	Approver  string      `json:"approver"`
	Approvals []inboxItem `json:"approvals"`
}

// inboxList: POST /approver/v1/inbox/{approver}/list {challengeId, response}
// → the pending approvals the signing approver may still decide: in one of
// their groups, not requested by them, not already decided by them, not
// expired.
func (h *Handler) inboxList(w http.ResponseWriter, r *http.Request) error {
	a, err := h.inboxApprover(r)
	if err != nil {
		return err
	}
	var req inboxListRequest
	if err := h.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	switch {
	case req.ChallengeID == "":
		return badRequest("challengeId is required")
	case !approverapi.ValidKey(req.ChallengeID, approverapi.MaxChallengeIDLen):
		return badRequest("challengeId is malformed")
	case !approverapi.IsJSONObject(req.Response):
		return badRequest("response must be the PublicKeyCredential JSON object")
	}
	v, err := h.passkeys.Verify(r.Context(), passkey.VerifyRequest{
		ChallengeID:        req.ChallengeID,
		TaskID:             inboxTaskID(a.ID),
		Tool:               inboxTool,
		ActionHash:         inboxHash(a.ID),
		Group:              inboxGroup(a),
		AuthenticatorClass: inboxClass,
		Method:             passkey.MethodWebAuthn,
		Response:           req.Response,
	})
	if err != nil {
		if passkey.ReasonOf(err) == "" && !errors.Is(err, passkey.ErrInvalidArgument) {
			return fmt.Errorf("web: verify inbox assertion: %w", err)
		}
		return err
	}
	signer := a
	if v.ApproverID != a.ID {
		// Another approver of the group signed on this link: the list is
		// theirs, since their passkey is what proves who is asking.
		if signer, err = h.passkeys.Approver(r.Context(), v.ApproverID); err != nil {
			return fmt.Errorf("web: inbox signer: %w", err)
		}
	}
	recs, err := h.approvals.Pending(r.Context())
	if err != nil {
		return fmt.Errorf("web: inbox: %w", err)
	}
	// The page shows these strings as they come, so they are revealed here
	// as the approval page reveals them: an agent's display text cannot
	// show the approver one thing in the list and another on the page.
	out := inboxListResponse{Approver: reveal(signer.Name), Approvals: []inboxItem{}}
	for _, rec := range recs {
		if !h.eligible(signer, rec) {
			continue
		}
		out.Approvals = append(out.Approvals, inboxItem{
			Ref:         rec.ApprovalRef,
			URL:         "/approve/" + rec.ApprovalRef,
			Tool:        reveal(rec.Tool),
			DisplayText: reveal(rec.DisplayText),
			Requester:   reveal(rec.Owner),
			Reason:      reveal(rec.Requirement.Reason),
			ExpiresAt:   rec.ExpiresAt,
			Approved:    rec.Approved(),
			Needed:      rec.Requirement.Quorum,
		})
	}
	h.log.InfoContext(r.Context(), "web: inbox listed", "approver_id", signer.ID, "count", len(out.Approvals))
	writeJSON(w, http.StatusOK, out)
	return nil
}

// eligible reports whether approver a may still decide rec, by the rules
// the workflow applies (group, not the requester, not already decided).
func (h *Handler) eligible(a passkey.Approver, rec tasks.Record) bool {
	if !h.pending(rec) || rec.ApprovalRef == "" {
		return false
	}
	inGroup := false
	for _, g := range a.Groups {
		if g == rec.Requirement.Group {
			inGroup = true
		}
	}
	if !inGroup {
		return false
	}
	if a.ActsAs(strings.TrimSpace(rec.Owner)) { // as the workflow's self_approval check
		return false
	}
	for _, d := range rec.Approvals {
		if d.ApproverID == a.ID {
			return false
		}
	}
	return true
}

type inboxPage struct {
	pageBase
	Name string
}

// inboxPage: GET /inbox/{approver}. The list itself needs a passkey; the
// page only carries the approver's name.
func (h *Handler) inboxPage(w http.ResponseWriter, r *http.Request) {
	a, err := h.inboxApprover(r)
	if err != nil {
		if errors.Is(err, errApproverNotFound) {
			h.renderError(w, r, http.StatusNotFound)
			return
		}
		if ae := (*apiError)(nil); errors.As(err, &ae) && ae.Status == http.StatusForbidden {
			h.renderError(w, r, http.StatusForbidden)
			return
		}
		h.log.ErrorContext(r.Context(), "web: inbox page", "route", r.Pattern, "error", err)
		h.renderError(w, r, http.StatusInternalServerError)
		return
	}
	h.render(w, r, http.StatusOK, "inbox", inboxPage{pageBase: h.base("inbox", "Your approvals"), Name: a.Name})
}
