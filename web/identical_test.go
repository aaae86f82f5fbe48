package web

import (
	"context"
	"html"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/approverapi"
	"github.com/countersign/countersign/tasks"
)

// An agent makes a gated call, never gets the answer, and makes it again:
// the approver of the second is shown the first, on the page and in the
// API, as it stands when they look. Once the first has run, with the
// warning. A call with other arguments, or another principal's, is not
// shown.
func TestIdenticalCallsShownToApprover(t *testing.T) {
	e := newFlowEnv(t)
	ann := e.enroll(t, "Ann", "approvers")
	spec := taskSpec{args: `{"amount":5000,"currency":"EUR","to":"acct-42"}`, display: "Transfer 5000 EUR to acct-42", group: "approvers"}
	first := e.startTask(t, spec)
	again := e.newTask(t, spec)
	otherArgs := spec
	otherArgs.args = `{"amount":5001,"currency":"EUR","to":"acct-42"}`
	otherOwner := spec
	otherOwner.owner = "agent-2"
	strangers := []tasks.Record{e.newTask(t, otherArgs), e.newTask(t, otherOwner)}

	view := func(t *testing.T) (approverapi.IdenticalCalls, string) {
		t.Helper()
		api := decodeAs[approverapi.Approval](t, e.do(t, "GET", "/approver/v1/approvals/"+again.ApprovalRef, nil))
		page := e.do(t, "GET", "/approve/"+again.ApprovalRef, nil)
		wantStatus(t, page, http.StatusOK)
		return api.IdenticalCalls, checkPage(t, page)
	}

	// While the first waits: listed, no warning.
	ic, page := view(t)
	if !ic.Checked || ic.Warning != "" || len(ic.Calls) != 1 || ic.Calls[0].Ref != first.ApprovalRef ||
		ic.Calls[0].ApprovalState != tasks.ApprovalPending || ic.Calls[0].MayHaveRun {
		t.Fatalf("while the first waits: %+v", ic)
	}
	if !strings.Contains(page, `href="/approve/`+first.ApprovalRef+`"`) || strings.Contains(page, "may already have run") {
		t.Errorf("page while the first waits lacks it, or warns:\n%s", page)
	}

	// The first is approved and runs.
	r, got := e.decide(t, first.ApprovalRef, e.sign(t, ann, first.ApprovalRef, "approve"))
	wantStatus(t, r, http.StatusOK)
	if !got.Accepted {
		t.Fatalf("approval: %+v", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	final, err := e.store.WaitTerminal(ctx, first.TaskID, testRequester)
	if err != nil || final.Disposition != tasks.ApprovedExecuted {
		t.Fatalf("first: %q, %v", final.Disposition, err)
	}

	// Looked up again: the first ran.
	ic, page = view(t)
	warning := tasks.IdenticalCalls{Calls: []tasks.IdenticalCall{{MayHaveRun: true}}}.Warning()
	if !ic.Checked || ic.Warning != warning || len(ic.Calls) != 1 {
		t.Fatalf("after the first ran: %+v", ic)
	}
	c := ic.Calls[0]
	if c.Ref != first.ApprovalRef || c.Disposition != tasks.ApprovedExecuted || !c.MayHaveRun || !c.EndedAt.Equal(final.LastUpdatedAt) {
		t.Errorf("the first, after it ran: %+v", c)
	}
	for _, want := range []string{html.EscapeString(warning), "This call may already have run", `href="/approve/` + first.ApprovalRef + `"`, "Ended: approved-executed"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q:\n%s", want, page)
		}
	}
	for _, s := range strangers {
		if strings.Contains(page, s.ApprovalRef) {
			t.Errorf("page lists %s's call %s", s.Owner, s.ApprovalRef)
		}
	}
	if strings.Contains(page, first.TaskID) {
		t.Error("page shows the first call's task ID")
	}
	// The first's own page lists the second, which has not run.
	firstView := decodeAs[approverapi.Approval](t, e.do(t, "GET", "/approver/v1/approvals/"+first.ApprovalRef, nil))
	if ic := firstView.IdenticalCalls; ic.Warning != "" || len(ic.Calls) != 1 || ic.Calls[0].Ref != again.ApprovalRef {
		t.Errorf("the first's identical calls: %+v", ic)
	}
}
