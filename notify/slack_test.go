package notify_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/countersign/countersign/notify"
	"github.com/countersign/countersign/tasks"
)

func newSlack(t *testing.T, f *fakeSlack, deny bool) *notify.Slack {
	t.Helper()
	js, _ := startNATS(t)
	s, err := notify.NewSlack(testCtx(t), js, notify.SlackOptions{
		Token: "xoxb-test", DefaultChannel: "#approvals", DenyButton: deny, APIURL: f.URL(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// buttons returns the action buttons of a call's blocks: action_id → url.
func buttons(t *testing.T, c call) map[string]string {
	t.Helper()
	var blocks []struct {
		Type     string `json:"type"`
		Elements []struct {
			ActionID string `json:"action_id"`
			URL      string `json:"url"`
			Value    string `json:"value"`
		} `json:"elements"`
	}
	if err := json.Unmarshal([]byte(c.blocksText()), &blocks); err != nil {
		t.Fatalf("blocks are not JSON: %v\n%s", err, c.blocksText())
	}
	out := map[string]string{}
	for _, b := range blocks {
		if b.Type != "actions" {
			continue
		}
		for _, e := range b.Elements {
			out[e.ActionID] = e.URL
		}
	}
	return out
}

func TestSlackPostsOnceThenUpdatesTheSameMessage(t *testing.T) {
	f := newFakeSlack(t)
	s := newSlack(t, f, true)
	ctx := testCtx(t)
	r := pendingRecord()
	url := "https://approve.example.com/approve/" + r.ApprovalRef

	if err := s.ApprovalRequested(ctx, r, url, tasks.IdenticalCalls{}); err != nil {
		t.Fatal(err)
	}
	calls := f.Calls()
	if len(calls) != 1 || calls[0].Method != "chat.postMessage" {
		t.Fatalf("calls = %+v, want one chat.postMessage", calls)
	}
	post := calls[0]
	if got := post.Form.Get("channel"); got != "#approvals" {
		t.Errorf("channel = %q, want the default #approvals", got)
	}
	blocks := post.blocksText()
	for _, want := range []string{r.DisplayText, "transfer_funds", "agent-1", "Transfers over 1,000 require approval", "acct-991", "0 of 2", "Review and approve", `\u003c!date^`} {
		if !strings.Contains(blocks, want) {
			t.Errorf("message lacks %q:\n%s", want, blocks)
		}
	}
	btn := buttons(t, post)
	if btn[notify.ActionReview] != url {
		t.Errorf("review button url = %q, want %q", btn[notify.ActionReview], url)
	}
	if _, ok := btn[notify.ActionDeny]; !ok {
		t.Errorf("no Deny button: %v", btn)
	}
	// Argument text can carry Slack markup; it must be plain text only.
	if strings.Contains(blocks, `"type":"mrkdwn","text":"\u003c!channel\u003e`) || strings.Contains(blocks, `"mrkdwn","text":"<!channel>`) {
		t.Errorf("argument text rendered as mrkdwn: %s", blocks)
	}

	// A retried request (the activity's next attempt) updates, not reposts.
	if err := s.ApprovalRequested(ctx, r, url, tasks.IdenticalCalls{}); err != nil {
		t.Fatal(err)
	}
	// One approval arrives.
	r.Approvals = append(r.Approvals, tasks.ApprovalEntry{ApproverID: "a1", ApproverName: "alice", Decision: tasks.DecisionApprove, At: t0})
	if err := s.ApprovalUpdated(ctx, r, url, tasks.IdenticalCalls{}); err != nil {
		t.Fatal(err)
	}
	// The task ends.
	r.Status, r.Disposition, r.ApprovalState = tasks.StatusCompleted, tasks.ApprovedExecuted, tasks.ApprovalExecuted
	r.StatusMessage = "Approved; transfer_funds ran once"
	if err := s.ApprovalUpdated(ctx, r, url, tasks.IdenticalCalls{}); err != nil {
		t.Fatal(err)
	}

	calls = f.Calls()
	if n := f.count("chat.postMessage"); n != 1 {
		t.Fatalf("%d chat.postMessage calls, want 1 (no duplicates)", n)
	}
	if n := f.count("chat.update"); n != 3 {
		t.Fatalf("%d chat.update calls, want 3", n)
	}
	for _, c := range calls[1:] {
		if c.Form.Get("channel") != "CAPPROVALS" || c.Form.Get("ts") != "1700000000.000001" {
			t.Errorf("update went to %s/%s, want the posted message CAPPROVALS/1700000000.000001", c.Form.Get("channel"), c.Form.Get("ts"))
		}
	}
	progress := calls[2].blocksText()
	if !strings.Contains(progress, "1 of 2") || !strings.Contains(progress, "Approved by alice") {
		t.Errorf("progress update lacks the approval:\n%s", progress)
	}
	final := calls[3]
	if !strings.Contains(final.blocksText(), "Approved and executed") {
		t.Errorf("final update lacks the outcome:\n%s", final.blocksText())
	}
	if _, ok := buttons(t, final)[notify.ActionDeny]; ok {
		t.Errorf("an ended task still shows Deny")
	}
	if !strings.HasPrefix(final.Form.Get("text"), "Approved and executed") {
		t.Errorf("fallback text = %q", final.Form.Get("text"))
	}
}

func TestSlackEndings(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*tasks.Record)
		label string
	}{
		{"denied", func(r *tasks.Record) {
			r.Status, r.Disposition, r.ApprovalState, r.StatusMessage = tasks.StatusCompleted, tasks.DeniedNotExecuted, tasks.ApprovalDenied, "Denied by bob: not today"
		}, "Denied"},
		{"expired", func(r *tasks.Record) {
			r.Status, r.Disposition, r.ApprovalState = tasks.StatusCompleted, tasks.DeniedNotExecuted, tasks.ApprovalExpired
		}, "Expired"},
		{"cancelled", func(r *tasks.Record) { r.Status, r.ApprovalState = tasks.StatusCancelled, tasks.ApprovalCancelled }, "Cancelled"},
		{"outcome unknown", func(r *tasks.Record) {
			r.Status, r.Disposition, r.ApprovalState = tasks.StatusCompleted, tasks.OutcomeUnknown, tasks.ApprovalFailed
		}, "outcome unknown"},
		{"execution error", func(r *tasks.Record) {
			r.Status, r.Disposition, r.ApprovalState = tasks.StatusCompleted, tasks.ExecutionError, tasks.ApprovalFailed
		}, "reported an error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeSlack(t)
			s := newSlack(t, f, false)
			ctx := testCtx(t)
			r := pendingRecord()
			if err := s.ApprovalRequested(ctx, r, "http://localhost:8080/approve/"+r.ApprovalRef, tasks.IdenticalCalls{}); err != nil {
				t.Fatal(err)
			}
			tc.edit(&r)
			if err := s.ApprovalUpdated(ctx, r, "http://localhost:8080/approve/"+r.ApprovalRef, tasks.IdenticalCalls{}); err != nil {
				t.Fatal(err)
			}
			calls := f.Calls()
			if len(calls) != 2 || calls[1].Method != "chat.update" {
				t.Fatalf("calls = %v, want post then update", calls)
			}
			if got := calls[1].blocksText(); !strings.Contains(got, tc.label) {
				t.Errorf("update lacks %q:\n%s", tc.label, got)
			}
		})
	}
}

func TestSlackPolicyChannelWins(t *testing.T) {
	f := newFakeSlack(t)
	s := newSlack(t, f, false)
	r := pendingRecord()
	r.Requirement.SlackChannel = "#payments"
	if err := s.ApprovalRequested(testCtx(t), r, "http://localhost:8080/approve/x", tasks.IdenticalCalls{}); err != nil {
		t.Fatal(err)
	}
	if got := f.Calls()[0].Form.Get("channel"); got != "#payments" {
		t.Errorf("channel = %q, want the policy's #payments", got)
	}
	if _, ok := buttons(t, f.Calls()[0])[notify.ActionDeny]; ok {
		t.Errorf("Deny shown without interactivity")
	}
}

// A Slack outage fails the attempt (the activity retries with backoff);
// once Slack is back, the retry posts exactly one message.
func TestSlackOutageThenRetryPostsOnce(t *testing.T) {
	f := newFakeSlack(t)
	s := newSlack(t, f, false)
	ctx := testCtx(t)
	r := pendingRecord()
	f.failFor(1)
	if err := s.ApprovalRequested(ctx, r, "http://localhost:8080/approve/x", tasks.IdenticalCalls{}); err == nil {
		t.Fatal("no error while Slack is down")
	}
	if err := s.ApprovalRequested(ctx, r, "http://localhost:8080/approve/x", tasks.IdenticalCalls{}); err != nil {
		t.Fatal(err)
	}
	if err := s.ApprovalRequested(ctx, r, "http://localhost:8080/approve/x", tasks.IdenticalCalls{}); err != nil {
		t.Fatal(err)
	}
	if n := f.count("chat.postMessage"); n != 1 {
		t.Errorf("%d messages posted, want 1", n)
	}
}

func TestSlackNoChannel(t *testing.T) {
	f := newFakeSlack(t)
	js, _ := startNATS(t)
	s, err := notify.NewSlack(testCtx(t), js, notify.SlackOptions{Token: "xoxb-test", APIURL: f.URL()})
	if err != nil {
		t.Fatal(err)
	}
	err = s.ApprovalRequested(testCtx(t), pendingRecord(), "http://localhost:8080/approve/x", tasks.IdenticalCalls{})
	if err == nil || !strings.Contains(err.Error(), "no Slack channel") {
		t.Errorf("err = %v, want a clear no-channel error", err)
	}
	if len(f.Calls()) != 0 {
		t.Errorf("Slack was called")
	}
}

func TestNewSlackValidates(t *testing.T) {
	js, _ := startNATS(t)
	if _, err := notify.NewSlack(testCtx(t), js, notify.SlackOptions{}); err == nil {
		t.Error("no token accepted")
	}
	if _, err := notify.NewSlack(testCtx(t), js, notify.SlackOptions{Token: "x", DefaultChannel: "#bad channel"}); err == nil {
		t.Error("bad channel accepted")
	}
}

// The fallback text, which Slack shows in mobile notifications and reads
// to screen readers as mrkdwn, carries the display text, which comes from
// the call: its markup stays text, so an agent cannot ping the channel or
// show a link to one site under the name of another.
func TestSlackFallbackTextIsEscaped(t *testing.T) {
	f := newFakeSlack(t)
	s := newSlack(t, f, true)
	ctx := testCtx(t)
	r := pendingRecord()
	r.DisplayText = "Pay <!channel> & <@U0ADMIN> at <https://evil.example|https://bank.example>"
	url := "https://approve.example.com/approve/" + r.ApprovalRef
	if err := s.ApprovalRequested(ctx, r, url, tasks.IdenticalCalls{}); err != nil {
		t.Fatal(err)
	}
	r.Approvals = append(r.Approvals, tasks.ApprovalEntry{ApproverID: "a1", ApproverName: "alice", Decision: tasks.DecisionApprove, At: t0})
	if err := s.ApprovalUpdated(ctx, r, url, tasks.IdenticalCalls{}); err != nil {
		t.Fatal(err)
	}
	calls := f.Calls()
	if len(calls) != 2 {
		t.Fatalf("calls = %+v, want a post and an update", calls)
	}
	want := "Approval requested: Pay &lt;!channel&gt; &amp; &lt;@U0ADMIN&gt; at &lt;https://evil.example|https://bank.example&gt;"
	for _, c := range calls {
		if got := c.Form.Get("text"); got != want {
			t.Errorf("%s text = %q, want %q", c.Method, got, want)
		}
	}
}
