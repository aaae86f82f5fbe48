package approverapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

func TestRejectedStatus(t *testing.T) {
	for reason, want := range map[string]int{
		"task_not_pending":         http.StatusConflict,
		"too_many_decisions":       http.StatusConflict,
		"malformed_decision":       http.StatusBadRequest,
		"verification_unavailable": http.StatusServiceUnavailable,
	} {
		if got := RejectedStatus(reason); got != want {
			t.Errorf("RejectedStatus(%q) = %d, want %d", reason, got, want)
		}
	}
}

// Every error the approvals service answers an approver with, wrapped as
// it wraps them, has its status and code; anything else is a fixed 500.
func TestErrorReply(t *testing.T) {
	wrap := func(sentinel error) error { return fmt.Errorf("%w: %w", sentinel, errors.New("cause")) }
	for _, tc := range []struct {
		name       string
		err        error
		status     int
		code       string
		retryAfter string
	}{
		{"not found", approvals.ErrNotFound, 404, "not_found", ""},
		{"invalid decision", approvals.ErrInvalidDecision, 400, "invalid_request", ""},
		{"not pending", approvals.ErrNotPending, 409, "task_not_pending", ""},
		{"too many challenges", approvals.ErrTooManyChallenges, 429, "rate_limited", ""},
		{"verification unavailable", wrap(approvals.ErrVerificationUnavailable), 503, "verification_unavailable", ""},
		{"in progress", wrap(approvals.ErrInProgress), 503, "decision_in_progress", "2"},
		{"limit unavailable", fmt.Errorf("%w: approval r: %w", approvals.ErrLimitUnavailable, errors.New("nats: timeout")), 503, "limit_unavailable", "2"},
		{"edge error", BadRequest("comment contains control characters"), 400, "invalid_request", ""},
		{"wrapped edge error", fmt.Errorf("x: %w", NotFound("no such approver")), 404, "not_found", ""},
		{"no eligible credential", &passkey.Error{Reason: passkey.ReasonNoEligibleCredential, Message: "m"}, 409, passkey.ReasonNoEligibleCredential, ""},
		{"no pending enrollment", &passkey.Error{Reason: passkey.ReasonNoPendingEnrollment, Message: "m"}, 410, passkey.ReasonNoPendingEnrollment, ""},
		{"enrollment verification", &passkey.Error{Reason: passkey.ReasonVerificationFailed, Message: "m"}, 400, passkey.ReasonVerificationFailed, ""},
		{"other passkey rejection", &passkey.Error{Reason: passkey.ReasonChallengeConsumed, Message: "m"}, 422, passkey.ReasonChallengeConsumed, ""},
		{"challenge capacity", fmt.Errorf("approvals: issue challenge: %w", fmt.Errorf("%w: full", passkey.ErrChallengeCapacity)), 503, "at_capacity", ""},
		{"internal", errors.New("nats: connection closed"), 500, "internal", ""},
		{"other service error", approvals.ErrExpired, 500, "internal", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ErrorReply(tc.err)
			b, ok := r.Body.(ErrorBody)
			if r.Status != tc.status || !ok || b.Error != tc.code || b.Message == "" || r.RetryAfter != tc.retryAfter {
				t.Errorf("ErrorReply = %+v, want %d %s (Retry-After %q)", r, tc.status, tc.code, tc.retryAfter)
			}
			if tc.status == 500 && (b.Message != MsgInternal || strings.Contains(fmt.Sprint(r), "nats")) {
				t.Errorf("a 500 tells more than %q: %+v", MsgInternal, r)
			}
		})
	}
}

