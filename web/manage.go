package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/approverapi"
	"github.com/countersign/countersign/internal/authn"
	"github.com/countersign/countersign/internal/oauth"
	"github.com/countersign/countersign/passkey"
)

// Listing, disabling, enabling and revoking agents, approvers and
// passkeys. Each change is recorded in the target's admin chain of the
// audit log (audit.AdminChainID), so a server that cannot sign audit
// records refuses them (503) before changing anything.

const codeRevoked = "revoked"

var errAdminAuditOff = &apiError{Status: http.StatusServiceUnavailable, Code: "audit_unavailable",
	Message: "admin changes are recorded in the signed audit log, and this server has no audit signing keys (--audit-key-dir); nothing was changed"}

func (h *Handler) routesManage(m *http.ServeMux) {
	m.HandleFunc("GET /admin/v1/agents", h.api(h.admin(h.listAgents)))
	for _, action := range []string{authn.ActionDisable, authn.ActionEnable, authn.ActionRevoke} {
		m.HandleFunc("POST /admin/v1/agents/{name}/"+action, h.api(h.admin(h.agentAction(action))))
		m.HandleFunc("POST /admin/v1/approvers/{id}/"+action, h.api(h.admin(h.approverAction(action))))
		m.HandleFunc("POST /admin/v1/approvers/{id}/passkeys/{credential}/"+action, h.api(h.admin(h.passkeyAction(action))))
	}
}

type agentView struct {
	Name       string    `json:"name"`
	Kind       string    `json:"kind"` // "agent" (a token of ours) or "oauth" (an OAuth principal)
	Status     string    `json:"status"`
	CreatedAt  time.Time `json:"createdAt"`
	DisabledAt time.Time `json:"disabledAt,omitzero"`
	RevokedAt  time.Time `json:"revokedAt,omitzero"`
	AuditChain string    `json:"auditChain"`
}

func newAgentView(p authn.Principal) agentView {
	return agentView{Name: p.Name, Kind: p.Kind, Status: p.Status(), CreatedAt: p.CreatedAt, DisabledAt: p.DisabledAt, RevokedAt: p.RevokedAt,
		AuditChain: audit.AdminChainID(audit.AdminTarget{Type: audit.TargetAgent, ID: p.Name})}
}

