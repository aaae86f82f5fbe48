package browsertest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/tasks"
)

var transferArgs = map[string]any{"to": "acct-991", "amount": 50000, "currency": "USD",
	"memo": "Q3 invoice 2231 for Northwind Traders: consulting hours for July and August, travel expenses, and the hardware order placed on 14 August (see the attached PO, approved by finance)."}

// enroll opens an invite on dev, creates the passkey and returns the inbox link.
func enroll(t *testing.T, s *stack, dev *device, name, shot string) string {
	t.Helper()
	dev.open(s.addApprover(name))
	dev.do(chromedp.WaitEnabled(chromedp.ID("enroll")))
	dev.waitText("#who", name)
	if shot != "" {
		dev.screenshot(shot, "")
	}
	dev.click("#enroll")
	dev.waitText("#status", "Your passkey is set up")
	if !dev.present("#inbox-link") {
		t.Fatal("no inbox link after enrollment")
	}
	href, err := chromedp.Run(dev.ctx, chromedp.Evaluate[string](`document.getElementById("inbox-link").href`))
	if err != nil || !strings.Contains(href, "/inbox/") {
		t.Fatalf("inbox link %q: %v", href, err)
	}
	return href
}

func TestApproverSite(t *testing.T) {
	browser := newBrowser(t)
	s := startStack(t, "")
	annPhone := newDevice(t, browser, true)
	var annInbox string

	t.Run("enroll", func(t *testing.T) {
		annInbox = enroll(t, s, annPhone.in(t), "Ann Lee", "enroll")
		// The invite is single-use: opening it again says so.
		dev := newDevice(t, browser, true)
		var added struct {
			EnrollURL string `json:"enrollUrl"`
		}
		s.HTTPJSON("POST", "/admin/v1/approvers", s.AdminToken, map[string]any{"name": "Once", "groups": []string{"approvers"}}, &added)
		dev.open(added.EnrollURL)
		dev.click("#enroll")
		dev.waitText("#status", "Your passkey is set up")
		dev.open(added.EnrollURL)
		dev.waitText("#status", "Invitation not usable")
		if dev.present("#enroll") && !strings.Contains(dev.text("#status"), "no longer valid") {
			t.Errorf("used invite: status %q", dev.text("#status"))
		}
	})

	t.Run("approve a transfer on a phone", func(t *testing.T) {
		annPhone := annPhone.in(t)
		before := s.Transfers()
		task := s.createTask("transfer_funds", transferArgs)
		ref := s.RefOf(task)
		annPhone.open(s.Base + "/approve/" + ref)
		annPhone.waitText("h1", "Transfer 50,000.00 USD to acct-991")
		for sel, want := range map[string]string{"#count": "0 of 1", "#state": "Waiting for approval", "#timeline": "Requested by dev-agent"} {
			if got := annPhone.text(sel); !strings.Contains(got, want) {
				t.Errorf("%s = %q, want %q", sel, got, want)
			}
		}
		// The long memo is folded but reachable.
		if !annPhone.present("details pre") || !strings.Contains(annPhone.text("details pre"), "hardware order") {
			t.Error("long memo is not folded into a <details>")
		}
		annPhone.screenshot("approve-phone", "")
		annPhone.click("#approve")
		annPhone.waitText("#status", "You approved")
		annPhone.waitText("#state", "Approved and done") // the page follows the task to its end
		annPhone.waitText("#timeline", "Executed")
		annPhone.screenshot("outcome-phone", "")
		res := s.waitTerminal(task)
		if res.disposition() != tasks.ApprovedExecuted {
			t.Fatalf("disposition %s: %s", res.disposition(), res.text())
		}
		time.Sleep(500 * time.Millisecond)
		if got := s.Transfers(); got != before+1 {
			t.Fatalf("ledger has %d new transfers, want exactly 1", got-before)
		}
		if annPhone.present("#approve") {
			t.Error("the buttons are still offered after the decision")
		}
	})

	t.Run("the same transfer again shows that it ran", func(t *testing.T) {
		annPhone := annPhone.in(t)
		before := s.Transfers()
		task := s.createTask("transfer_funds", transferArgs)
		ref := s.RefOf(task)
		annPhone.open(s.Base + "/approve/" + ref)
		annPhone.waitText("#identical", "already ran or may have run")
		annPhone.waitText("#identical", "approved-executed")
		if !annPhone.present("#identical a[href^='/approve/']") {
			t.Error("the identical call is not linked to its approval page")
		}
		annPhone.screenshot("identical-phone", "#identical")
		annPhone.click("#deny")
		annPhone.do(chromedp.SendKeys(chromedp.ID("comment"), "Already paid"))
		annPhone.click("#deny-confirm")
		annPhone.waitText("#state", "Denied")
		if res := s.waitTerminal(task); res.disposition() != tasks.DeniedNotExecuted {
			t.Fatalf("disposition %s: %s", res.disposition(), res.text())
		}
		if s.Transfers() != before {
			t.Fatal("the denied second transfer ran")
		}
	})

	t.Run("deny with a comment", func(t *testing.T) {
		annPhone := annPhone.in(t)
		before := s.Transfers()
		task := s.createTask("transfer_funds", map[string]any{"to": "acct-666", "amount": 9000, "currency": "EUR"})
		ref := s.RefOf(task)
		annPhone.open(s.Base + "/approve/" + ref)
		annPhone.click("#deny")
		if !annPhone.present("#deny-panel") || annPhone.present("#actions") {
			t.Fatal("Deny did not open the comment panel")
		}
		annPhone.do(chromedp.SendKeys(chromedp.ID("comment"), "Unknown payee, call me first"))
		annPhone.click("#deny-confirm")
		annPhone.waitText("#status", "You denied this request")
		annPhone.waitText("#state", "Denied")
		annPhone.waitText("#outcome", "Unknown payee, call me first")
		res := s.waitTerminal(task)
		if res.disposition() != tasks.DeniedNotExecuted || !strings.Contains(res.text(), "Unknown payee, call me first") {
			t.Fatalf("want a denial carrying the comment, got %s: %s", res.disposition(), res.text())
		}
		if s.Transfers() != before {
			t.Fatal("a denied transfer ran")
		}
	})

	bobDesk := newDevice(t, browser, false)
	var bobInbox string
	t.Run("enroll a second approver on a desktop", func(t *testing.T) {
		bobInbox = enroll(t, s, bobDesk.in(t), "Bob Ortiz", "")
	})

	t.Run("quorum of two, with the inbox", func(t *testing.T) {
		annPhone, bobDesk := annPhone.in(t), bobDesk.in(t)
		task := s.createTask("delete_records", map[string]any{"table": "customers", "filter": "last_order < '2019-01-01' AND region = 'EU'"})
		ref := s.RefOf(task)

		// Ann's inbox lists it.
		annPhone.open(annInbox)
		annPhone.click("#inbox-open")
		annPhone.waitText("#status", "waits for Ann Lee")
		annPhone.waitText("#inbox-list", "delete_records")
		annPhone.screenshot("inbox-phone", "")

		// Ann approves from the inbox: 1 of 2, nothing runs yet.
		annPhone.click("#inbox-list a")
		annPhone.waitText("#count", "0 of 2")
		annPhone.click("#approve")
		annPhone.waitText("#status", "Waiting for more approvals: 1 of 2")
		if v := s.approval(ref); v.Status != "pending" || v.Approved != 1 {
			t.Fatalf("after one of two: %+v", v)
		}

		// Ann's inbox no longer lists what she approved; Bob's does.
		annPhone.open(annInbox)
		annPhone.click("#inbox-open")
		annPhone.waitText("#inbox-empty", "Nothing is waiting for you")
		bobDesk.open(bobInbox)
		bobDesk.click("#inbox-open")
		bobDesk.waitText("#inbox-list", "delete_records")

		bobDesk.open(s.Base + "/approve/" + ref)
		bobDesk.waitText("#count", "1 of 2")
		bobDesk.screenshot("approve-desktop", "")
		bobDesk.click("#approve")
		bobDesk.waitText("#status", "You approved")
		bobDesk.waitText("#state", "Approved and done")
		res := s.waitTerminal(task)
		if res.disposition() != tasks.ApprovedExecuted {
			t.Fatalf("disposition %s: %s", res.disposition(), res.text())
		}
		bobDesk.waitText("#timeline", "Executed")
		bobDesk.screenshot("timeline-desktop", "#timeline")
		for _, want := range []string{"Approved by Ann Lee (1 of 2)", "Approved by Bob Ortiz (2 of 2)", "Policy re-checked"} {
			if !strings.Contains(bobDesk.text("#timeline"), want) {
				t.Errorf("timeline lacks %q: %s", want, bobDesk.text("#timeline"))
			}
		}
	})

	t.Run("replayed decision", func(t *testing.T) {
		annPhone := annPhone.in(t)
		task := s.createTask("delete_records", map[string]any{"table": "audit_log", "filter": "true"})
		ref := s.RefOf(task)
		annPhone.open(s.Base + "/approve/" + ref)
		// Capture the decision the page posts.
		annPhone.do(chromedp.Evaluate[chromedp.Void](`window.__decisions = []; (function(f){ window.fetch = function(u, o){ if (String(u).endsWith("/decision")) window.__decisions.push(o.body); return f.apply(this, arguments); }; })(window.fetch);`))
		annPhone.click("#approve")
		annPhone.waitText("#status", "1 of 2")
		type answer struct {
			Status int `json:"status"`
			Body   struct {
				Accepted bool   `json:"accepted"`
				Reason   string `json:"reason"`
				Approved int    `json:"approved"`
			} `json:"body"`
		}
		post := func(body string) (answer, []byte) {
			out := annPhone.eval(`fetch(location.pathname.replace("/approve/", "/approver/v1/approvals/") + "/decision",
				{method: "POST", headers: {"Content-Type": "application/json"}, body: ` + body + `})
				.then(async r => ({status: r.status, body: await r.json()}))`)
			var a answer
			if err := json.Unmarshal(out, &a); err != nil {
				t.Fatalf("replay answer %s: %v", out, err)
			}
			return a, out
		}
		// The same request again (a page that retries) is the same decision:
		// the same answer, counted once.
		if again, out := post(`window.__decisions[0]`); again.Status != 200 || !again.Body.Accepted || again.Body.Approved != 1 {
			t.Fatalf("the same request again: want 200 accepted, 1 approved, got %s", out)
		}
		// The assertion replayed in another request is refused.
		replay, out := post(`JSON.stringify(Object.assign(JSON.parse(window.__decisions[0]), {comment: "again"}))`)
		if replay.Status != 422 || replay.Body.Accepted || replay.Body.Reason != "challenge_consumed" {
			t.Fatalf("replay: want 422 challenge_consumed, got %s", out)
		}
		if v := s.approval(ref); v.Status != "pending" || v.Approved != 1 {
			t.Fatalf("the replay changed the approval: %+v", v)
		}
		if s.getTask(task).Status != tasks.StatusWorking {
			t.Fatal("the replay moved the task")
		}
		annPhone.open(s.Base + "/approve/" + ref)
		annPhone.waitText("#timeline", "A confirmation was replayed; nothing changed.")
		annPhone.waitText("#count", "1 of 2")
	})
}

