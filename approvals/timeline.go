package approvals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/tasks"
)

// auditTimelineTimeout bounds reading one task's audit chain for its
// timeline; past it the page shows the read model's timeline.
const auditTimelineTimeout = 3 * time.Second

// withAuditTimeline returns rec with its timeline read from the task's
// audit chain, the signed records auditors check, in the read model's event
// kinds and details, so the page and the API show the same steps whichever
// source they come from. Without an audit log, or when the chain is missing
// (a task whose workflow has not written its first record yet, or started
// before audit records) or does not hold together, rec keeps the read
// model's timeline and the reason is logged.
func (s *Service) withAuditTimeline(ctx context.Context, rec tasks.Record) tasks.Record {
	if s.audit == nil {
		return rec
	}
	ctx, cancel := context.WithTimeout(ctx, auditTimelineTimeout)
	defer cancel()
	events, err := s.auditTimeline(ctx, rec)
	switch {
	case errors.Is(err, audit.ErrNotFound):
		s.log.DebugContext(ctx, "approvals: no audit records yet; timeline from the read model", "approval_ref", rec.ApprovalRef)
	case err != nil:
		s.log.WarnContext(ctx, "approvals: audit chain unusable; timeline from the read model",
			"approval_ref", rec.ApprovalRef, "task_id", rec.TaskID, "error", err)
	default:
		rec.Timeline = events
	}
	return rec
}

// errChain reports a chain that does not hold together for this task.
var errChain = errors.New("approvals: audit chain")

func chainErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errChain, fmt.Sprintf(format, args...))
}

// auditTimeline reads and checks the task's chain and maps it to timeline
// events.
func (s *Service) auditTimeline(ctx context.Context, rec tasks.Record) ([]tasks.Event, error) {
	if !audit.ValidTaskID(rec.TaskID) {
		return nil, audit.ErrInvalidTaskID
	}
	lines, err := s.audit.Chain(ctx, rec.TaskID)
	if err != nil {
		return nil, err
	}
	recs, req, err := checkChain(rec, lines)
	if err != nil {
		return nil, err
	}
	return chainEvents(recs, req)
}

// checkChain checks the chain by the audit verifier's rules, all but the
// signatures (an HTTP-only server holds no public keys; `countersign audit
// verify` checks them), accepting a chain not sealed yet; then that it
// starts with the request of this very approval (reference, tool, action
// hash).
func checkChain(rec tasks.Record, lines [][]byte) ([]audit.Record, audit.Requested, error) {
	var req audit.Requested
	v, recs, err := audit.CheckChain(rec.TaskID, lines, audit.CheckOptions{SkipSignatures: true, AllowIncomplete: true})
	if err != nil {
		return nil, req, err
	}
	if !v.OK {
		return nil, req, chainErr("breaks %s: %s", strings.Join(v.Rules(), ", "), v.Failures[0])
	}
	// The check passed, so the chain starts with a well-formed request.
	if err := json.Unmarshal(recs[0].Body, &req); err != nil {
		return nil, req, chainErr("requested body: %v", err)
	}
	if req.ApprovalRef != rec.ApprovalRef || req.Envelope.Tool != rec.Tool || req.Envelope.ActionHash != rec.ActionHash {
		return nil, req, chainErr("the chain records another call than this approval's")
	}
	return recs, req, nil
}

// chainEvents maps records to the read model's timeline events. Only what
// the read model's timeline says is taken from the records: who approved,
// why a decision was refused, the policy version of the claim and the end;
// never the assertions, keys, arguments or task ID.
func chainEvents(recs []audit.Record, req audit.Requested) ([]tasks.Event, error) {
	tool := req.Envelope.Tool
	quorum := req.Requirement.Quorum
	approvers := map[string]bool{}
	claimed := false
	out := make([]tasks.Event, 0, len(recs))
	add := func(r audit.Record, e tasks.Event) {
		e.At = r.At
		out = append(out, e)
	}
	for _, r := range recs {
		switch r.Kind {
		case audit.KindRequested:
			add(r, tasks.NewEvent(tasks.EventRequested, req.Requirement.Reason))
		case audit.KindNotified:
			add(r, tasks.NewEvent(tasks.EventNotified, ""))
		case audit.KindNotifyFail:
			add(r, tasks.NewEvent(tasks.EventNotifyFailed, ""))
		case audit.KindDecision:
			var d audit.Decision
			if err := json.Unmarshal(r.Body, &d); err != nil {
				return nil, chainErr("decision %d: %v", r.Seq, err)
			}
			switch {
			case !d.Accepted:
				add(r, tasks.RejectedDecisionEvent(d.Reason))
			case d.Decision == tasks.DecisionApprove && d.Approval != nil:
				approvers[d.Approval.ApproverID] = true
				add(r, tasks.ApprovalEvent(d.Approval.ApproverName, len(approvers), quorum))
			}
			// An accepted deny, with a passkey or unsigned through another
			// channel, ends the task: the "denied" step that follows names
			// who denied, as in the read model.
		case audit.KindReevaluated:
			// Policy's answer shows in the step that follows: "claimed"
			// when it allowed, "denied" with its reason when it did not.
		case audit.KindClaimed:
			var p audit.Policy
			if err := json.Unmarshal(r.Body, &p); err != nil {
				return nil, chainErr("claimed %d: %v", r.Seq, err)
			}
			claimed = true
			add(r, tasks.ClaimedEvent(p.PolicyVersion))
		case audit.KindCancelRefused:
			add(r, tasks.NewEvent(tasks.EventCancelRefused, ""))
		case audit.KindOutcome:
			// The summary of the steps above: nothing new to show.
		default:
			if !audit.IsTerminalKind(r.Kind) {
				continue // unreachable: the audit check refuses unknown kinds
			}
			var e audit.Ended
			if err := json.Unmarshal(r.Body, &e); err != nil {
				return nil, chainErr("%s %d: %v", r.Kind, r.Seq, err)
			}
			kind := tasks.EventKind(r.Kind) // the terminal audit kinds are the timeline's
			add(r, tasks.NewEvent(kind, endDetail(kind, e, tool, quorum, claimed)))
		}
	}
	return out, nil
}

// endDetail is the detail of a terminal step, in the read model's words.
// Only a denial's recorded detail is shown as is (who denied and their
// comment, or policy's reason); a failure's detail may hold a tool's error
// text, which approvers never see.
func endDetail(kind tasks.EventKind, e audit.Ended, tool string, quorum int, claimed bool) string {
	switch kind {
	case tasks.EventDenied:
		if e.Detail != "" {
			return e.Detail
		}
		return "Denied"
	case tasks.EventFailed:
		if !claimed {
			return "Failed"
		}
	}
	// quorum 0 is unattended: nothing was approved.
	return tasks.OutcomeText(kind, tool, quorum != 0)
}