// listAgents: GET /admin/v1/agents → 200 [...] by name: every agent with
// its status (active, disabled, revoked) and its admin audit chain. Tokens
// are never shown again.
func (h *Handler) listAgents(w http.ResponseWriter, r *http.Request) error {
	ps, err := h.tokens.Agents(r.Context())
	if err != nil {
		return err
	}
	out := make([]agentView, 0, len(ps))
	for _, p := range ps {
		out = append(out, newAgentView(p))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// actionResponse answers every admin action: the target after it, whether
// it changed anything (a second revoke does not, and is not an error) and
// the audit record of the change.
type actionResponse struct {
	Action      string `json:"action"`
	Changed     bool   `json:"changed"`
	Status      string `json:"status"`
	AuditChain  string `json:"auditChain,omitempty"`
	AuditRecord string `json:"auditRecord,omitempty"`
	Agent       any    `json:"agent,omitempty"`
	Approver    any    `json:"approver,omitempty"`
	Passkey     any    `json:"passkey,omitempty"`
}

// actor is who an admin record says acted: the admin token's principal.
func (h *Handler) actor(r *http.Request) string {
	p, err := h.tokens.Lookup(r.Context(), authn.BearerToken(r.Header.Get("Authorization")))
	if err != nil {
		return "admin:?"
	}
	return "admin:" + p.Name
}

// record writes the admin record of a change. An unchanged disable or
// enable writes nothing; an unchanged revoke writes its record only if the
// revocation answered earlier lost it (a target's revoke record is written
// once: a retry heals the chain and never duplicates it).
func (h *Handler) record(r *http.Request, res *actionResponse, a audit.AdminAction, changed bool, rev uint64) error {
	res.AuditChain = audit.AdminChainID(a.Target)
	if !changed && a.Action != audit.AdminRevoke {
		return nil
	}
	chain, rec, err := h.audit.RecordAdmin(r.Context(), a, rev)
	if err != nil {
		return fmt.Errorf("web: record admin action: %w", err)
	}
	res.AuditChain, res.AuditRecord = chain, rec.RecordRef
	return nil
}

func (h *Handler) canRecord() error {
	if h.audit == nil || !h.audit.CanSign() {
		return errAdminAuditOff
	}
	return nil
}

// agentAction: POST /admin/v1/agents/{name}/{disable,enable,revoke} → 200
// actionResponse. Unknown agent: 404. Enable or disable a revoked agent:
// 409 (a revocation is permanent). Takes effect at once on every replica.
func (h *Handler) agentAction(action string) apiFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if err := h.canRecord(); err != nil {
			return err
		}
		if err := h.decodeJSON(w, r, &struct{}{}, false); err != nil {
			return err
		}
		name := r.PathValue("name")
		var (
			p   authn.Principal
			ch  authn.Change
			err error
		)
		if strings.HasPrefix(name, authn.OAuthPrefix) {
			// An OAuth principal: its tokens come from the identity
			// provider, so its status is all Countersign holds.
			if !oauth.ValidPrincipal(name) {
				return notFound(fmt.Sprintf("no agent named %q: not a principal an OAuth access token can give", approverapi.Clip(name)))
			}
			p, ch, err = h.tokens.SetOAuthStatus(r.Context(), name, action)
		} else {
			p, ch, err = h.tokens.SetAgentStatus(r.Context(), name, action)
		}
		switch {
		case errors.Is(err, authn.ErrNotFound):
			return notFound(fmt.Sprintf("no agent named %q", approverapi.Clip(name)))
		case errors.Is(err, authn.ErrRevoked):
			return &apiError{Status: http.StatusConflict, Code: codeRevoked,
				Message: fmt.Sprintf("agent %q is revoked; a revocation is permanent, so it cannot be %sd", approverapi.Clip(name), action)}
		case err != nil:
			return err
		}
		res := actionResponse{Action: action, Changed: ch.Changed, Status: ch.Status, Agent: newAgentView(p)}
		err = h.record(r, &res, audit.AdminAction{Action: action, Target: audit.AdminTarget{Type: audit.TargetAgent, ID: p.Name},
			Status: ch.Status, By: h.actor(r), At: ch.At}, ch.Changed, ch.Revision)
		if err != nil {
			return err
		}
		h.log.InfoContext(r.Context(), "web: agent status set", "agent", p.Name, "action", action, "status", ch.Status, "changed", ch.Changed)
		writeJSON(w, http.StatusOK, res)
		return nil
	}
}

// approverAction: POST /admin/v1/approvers/{id}/{disable,enable,revoke} →
// 200 actionResponse. A disabled or revoked approver's passkeys no longer
// verify (a challenge already issued included) and are not offered; the
// approver cannot deny through Slack, enroll or open their inbox.
func (h *Handler) approverAction(action string) apiFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if err := h.canRecord(); err != nil {
			return err
		}
		if err := h.decodeJSON(w, r, &struct{}{}, false); err != nil {
			return err
		}
		id := r.PathValue("id")
		a, ch, err := h.passkeys.SetApproverStatus(r.Context(), id, action)
		if err := statusError(err, "approver "+quote(id), action); err != nil {
			return err
		}
		view, err := h.approverView(r, a)
		if err != nil {
			return err
		}
		res := actionResponse{Action: action, Changed: ch.Changed, Status: ch.Status, Approver: view}
		err = h.record(r, &res, audit.AdminAction{Action: action, Target: audit.AdminTarget{Type: audit.TargetApprover, ID: a.ID},
			Status: ch.Status, By: h.actor(r), At: ch.At}, ch.Changed, ch.Revision)
		if err != nil {
			return err
		}
		h.log.InfoContext(r.Context(), "web: approver status set", "approver_id", a.ID, "action", action, "status", ch.Status, "changed", ch.Changed)
		writeJSON(w, http.StatusOK, res)
		return nil
	}
}

