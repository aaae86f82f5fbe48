package notify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/approverapi"
	"github.com/countersign/countersign/internal/authn"
	"github.com/countersign/countersign/passkey"
)

// ErrUnknownSlackUser is returned for a Slack user linked to no approver.
var ErrUnknownSlackUser = errors.New("notify: slack user is not linked to an approver")

// ErrInvalidSlackUser is returned for a string that cannot be a Slack user ID.
var ErrInvalidSlackUser = errors.New("notify: slackUserId must be a Slack user ID such as U012AB3CD")

// SlackUsers maps Slack user IDs to approver IDs, in the NATS KV bucket
// [SlackUsersBucket] (key: Slack user ID). One Slack user is one approver;
// linking again replaces the link. A link lets the Slack user deny tasks
// for the approver, so [SlackUsers.LinkHandler] records every link, and
// the unlinking of a link it replaces, in the approvers' admin chains of
// the audit log.
type SlackUsers struct {
	kv       jetstream.KeyValue
	passkeys *passkey.Service
	audit    *audit.Log
	log      *slog.Logger
}

type slackUserRecord struct {
	// ApproverID is the approver the Slack user is linked to; empty once
	// unlinked.
	ApproverID string `json:"approverId"`
	// Unlinked is the approver the Slack user was unlinked from, when
	// ApproverID is empty (see Unlink).
	Unlinked string `json:"unlinked,omitempty"`
	// Replaced is the approver the Slack user was linked to before this
	// link, so that a retried link can record the unlinking too.
	Replaced string `json:"replaced,omitempty"`
}

// SlackUsersOptions configures [NewSlackUsers].
type SlackUsersOptions struct {
	// Passkeys resolves the approvers linked to. Required.
	Passkeys *passkey.Service
	// Audit records the links. Without it, or without its signing keys,
	// LinkHandler refuses every link (503 audit_unavailable).
	Audit *audit.Log
	// Replicas of the mapping bucket in a clustered NATS; 0 means 1.
	Replicas int
	// Logger; nil discards.
	Logger *slog.Logger
}

