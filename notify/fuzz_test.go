package notify_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/descope/virtualwebauthn"
	"github.com/nats-io/nats.go"

	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/notify"
	"github.com/countersign/countersign/tasks"
)

// refMark in a fuzz input stands for the approval reference of the pending
// task, so that mutations reach past the reference check.
const refMark = "@REF@"

// FuzzDecisionMessage sends arbitrary request bodies to the three subjects
// of the NATS decision service, over a real NATS connection to the real
// service, with a pending approval whose workflow runs (in memory) and an
// enrolled approver. Whatever arrives:
//
//   - there is always a reply, with a status in the Countersign-Status
//     header that is never 5xx, and a JSON object body; an error reply has
//     an "error" code and a non-empty, valid UTF-8 "message", or is a
//     decision refused with its reason;
//   - the approval never changes: the fuzzer has no key that can sign an
//     assertion (the decision seeds carry a well-formed assertion by a
//     passkey that is not enrolled), so no input may count as a decision.
func FuzzDecisionMessage(f *testing.F) {
	e := newDecisionEnv(f)
	rec := e.addTask(f, nil)
	if err := e.engine.Start(testCtx(f), approvalInput(rec)); err != nil {
		f.Fatal(err)
	}
	e.enroll(f, "alice")
	// A well-formed assertion over a real challenge of this approval, by a
	// passkey that claims to be alice's but was never enrolled.
	m, err := e.nc.Request(notify.SubjectChallenge, []byte(`{"ref":"`+rec.ApprovalRef+`","decision":"approve"}`), 10*time.Second)
	if err != nil {
		f.Fatal(err)
	}
	var ch struct {
		ChallengeID    string          `json:"challengeId"`
		RequestOptions json.RawMessage `json:"requestOptions"`
	}
	if err := json.Unmarshal(m.Data, &ch); err != nil || ch.ChallengeID == "" {
		f.Fatalf("challenge: %s", m.Data)
	}
	opts, err := virtualwebauthn.ParseAssertionOptions(string(ch.RequestOptions))
	if err != nil {
		f.Fatal(err)
	}
	rogue := virtualwebauthn.NewAuthenticator()
	cred := testpasskey.NewEC2Credential()
	rogue.AddCredential(cred)
	assertion := virtualwebauthn.CreateAssertionResponse(testRP, rogue, cred, *opts)

	subjects := []string{notify.SubjectApproval, notify.SubjectChallenge, notify.SubjectDecision}
	for _, s := range []struct {
		subject int
		body    string
	}{
		{0, `{"ref":"@REF@"}`},
		{0, `{"ref":"@REF@","x":1}`},
		{0, `{}`},
		{1, `{"ref":"@REF@","decision":"approve"}`},
		{1, `{"ref":"@REF@","decision":"deny"}`},
		{1, `{"ref":"@REF@","decision":"maybe"}`},
		{1, `{"ref":"@REF@","decision":"approve","admin":true}`},
		{1, `{"ref":"../admin/v1/agents","decision":"approve"}`},
		{1, `{"ref":` + strconv.Quote(tasks.NewID("apr_")) + `,"decision":"approve"}`},
		{2, `{"ref":"@REF@","challengeId":"` + ch.ChallengeID + `","decision":"approve","comment":"ok","response":` + assertion + `}`},
		{2, `{"ref":"@REF@","challengeId":"` + ch.ChallengeID + `","decision":"deny","response":` + assertion + `}`},
		{2, `{"ref":"@REF@","challengeId":"abc","decision":"approve"}`},
		{2, `{"ref":"@REF@","challengeId":"abc","decision":"approve","response":{}}`},
		{2, `{"ref":"@REF@","challengeId":"abc","decision":"approve","response":null,"comment":"` + strings.Repeat("x", 300) + `"}`},
		{2, `{"ref":42}`},
		{2, `{"ref":"@REF@"} {}`},
		{2, `[1,2]`},
		{2, `{"ref":`},
		{2, ``},
	} {
		f.Add(uint8(s.subject), []byte(s.body))
	}

	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		subject := subjects[int(which)%len(subjects)]
		body = bytes.ReplaceAll(body, []byte(refMark), []byte(rec.ApprovalRef))
		m, err := e.nc.RequestMsg(&nats.Msg{Subject: subject, Data: body}, 30*time.Second)
		if err != nil {
			t.Fatalf("%s: no reply: %v", subject, err)
		}
		status, err := strconv.Atoi(m.Header.Get(notify.StatusHeader))
		if err != nil || status < 200 || status > 499 {
			t.Fatalf("%s %q: status %q: %s", subject, body, m.Header.Get(notify.StatusHeader), m.Data)
		}
		var reply map[string]any
		if err := json.Unmarshal(m.Data, &reply); err != nil || reply == nil {
			t.Fatalf("%s %q: the reply is not a JSON object: %s", subject, body, m.Data)
		}
		if status >= 400 {
			// An error, or a decision refused with its reason.
			msg, _ := reply["message"].(string)
			code, _ := reply["error"].(string)
			reason, _ := reply["reason"].(string)
			refused := reply["accepted"] == false && reason != ""
			if !refused && (code == "" || msg == "" || !utf8.ValidString(msg)) {
				t.Fatalf("%s %q: error reply %d without a code and message or a reason: %s", subject, body, status, m.Data)
			}
		}
		got, err := e.store.Get(testCtx(t), rec.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		if got.ApprovalState != tasks.ApprovalPending || len(got.Approvals) != 0 || got.Status != tasks.StatusWorking {
			t.Fatalf("%s %q changed the approval: %+v", subject, body, got)
		}
	})
}

