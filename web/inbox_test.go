package web

import (
	"encoding/json"
	"html"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/ratelimit"
	"github.com/countersign/countersign/internal/testnats"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// inboxChallengeOut decodes inbox and approval challenges alike.
type inboxChallengeOut struct {
	ChallengeID    string          `json:"challengeId"`
	Decision       string          `json:"decision"`
	DisplayText    string          `json:"displayText"`
	ExpiresAt      time.Time       `json:"expiresAt"`
	RequestOptions json.RawMessage `json:"requestOptions"`
}

func (e *env) inboxChallenge(t *testing.T, approverID string) inboxChallengeOut {
	t.Helper()
	r := e.do(t, "POST", "/approver/v1/inbox/"+approverID+"/challenge", nil, "Origin", testPublicURL)
	wantStatus(t, r, http.StatusOK)
	return decodeAs[inboxChallengeOut](t, r)
}

func TestInbox(t *testing.T) {
	e := newEnv(t)
	ann := e.enroll(t, "Ann", "finance")
	bob := e.enroll(t, "Bob", "finance", "ops")
	cat := e.enroll(t, "Cat", "ops")
	self := e.enroll(t, testRequester, "finance") // the requester is an approver too
	// An approver an admin mapped to the requester's principal: not by
	// name, by principal (the rule the workflow's self_approval applies).
	dee, deeToken, err := e.passkeys.AddApprover(t.Context(), "Dee", []string{"finance"}, passkey.WithPrincipals(testRequester))
	if err != nil {
		t.Fatal(err)
	}
	deeDev := e.enrollDevice(t, dee.ID, deeToken)
	// Named like the requester, but mapped to another principal: the
	// requester's calls are theirs to decide.
	namesake, namesakeToken, err := e.passkeys.AddApprover(t.Context(), strings.ToUpper(testRequester), []string{"finance"}, passkey.WithPrincipals("someone-else"))
	if err != nil {
		t.Fatal(err)
	}
	namesakeDev := e.enrollDevice(t, namesake.ID, namesakeToken)

	mine := e.newTask(t, taskSpec{display: "Transfer 100 EUR to acct-42"})
	ops := e.newTask(t, taskSpec{group: "ops", tool: "deploy_service", args: `{"service":"api"}`, display: "Deploy api"})
	decided := e.newTask(t, taskSpec{display: "Transfer already approved by Ann", quorum: 2})
	if _, err := e.store.Update(t.Context(), decided.TaskID, func(r *tasks.Record) error {
		r.Approvals = append(r.Approvals, tasks.ApprovalEntry{ApproverID: ann.id, ApproverName: "Ann", Decision: tasks.DecisionApprove})
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	list := func(t *testing.T, linkOwner string, d approverDevice) inboxListResponse {
		t.Helper()
		ch := e.inboxChallenge(t, linkOwner)
		body := `{"challengeId":"` + ch.ChallengeID + `","response":` + e.assert(t, d, ch.RequestOptions) + `}`
		r := e.do(t, "POST", "/approver/v1/inbox/"+linkOwner+"/list", body, "Origin", testPublicURL)
		wantStatus(t, r, http.StatusOK)
		return decodeAs[inboxListResponse](t, r)
	}
	refs := func(out inboxListResponse) string {
		var s []string
		for _, a := range out.Approvals {
			s = append(s, a.DisplayText)
		}
		return strings.Join(s, "|")
	}

	for _, tc := range []struct {
		name string
		link string
		dev  approverDevice
		who  string
		want string
	}{
		{"only my groups, not what I decided", ann.id, ann, "Ann", mine.DisplayText},
		{"every group I am in", bob.id, bob, "Bob", mine.DisplayText + "|" + ops.DisplayText + "|" + decided.DisplayText},
		{"other group only", cat.id, cat, "Cat", ops.DisplayText},
		{"never my own requests", self.id, self, testRequester, ""},
		{"never my principal's requests", dee.ID, deeDev, "Dee", ""},
		{"a namesake mapped elsewhere decides them", namesake.ID, namesakeDev, strings.ToUpper(testRequester), mine.DisplayText + "|" + decided.DisplayText},
		{"the signer's list, whoever's link", ann.id, bob, "Bob", mine.DisplayText + "|" + ops.DisplayText + "|" + decided.DisplayText},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := list(t, tc.link, tc.dev)
			if out.Approver != tc.who {
				t.Errorf("approver = %q, want %q", out.Approver, tc.who)
			}
			if got := refs(out); got != tc.want {
				t.Errorf("listed %q, want %q", got, tc.want)
			}
			for _, a := range out.Approvals {
				if a.URL != "/approve/"+a.Ref || !tasks.ValidID(a.Ref) {
					t.Errorf("item %+v has a bad link", a)
				}
			}
		})
	}

	t.Run("page", func(t *testing.T) {
		r := e.do(t, "GET", "/inbox/"+ann.id, nil)
		wantStatus(t, r, http.StatusOK)
		body := checkPage(t, r)
		for _, s := range []string{`data-page="inbox"`, "Approvals for Ann", `id="inbox-open"`} {
			if !strings.Contains(body, s) {
				t.Errorf("inbox page lacks %q", s)
			}
		}
		if strings.Contains(body, mine.DisplayText) {
			t.Error("the inbox page lists approvals without a passkey")
		}
	})

	t.Run("bad input", func(t *testing.T) {
		disabled, _, err := e.passkeys.AddApprover(t.Context(), "Gone", []string{"finance"})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := e.passkeys.SetApproverStatus(t.Context(), disabled.ID, passkey.ActionDisable); err != nil {
			t.Fatal(err)
		}
		ch := e.inboxChallenge(t, ann.id)
		assertion := e.assert(t, ann, ch.RequestOptions)
		// An approval challenge's assertion is not an inbox assertion.
		r := e.do(t, "POST", "/approver/v1/approvals/"+mine.ApprovalRef+"/challenge", `{"decision":"approve"}`, "Origin", testPublicURL)
		wantStatus(t, r, http.StatusOK)
		approval := decodeAs[inboxChallengeOut](t, r)
		wrongTask := `{"challengeId":"` + approval.ChallengeID + `","response":` + e.assert(t, ann, approval.RequestOptions) + `}`

		for _, tc := range []struct {
			name, method, path, body string
			hdr                      []string
			status                   int
			code                     string
		}{
			{"unknown approver page", "GET", "/inbox/0123456789abcdef0123456789abcdef", "", nil, 404, ""},
			{"disabled approver page", "GET", "/inbox/" + disabled.ID, "", nil, 403, ""},
			{"malformed approver page", "GET", "/inbox/not-an-id", "", nil, 404, ""},
			{"unknown approver", "POST", "/approver/v1/inbox/0123456789abcdef0123456789abcdef/challenge", "", nil, 404, "not_found"},
			{"empty list body", "POST", "/approver/v1/inbox/" + ann.id + "/list", "", nil, 400, "invalid_request"},
			{"no challenge", "POST", "/approver/v1/inbox/" + ann.id + "/list", `{"response":{}}`, nil, 400, "invalid_request"},
			{"malformed challenge", "POST", "/approver/v1/inbox/" + ann.id + "/list", `{"challengeId":"a/b","response":{}}`, nil, 400, "invalid_request"},
			{"unknown field", "POST", "/approver/v1/inbox/" + ann.id + "/list", `{"challengeId":"x","response":{},"as":"admin"}`, nil, 400, "invalid_request"},
			{"cross origin", "POST", "/approver/v1/inbox/" + ann.id + "/list", `{"challengeId":"` + ch.ChallengeID + `","response":` + assertion + `}`, []string{"Origin", "https://evil.example"}, 403, "cross_origin_request"},
			{"approval challenge", "POST", "/approver/v1/inbox/" + ann.id + "/list", wrongTask, nil, 422, "challenge_wrong_task"},
			{"garbage assertion", "POST", "/approver/v1/inbox/" + ann.id + "/list", `{"challengeId":"` + ch.ChallengeID + `","response":{"id":"x"}}`, nil, 422, "missing_evidence"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				var body any
				if tc.body != "" {
					body = tc.body
				}
				hdr := tc.hdr
				if hdr == nil {
					hdr = []string{"Origin", testPublicURL}
				}
				r := e.do(t, tc.method, tc.path, body, hdr...)
				wantStatus(t, r, tc.status)
				if tc.code != "" {
					if got := decodeAs[errorBody](t, r).Error; got != tc.code {
						t.Errorf("error = %q, want %q", got, tc.code)
					}
				}
			})
		}
		// The refused attempts left the inbox challenge usable once, then never again.
		body := `{"challengeId":"` + ch.ChallengeID + `","response":` + assertion + `}`
		r = e.do(t, "POST", "/approver/v1/inbox/"+ann.id+"/list", body, "Origin", testPublicURL)
		wantStatus(t, r, http.StatusOK)
		r = e.do(t, "POST", "/approver/v1/inbox/"+ann.id+"/list", body, "Origin", testPublicURL)
		wantStatus(t, r, http.StatusUnprocessableEntity)
		if got := decodeAs[errorBody](t, r).Error; got != "challenge_consumed" {
			t.Errorf("replayed inbox assertion: %q, want challenge_consumed", got)
		}
	})
}