// passkeyAction: POST
// /admin/v1/approvers/{id}/passkeys/{credential}/{disable,enable,revoke} →
// 200 actionResponse: one passkey (a lost phone) without the approver's
// others.
func (h *Handler) passkeyAction(action string) apiFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if err := h.canRecord(); err != nil {
			return err
		}
		if err := h.decodeJSON(w, r, &struct{}{}, false); err != nil {
			return err
		}
		id, cred := r.PathValue("id"), r.PathValue("credential")
		info, ch, err := h.passkeys.SetPasskeyStatus(r.Context(), id, cred, action)
		if err := statusError(err, "passkey "+quote(cred)+" of approver "+quote(id), action); err != nil {
			return err
		}
		res := actionResponse{Action: action, Changed: ch.Changed, Status: ch.Status, Passkey: info}
		err = h.record(r, &res, audit.AdminAction{Action: action, Target: audit.AdminTarget{Type: audit.TargetPasskey, ID: cred, Approver: id},
			Status: ch.Status, By: h.actor(r), At: ch.At}, ch.Changed, ch.Revision)
		if err != nil {
			return err
		}
		h.log.InfoContext(r.Context(), "web: passkey status set", "approver_id", id, "credential_id", cred, "action", action, "status", ch.Status, "changed", ch.Changed)
		writeJSON(w, http.StatusOK, res)
		return nil
	}
}

// statusError maps a passkey status change's failure; nil stays nil.
func statusError(err error, what, action string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, passkey.ErrNotFound):
		return notFound("no " + what)
	case errors.Is(err, passkey.ErrRevoked):
		return &apiError{Status: http.StatusConflict, Code: codeRevoked,
			Message: fmt.Sprintf("%s is revoked; a revocation is permanent, so it cannot be %sd", what, action)}
	}
	return err
}

func quote(s string) string { return fmt.Sprintf("%q", approverapi.Clip(s)) }

// RecordAgentCreated records, in l, that by created the agent name: before
// its token is stored, by the admin API and by dev's bootstrap alike.
func RecordAgentCreated(ctx context.Context, l *audit.Log, name, by string) (string, audit.Receipt, error) {
	chain, rec, err := l.RecordAdmin(ctx, audit.AdminAction{Action: audit.AdminCreate,
		Target: audit.AdminTarget{Type: audit.TargetAgent, ID: name}, Status: authn.StatusActive,
		By: by, At: time.Now().UTC()}, 0)
	if err != nil {
		return "", audit.Receipt{}, fmt.Errorf("web: record the creation of agent %s: %w", name, err)
	}
	return chain, rec, nil
}

// errPasskeyAuditOff refuses a change to who can approve in a process that
// cannot sign its record.
var errPasskeyAuditOff = errors.New("changes to approvers and passkeys are recorded in the signed audit log, and this process has no audit signing keys (--audit-key-dir)")

// RecordPasskeyEvent records e, a change to who can approve (an approver
// added, an invite issued, a passkey enrolled: passkey.Options.Record), as
// an admin record in the approver's chain of l. Without a log that can
// sign it refuses, and the change does not happen.
func RecordPasskeyEvent(ctx context.Context, l *audit.Log, e passkey.Event) error {
	if l == nil || !l.CanSign() {
		return errPasskeyAuditOff
	}
	target := audit.AdminTarget{Type: audit.TargetApprover, ID: e.ApproverID}
	if e.Kind == passkey.EventEnroll {
		target = audit.AdminTarget{Type: audit.TargetPasskey, ID: e.CredentialID, Approver: e.ApproverID}
	}
	_, _, err := l.RecordAdmin(ctx, audit.AdminAction{Action: e.Kind, Target: target, Status: passkey.StatusActive,
		By: e.By, At: time.Now().UTC()}, e.Key)
	return err
}