// NewSlackUsers opens (or creates) the mapping bucket.
func NewSlackUsers(ctx context.Context, js jetstream.JetStream, opts SlackUsersOptions) (*SlackUsers, error) {
	if js == nil || opts.Passkeys == nil {
		return nil, errors.New("notify: SlackUsers needs JetStream and the passkey service")
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      SlackUsersBucket,
		Description: "Countersign: Slack user ID → approver ID",
		Storage:     jetstream.FileStorage,
		Replicas:    max(opts.Replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("notify: slack users bucket: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &SlackUsers{kv: kv, passkeys: opts.Passkeys, audit: opts.Audit, log: log}, nil
}

// ValidSlackUserID reports whether s looks like a Slack user ID (U… or W…,
// uppercase letters and digits).
func ValidSlackUserID(s string) bool {
	if len(s) < 3 || len(s) > 32 || (s[0] != 'U' && s[0] != 'W') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// LinkChange is what [SlackUsers.Link] did.
type LinkChange struct {
	// Changed is false when the Slack user was linked to the approver
	// already.
	Changed bool
	// Replaced is the approver the link replaced, if another.
	Replaced string
	// Revision is the link's revision in the bucket, the key of its audit
	// records.
	Revision uint64
	// At is when the link was made.
	At time.Time
}

// Link links a Slack user to an existing approver, in place of any link
// the user had. It records nothing: the admin endpoint, LinkHandler, does.
func (u *SlackUsers) Link(ctx context.Context, approverID, slackUserID string) (LinkChange, error) {
	if !ValidSlackUserID(slackUserID) {
		return LinkChange{}, ErrInvalidSlackUser
	}
	if _, err := u.passkeys.Approver(ctx, approverID); err != nil {
		return LinkChange{}, err // passkey.ErrNotFound for an unknown approver
	}
	for attempt := 0; ; attempt++ {
		var prev slackUserRecord
		var rev uint64
		e, err := u.kv.Get(ctx, slackUserID)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return LinkChange{}, fmt.Errorf("notify: link slack user: %w", err)
		default:
			if err := json.Unmarshal(e.Value(), &prev); err != nil {
				return LinkChange{}, fmt.Errorf("notify: slack user record of %s is malformed", slackUserID)
			}
			rev = e.Revision()
		}
		if prev.ApproverID == approverID {
			return LinkChange{Replaced: prev.Replaced, Revision: rev, At: e.Created().UTC()}, nil
		}
		at := time.Now().UTC()
		b, _ := json.Marshal(slackUserRecord{ApproverID: approverID, Replaced: prev.ApproverID})
		// Guarded by the revision read, so that the link replaced is the
		// one recorded as unlinked.
		if rev == 0 {
			rev, err = u.kv.Create(ctx, slackUserID, b)
		} else {
			rev, err = u.kv.Update(ctx, slackUserID, b, rev)
		}
		switch {
		case err == nil:
			return LinkChange{Changed: true, Replaced: prev.ApproverID, Revision: rev, At: at}, nil
		case attempt < 5 && (errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)):
			// Linked meanwhile by another request: read it again.
		default:
			return LinkChange{}, fmt.Errorf("notify: link slack user: %w", err)
		}
	}
}

// record writes the admin records of a link: the unlinking from the
// approver it replaced, if any, then the link. Both are keyed by the
// link's revision, so a retried link (unchanged by then) writes them only
// if the first attempt lost them.
func (u *SlackUsers) record(ctx context.Context, approverID, slackUserID string, ch LinkChange, by string) (string, audit.Receipt, error) {
	if ch.Replaced != "" {
		if _, _, err := u.audit.RecordAdmin(ctx, audit.AdminAction{Action: audit.AdminSlackUnlink,
			Target: audit.AdminTarget{Type: audit.TargetSlackUser, ID: slackUserID, Approver: ch.Replaced},
			Status: "unlinked", By: by, At: ch.At}, ch.Revision); err != nil {
			return "", audit.Receipt{}, err
		}
	}
	return u.audit.RecordAdmin(ctx, audit.AdminAction{Action: audit.AdminSlackLink,
		Target: audit.AdminTarget{Type: audit.TargetSlackUser, ID: slackUserID, Approver: approverID},
		Status: "linked", By: by, Replaced: ch.Replaced, At: ch.At}, ch.Revision)
}

// Approver returns the approver ID linked to a Slack user, or
// [ErrUnknownSlackUser].
func (u *SlackUsers) Approver(ctx context.Context, slackUserID string) (string, error) {
	if !ValidSlackUserID(slackUserID) {
		return "", ErrUnknownSlackUser
	}
	e, err := u.kv.Get(ctx, slackUserID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", ErrUnknownSlackUser
	}
	if err != nil {
		return "", fmt.Errorf("notify: slack user: %w", err)
	}
	var rec slackUserRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil || (rec.ApproverID == "" && rec.Unlinked == "") {
		return "", fmt.Errorf("notify: slack user record of %s is malformed", slackUserID)
	}
	if rec.ApproverID == "" {
		return "", ErrUnknownSlackUser // unlinked
	}
	return rec.ApproverID, nil
}

// LinkHandler serves POST /admin/v1/approvers/{id}/slack {slackUserId} →
// 200 {approverId, slackUserId, changed, replaced?, auditChain,
// auditRecord}. authorize checks the admin bearer token and returns the
// admin ((*authn.Tokens).Admin): authn.ErrInvalidToken is a 401; any other
// error is the token store failing, a 500, so an outage is not mistaken
// for a revoked token. The link is an admin record (audit.AdminSlackLink)
// in the approver's admin chain, naming the admin, and the link it
// replaces, if to another approver, an audit.AdminSlackUnlink in that
// approver's; without audit signing keys the link is refused (503
// audit_unavailable) and nothing changes. Linking again to the same
// approver is 200 with changed false and writes no second record. Errors
// answer in the API's {error, message} shape.
func (u *SlackUsers) LinkHandler(authorize func(*http.Request) (authn.Principal, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		admin, ok := u.admitAdmin(w, r, authorize)
		if !ok {
			return
		}
		if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
			writeJSONError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "Content-Type must be application/json")
			return
		}
		b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 4<<10))
		if err != nil {
			writeJSONError(w, http.StatusRequestEntityTooLarge, "body_too_large", "request body exceeds 4096 bytes")
			return
		}
		var req struct {
			SlackUserID string `json:"slackUserId"`
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeJSONError(w, http.StatusBadRequest, "invalid_request", "the body must be {\"slackUserId\": \"U…\"}")
			return
		}
		id := r.PathValue("id")
		ch, err := u.Link(r.Context(), id, req.SlackUserID)
		switch {
		case errors.Is(err, ErrInvalidSlackUser):
			writeJSONError(w, http.StatusBadRequest, "invalid_request", "slackUserId must be a Slack user ID such as U012AB3CD")
			return
		case errors.Is(err, passkey.ErrNotFound), errors.Is(err, passkey.ErrInvalidArgument):
			writeJSONError(w, http.StatusNotFound, "not_found", "no such approver")
			return
		case err != nil:
			u.log.ErrorContext(r.Context(), "notify: link slack user", "approver_id", id, "error", err)
			writeJSONError(w, http.StatusInternalServerError, "internal", "internal error")
			return
		}
		chain, rec, err := u.record(r.Context(), id, req.SlackUserID, ch, "admin:"+admin.Name)
		if err != nil {
			u.log.ErrorContext(r.Context(), "notify: record slack user link", "approver_id", id, "error", err)
			writeJSONError(w, http.StatusInternalServerError, "internal", "internal error")
			return
		}
		u.log.InfoContext(r.Context(), "notify: slack user linked", "approver_id", id, "replaced_approver_id", ch.Replaced, "changed", ch.Changed)
		res := linkResponse{ApproverID: id, SlackUserID: req.SlackUserID, Changed: ch.Changed, AuditChain: chain, AuditRecord: rec.RecordRef}
		if ch.Changed {
			res.Replaced = ch.Replaced
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		_ = json.NewEncoder(w).Encode(res)
	})
}

