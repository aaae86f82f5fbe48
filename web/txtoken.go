package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/authn"
	"github.com/countersign/countersign/internal/oauth"
	"github.com/countersign/countersign/txtoken"
)

// TokenIssuer issues a transaction token on a principal's behalf after
// checking the call as tools/call would (the tool exists, the arguments
// validate; an error wrapping txtoken.ErrInvalidRequest is the caller's),
// and rotates the signing key (txtoken.Service.Rotate).
type TokenIssuer interface {
	IssueFor(ctx context.Context, principal, tool string, arguments json.RawMessage, issuedBy string) (txtoken.Issued, error)
	Rotate(ctx context.Context) (txtoken.Rotation, error)
}

var errTokensOff = notFound("transaction tokens are not enabled on this server")

type issueTokenRequest struct {
	Principal string          `json:"principal"`
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
}

type issueTokenResponse struct {
	txtoken.Issued
	MetaKey string `json:"metaKey"`
}

// issueToken: POST /admin/v1/transaction-tokens {principal, tool,
// arguments} → 201 {token, jti, kid, sub, tool, parameters_hash,
// issued_at, expires_at, metaKey}. An operator issues a single-use token
// for one exact call of an agent; policy is not asked (the operator is the
// human who decided), and the issuance is audited with issuedBy
// "admin:<name>". The agent's client sends the token in the tools/call's
// params._meta[metaKey].
func (h *Handler) issueToken(w http.ResponseWriter, r *http.Request) error {
	if h.txtokens == nil {
		return errTokensOff
	}
	var req issueTokenRequest
	if err := h.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	if !authn.ValidName(req.Principal) && !oauth.ValidPrincipal(req.Principal) {
		return badRequest("principal must be an agent's name (1-64 characters of letters, digits, '.', '_', '-' or '@') or an OAuth principal (%q and 1-%d bytes of its claim)",
			oauth.PrincipalPrefix, oauth.MaxPrincipalBytes)
	}
	if req.Tool == "" {
		return badRequest("tool is required")
	}
	if len(req.Arguments) == 0 || string(req.Arguments) == "null" {
		req.Arguments = json.RawMessage("{}")
	}
	admin, err := h.tokens.Lookup(r.Context(), authn.BearerToken(r.Header.Get("Authorization")))
	if err != nil {
		return err
	}
	is, err := h.txtokens.IssueFor(r.Context(), req.Principal, req.Tool, req.Arguments, "admin:"+admin.Name)
	if errors.Is(err, txtoken.ErrInvalidRequest) {
		return badRequest("%s", strings.TrimPrefix(err.Error(), "txtoken: invalid token request: "))
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, issueTokenResponse{Issued: is, MetaKey: txtoken.MetaKey})
	return nil
}

type rotateKeyResponse struct {
	KeyID       string `json:"kid"`
	Retired     string `json:"retired,omitempty"`
	AuditChain  string `json:"auditChain,omitempty"`
	AuditRecord string `json:"auditRecord,omitempty"`
}

// rotateTokenKey: POST /admin/v1/transaction-tokens/keys → 201 {kid,
// retired, auditChain, auditRecord}: a new signing key for every replica;
// the old one is retired (its tokens issued before now still verify until
// they expire). The rotation is an admin record (audit.AdminKeyRotate) in
// the new key's chain: who rotated, the new key and the one it retired.
// When a concurrent rotation won, this one made no key current: it
// answers the winner's key, without "retired", and records nothing (the
// winner does).
func (h *Handler) rotateTokenKey(w http.ResponseWriter, r *http.Request) error {
	if h.txtokens == nil {
		return errTokensOff
	}
	if err := h.canRecord(); err != nil {
		return err
	}
	if err := h.decodeJSON(w, r, &struct{}{}, false); err != nil {
		return err
	}
	rot, err := h.txtokens.Rotate(r.Context())
	if err != nil {
		return err
	}
	out := rotateKeyResponse{KeyID: rot.KeyID, Retired: rot.Retired}
	if rot.Retired != "" {
		// Key 0: a key becomes current once, so its chain holds one
		// rotation, and a retry of the record writes nothing new.
		chain, rec, err := h.audit.RecordAdmin(r.Context(), audit.AdminAction{Action: audit.AdminKeyRotate,
			Target: audit.AdminTarget{Type: audit.TargetTokenKey, ID: rot.KeyID}, Status: "active",
			By: h.actor(r), Replaced: rot.Retired, At: h.now().UTC()}, 0)
		if err != nil {
			return fmt.Errorf("web: record the rotation to %s (done; not recorded): %w", rot.KeyID, err)
		}
		out.AuditChain, out.AuditRecord = chain, rec.RecordRef
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}
