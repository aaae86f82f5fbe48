package notify

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/tasks"
)

// maxInteractionBody caps a Slack interactivity request.
const maxInteractionBody = 64 << 10

// replayWindow is how long a seen interaction is remembered: longer than the
// 5 minutes after which its signature is stale anyway.
const replayWindow = 10 * time.Minute

// UnsignedDenier takes a deny without a passkey: *approvals.Service, the one
// place that changes a task. DenyUnsigned answers approvals.ErrUnknownApprover,
// approvals.ErrNotFound, approvals.ErrNotEligible, approvals.ErrNotPending,
// an error wrapping approvals.ErrInProgress, or another (internal) error.
type UnsignedDenier interface {
	DenyUnsigned(ctx context.Context, ref, approverID, via string, at time.Time) error
}

// InteractionsOptions configures [NewInteractions].
type InteractionsOptions struct {
	// SigningSecret is the Slack app's signing secret. Required.
	SigningSecret string
	// Slack answers the user (chat.postEphemeral). Required.
	Slack *Slack
	// Users maps Slack users to approvers. Required.
	Users *SlackUsers
	// Approvals takes the deny. Required.
	Approvals UnsignedDenier
	// Replicas of the replay bucket in a clustered NATS; 0 means 1.
	Replicas int
	Logger   *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Interactions is the Slack interactivity endpoint (mount it at
// /slack/interactivity), a thin adapter over the approvals service. It
// handles one action, the Deny button:
//
//  1. the request signature is verified (slack.NewSecretsVerifier): a bad
//     or stale (> 5 min) signature is 401 and nothing else happens;
//  2. a replay of an already seen request (same timestamp and body) is 409;
//  3. the Slack user must be mapped to an approver ([SlackUsers]), else they
//     get an ephemeral error;
//  4. the approvals service denies on the approver's behalf, via "slack"
//     (it checks the approver is in the approval's group; the workflow
//     records who and when), and the user is told the outcome in an
//     ephemeral message.
//
// A deny needs no passkey because it can only stop a call. Approving never
// happens in Slack.
type Interactions struct {
	secret    string
	slack     *Slack
	users     *SlackUsers
	approvals UnsignedDenier
	replay    jetstream.KeyValue
	log       *slog.Logger
	now       func() time.Time
}

// NewInteractions validates opts and opens the replay bucket.
func NewInteractions(ctx context.Context, js jetstream.JetStream, opts InteractionsOptions) (*Interactions, error) {
	switch {
	case opts.SigningSecret == "":
		return nil, errors.New("notify: Slack signing secret is required")
	case opts.Slack == nil || opts.Users == nil || opts.Approvals == nil:
		return nil, errors.New("notify: interactions need Slack, Users and Approvals")
	case js == nil:
		return nil, errors.New("notify: JetStream is required")
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      SlackReplayBucket,
		Description: "Countersign: digests of Slack interactions seen (replay guard)",
		TTL:         replayWindow,
		Storage:     jetstream.FileStorage,
		Replicas:    max(opts.Replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("notify: slack replay bucket: %w", err)
	}
	i := &Interactions{secret: opts.SigningSecret, slack: opts.Slack, users: opts.Users,
		approvals: opts.Approvals, replay: kv, log: opts.Logger, now: opts.Now}
	if i.log == nil {
		i.log = slog.New(slog.DiscardHandler)
	}
	if i.now == nil {
		i.now = time.Now
	}
	return i, nil
}

func httpError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg+"\n")
}

// ServeHTTP implements http.Handler.
func (i *Interactions) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		httpError(w, http.StatusMethodNotAllowed, "method not allowed; Slack posts here")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxInteractionBody))
	if err != nil {
		httpError(w, http.StatusRequestEntityTooLarge, "request body too large")
		return
	}
	sv, err := slack.NewSecretsVerifier(r.Header, i.secret)
	if err == nil {
		_, _ = sv.Write(body)
		err = sv.Ensure()
	}
	if err != nil {
		i.log.WarnContext(r.Context(), "notify: slack interaction with a bad signature refused", "error", err)
		httpError(w, http.StatusUnauthorized, "invalid or stale Slack signature")
		return
	}
	// Signed by Slack: now refuse a replay of the very same request.
	sum := sha256.Sum256(append([]byte(r.Header.Get("X-Slack-Request-Timestamp")+":"), body...))
	if _, err := i.replay.Create(r.Context(), hex.EncodeToString(sum[:]), []byte("1")); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			i.log.WarnContext(r.Context(), "notify: replayed slack interaction refused")
			httpError(w, http.StatusConflict, "this interaction was already handled")
			return
		}
		i.log.ErrorContext(r.Context(), "notify: slack replay guard unavailable", "error", err)
		httpError(w, http.StatusServiceUnavailable, "temporarily unavailable; try again")
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/x-www-form-urlencoded" {
		httpError(w, http.StatusUnsupportedMediaType, "expected application/x-www-form-urlencoded")
		return
	}
	form, err := url.ParseQuery(string(body))
	if err != nil || form.Get("payload") == "" {
		httpError(w, http.StatusBadRequest, "missing payload")
		return
	}
	var cb slack.InteractionCallback
	if err := json.Unmarshal([]byte(form.Get("payload")), &cb); err != nil {
		httpError(w, http.StatusBadRequest, "malformed payload")
		return
	}
	if cb.Type != slack.InteractionTypeBlockActions {
		w.WriteHeader(http.StatusOK) // not ours to handle; acknowledge
		return
	}
	for _, act := range cb.ActionCallback.BlockActions {
		if act.ActionID != ActionDeny {
			continue
		}
		if act.Value == "" {
			// Our Deny buttons always carry the approval reference; one
			// without it names no approval, so nothing is asked of the
			// service.
			i.log.InfoContext(r.Context(), "notify: slack deny without an approval reference ignored", "slack_user", cb.User.ID)
			continue
		}
		i.deny(r.Context(), cb, act.Value)
	}
	w.WriteHeader(http.StatusOK)
}

