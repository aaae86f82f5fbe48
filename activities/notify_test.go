package activities_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/internal/testnats"
	"github.com/countersign/countersign/tasks"
)

// countingNotifier is a notifier that records what it was told and fails
// with err.
type countingNotifier struct {
	mu        sync.Mutex
	requested []tasks.Record
	updated   []tasks.Record
	err       error
	block     chan struct{} // when set, ApprovalUpdated waits on it or ctx
}

func (n *countingNotifier) ApprovalRequested(_ context.Context, r tasks.Record, _ string, _ tasks.IdenticalCalls) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.requested = append(n.requested, r)
	return n.err
}

func (n *countingNotifier) ApprovalUpdated(ctx context.Context, r tasks.Record, _ string, _ tasks.IdenticalCalls) error {
	if n.block != nil {
		select {
		case <-n.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.updated = append(n.updated, r)
	return n.err
}

func TestFanoutOneFailingChannelDoesNotStopTheOthers(t *testing.T) {
	bad := &countingNotifier{err: errors.New("slack down")}
	good := &countingNotifier{}
	var console bytes.Buffer
	f := &activities.Fanout{
		Notifiers: []activities.Notifier{bad, activities.ConsoleNotifier{W: &console}, good},
		Names:     []string{"slack", "console", "nats"},
	}
	r := tasks.Record{TaskID: "tsk_x", Tool: "transfer_funds", DisplayText: "Transfer 5", Requirement: tasks.Requirement{Quorum: 1}}
	err := f.ApprovalRequested(context.Background(), r, "http://localhost:8080/approve/apr_x", tasks.IdenticalCalls{})
	if err == nil || !strings.Contains(err.Error(), "slack: slack down") {
		t.Fatalf("err = %v, want the Slack failure, named", err)
	}
	if len(good.requested) != 1 || !strings.Contains(console.String(), "approve at http://localhost:8080/approve/apr_x") {
		t.Errorf("the other channels were not told: nats %d, console %q", len(good.requested), console.String())
	}
}

func TestFanoutSlowChannelDoesNotDelayTheOthers(t *testing.T) {
	slow := &countingNotifier{block: make(chan struct{})}
	fast := &countingNotifier{}
	f := &activities.Fanout{Notifiers: []activities.Notifier{slow, fast}}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	r := tasks.Record{TaskID: "tsk_x", Status: tasks.StatusCompleted}
	err := f.ApprovalUpdated(ctx, r, "u", tasks.IdenticalCalls{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want the slow channel's deadline", err)
	}
	if len(fast.updated) != 1 {
		t.Errorf("the fast channel was not told")
	}
}

func TestConsoleNotifierUpdates(t *testing.T) {
	var buf bytes.Buffer
	n := activities.ConsoleNotifier{W: &buf}
	r := tasks.Record{Tool: "transfer_funds", DisplayText: "Transfer\x1b[2J 5", Requirement: tasks.Requirement{Quorum: 2},
		Approvals: []tasks.ApprovalEntry{{Decision: tasks.DecisionApprove}}}
	if err := n.ApprovalUpdated(context.Background(), r, "http://localhost:8080/approve/apr_x", tasks.IdenticalCalls{}); err != nil {
		t.Fatal(err)
	}
	r.Status, r.Disposition, r.ApprovalState = tasks.StatusCompleted, tasks.ApprovedExecuted, tasks.ApprovalExecuted
	if err := n.ApprovalUpdated(context.Background(), r, "http://localhost:8080/approve/apr_x", tasks.IdenticalCalls{}); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"1 of 2 approvals", "ended: approved-executed (executed)", `\x1b`} {
		if !strings.Contains(out, want) {
			t.Errorf("console output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("a control sequence reached the console")
	}
}

func TestNotifyUpdateReadsTheCurrentRecord(t *testing.T) {
	js, _ := testnats.Start(t)
	ctx := context.Background()
	store, err := tasks.NewStore(ctx, js, tasks.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec := tasks.Record{TaskID: tasks.NewID("tsk_"), Owner: "agent", Status: tasks.StatusWorking, ApprovalRef: tasks.NewID("apr_"),
		ApprovalState: tasks.ApprovalPending, CreatedAt: time.Now(), TTL: time.Hour, ExpiresAt: time.Now().Add(time.Hour)}
	if err := store.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	n := &countingNotifier{}
	a := &activities.Activities{Tasks: store, Notifier: n, PublicURL: "https://approve.example.com/"}
	if err := a.NotifyUpdate(ctx, activities.NotifyUpdateInput{Version: activities.Version, TaskID: rec.TaskID, Kind: activities.NotifyProgress}); err != nil {
		t.Fatal(err)
	}
	if len(n.updated) != 1 || n.updated[0].ApprovalRef != rec.ApprovalRef {
		t.Fatalf("notifier got %+v", n.updated)
	}
	for _, in := range []activities.NotifyUpdateInput{
		{Version: 99, TaskID: rec.TaskID, Kind: activities.NotifyProgress},
		{Version: activities.Version, TaskID: rec.TaskID, Kind: "gossip"},
		{Version: activities.Version, TaskID: tasks.NewID("tsk_"), Kind: activities.NotifyResolved},
	} {
		if err := a.NotifyUpdate(ctx, in); err == nil {
			t.Errorf("NotifyUpdate(%+v) succeeded", in)
		}
	}
	if len(n.updated) != 1 {
		t.Errorf("bad inputs reached the notifier")
	}
}
