package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/slack-go/slack"

	"github.com/countersign/countersign/tasks"
)

// Slack bucket names and the action ID of the Deny button.
const (
	SlackMessagesBucket = "countersign_slack_messages"
	SlackReplayBucket   = "countersign_slack_replay"
	SlackUsersBucket    = "countersign_slack_users"
	ActionDeny          = "countersign_deny"
	ActionReview        = "countersign_review"
)

// slackMessageTTL keeps the channel+ts of a task's message well past any
// approval window and the result retention.
const slackMessageTTL = 60 * 24 * time.Hour

// SlackOptions configures [NewSlack].
type SlackOptions struct {
	// Token is the bot token (xoxb-…); it needs the chat:write scope.
	Token string
	// DefaultChannel is where a task's message goes when its policy names
	// no channel (tasks.Requirement.SlackChannel).
	DefaultChannel string
	// DenyButton adds a Deny button to pending messages. Set it only when
	// the interactivity endpoint is mounted (a signing secret is
	// configured).
	DenyButton bool
	// APIURL overrides Slack's API base URL (tests: slacktest). Empty means
	// https://slack.com/api/.
	APIURL string
	// HTTPClient for Slack calls; nil means a client with a 10 s timeout.
	HTTPClient *http.Client
	// Replicas of the message bucket in a clustered NATS; 0 means 1.
	Replicas int
	// Logger; nil discards.
	Logger *slog.Logger
}

// Slack posts one Block Kit message per task and keeps it current: it is
// updated in place (chat.update) as approvals arrive and when the task ends.
// The message shows the call and links to the approval page; approving
// never happens inside Slack. It implements activities.Notifier.
//
// Idempotency: the channel and ts of each task's message are kept in the
// NATS KV bucket [SlackMessagesBucket], keyed by task ID. A notification for
// a task that already has a message updates it instead of posting again, so
// activity retries do not duplicate messages. The one window left is a post
// that Slack accepted but whose answer never arrived (a timeout): the retry
// cannot know of it.
type Slack struct {
	api     *slack.Client
	channel string
	deny    bool
	msgs    jetstream.KeyValue
	log     *slog.Logger
}

// slackMessage is what [SlackMessagesBucket] stores per task.
type slackMessage struct {
	Channel string `json:"channel"`
	TS      string `json:"ts"`
}

