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

	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/internal/authn"
	"github.com/countersign/countersign/passkey"
)

// ErrUnknownSlackUser is returned for a Slack user linked to no approver.
var ErrUnknownSlackUser = errors.New("notify: slack user is not linked to an approver")

// ErrInvalidSlackUser is returned for a string that cannot be a Slack user ID.
var ErrInvalidSlackUser = errors.New("notify: slackUserId must be a Slack user ID such as U012AB3CD")

// SlackUsers maps Slack user IDs to approver IDs, in the NATS KV bucket
// [SlackUsersBucket] (key: Slack user ID). One Slack user is one approver;
// linking again replaces the link.
type SlackUsers struct {
	kv       jetstream.KeyValue
	passkeys *passkey.Service
	log      *slog.Logger
}

type slackUserRecord struct {
	ApproverID string `json:"approverId"`
}

// SlackUsersOptions configures [NewSlackUsers].
type SlackUsersOptions struct {
	// Passkeys resolves the approvers linked to. Required.
	Passkeys *passkey.Service
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
	return &SlackUsers{kv: kv, passkeys: opts.Passkeys, log: log}, nil
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

// Link links a Slack user to an existing approver.
func (u *SlackUsers) Link(ctx context.Context, approverID, slackUserID string) error {
	if !ValidSlackUserID(slackUserID) {
		return ErrInvalidSlackUser
	}
	if _, err := u.passkeys.Approver(ctx, approverID); err != nil {
		return err // passkey.ErrNotFound for an unknown approver
	}
	b, _ := json.Marshal(slackUserRecord{ApproverID: approverID})
	if _, err := u.kv.Put(ctx, slackUserID, b); err != nil {
		return fmt.Errorf("notify: link slack user: %w", err)
	}
	return nil
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
	if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.ApproverID == "" {
		return "", fmt.Errorf("notify: slack user record of %s is malformed", slackUserID)
	}
	return rec.ApproverID, nil
}

// LinkHandler serves POST /admin/v1/approvers/{id}/slack {slackUserId} →
// 200 {approverId, slackUserId}. authorize checks the admin bearer token
// ((*authn.Tokens).AuthorizeAdmin): authn.ErrInvalidToken is a 401; any
// other error is the token store failing, a 500, so an outage is not
// mistaken for a revoked token. Errors answer in the API's {error, message}
// shape.
func (u *SlackUsers) LinkHandler(authorize func(*http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		switch err := authorize(r); {
		case errors.Is(err, authn.ErrInvalidToken):
			w.Header().Set("WWW-Authenticate", `Bearer realm="countersign-admin"`)
			msg := "the admin bearer token is invalid: unknown, revoked, or not an admin token"
			if errors.Is(err, authn.ErrMissingToken) {
				msg = "an admin bearer token is required"
			}
			writeJSONError(w, http.StatusUnauthorized, "unauthorized", msg)
			return
		case err != nil:
			u.log.ErrorContext(r.Context(), "notify: check admin token", "error", err)
			writeJSONError(w, http.StatusInternalServerError, "internal", "internal error")
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
		err = u.Link(r.Context(), id, req.SlackUserID)
		switch {
		case errors.Is(err, ErrInvalidSlackUser):
			writeJSONError(w, http.StatusBadRequest, "invalid_request", "slackUserId must be a Slack user ID such as U012AB3CD")
		case errors.Is(err, passkey.ErrNotFound), errors.Is(err, passkey.ErrInvalidArgument):
			writeJSONError(w, http.StatusNotFound, "not_found", "no such approver")
		case err != nil:
			u.log.ErrorContext(r.Context(), "notify: link slack user", "approver_id", id, "error", err)
			writeJSONError(w, http.StatusInternalServerError, "internal", "internal error")
		default:
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			_ = json.NewEncoder(w).Encode(map[string]string{"approverId": id, "slackUserId": req.SlackUserID})
		}
	})
}

func writeJSONError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code, "message": message})
}
