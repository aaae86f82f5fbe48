package activities

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/countersign/countersign/tasks"
)

// Notifier tells approvers that a task awaits their decision. approveURL is
// the approval page of the task.
type Notifier interface {
	ApprovalRequested(ctx context.Context, r tasks.Record, approveURL string) error
}

// ConsoleNotifier writes one line per request to W: the dev-mode notifier
// when neither Slack nor NATS is configured. It prints the display text, never
// the raw arguments.
type ConsoleNotifier struct {
	W io.Writer
}

// ApprovalRequested implements [Notifier]. The display text is quoted so that
// argument-derived text cannot inject terminal control sequences.
func (n ConsoleNotifier) ApprovalRequested(_ context.Context, r tasks.Record, approveURL string) error {
	line := fmt.Sprintf("countersign: approval requested for %s %q: %d of group %q, expires %s; approve at %s\n",
		r.Tool, r.DisplayText, r.Requirement.Quorum, r.Requirement.Group,
		r.ExpiresAt.UTC().Format(time.RFC3339), approveURL)
	if _, err := io.WriteString(n.W, line); err != nil {
		return fmt.Errorf("activities: console notify: %w", err)
	}
	return nil
}
