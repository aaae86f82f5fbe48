package activities

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/countersign/countersign/tasks"
)

// Notifier tells approvers that a task awaits their decision, and follows the
// task afterwards. approveURL is the approval page of the task; identical
// are the requester's identical calls (tasks.Store.IdenticalCalls), looked
// up when the notification is sent, for the notifier to show with their
// warning.
type Notifier interface {
	// ApprovalRequested: the task r was created and awaits approval.
	ApprovalRequested(ctx context.Context, r tasks.Record, approveURL string, identical tasks.IdenticalCalls) error
	// ApprovalUpdated: the task r moved on. Either an approval was accepted
	// (r.Status is not terminal; r.Approvals has it), or the task ended
	// (r.Status is terminal; r.Disposition and r.ApprovalState say how).
	// The record is read when the notification is sent, so a late
	// notification carries the newest state, never an older one.
	ApprovalUpdated(ctx context.Context, r tasks.Record, approveURL string, identical tasks.IdenticalCalls) error
}

// NotifyKind is what a [NotifyUpdateInput] reports.
type NotifyKind string

const (
	// NotifyProgress: an approval was accepted; the task still runs.
	NotifyProgress NotifyKind = "progress"
	// NotifyResolved: the task ended.
	NotifyResolved NotifyKind = "resolved"
)

// NotifyUpdateInput asks for the notifiers to be told that the task moved on.
type NotifyUpdateInput struct {
	Version int        `json:"version"`
	TaskID  string     `json:"taskId"`
	Kind    NotifyKind `json:"kind"`
}

// Fanout sends every notification to each of its notifiers concurrently. A
// failing or slow notifier never keeps the others from being told: each one
// runs on its own, and Fanout returns the failures joined once all have
// answered (or the context ended). The activity then retries; the Slack and
// NATS notifiers are idempotent per task, so a retry updates rather than
// repeats.
type Fanout struct {
	Notifiers []Notifier
	// Names label the notifiers in errors and logs, by index; optional.
	Names  []string
	Logger *slog.Logger
}

func (f *Fanout) name(i int) string {
	if i < len(f.Names) && f.Names[i] != "" {
		return f.Names[i]
	}
	return fmt.Sprintf("notifier %d", i)
}

func (f *Fanout) each(ctx context.Context, op string, fn func(Notifier) error) error {
	errs := make([]error, len(f.Notifiers))
	var wg sync.WaitGroup
	for i, n := range f.Notifiers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(n); err != nil {
				errs[i] = fmt.Errorf("%s: %w", f.name(i), err)
				if f.Logger != nil {
					f.Logger.WarnContext(ctx, "activities: notifier failed", "notifier", f.name(i), "op", op, "error", err)
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// ApprovalRequested implements [Notifier].
func (f *Fanout) ApprovalRequested(ctx context.Context, r tasks.Record, approveURL string, identical tasks.IdenticalCalls) error {
	return f.each(ctx, "requested", func(n Notifier) error { return n.ApprovalRequested(ctx, r, approveURL, identical) })
}

// ApprovalUpdated implements [Notifier].
func (f *Fanout) ApprovalUpdated(ctx context.Context, r tasks.Record, approveURL string, identical tasks.IdenticalCalls) error {
	return f.each(ctx, "updated", func(n Notifier) error { return n.ApprovalUpdated(ctx, r, approveURL, identical) })
}

// ConsoleNotifier writes one line per request to W: the dev-mode notifier
// when neither Slack nor NATS is configured. It prints the display text, never
// the raw arguments.
type ConsoleNotifier struct {
	W io.Writer
}

// ApprovalRequested implements [Notifier]. The display text is quoted so that
// argument-derived text cannot inject terminal control sequences. The
// identical calls' warning, when there is one, follows on a line of its own.
func (n ConsoleNotifier) ApprovalRequested(_ context.Context, r tasks.Record, approveURL string, identical tasks.IdenticalCalls) error {
	line := fmt.Sprintf("countersign: approval requested for %s %q: %d of group %q, expires %s; approve at %s\n",
		r.Tool, r.DisplayText, r.Requirement.Quorum, r.Requirement.Group,
		r.ExpiresAt.UTC().Format(time.RFC3339), approveURL)
	if w := identical.Warning(); w != "" {
		line += "countersign: WARNING: " + w + "\n"
	}
	if _, err := io.WriteString(n.W, line); err != nil {
		return fmt.Errorf("activities: console notify: %w", err)
	}
	return nil
}

// ApprovalUpdated implements [Notifier]: one line per accepted approval and
// one when the task ends.
func (n ConsoleNotifier) ApprovalUpdated(_ context.Context, r tasks.Record, approveURL string, _ tasks.IdenticalCalls) error {
	var line string
	if r.Status.Terminal() {
		how := string(r.Disposition)
		if how == "" {
			how = string(r.Status)
		}
		line = fmt.Sprintf("countersign: %s %q ended: %s (%s)\n", r.Tool, r.DisplayText, how, r.ApprovalState)
	} else {
		approved := 0
		for _, e := range r.Approvals {
			if e.Decision == tasks.DecisionApprove {
				approved++
			}
		}
		line = fmt.Sprintf("countersign: %s %q: %d of %d approvals; %s\n", r.Tool, r.DisplayText, approved, r.Requirement.Quorum, approveURL)
	}
	if _, err := io.WriteString(n.W, line); err != nil {
		return fmt.Errorf("activities: console notify: %w", err)
	}
	return nil
}
