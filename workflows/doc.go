// Package workflows holds Countersign's deterministic Temporal workflow code:
// the approval state machine of one held tool call. Its imports are the
// determinism boundary: tasks (types), activities (method references and
// message types), the Temporal workflow and temporal packages, and nothing
// that does I/O.
//
// The worker registers [Approval] under [tasks.WorkflowName]:
//
//	w.RegisterWorkflowWithOptions(workflows.Approval, workflow.RegisterOptions{Name: tasks.WorkflowName})
//	w.RegisterActivity(&activities.Activities{…})
//
// # State machine
//
// One workflow per task; workflow ID = task ID. Every state change below is a
// step of the single-threaded workflow, so the execution claim, a cancel and
// the expiry cannot interleave.
//
//		pending ──(distinct approvals ≥ quorum)──► approved ──(policy allows)──► claimed ──► ended
//		   │                                          │ (policy denies or cannot be evaluated) ──► ended
//		   ├──(verified deny)──► ended                │
//		   ├──(ExpiresAt passes)──► ended             │
//		   └──(cancel)──► ended  ◄──(cancel)──────────┘
//
//	  - Decisions arrive as the [tasks.UpdateDecide] update. Its validator
//	    rejects, without writing history, a malformed decision
//	    ([ErrTypeMalformedDecision]) and one for a task that is no longer
//	    pending ([ErrTypeTaskNotPending]). Accepted updates are processed one at
//	    a time under a workflow mutex: the passkey assertion is verified by an
//	    activity whose consumer key is the update ID, so a retried activity does
//	    not consume a second challenge; pending-ness is checked again after
//	    verification. Invalid evidence changes nothing but the timeline; the
//	    same approver approving twice is refused with [ReasonAlreadyApproved];
//	    a verified deny ends the task as denied-not-executed.
//	  - Cancel ([tasks.UpdateCancel]) succeeds in pending and approved, before
//	    the execution claim. After the claim it answers Cancelled false.
//	  - Expiry: if quorum is not reached by ExpiresAt (workflow time), the task
//	    ends denied-not-executed. Once quorum is reached, expiry no longer
//	    applies.
//	  - Re-evaluation: the current policy sees the same envelope with the
//	    approvals. Anything but allow, including an evaluation that keeps
//	    failing, ends the task denied-not-executed.
//	  - The claim, then one ExecuteTool activity with a single attempt and the
//	    task ID as idempotency key. A result with IsError is execution-error;
//	    any activity failure (timeout, crash, panic) is outcome-unknown, except
//	    the activity's own refusals before running anything (envelope mismatch,
//	    unknown tool), which are denied-not-executed. The tool is never called
//	    a second time.
//	  - The end: the Complete activity writes the terminal read model, then the
//	    workflow waits for every update handler to finish and returns
//	    [tasks.ApprovalOutcome].
//
// Read-model writes (RecordState, Complete) are serialized by the same mutex,
// so the record's timeline follows the workflow's order and nothing written
// late overwrites the end.
//
// Replay: when a workflow version is released, its histories go to
// workflows/testdata/ with one replay test each (worker.NewWorkflowReplayer).
// Until then there is no released history to replay.
package workflows