// admitAdmin answers a request to change a link that cannot go on: a
// missing or invalid admin token (401), a token store that fails (500), a
// server that cannot sign the audit record (503 audit_unavailable). It
// returns the admin and true when the request may go on.
func (u *SlackUsers) admitAdmin(w http.ResponseWriter, r *http.Request, authorize func(*http.Request) (authn.Principal, error)) (authn.Principal, bool) {
	w.Header().Set("Cache-Control", "no-store")
	admin, err := authorize(r)
	switch {
	case errors.Is(err, authn.ErrInvalidToken):
		w.Header().Set("WWW-Authenticate", `Bearer realm="countersign-admin"`)
		msg := "the admin bearer token is invalid: unknown, revoked, or not an admin token"
		if errors.Is(err, authn.ErrMissingToken) {
			msg = "an admin bearer token is required"
		}
		writeJSONError(w, http.StatusUnauthorized, "unauthorized", msg)
		return authn.Principal{}, false
	case err != nil:
		u.log.ErrorContext(r.Context(), "notify: check admin token", "error", err)
		writeJSONError(w, http.StatusInternalServerError, "internal", "internal error")
		return authn.Principal{}, false
	}
	if u.audit == nil || !u.audit.CanSign() {
		writeJSONError(w, http.StatusServiceUnavailable, "audit_unavailable",
			"admin changes are recorded in the signed audit log, and this server has no audit signing keys (--audit-key-dir); nothing was changed")
		return authn.Principal{}, false
	}
	return admin, true
}

// ErrNotLinked is Unlink's answer for a Slack user not linked to the
// approver.
var ErrNotLinked = errors.New("notify: the slack user is not linked to this approver")

