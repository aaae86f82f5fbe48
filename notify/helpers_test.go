package notify_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/slack-go/slack/slacktest"

	"github.com/countersign/countersign/internal/testnats"
	"github.com/countersign/countersign/tasks"
)

// call is one captured Slack API call: its method and form.
type call struct {
	Method string
	Form   url.Values
}

// blocksText is every text of the call's blocks, joined, for assertions.
func (c call) blocksText() string { return c.Form.Get("blocks") }

// fakeSlack is slacktest with handlers that capture chat.postMessage,
// chat.update and chat.postEphemeral. failNext makes the next N calls fail
// with HTTP 500 (a Slack outage).
type fakeSlack struct {
	srv      *slacktest.Server
	mu       sync.Mutex
	calls    []call
	failNext int
	nextTS   int
}

func newFakeSlack(t testing.TB) *fakeSlack {
	t.Helper()
	f := &fakeSlack{}
	h := func(method string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if err := r.ParseForm(); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.failNext > 0 {
				f.failNext--
				http.Error(w, "slack is down", http.StatusInternalServerError)
				return
			}
			f.calls = append(f.calls, call{Method: method, Form: r.PostForm})
			w.Header().Set("Content-Type", "application/json")
			switch method {
			case "chat.postMessage":
				f.nextTS++
				ch := r.PostForm.Get("channel")
				if strings.HasPrefix(ch, "#") {
					ch = "C" + strings.ToUpper(strings.TrimPrefix(ch, "#"))
				}
				_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "channel": ch, "ts": "1700000000.00000" + string(rune('0'+f.nextTS))})
			case "chat.update":
				_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "channel": r.PostForm.Get("channel"), "ts": r.PostForm.Get("ts"), "text": r.PostForm.Get("text")})
			default:
				_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "message_ts": "1700000001.000001"})
			}
		}
	}
	f.srv = slacktest.NewTestServer(func(c slacktest.Customize) {
		c.Handle("/chat.postMessage", h("chat.postMessage"))
		c.Handle("/chat.update", h("chat.update"))
		c.Handle("/chat.postEphemeral", h("chat.postEphemeral"))
	})
	f.srv.Start()
	t.Cleanup(f.srv.Stop)
	return f
}

func (f *fakeSlack) URL() string { return f.srv.GetAPIURL() }

func (f *fakeSlack) Calls() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

func (f *fakeSlack) count(method string) int {
	n := 0
	for _, c := range f.Calls() {
		if c.Method == method {
			n++
		}
	}
	return n
}

func (f *fakeSlack) failFor(n int) {
	f.mu.Lock()
	f.failNext = n
	f.mu.Unlock()
}

func startNATS(t testing.TB) (jetstream.JetStream, *nats.Conn) {
	t.Helper()
	return testnats.Start(t)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var t0 = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// pendingRecord is a task awaiting one approval from group "approvers".
func pendingRecord() tasks.Record {
	return tasks.Record{
		TaskID:        tasks.NewID("tsk_"),
		Owner:         "agent-1",
		Era:           tasks.Era2026,
		Status:        tasks.StatusWorking,
		StatusMessage: "Awaiting approval",
		CreatedAt:     t0,
		LastUpdatedAt: t0,
		TTL:           48 * time.Hour,
		Tool:          "transfer_funds",
		Arguments:     json.RawMessage(`{"amount":50000,"currency":"USD","to":"acct-991","memo":"<!channel> pay now"}`),
		ActionHash:    strings.Repeat("ab", 32),
		DisplayText:   "Transfer 50,000.00 USD to acct-991",
		ApprovalRef:   tasks.NewID("apr_"),
		Requirement:   tasks.Requirement{Group: "approvers", Quorum: 2, TTL: 24 * time.Hour, AuthenticatorClass: "platform", Reason: "Transfers over 1,000 require approval"},
		ExpiresAt:     t0.Add(24 * time.Hour),
		ApprovalState: tasks.ApprovalPending,
	}
}
