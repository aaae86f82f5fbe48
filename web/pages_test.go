package web

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/countersign/countersign/tasks"
)

var (
	scriptTag  = regexp.MustCompile(`(?is)<script\b([^>]*)>(.*?)</script>`)
	inlineAttr = regexp.MustCompile(`(?i)\s(on[a-z]+|style)\s*=`)
	jsURL      = regexp.MustCompile(`(?i)javascript:`)
)

// checkPage asserts the headers every page carries and that the HTML has no
// inline script, inline style or event handler attribute.
func checkPage(t *testing.T, r response) string {
	t.Helper()
	want := map[string]string{
		"Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
		"X-Content-Type-Options":  "nosniff",
		"Referrer-Policy":         "no-referrer",
		"Content-Type":            "text/html; charset=utf-8",
		"Cache-Control":           "no-store",
	}
	for k, v := range want {
		if got := r.hdr.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	body := string(r.body)
	tags := scriptTag.FindAllStringSubmatch(body, -1)
	if len(tags) != strings.Count(strings.ToLower(body), "<script") {
		t.Errorf("unbalanced <script> tags in:\n%s", body)
	}
	for _, m := range tags {
		if !strings.Contains(m[1], `src="/static/app.js`) || strings.TrimSpace(m[2]) != "" {
			t.Errorf("inline or foreign script: %s", m[0])
		}
	}
	if m := inlineAttr.FindString(body); m != "" {
		t.Errorf("inline attribute %q in page", m)
	}
	if strings.Contains(strings.ToLower(body), "<style") || jsURL.MatchString(body) {
		t.Error("inline <style> or javascript: URL in page")
	}
	return body
}

func TestPages(t *testing.T) {
	e := newEnv(t)
	_, token := e.addApprover(t, "Ann", "finance")
	rec := e.newTask(t, taskSpec{quorum: 2, args: `{"amount":100,"memo":"rent\u202egpj.exe","to":"<b>acct-42</b>"}`})

	t.Run("landing", func(t *testing.T) {
		r := e.do(t, "GET", "/", nil)
		wantStatus(t, r, http.StatusOK)
		checkPage(t, r)
	})
	t.Run("enroll", func(t *testing.T) {
		r := e.do(t, "GET", "/enroll/"+token, nil)
		wantStatus(t, r, http.StatusOK)
		body := checkPage(t, r)
		if strings.Contains(body, token) {
			t.Error("enroll page embeds the invite token")
		}
		for _, s := range []string{`data-page="enroll"`, `id="enroll"`, "passkey"} {
			if !strings.Contains(body, s) {
				t.Errorf("enroll page lacks %q", s)
			}
		}
	})
	t.Run("approve", func(t *testing.T) {
		r := e.do(t, "GET", "/approve/"+rec.ApprovalRef, nil)
		wantStatus(t, r, http.StatusOK)
		body := checkPage(t, r)
		if strings.Contains(body, rec.TaskID) {
			t.Error("approval page shows the task ID")
		}
		wantIn := []string{
			`data-page="approve"`,
			"Transfer 100 EUR to acct-42",
			"transfer_funds",
			testRequester,
			"Transfers need a human",
			"0 of 2",
			fingerprint(rec.ActionHash),
			"amount", "memo", "to",
			`&#34;rent&lt;U&#43;202E&gt;gpj.exe&#34;`, // the bidi override is shown, not obeyed
			`&#34;&lt;b&gt;acct-42&lt;/b&gt;&#34;`,    // markup in arguments is text
			`id="approve"`, `id="deny"`, `id="expires"`,
		}
		for _, s := range wantIn {
			if !strings.Contains(body, s) {
				t.Errorf("approval page lacks %q", s)
			}
		}
		if strings.Contains(body, "\u202e") {
			t.Error("raw U+202E reached the page")
		}
		if len(strings.Fields(fingerprint(rec.ActionHash))) != 8 {
			t.Errorf("fingerprint %q is not 8 groups", fingerprint(rec.ActionHash))
		}
	})
	t.Run("approve, decided", func(t *testing.T) {
		done := e.newTask(t, taskSpec{})
		if _, err := e.store.Update(context.Background(), done.TaskID, func(r *tasks.Record) error {
			r.ApprovalState = tasks.ApprovalDenied
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		r := e.do(t, "GET", "/approve/"+done.ApprovalRef, nil)
		wantStatus(t, r, http.StatusOK)
		body := checkPage(t, r)
		if strings.Contains(body, `id="approve"`) || !strings.Contains(body, "Denied") {
			t.Error("a decided approval still offers the buttons, or hides its state")
		}
	})
	for _, target := range []string{"/approve/" + tasks.NewID("apr_"), "/approve/not-a-ref", "/enroll/a.b", "/nowhere", "/static/missing.js"} {
		t.Run("not found "+target, func(t *testing.T) {
			r := e.do(t, "GET", target, nil)
			wantStatus(t, r, http.StatusNotFound)
			checkPage(t, r)
		})
	}
}

func TestStaticFiles(t *testing.T) {
	e := newEnv(t)
	for file, ctype := range map[string]string{"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"} {
		r := e.do(t, "GET", "/static/"+file+"?v="+e.h.pages.version, nil)
		wantStatus(t, r, http.StatusOK)
		if got := r.hdr.Get("Content-Type"); got != ctype {
			t.Errorf("%s Content-Type = %q", file, got)
		}
		if !strings.Contains(r.hdr.Get("Cache-Control"), "immutable") || r.hdr.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s headers = %v", file, r.hdr)
		}
		etag := r.hdr.Get("ETag")
		r = e.do(t, "GET", "/static/"+file, nil, "If-None-Match", etag)
		wantStatus(t, r, http.StatusNotModified)
		if r.hdr.Get("Cache-Control") != "no-cache" {
			t.Errorf("unversioned %s Cache-Control = %q", file, r.hdr.Get("Cache-Control"))
		}
	}
}

// TestOutcomeSentences: the outcome panel's text reads as sentences, whether
// or not the event's text (an approver's comment, say) ends with a full stop.
func TestOutcomeSentences(t *testing.T) {
	for _, tc := range []struct {
		state  tasks.ApprovalState
		kind   tasks.EventKind
		detail string
		want   string
	}{
		{tasks.ApprovalDenied, tasks.EventDenied, "Denied by bob: not in prod", "Denied by bob: not in prod. The call did not run."},
		{tasks.ApprovalDenied, tasks.EventDenied, "The tool is not available.", "The tool is not available. The call did not run."},
		{tasks.ApprovalFailed, tasks.EventOutcomeUnknown, "The tool did not report back.", "The tool did not report back."},
		{tasks.ApprovalFailed, tasks.EventOutcomeUnknown, "The tool did not report back", "The tool did not report back."},
	} {
		rec := tasks.Record{Tool: "fs__write_file", Timeline: []tasks.Event{{Kind: tc.kind, Detail: tc.detail}}}
		if got := outcomeOf(rec, tc.state).Text; got != tc.want {
			t.Errorf("%s after %q: %q, want %q", tc.state, tc.detail, got, tc.want)
		}
	}
}

// TestApprovePageHeadline: a display text longer than maxHeadline (an
// upstream tool's holds all its arguments, up to 4,000 bytes) is shortened
// in the headline, saying so, and shown whole in no other large type; a
// short one is shown whole.
func TestApprovePageHeadline(t *testing.T) {
	e := newEnv(t)
	long := "fs: write_file(" + strings.Repeat("é", 3000) + ")"
	rec := e.newTask(t, taskSpec{display: long, args: `{"content":"x"}`})
	r := e.do(t, "GET", "/approve/"+rec.ApprovalRef, nil)
	wantStatus(t, r, http.StatusOK)
	body := checkPage(t, r)
	want := `<h1 id="display" class="display long">fs: write_file(` + strings.Repeat("é", maxHeadline-len("fs: write_file(")) + `…</h1>`
	if !strings.Contains(body, want) {
		t.Errorf("headline not cut to %d characters:\n%s", maxHeadline, body[:min(len(body), 2000)])
	}
	if !strings.Contains(body, "Shortened: every argument is shown in full under Arguments.") {
		t.Error("no note that the headline was shortened")
	}
	short := e.newTask(t, taskSpec{display: "Transfer 5 EUR"})
	r = e.do(t, "GET", "/approve/"+short.ApprovalRef, nil)
	wantStatus(t, r, http.StatusOK)
	body = checkPage(t, r)
	if !strings.Contains(body, `>Transfer 5 EUR</h1>`) || strings.Contains(body, "Shortened:") {
		t.Error("a short display text was changed")
	}
}

// TestFavicon: the icon browsers ask for on every page is answered 204,
// not a 404 page (a console error each time).
func TestFavicon(t *testing.T) {
	e := newEnv(t)
	r := e.do(t, "GET", "/favicon.ico", nil)
	wantStatus(t, r, http.StatusNoContent)
	if len(r.body) != 0 || r.hdr.Get("Cache-Control") == "" {
		t.Errorf("body %q, Cache-Control %q", r.body, r.hdr.Get("Cache-Control"))
	}
}
