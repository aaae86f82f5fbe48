package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/internal/approverapi"
	"github.com/countersign/countersign/tasks"
)

// The JetStream stream of approval events and its subjects.
const (
	EventsStream       = "COUNTERSIGN_APPROVALS"
	SubjectRequested   = "countersign.approvals.requested" // + "." + tool
	SubjectResolved    = "countersign.approvals.resolved"  // + "." + tool
	EventVersion       = 1
	EventTypeRequested = "requested"
	EventTypeResolved  = "resolved"
)

// eventsDedupWindow is how long JetStream remembers a Nats-Msg-Id: longer
// than any run of notification retries.
const eventsDedupWindow = time.Hour

// Event is the JSON payload of every approval event, version [EventVersion].
// It carries no arguments field, no task ID (the agent's handle), no tokens
// or assertions. The display text stands for the arguments: an upstream
// tool's holds their JSON (gateway/upstream), so a subscriber learns what
// the call asks, as an approver does. IdenticalCalls are the requester's
// identical calls as the approver API shows them, looked up when the event
// is published.
type Event struct {
	V           int                 `json:"v"`
	Type        string              `json:"type"` // requested | resolved
	Ref         string              `json:"ref"`
	Tool        string              `json:"tool"`
	DisplayText string              `json:"displayText"`
	Requester   string              `json:"requester"`
	Reason      string              `json:"reason"`
	Group       string              `json:"group"`
	Quorum      int                 `json:"quorum"`
	ActionHash  string              `json:"actionHash"`
	ExpiresAt   time.Time           `json:"expiresAt"`
	ApproveURL  string              `json:"approveUrl"`
	At          time.Time           `json:"at"`
	Status      tasks.Status        `json:"status"`
	State       tasks.ApprovalState `json:"approvalState"`
	// IdenticalCalls: see the approver API's approval.
	IdenticalCalls approverapi.IdenticalCalls `json:"identicalCalls"`
	// Resolved only.
	Disposition tasks.Disposition `json:"disposition,omitempty"`
	Message     string            `json:"message,omitempty"`
	Approvals   []EventApproval   `json:"approvals,omitempty"`
}

// EventApproval is one accepted decision in a resolved event.
type EventApproval struct {
	ApproverID   string    `json:"approverId"`
	ApproverName string    `json:"approverName"`
	Decision     string    `json:"decision"`
	At           time.Time `json:"at"`
}

// EventsOptions configures [NewEvents].
type EventsOptions struct {
	// Replicas of the stream (1 in dev; 3 in a cluster). Zero means 1.
	Replicas int
	// MaxAge of events in the stream. Zero means 30 days.
	MaxAge time.Duration
}

// Events publishes approval events to JetStream. It implements
// activities.Notifier. Each event carries Nats-Msg-Id "<ref>.<type>", so a
// retried publish within the stream's duplicate window is stored once.
type Events struct {
	js jetstream.JetStream
}

// EventsStreamConfig is the configuration of the [EventsStream] stream;
// a copy of the stream (countersign dev's, for its NATS clients) uses it too.
func EventsStreamConfig(opts EventsOptions) jetstream.StreamConfig {
	if opts.Replicas == 0 {
		opts.Replicas = 1
	}
	if opts.MaxAge == 0 {
		opts.MaxAge = 30 * 24 * time.Hour
	}
	return jetstream.StreamConfig{
		Name:        EventsStream,
		Description: "Countersign approval events (JSON, v1)",
		Subjects:    []string{SubjectRequested + ".>", SubjectResolved + ".>"},
		Storage:     jetstream.FileStorage,
		Replicas:    opts.Replicas,
		MaxAge:      opts.MaxAge,
		Duplicates:  eventsDedupWindow,
	}
}

// NewEvents creates or updates the [EventsStream] stream.
func NewEvents(ctx context.Context, js jetstream.JetStream, opts EventsOptions) (*Events, error) {
	if js == nil {
		return nil, errors.New("notify: JetStream is required")
	}
	_, err := js.CreateOrUpdateStream(ctx, EventsStreamConfig(opts))
	if err != nil {
		return nil, fmt.Errorf("notify: events stream: %w", err)
	}
	return &Events{js: js}, nil
}

// ToolToken turns a tool name into one subject token: characters that NATS
// subjects reserve ('.', '*', '>', whitespace) and anything outside
// printable ASCII become '_'.
func ToolToken(tool string) string {
	if tool == "" {
		return "_"
	}
	var b strings.Builder
	for _, r := range tool {
		if r <= ' ' || r > '~' || r == '.' || r == '*' || r == '>' {
			b.WriteByte('_')
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func newEvent(typ string, r tasks.Record, approveURL string, identical tasks.IdenticalCalls) Event {
	e := Event{
		V: EventVersion, Type: typ, Ref: r.ApprovalRef, Tool: r.Tool,
		DisplayText: r.DisplayText, Requester: r.Owner, Reason: r.Requirement.Reason,
		Group: r.Requirement.Group, Quorum: r.Requirement.Quorum, ActionHash: r.ActionHash,
		ExpiresAt: r.ExpiresAt, ApproveURL: approveURL, At: r.LastUpdatedAt,
		Status: r.Status, State: r.ApprovalState, IdenticalCalls: approverapi.NewIdenticalCalls(identical),
	}
	if e.At.IsZero() {
		e.At = r.CreatedAt
	}
	if typ == EventTypeResolved {
		e.Disposition = r.Disposition
		e.Message = r.StatusMessage
		for _, a := range r.Approvals {
			e.Approvals = append(e.Approvals, EventApproval{ApproverID: a.ApproverID, ApproverName: a.ApproverName, Decision: a.Decision, At: a.At})
		}
	}
	return e
}

func (ev *Events) publish(ctx context.Context, subject string, e Event) error {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("notify: encode event: %w", err)
	}
	msg := nats.NewMsg(subject + "." + ToolToken(e.Tool))
	msg.Data = b
	msg.Header.Set(jetstream.MsgIDHeader, e.Ref+"."+e.Type)
	if _, err := ev.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("notify: publish %s event: %w", e.Type, err)
	}
	return nil
}

// ApprovalRequested implements activities.Notifier.
func (ev *Events) ApprovalRequested(ctx context.Context, r tasks.Record, approveURL string, identical tasks.IdenticalCalls) error {
	return ev.publish(ctx, SubjectRequested, newEvent(EventTypeRequested, r, approveURL, identical))
}

// ApprovalUpdated implements activities.Notifier: it publishes the resolved
// event when the task has ended and nothing for progress.
func (ev *Events) ApprovalUpdated(ctx context.Context, r tasks.Record, approveURL string, identical tasks.IdenticalCalls) error {
	if !r.Status.Terminal() {
		return nil
	}
	return ev.publish(ctx, SubjectResolved, newEvent(EventTypeResolved, r, approveURL, identical))
}