// FuzzSlackInteraction posts arbitrary, correctly signed bodies to the Slack
// interactivity endpoint, with one Slack user (U0ALICE) linked to an
// approver. Whatever the body:
//
//   - the answer is one of 200, 400, 413 or 415 (never 5xx; never 401,
//     since it is signed), and the same request again is 409 (the replay
//     guard) unless it was too large to read;
//   - a deny reaches the approvals service only for the linked user's
//     approver, via "slack", with a reference that is in the request, and
//     only from a body that names the Deny action; nothing else is ever
//     asked of the service.
func FuzzSlackInteraction(f *testing.F) {
	d := &fakeDenier{}
	e := newInteractEnvWith(f, d, nil)
	if _, err := e.users.Link(testCtx(f), e.alice.ID, "U0ALICE"); err != nil {
		f.Fatal(err)
	}
	payload := func(v any) []byte {
		b, _ := json.Marshal(v)
		return []byte("payload=" + url.QueryEscape(string(b)))
	}
	for _, s := range [][]byte{
		denyPayload("U0ALICE", refMark),
		denyPayload("U0BOB", refMark),
		denyPayload("U0ALICE", "../../admin"),
		payload(map[string]any{"type": "block_actions", "user": map[string]string{"id": "U0ALICE"},
			"actions": []map[string]string{{"action_id": "other", "value": refMark}, {"action_id": notify.ActionDeny, "value": refMark}}}),
		payload(map[string]any{"type": "view_submission", "user": map[string]string{"id": "U0ALICE"}}),
		payload(map[string]any{"type": "block_actions"}),
		payload("x"),
		[]byte("payload=%7B"),
		[]byte("payload="),
		[]byte("a=b&payload=%7B%7D&payload=x"),
		[]byte("%zz"),
		[]byte(""),
	} {
		f.Add(s)
	}
	// The replay guard refuses a (timestamp, body) pair seen before, and the
	// fuzzer repeats inputs: each pair is sent fresh, the timestamp moved
	// back a second at a time (Slack's window is five minutes).
	sent := map[string]bool{}
	f.Fuzz(func(t *testing.T, body []byte) {
		hung := time.AfterFunc(10*time.Second, func() {
			buf := make([]byte, 1<<20)
			panic("hung:\n" + string(buf[:runtime.Stack(buf, true)]))
		})
		defer hung.Stop()
		body = bytes.ReplaceAll(body, []byte(refMark), []byte(e.rec.ApprovalRef))
		d.mu.Lock()
		before := len(d.calls)
		d.mu.Unlock()
		now := time.Now().Unix()
		for sent[strconv.FormatInt(now, 10)+":"+string(body)] {
			now--
		}
		sent[strconv.FormatInt(now, 10)+":"+string(body)] = true
		w := e.post(t, body, now, sign(signingSecret, now, body))
		switch w.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusUnsupportedMediaType:
			if again := e.post(t, body, now, sign(signingSecret, now, body)); again.Code != http.StatusConflict {
				t.Fatalf("%q replayed: %d, want 409", body, again.Code)
			}
		case http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("%q: status %d: %s", body, w.Code, w.Body)
		}
		d.mu.Lock()
		calls := append([]denyCall(nil), d.calls[before:]...)
		d.mu.Unlock()
		if len(calls) == 0 {
			return
		}
		if w.Code != http.StatusOK {
			t.Fatalf("%q: a deny from a request answered %d", body, w.Code)
		}
		form, _ := url.ParseQuery(string(body))
		var p any
		_ = json.Unmarshal([]byte(form.Get("payload")), &p)
		named := map[string]bool{}
		stringsIn(p, named)
		if !named[notify.ActionDeny] {
			t.Fatalf("%q: a deny from a payload without the Deny action", body)
		}
		for _, c := range calls {
			if c.approverID != e.alice.ID || c.via != "slack" || !named[c.ref] {
				t.Fatalf("%q: deny %+v (alice is %s)", body, c, e.alice.ID)
			}
		}
	})
}

// stringsIn adds every string of the JSON value v (keys and values) to out.
func stringsIn(v any, out map[string]bool) {
	switch v := v.(type) {
	case string:
		out[v] = true
	case []any:
		for _, x := range v {
			stringsIn(x, out)
		}
	case map[string]any:
		for k, x := range v {
			out[k] = true
			stringsIn(x, out)
		}
	}
}