// Unlink removes a Slack user's link to approverID: the user can no longer
// deny that approver's tasks. The record stays, as a tombstone naming the
// approver, so that a retried unlink is seen as done (Changed false) and
// can still have its audit record written, keyed by the tombstone's
// revision. A Slack user not linked to approverID (never linked, linked to
// another approver, unlinked from another) is ErrNotLinked. It records
// nothing: the admin endpoint, UnlinkHandler, does.
func (u *SlackUsers) Unlink(ctx context.Context, approverID, slackUserID string) (LinkChange, error) {
	if !ValidSlackUserID(slackUserID) {
		return LinkChange{}, ErrInvalidSlackUser
	}
	for attempt := 0; ; attempt++ {
		e, err := u.kv.Get(ctx, slackUserID)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return LinkChange{}, ErrNotLinked
		}
		if err != nil {
			return LinkChange{}, fmt.Errorf("notify: unlink slack user: %w", err)
		}
		var rec slackUserRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return LinkChange{}, fmt.Errorf("notify: slack user record of %s is malformed", slackUserID)
		}
		switch {
		case rec.ApproverID == "" && rec.Unlinked == approverID:
			return LinkChange{Revision: e.Revision(), At: e.Created().UTC()}, nil
		case rec.ApproverID != approverID:
			return LinkChange{}, ErrNotLinked
		}
		at := time.Now().UTC()
		b, _ := json.Marshal(slackUserRecord{Unlinked: approverID})
		rev, err := u.kv.Update(ctx, slackUserID, b, e.Revision())
		switch {
		case err == nil:
			return LinkChange{Changed: true, Revision: rev, At: at}, nil
		case attempt < 5 && (errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)):
			// Linked or unlinked meanwhile by another request: read it again.
		default:
			return LinkChange{}, fmt.Errorf("notify: unlink slack user: %w", err)
		}
	}
}

// UnlinkHandler serves DELETE /admin/v1/approvers/{id}/slack/{slackUserId}
// → 200 {approverId, slackUserId, changed, auditChain, auditRecord}: the
// Slack user can no longer deny for the approver. It admits requests as
// LinkHandler does (401, 500, 503 audit_unavailable, nothing changed). The
// unlinking is an admin record (audit.AdminSlackUnlink) in the approver's
// admin chain, naming the admin. Unlinking again is 200 with changed false
// and writes no second record (or the first, if the first attempt lost
// it). A Slack user not linked to the approver is 404 not_linked.
func (u *SlackUsers) UnlinkHandler(authorize func(*http.Request) (authn.Principal, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		admin, ok := u.admitAdmin(w, r, authorize)
		if !ok {
			return
		}
		id, slackUserID := r.PathValue("id"), r.PathValue("slackUserId")
		ch, err := u.Unlink(r.Context(), id, slackUserID)
		switch {
		case errors.Is(err, ErrInvalidSlackUser):
			writeJSONError(w, http.StatusBadRequest, "invalid_request", "the Slack user ID must be one such as U012AB3CD")
			return
		case errors.Is(err, ErrNotLinked):
			writeJSONError(w, http.StatusNotFound, "not_linked", fmt.Sprintf("Slack user %s is not linked to approver %q", slackUserID, approverapi.Clip(id)))
			return
		case err != nil:
			u.log.ErrorContext(r.Context(), "notify: unlink slack user", "approver_id", id, "error", err)
			writeJSONError(w, http.StatusInternalServerError, "internal", "internal error")
			return
		}
		chain, rec, err := u.audit.RecordAdmin(r.Context(), audit.AdminAction{Action: audit.AdminSlackUnlink,
			Target: audit.AdminTarget{Type: audit.TargetSlackUser, ID: slackUserID, Approver: id},
			Status: "unlinked", By: "admin:" + admin.Name, At: ch.At}, ch.Revision)
		if err != nil {
			u.log.ErrorContext(r.Context(), "notify: record slack user unlink", "approver_id", id, "error", err)
			writeJSONError(w, http.StatusInternalServerError, "internal", "internal error")
			return
		}
		u.log.InfoContext(r.Context(), "notify: slack user unlinked", "approver_id", id, "changed", ch.Changed)
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		_ = json.NewEncoder(w).Encode(linkResponse{ApproverID: id, SlackUserID: slackUserID, Changed: ch.Changed, AuditChain: chain, AuditRecord: rec.RecordRef})
	})
}

type linkResponse struct {
	ApproverID  string `json:"approverId"`
	SlackUserID string `json:"slackUserId"`
	Changed     bool   `json:"changed"`
	Replaced    string `json:"replaced,omitempty"`
	AuditChain  string `json:"auditChain"`
	AuditRecord string `json:"auditRecord"`
}

func writeJSONError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code, "message": message})
}
