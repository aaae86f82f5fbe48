package e2e

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/slack-go/slack/slacktest"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/notify"
	"github.com/countersign/countersign/tasks"
)

// slackCalls captures the chat.* calls Countersign makes to a slacktest server.
type slackCalls struct {
	mu    sync.Mutex
	calls []url.Values // with "_method"
	ts    int
}

func (c *slackCalls) handler(method string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		c.mu.Lock()
		defer c.mu.Unlock()
		f := r.PostForm
		f.Set("_method", method)
		c.calls = append(c.calls, f)
		w.Header().Set("Content-Type", "application/json")
		resp := map[string]any{"ok": true, "channel": "CAPPROVALS", "ts": f.Get("ts")}
		if method == "chat.postMessage" {
			c.ts++
			resp["ts"] = "1700000000.00000" + strconv.Itoa(c.ts)
		}
		_ = json.NewEncoder(w).Encode(resp)
	}
}

// waitFor returns the first call of method whose blocks or text contain
// want, within 20 s.
func (c *slackCalls) waitFor(t *testing.T, method, want string) url.Values {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		for _, f := range c.calls {
			if f.Get("_method") == method && (strings.Contains(f.Get("blocks"), want) || strings.Contains(f.Get("text"), want)) {
				c.mu.Unlock()
				return f
			}
		}
		c.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no %s containing %q; calls: %v", method, want, c.all())
	return nil
}

func (c *slackCalls) all() []url.Values {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]url.Values(nil), c.calls...)
}

func (c *slackCalls) count(method, want string) int {
	n := 0
	for _, f := range c.all() {
		if f.Get("_method") == method && strings.Contains(f.Get("blocks"), want) {
			n++
		}
	}
	return n
}

const e2eSigningSecret = "e2e-signing-secret"