// The in-band group decides no task, so it cannot carry an inbox: an
// approver in it alone (the one in-band enrollment creates for an agent)
// has no inbox, and one an admin also put in it lists by their other
// group. Both used to be a 500: the inbox asked for a challenge in the
// approver's first group, and the passkey service refuses one for it.
func TestInboxSkipsTheInBandGroup(t *testing.T) {
	e := newEnv(t)
	if _, err := e.passkeys.BeginPrincipalEnrollment(t.Context(), "agent-9"); err != nil {
		t.Fatal(err)
	}
	as, err := e.passkeys.Approvers(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var inBand string
	for _, a := range as {
		if a.MappedTo("agent-9") {
			inBand = a.ID
		}
	}
	if inBand == "" {
		t.Fatal("in-band enrollment made no approver")
	}
	wantStatus(t, e.do(t, "GET", "/inbox/"+inBand, nil), http.StatusNotFound)
	wantError(t, e.do(t, "POST", "/approver/v1/inbox/"+inBand+"/challenge", nil, "Origin", testPublicURL), http.StatusNotFound, "not_found")

	// "in-band" sorts before "ops": the approver's first group.
	eve := e.enroll(t, "Eve", "ops", passkey.InBandGroup)
	task := e.newTask(t, taskSpec{group: "ops", tool: "deploy_service", args: `{"service":"api"}`, display: "Deploy api"})
	ch := e.inboxChallenge(t, eve.id)
	body := `{"challengeId":"` + ch.ChallengeID + `","response":` + e.assert(t, eve, ch.RequestOptions) + `}`
	r := e.do(t, "POST", "/approver/v1/inbox/"+eve.id+"/list", body, "Origin", testPublicURL)
	wantStatus(t, r, http.StatusOK)
	if out := decodeAs[inboxListResponse](t, r); len(out.Approvals) != 1 || out.Approvals[0].Ref != task.ApprovalRef {
		t.Errorf("Eve's inbox = %+v, want the ops task %s", out.Approvals, task.ApprovalRef)
	}
}

// An agent's display text may carry a right-to-left override or zero-width
// characters. The approval page makes them visible; the inbox's list shows
// them the same way, so the list cannot read differently from the page.
func TestInboxRevealsHiddenCharacters(t *testing.T) {
	e := newEnv(t)
	ann := e.enroll(t, "Ann", "finance")
	const display = "Transfer 5 EUR to acct\u200b-42 \u202e0009 RUE refsnarT\u202c\u2066!\u2069"
	rec := e.newTask(t, taskSpec{display: display})

	ch := e.inboxChallenge(t, ann.id)
	body := `{"challengeId":"` + ch.ChallengeID + `","response":` + e.assert(t, ann, ch.RequestOptions) + `}`
	r := e.do(t, "POST", "/approver/v1/inbox/"+ann.id+"/list", body, "Origin", testPublicURL)
	wantStatus(t, r, http.StatusOK)
	out := decodeAs[inboxListResponse](t, r)
	if len(out.Approvals) != 1 {
		t.Fatalf("listed %d approvals, want 1", len(out.Approvals))
	}
	got := out.Approvals[0].DisplayText
	const want = "Transfer 5 EUR to acct<U+200B>-42 <U+202E>0009 RUE refsnarT<U+202C><U+2066>!<U+2069>"
	if got != want {
		t.Errorf("inbox display text = %q, want %q", got, want)
	}

	// The approval page's heading says the same.
	r = e.do(t, "GET", "/approve/"+rec.ApprovalRef, nil)
	wantStatus(t, r, http.StatusOK)
	m := regexp.MustCompile(`<h1 id="display"[^>]*>([^<]*)</h1>`).FindStringSubmatch(checkPage(t, r))
	if m == nil {
		t.Fatal("the approval page has no display heading")
	}
	if page := html.UnescapeString(m[1]); page != got {
		t.Errorf("approval page shows %q, the inbox %q", page, got)
	}
}

// Two handlers whose limits share one NATS, as two replicas' do: an
// inbox's burst of challenges is spent across both, not once per handler.
func TestInboxChallengesAreRateLimitedAcrossReplicas(t *testing.T) {
	e := newEnv(t)
	ann := e.enroll(t, "Ann", "finance")
	js2, _ := testnats.Connect(t, e.nc.ConnectedUrl())
	rates2, err := ratelimit.Open(t.Context(), js2, ratelimit.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h2, err := New(Options{PublicURL: testPublicURL, Passkeys: e.passkeys, Tokens: e.tokens, Approvals: e.svc, Rates: rates2})
	if err != nil {
		t.Fatal(err)
	}
	handlers := []*Handler{e.h, h2}
	now := time.Now() // one instant: nothing refills however slow the test runs
	for _, h := range handlers {
		h.now = func() time.Time { return now }
	}
	for i := range inboxChallengeBurst {
		e.h = handlers[i%2]
		e.inboxChallenge(t, ann.id)
	}
	for _, h := range handlers {
		e.h = h
		wantError(t, e.do(t, "POST", "/approver/v1/inbox/"+ann.id+"/challenge", nil, "Origin", testPublicURL),
			http.StatusTooManyRequests, "rate_limited")
	}
}