func TestDecisionReply(t *testing.T) {
	standing := approvals.Verdict{Status: tasks.ApprovalPending, Approved: 1, Needed: 2}
	with := func(f func(*approvals.Verdict)) approvals.Verdict { v := standing; f(&v); return v }
	for _, tc := range []struct {
		name   string
		v      approvals.Verdict
		status int
	}{
		{"accepted", with(func(v *approvals.Verdict) { v.Accepted = true }), 200},
		{"evidence rejected", with(func(v *approvals.Verdict) { v.Reason = passkey.ReasonChallengeConsumed }), 422},
		{"refused: not pending", with(func(v *approvals.Verdict) { v.Reason, v.Refused = tasks.ErrTypeTaskNotPending, true }), 409},
		{"refused: malformed", with(func(v *approvals.Verdict) { v.Reason, v.Refused = tasks.ErrTypeMalformedDecision, true }), 400},
		{"refused: unverifiable", with(func(v *approvals.Verdict) { v.Reason, v.Refused = tasks.ErrTypeVerificationUnavailable, true }), 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := DecisionReply(tc.v, nil)
			want := Decision{Accepted: tc.v.Accepted, Reason: tc.v.Reason, Status: tc.v.Status, Approved: tc.v.Approved, Needed: tc.v.Needed}
			if r.Status != tc.status || r.Body != want {
				t.Errorf("DecisionReply = %+v, want %d %+v", r, tc.status, want)
			}
		})
	}
	if r := DecisionReply(standing, approvals.ErrNotFound); r.Status != 404 {
		t.Errorf("an error is ErrorReply's: %+v", r)
	}
}

func TestDecisionRequest(t *testing.T) {
	ok := DecisionRequest{ChallengeID: "abc", Decision: "deny", Comment: "line one\n\tline two", Response: json.RawMessage(` {"id":"x"}`)}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid request: %v", err)
	}
	if diff := cmp.Diff(tasks.DecisionUpdate{ChallengeID: "abc", Decision: "deny", Comment: ok.Comment,
		Method: passkey.MethodWebAuthn, Response: ok.Response}, ok.Update()); diff != "" {
		t.Errorf("update (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		name string
		edit func(*DecisionRequest)
		msg  string
	}{
		{"no challenge", func(r *DecisionRequest) { r.ChallengeID = "" }, "challengeId is required"},
		{"malformed challenge", func(r *DecisionRequest) { r.ChallengeID = "a/b" }, "challengeId is malformed"},
		{"long challenge", func(r *DecisionRequest) { r.ChallengeID = strings.Repeat("a", MaxChallengeIDLen+1) }, "challengeId is malformed"},
		{"bad decision", func(r *DecisionRequest) { r.Decision = "maybe" }, "decision must be"},
		{"long comment", func(r *DecisionRequest) { r.Comment = strings.Repeat("a", MaxCommentRunes+1) }, "comment must be at most"},
		{"comment over the byte bound", func(r *DecisionRequest) { r.Comment = strings.Repeat("€", MaxCommentBytes/3+1) }, "comment must be at most"},
		{"invalid UTF-8", func(r *DecisionRequest) { r.Comment = "\xff" }, "comment must be at most"},
		{"control characters", func(r *DecisionRequest) { r.Comment = "a\u0007b" }, "control characters"},
		{"response not an object", func(r *DecisionRequest) { r.Response = json.RawMessage(`"sig"`) }, "PublicKeyCredential"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			tc.edit(&r)
			err := r.Validate()
			var e *Error
			if !errors.As(err, &e) || e.Status != 400 || e.Code != CodeInvalidRequest || !strings.Contains(e.Message, tc.msg) {
				t.Errorf("Validate = %v, want a 400 mentioning %q", err, tc.msg)
			}
		})
	}
}

func TestDecode(t *testing.T) {
	for _, tc := range []struct{ body, msg string }{
		{`{"decision": x}`, "malformed JSON at byte"},
		{`{"decision": "approve"`, "unexpected end"},
		{`{"decision":"approve","taskId":"x"}`, `unknown field "taskId"`},
		{`{"decision":12}`, `"decision"`},
		{`[1,2]`, "JSON object"},
		{`{"decision":"approve"} {}`, "single JSON object"},
	} {
		var req ChallengeRequest
		err := Decode([]byte(tc.body), &req)
		var e *Error
		if !errors.As(err, &e) || e.Status != 400 || !strings.Contains(e.Message, tc.msg) {
			t.Errorf("Decode(%s) = %v, want a 400 mentioning %q", tc.body, err, tc.msg)
		}
	}
	var req ChallengeRequest
	if err := Decode([]byte(` {"decision":"approve"} `), &req); err != nil || req.Decision != "approve" {
		t.Errorf("Decode = %+v, %v", req, err)
	}
}