// TestSlackAndNATS runs `countersign dev` with Slack (slacktest) and drives
// it the way approvers would: the Slack message appears, an approval over
// the NATS decision service runs the tool once and updates the same
// message, a Deny from Slack stops another call, and NATS carries the
// events.
func TestSlackAndNATS(t *testing.T) {
	calls := &slackCalls{}
	fake := slacktest.NewTestServer(func(c slacktest.Customize) {
		c.Handle("/chat.postMessage", calls.handler("chat.postMessage"))
		c.Handle("/chat.update", calls.handler("chat.update"))
		c.Handle("/chat.postEphemeral", calls.handler("chat.postEphemeral"))
	})
	fake.Start()
	defer fake.Stop()

	s := startStackConfig(t, app.Config{
		SlackToken: "xoxb-e2e", SlackChannel: "#approvals", SlackSigningSecret: e2eSigningSecret,
		SlackAPIURL: fake.GetAPIURL(),
	}, 0)
	nc, err := nats.Connect(s.App.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	alice := s.Enroll("alice", "approvers")

	// 1. A gated transfer: one Slack message with the link.
	task := s.CreateTask(s.AgentToken, "transfer_funds", map[string]any{"to": "acct-991", "amount": 50000, "currency": "USD"})
	ref := s.RefOf(task.TaskID)
	post := calls.waitFor(t, "chat.postMessage", ref)
	if !strings.Contains(post.Get("blocks"), s.Base+"/approve/"+ref) || !strings.Contains(post.Get("blocks"), "Transfer 50,000.00 USD to acct-991") {
		t.Errorf("message lacks the link or the display text: %s", post.Get("blocks"))
	}

	// 2. Approve over NATS: challenge, sign, decision.
	natsReq := func(subject string, body map[string]any) (int, json.RawMessage) {
		t.Helper()
		b, _ := json.Marshal(body)
		m, err := nc.Request(subject, b, 30*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", subject, err)
		}
		st, _ := strconv.Atoi(m.Header.Get(notify.StatusHeader))
		return st, m.Data
	}
	st, raw := natsReq(notify.SubjectChallenge, map[string]any{"ref": ref, "decision": "approve"})
	if st != 200 {
		t.Fatalf("challenge over NATS: %d %s", st, raw)
	}
	var c challenge
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	before := s.Transfers()
	st, raw = natsReq(notify.SubjectDecision, map[string]any{"ref": ref, "challengeId": c.ChallengeID, "decision": "approve", "response": alice.Sign(t, c)})
	if st != 200 || !bytes.Contains(raw, []byte(`"accepted":true`)) {
		t.Fatalf("decision over NATS: %d %s", st, raw)
	}
	if d := s.WaitTerminal(s.AgentToken, task.TaskID); disposition(d) != tasks.ApprovedExecuted {
		t.Fatalf("disposition %s", disposition(d))
	}
	if s.Transfers() != before+1 {
		t.Errorf("the transfer did not run exactly once")
	}
	final := calls.waitFor(t, "chat.update", "Approved and executed")
	if final.Get("ts") != "1700000000.000001" || final.Get("channel") != "CAPPROVALS" {
		t.Errorf("the end updated another message: ts %s", final.Get("ts"))
	}
	if n := calls.count("chat.postMessage", ref); n != 1 {
		t.Errorf("%d messages posted for one task", n)
	}
	// A decision for the finished task: refused, nothing changes.
	st, raw = natsReq(notify.SubjectDecision, map[string]any{"ref": ref, "challengeId": c.ChallengeID, "decision": "approve", "response": alice.Sign(t, c)})
	if st != http.StatusConflict || !bytes.Contains(raw, []byte("task_not_pending")) {
		t.Errorf("decision on a finished task: %d %s", st, raw)
	}

	// 3. Events: requested and resolved, once each.
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, notify.EventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"countersign.approvals.*.transfer_funds"}})
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	batch, err := cons.Fetch(10, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		var e notify.Event
		if json.Unmarshal(m.Data(), &e) == nil && e.Ref == ref {
			types = append(types, e.Type+"/"+string(e.Disposition))
		}
	}
	if strings.Join(types, ",") != "requested/,resolved/approved-executed" {
		t.Errorf("events for the task: %v", types)
	}

	// 4. Deny from Slack: link alice's Slack account, press Deny.
	task2 := s.CreateTask(s.AgentToken, "transfer_funds", map[string]any{"to": "acct-992", "amount": 60000, "currency": "USD"})
	ref2 := s.RefOf(task2.TaskID)
	calls.waitFor(t, "chat.postMessage", ref2)
	var linked map[string]any
	if code := s.HTTPJSON("POST", "/admin/v1/approvers/"+alice.ID+"/slack", s.AdminToken, map[string]string{"slackUserId": "U0ALICE"}, &linked); code != 200 ||
		linked["auditChain"] != "admin-approver-"+alice.ID || linked["auditRecord"] == nil {
		t.Fatalf("link slack user: %d %v; want it recorded in alice's admin chain", code, linked)
	}
	payload, _ := json.Marshal(map[string]any{
		"type": "block_actions", "user": map[string]string{"id": "U0ALICE"}, "channel": map[string]string{"id": "CAPPROVALS"},
		"actions": []map[string]string{{"action_id": notify.ActionDeny, "block_id": "actions", "type": "button", "value": ref2}},
	})
	body := []byte("payload=" + url.QueryEscape(string(payload)))
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	mac := hmac.New(sha256.New, []byte(e2eSigningSecret))
	mac.Write([]byte("v0:" + ts + ":"))
	mac.Write(body)
	send := func(sig string) int {
		req, _ := http.NewRequest("POST", s.Base+"/slack/interactivity", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("X-Slack-Request-Timestamp", ts)
		req.Header.Set("X-Slack-Signature", sig)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := send("v0=" + strings.Repeat("0", 64)); code != http.StatusUnauthorized {
		t.Errorf("forged signature: %d", code)
	}
	if d, _ := s.GetTask(s.AgentToken, task2.TaskID); d.Status.Terminal() {
		t.Fatalf("a forged callback ended the task")
	}
	if code := send("v0=" + hex.EncodeToString(mac.Sum(nil))); code != http.StatusOK {
		t.Fatalf("signed deny: %d", code)
	}
	calls.waitFor(t, "chat.postEphemeral", "Denied.")
	d := s.WaitTerminal(s.AgentToken, task2.TaskID)
	if disposition(d) != tasks.DeniedNotExecuted {
		t.Fatalf("slack deny: disposition %s", disposition(d))
	}
	if s.Transfers() != before+1 {
		t.Errorf("a denied transfer ran")
	}
	calls.waitFor(t, "chat.update", "Denied by alice via slack")
	if code := send("v0=" + hex.EncodeToString(mac.Sum(nil))); code != http.StatusConflict {
		t.Errorf("replayed deny: %d, want 409", code)
	}

	// 5. The link removed, the same Slack user's Deny changes nothing.
	var unlinked map[string]any
	if code := s.HTTPJSON("DELETE", "/admin/v1/approvers/"+alice.ID+"/slack/U0ALICE", s.AdminToken, nil, &unlinked); code != 200 ||
		unlinked["changed"] != true || unlinked["auditChain"] != "admin-approver-"+alice.ID {
		t.Fatalf("unlink slack user: %d %v", code, unlinked)
	}
	task3 := s.CreateTask(s.AgentToken, "transfer_funds", map[string]any{"to": "acct-993", "amount": 60000, "currency": "USD"})
	ref3 := s.RefOf(task3.TaskID)
	calls.waitFor(t, "chat.postMessage", ref3)
	payload, _ = json.Marshal(map[string]any{
		"type": "block_actions", "user": map[string]string{"id": "U0ALICE"}, "channel": map[string]string{"id": "CAPPROVALS"},
		"actions": []map[string]string{{"action_id": notify.ActionDeny, "block_id": "actions", "type": "button", "value": ref3}},
	})
	body = []byte("payload=" + url.QueryEscape(string(payload)))
	ts = strconv.FormatInt(time.Now().Unix(), 10)
	mac = hmac.New(sha256.New, []byte(e2eSigningSecret))
	mac.Write([]byte("v0:" + ts + ":"))
	mac.Write(body)
	if code := send("v0=" + hex.EncodeToString(mac.Sum(nil))); code != http.StatusOK {
		t.Fatalf("signed deny of an unlinked user: %d", code)
	}
	calls.waitFor(t, "chat.postEphemeral", "does not know your Slack account")
	if d, _ := s.GetTask(s.AgentToken, task3.TaskID); d.Status.Terminal() {
		t.Fatalf("an unlinked Slack user's Deny ended the task")
	}
}