func TestExpiredApproval(t *testing.T) {
	browser := newBrowser(t)
	policy := devtest.ShortApprovalPolicy(t)
	s := startStack(t, policy)
	phone := newDevice(t, browser, true)
	enroll(t, s, phone, "Ann Lee", "")

	task := s.createTask("transfer_funds", map[string]any{"to": "acct-991", "amount": 50000, "currency": "USD"})
	ref := s.RefOf(task)
	phone.open(s.Base + "/approve/" + ref)
	// Whether the page opened before or after the second ran out, it ends
	// up saying so and offers no buttons.
	phone.waitText("#state", "Expired")
	res := s.waitTerminal(task)
	if res.disposition() != tasks.DeniedNotExecuted {
		t.Fatalf("disposition %s: %s", res.disposition(), res.text())
	}
	phone.open(s.Base + "/approve/" + ref)
	phone.waitText("#outcome", "Not enough approvers decided in time")
	phone.waitText("#timeline", "Expired")
	if phone.present("#approve") {
		t.Error("an expired approval still offers the buttons")
	}
	// Asking for a challenge anyway is refused, and changes nothing.
	out := phone.eval(`fetch(location.pathname.replace("/approve/", "/approver/v1/approvals/") + "/challenge",
		{method: "POST", headers: {"Content-Type": "application/json"}, body: '{"decision":"approve"}'})
		.then(async r => ({status: r.status, body: await r.json()}))`)
	if !strings.Contains(string(out), `"status":409`) || !strings.Contains(string(out), "task_not_pending") {
		t.Fatalf("challenge on an expired approval: %s", out)
	}
	if s.Transfers() != 0 {
		t.Fatal("an expired transfer ran")
	}
}