// deny handles one press of the Deny button and answers the user with an
// ephemeral message.
func (i *Interactions) deny(ctx context.Context, cb slack.InteractionCallback, ref string) {
	tell := func(text string) {
		if cb.Channel.ID == "" || cb.User.ID == "" {
			return
		}
		if _, err := i.slack.api.PostEphemeralContext(ctx, cb.Channel.ID, cb.User.ID, slack.MsgOptionText(text, false)); err != nil {
			i.log.WarnContext(ctx, "notify: slack ephemeral reply failed", "error", err)
		}
	}
	approverID, err := i.users.Approver(ctx, cb.User.ID)
	if errors.Is(err, ErrUnknownSlackUser) {
		i.log.InfoContext(ctx, "notify: slack deny from an unmapped user refused", "slack_user", cb.User.ID)
		tell("Countersign does not know your Slack account, so nothing changed. Ask an admin to link it to your approver (POST /admin/v1/approvers/{id}/slack).")
		return
	}
	if err != nil {
		i.log.ErrorContext(ctx, "notify: slack user lookup failed", "error", err)
		tell("Countersign could not check your account right now; nothing changed. Try again, or deny on the approval page.")
		return
	}
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err = i.approvals.DenyUnsigned(dctx, ref, approverID, "slack", i.now())
	switch {
	case err == nil:
		i.log.InfoContext(ctx, "notify: denied from slack", "approval_ref", ref, "approver_id", approverID, "slack_user", cb.User.ID)
		tell("Denied. The call will not run; the denial is recorded under your name.")
	case errors.Is(err, approvals.ErrUnknownApprover):
		i.log.InfoContext(ctx, "notify: slack deny: approver not found", "approver_id", approverID, "slack_user", cb.User.ID)
		tell("Your Slack account is linked to an approver that no longer exists; nothing changed.")
	case errors.Is(err, approvals.ErrNotFound) && !tasks.ValidID(ref):
		tell("This approval is unknown; nothing changed.")
	case errors.Is(err, approvals.ErrNotFound):
		tell("This approval is unknown or no longer kept; nothing changed.")
	case errors.Is(err, approvals.ErrNotEligible):
		i.log.InfoContext(ctx, "notify: slack deny by a non-eligible approver refused", "approver_id", approverID, "approval_ref", ref)
		tell("You are not in the approver group for this call; nothing changed.")
	case errors.Is(err, approvals.ErrNotPending):
		tell("This approval is no longer pending; nothing changed.")
	case errors.Is(err, approvals.ErrInProgress):
		// The outcome is unknown; a deny pressed again is harmless.
		i.log.WarnContext(ctx, "notify: slack deny still in progress", "approval_ref", ref, "approver_id", approverID, "error", err)
		tell("The denial could not be delivered right now; try again, or deny on the approval page.")
	default:
		i.log.ErrorContext(ctx, "notify: slack deny failed", "approval_ref", ref, "approver_id", approverID, "error", err)
		tell("The denial could not be delivered right now; try again, or deny on the approval page.")
	}
}