// The view never carries the task ID, not even in a timeline's words.
func TestNewApproval(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := tasks.Record{TaskID: "tsk_1", ApprovalRef: "apr_1", Tool: "t", Owner: "agent-1",
		Requirement:   tasks.Requirement{Quorum: 2, Reason: "why"},
		ApprovalState: tasks.ApprovalPending,
		Approvals: []tasks.ApprovalEntry{
			{ApproverID: "a1", ApproverName: "Ann", CredentialID: "c1", Decision: tasks.DecisionApprove, At: at},
		},
		Timeline: []tasks.Event{{At: at, Kind: "approval", Detail: "Ann approved tsk_1"}},
	}
	v := NewApproval(approvals.Approval{Record: rec})
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "tsk_1") || strings.Contains(string(b), "c1") {
		t.Errorf("the view shows the task or credential ID: %s", b)
	}
	if string(v.Arguments) != "{}" || v.Approved != 1 || v.Needed != 2 || v.Timeline[0].Detail != "Ann approved [task]" {
		t.Errorf("view = %+v", v)
	}
}

// An approval shows its requester's identical calls by reference, with a
// warning when one ran or may have run, and says when it could not look.
func TestNewIdenticalCalls(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ran := tasks.IdenticalCall{Ref: "apr_2", Status: tasks.StatusCompleted, Disposition: tasks.ApprovedExecuted,
		ApprovalState: tasks.ApprovalExecuted, CreatedAt: at, EndedAt: at.Add(time.Minute), MayHaveRun: true}
	waiting := tasks.IdenticalCall{Ref: "apr_3", Status: tasks.StatusWorking, ApprovalState: tasks.ApprovalPending, CreatedAt: at}
	tests := []struct {
		name string
		in   tasks.IdenticalCalls
		want string
	}{
		{"none", tasks.IdenticalCalls{}, `{"checked":true,"calls":[]}`},
		{"pending only", tasks.IdenticalCalls{Calls: []tasks.IdenticalCall{waiting}},
			`{"checked":true,"calls":[{"ref":"apr_3","status":"working","approvalState":"pending","mayHaveRun":false,"createdAt":"2026-01-02T03:04:05Z"}]}`},
		{"one ran", tasks.IdenticalCalls{Calls: []tasks.IdenticalCall{ran, waiting}},
			`{"checked":true,"warning":"` + tasks.IdenticalCalls{Calls: []tasks.IdenticalCall{ran}}.Warning() + `","calls":[` +
				`{"ref":"apr_2","status":"completed","disposition":"approved-executed","approvalState":"executed","mayHaveRun":true,"createdAt":"2026-01-02T03:04:05Z","endedAt":"2026-01-02T03:05:05Z"},` +
				`{"ref":"apr_3","status":"working","approvalState":"pending","mayHaveRun":false,"createdAt":"2026-01-02T03:04:05Z"}]}`},
		{"unknown", tasks.IdenticalCalls{Unknown: true},
			`{"checked":false,"warning":"` + tasks.IdenticalCalls{Unknown: true}.Warning() + `","calls":[]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(NewIdenticalCalls(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tt.want {
				t.Errorf("got  %s\nwant %s", b, tt.want)
			}
		})
	}
	if w := (tasks.IdenticalCalls{Calls: []tasks.IdenticalCall{ran}}).Warning(); !strings.Contains(w, "ran or may have run") {
		t.Errorf("warning %q", w)
	}
	if w := (tasks.IdenticalCalls{Calls: []tasks.IdenticalCall{waiting}}).Warning(); w != "" {
		t.Errorf("warning for a call that did not run: %q", w)
	}
}