// NewSlack validates opts and opens (or creates) the message bucket.
func NewSlack(ctx context.Context, js jetstream.JetStream, opts SlackOptions) (*Slack, error) {
	if opts.Token == "" {
		return nil, errors.New("notify: Slack token is required")
	}
	if js == nil {
		return nil, errors.New("notify: JetStream is required")
	}
	if opts.DefaultChannel != "" && !validChannel(opts.DefaultChannel) {
		return nil, fmt.Errorf("notify: Slack channel %q is not a channel ID or #name", opts.DefaultChannel)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      SlackMessagesBucket,
		Description: "Countersign: the Slack message (channel, ts) of each task",
		TTL:         slackMessageTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    max(opts.Replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("notify: slack message bucket: %w", err)
	}
	hc := opts.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	sopts := []slack.Option{slack.OptionHTTPClient(hc)}
	if opts.APIURL != "" {
		u := opts.APIURL
		if !strings.HasSuffix(u, "/") {
			u += "/"
		}
		sopts = append(sopts, slack.OptionAPIURL(u))
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Slack{
		api:     slack.New(opts.Token, sopts...),
		channel: opts.DefaultChannel,
		deny:    opts.DenyButton,
		msgs:    kv,
		log:     log,
	}, nil
}

// validChannel accepts a channel ID (C…, G…, D…) or a #name / name.
func validChannel(c string) bool {
	c = strings.TrimPrefix(c, "#")
	if c == "" || len(c) > 80 {
		return false
	}
	for _, r := range c {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// ApprovalRequested implements activities.Notifier: it posts the task's
// message, or updates it if an earlier attempt posted it.
func (s *Slack) ApprovalRequested(ctx context.Context, r tasks.Record, approveURL string, identical tasks.IdenticalCalls) error {
	return s.upsert(ctx, r, approveURL, identical)
}

// ApprovalUpdated implements activities.Notifier: it updates the task's
// message in place (or posts it, when the first post never succeeded).
func (s *Slack) ApprovalUpdated(ctx context.Context, r tasks.Record, approveURL string, identical tasks.IdenticalCalls) error {
	return s.upsert(ctx, r, approveURL, identical)
}

func (s *Slack) upsert(ctx context.Context, r tasks.Record, approveURL string, identical tasks.IdenticalCalls) error {
	blocks := s.blocks(r, approveURL, identical)
	text := fallbackText(r, identical)
	msg, err := s.message(ctx, r.TaskID)
	if err != nil {
		return err
	}
	if msg != nil {
		_, _, _, err := s.api.UpdateMessageContext(ctx, msg.Channel, msg.TS,
			slack.MsgOptionText(text, true), slack.MsgOptionBlocks(blocks...))
		if err != nil {
			return fmt.Errorf("notify: slack chat.update: %w", err)
		}
		s.log.DebugContext(ctx, "notify: slack message updated", "task_id", r.TaskID, "approval_state", r.ApprovalState)
		return nil
	}
	channel := r.Requirement.SlackChannel
	if channel == "" {
		channel = s.channel
	}
	if channel == "" {
		return errors.New("notify: no Slack channel: the policy names none and no default channel is configured")
	}
	ch, ts, err := s.api.PostMessageContext(ctx, channel,
		slack.MsgOptionText(text, true), slack.MsgOptionBlocks(blocks...))
	if err != nil {
		return fmt.Errorf("notify: slack chat.postMessage: %w", err)
	}
	b, _ := json.Marshal(slackMessage{Channel: ch, TS: ts})
	// Create, not put: a concurrent writer's message wins and ours is the
	// duplicate to report.
	if _, err := s.msgs.Create(ctx, r.TaskID, b); err != nil {
		// The message is out but not remembered: a retry would post again,
		// so report success and log loudly instead of retrying.
		s.log.ErrorContext(ctx, "notify: slack message posted but not recorded; later updates will post a new message",
			"task_id", r.TaskID, "channel", ch, "error", err)
		return nil
	}
	s.log.InfoContext(ctx, "notify: slack message posted", "task_id", r.TaskID, "channel", ch)
	return nil
}

func (s *Slack) message(ctx context.Context, taskID string) (*slackMessage, error) {
	e, err := s.msgs.Get(ctx, taskID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("notify: slack message of %s: %w", taskID, err)
	}
	var m slackMessage
	if err := json.Unmarshal(e.Value(), &m); err != nil || m.Channel == "" || m.TS == "" {
		return nil, fmt.Errorf("notify: slack message record of %s is malformed", taskID)
	}
	return &m, nil
}

// fallbackText is the notification text (push, screen readers). Slack reads
// it as mrkdwn, and it carries the display text, which comes from the call:
// it is sent escaped (&, <, > as entities; slack.MsgOptionText with escape),
// so it cannot mention users or channels or fake links, as the blocks'
// plain_text cannot. When an identical call ran or may have run, the state
// says so before the display text.
func fallbackText(r tasks.Record, identical tasks.IdenticalCalls) string {
	label := stateLabel(r)
	if identical.MayHaveRun() {
		label += " (an identical call already ran or may have run)"
	}
	return clip(label+": "+r.DisplayText, 300)
}

// stateLabel says where the task is, in words.
func stateLabel(r tasks.Record) string {
	if r.Status.Terminal() {
		switch {
		case r.Disposition == tasks.ApprovedExecuted:
			return "Approved and executed"
		case r.Disposition == tasks.ExecutionError:
			return "Approved; the tool ran and reported an error"
		case r.Disposition == tasks.OutcomeUnknown:
			return "Approved; outcome unknown (the tool may have run)"
		case r.ApprovalState == tasks.ApprovalExpired:
			return "Expired"
		case r.Disposition == tasks.DeniedNotExecuted:
			return "Denied"
		case r.Status == tasks.StatusCancelled:
			return "Cancelled"
		default:
			return "Failed"
		}
	}
	switch r.ApprovalState {
	case tasks.ApprovalApproved:
		return "Approved; running"
	default:
		return "Approval requested"
	}
}

func stateEmoji(r tasks.Record) string {
	switch {
	case r.Disposition == tasks.ApprovedExecuted:
		return ":white_check_mark:"
	case r.Disposition == tasks.ExecutionError, r.Disposition == tasks.OutcomeUnknown:
		return ":warning:"
	case r.ApprovalState == tasks.ApprovalExpired:
		return ":hourglass:"
	case r.Status.Terminal():
		return ":no_entry:"
	}
	return ":lock:"
}

func approvedCount(r tasks.Record) int {
	n := 0
	for _, e := range r.Approvals {
		if e.Decision == tasks.DecisionApprove {
			n++
		}
	}
	return n
}

func plain(s string) *slack.TextBlockObject {
	if s == "" {
		s = "–"
	}
	return slack.NewTextBlockObject(slack.PlainTextType, s, false, false)
}

func mrkdwn(s string) *slack.TextBlockObject {
	return slack.NewTextBlockObject(slack.MarkdownType, s, false, false)
}

// blocks renders the task. Everything that comes from the call or the
// requester (display text, arguments, names, comments) goes in plain_text,
// so it cannot mention users or channels or fake links.
func (s *Slack) blocks(r tasks.Record, approveURL string, identical tasks.IdenticalCalls) []slack.Block {
	bs := []slack.Block{
		slack.NewHeaderBlock(plain(clip(r.DisplayText, 150))),
		slack.NewSectionBlock(mrkdwn(stateEmoji(r)+" *"+stateLabel(r)+"*"), nil, nil),
	}
	bs = append(bs, identicalBlocks(identical)...)
	expires := slackDate(r.ExpiresAt)
	bs = append(bs,
		slack.NewSectionBlock(nil, []*slack.TextBlockObject{
			mrkdwn("*Tool*"), mrkdwn("*Requester*"),
			plain(clip(r.Tool, 100)), plain(clip(r.Owner, 100)),
		}, nil),
		slack.NewSectionBlock(nil, []*slack.TextBlockObject{
			mrkdwn("*Reason*"), mrkdwn("*Approvals*"),
			plain(clip(r.Requirement.Reason, 300)), plain(fmt.Sprintf("%d of %d (group %s)", approvedCount(r), r.Requirement.Quorum, r.Requirement.Group)),
		}, nil),
	)
	if args := keyArguments(r.Arguments, 4); len(args) > 0 {
		bs = append(bs, slack.NewSectionBlock(mrkdwn("*Key arguments*"), args, nil))
	}
	var ctxEls []slack.MixedElement
	if !r.Status.Terminal() {
		ctxEls = append(ctxEls, mrkdwn("Expires "+expires))
	}
	for _, e := range r.Approvals {
		verb := "Approved"
		if e.Decision == tasks.DecisionDeny {
			verb = "Denied"
		}
		ctxEls = append(ctxEls, plain(clip(verb+" by "+e.ApproverName+" at "+e.At.UTC().Format("2006-01-02 15:04 UTC"), 150)))
	}
	if r.Status.Terminal() && r.StatusMessage != "" {
		ctxEls = append(ctxEls, plain(clip(r.StatusMessage, 300)))
	}
	if len(ctxEls) > 10 { // Slack's limit per context block
		ctxEls = ctxEls[len(ctxEls)-10:]
	}
	if len(ctxEls) > 0 {
		bs = append(bs, slack.NewContextBlock("status", ctxEls...))
	}
	if r.ApprovalState == tasks.ApprovalPending && !r.Status.Terminal() {
		review := slack.NewButtonBlockElement(ActionReview, r.ApprovalRef, plain("Review and approve")).
			WithURL(approveURL).WithStyle(slack.StylePrimary)
		els := []slack.BlockElement{review}
		if s.deny {
			deny := slack.NewButtonBlockElement(ActionDeny, r.ApprovalRef, plain("Deny")).
				WithStyle(slack.StyleDanger).
				WithConfirm(slack.NewConfirmationBlockObject(plain("Deny this call?"),
					plain("The call will not run. Your Slack account is recorded as the approver who denied it."),
					plain("Deny"), plain("Keep pending")))
			els = append(els, deny)
		}
		bs = append(bs, slack.NewActionBlock("actions", els...))
	} else {
		bs = append(bs, slack.NewActionBlock("actions",
			slack.NewButtonBlockElement(ActionReview, r.ApprovalRef, plain("View")).WithURL(approveURL)))
	}
	return bs
}

// identicalBlocks renders the requester's identical calls: the warning when
// one ran or may have run (or the look-up failed), then one line per call,
// newest first; nothing when there are none. Every word in it is ours (the
// warning, references, dispositions, dates), so it is mrkdwn.
func identicalBlocks(identical tasks.IdenticalCalls) []slack.Block {
	if len(identical.Calls) == 0 && !identical.Unknown {
		return nil
	}
	var b strings.Builder
	if w := identical.Warning(); w != "" {
		b.WriteString(":warning: *" + w + "*")
	}
	if len(identical.Calls) > 0 {
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "*Identical calls* (same requester, tool and arguments; open, or ended in the last %d hours):", int(tasks.IdenticalWindow/time.Hour))
		for _, c := range identical.Calls {
			verb, at := "ended", c.EndedAt
			if at.IsZero() {
				verb, at = "requested", c.CreatedAt
			}
			fmt.Fprintf(&b, "\n• `%s` %s, %s %s", c.Ref, c.Outcome(), verb, slackDate(at))
		}
	}
	return []slack.Block{slack.NewSectionBlock(mrkdwn(b.String()), nil, nil)}
}

// slackDate shows t in the reader's time zone, with RFC 3339 as the
// fallback.
func slackDate(t time.Time) string {
	return fmt.Sprintf("<!date^%d^{date_short_pretty} {time}|%s>", t.Unix(), t.UTC().Format(time.RFC3339))
}

// keyArguments renders up to max top-level arguments as field pairs (a
// section takes 10 fields: max 4 leaves room for the "more" pair), values
// clipped; nested values are shown as compact JSON.
func keyArguments(raw json.RawMessage, max int) []*slack.TextBlockObject {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || len(m) == 0 {
		return nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []*slack.TextBlockObject
	for i, k := range keys {
		if i == max {
			out = append(out, plain(fmt.Sprintf("+%d more", len(keys)-max)), plain("see the approval page"))
			break
		}
		v := string(m[k])
		var str string
		if json.Unmarshal(m[k], &str) == nil {
			v = str
		}
		out = append(out, plain(clip(k, 60)), plain(clip(v, 120)))
	}
	return out
}

// clip bounds s to max runes, with an ellipsis.
func clip(s string, max int) string {
	s = strings.ToValidUTF8(s, "")
	if utf8.RuneCountInString(s) <= max {
		return s
	}
	r := []rune(s)
	return string(r[:max-1]) + "…"
}
