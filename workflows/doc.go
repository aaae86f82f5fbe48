// Package workflows holds Countersign's deterministic Temporal workflow code:
// the approval state machine of one held tool call. Its imports are the
// determinism boundary: tasks (types), activities (method references and
// message types), the Temporal workflow and temporal packages, and nothing
// that does I/O.
//
// The worker registers [Approval], or [Options.Approval] for other
// settings, under [tasks.WorkflowName]:
//
//	w.RegisterWorkflowWithOptions(workflows.Options{…}.Approval, workflow.RegisterOptions{Name: tasks.WorkflowName})
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
//	    the execution claim. After the claim it answers Cancelled false and
//	    is recorded once as cancel-refused. The claim is taken in the same
//	    workflow step as the last check for a cancel, a deny or the expiry,
//	    so whichever of them the committed history holds first wins, and
//	    every view (ledger, tasks/get, tasks/result, audit) shows that one.
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
//	    unknown tool, a tool changed since the call was made: its detail says
//	    what changed), which are denied-not-executed, and a refused execution
//	    fence (the task's record had ended, or was claimed before:
//	    tasks.Store.ClaimExecution), which ends the task failed, not run. The
//	    tool is never called a second time.
//	  - A dead worker: the attempt heartbeats while the tool runs (every
//	    fifth of its heartbeat timeout, sent at least every third), so a
//	    slow tool on a live worker runs to its end, up to [ExecuteTimeout].
//	    When the worker running it dies (killed, its host lost, cut off from
//	    Temporal), no heartbeat comes, and after the heartbeat timeout
//	    ([DefaultExecuteHeartbeatTimeout], 30 s; [Options]) the attempt
//	    fails and the task ends outcome-unknown, as a restarted worker sees
//	    it, instead of waiting out ExecuteTimeout (5 min). The attempt is not
//	    retried: the dead worker may have sent the call, so the honest end
//	    is outcome-unknown even when the death came before the tool was
//	    called. A worker cut off longer than the heartbeat timeout but still
//	    alive learns on its next heartbeat that the attempt is over, and the
//	    tool call's context is cancelled; its late result is refused by
//	    Temporal and the task keeps its outcome-unknown. An attempt that no
//	    worker started yet (scheduled, waiting in the task queue when the
//	    worker died) is not affected: the next worker starts it and the call
//	    runs once.
//	  - The end: the outbox's terminal entry (Publish → Complete) writes the
//	    terminal read model and seals the audit chain, then the workflow
//	    waits for every update handler to finish and returns
//	    [tasks.ApprovalOutcome].
//
// # Committed history is the only source of truth
//
// A workflow task is the unit Temporal commits. Under concurrent updates a
// workflow task can be discarded and retried from the last committed
// history (a conflicting completion, a worker crash, an update the server
// aborted), and the retry may handle the updates in another order and take
// another path: a cancel first in one attempt, an approval first in the
// next. Whatever ran inside the discarded attempt must therefore state
// nothing. Before this rule, read-model and audit writes ran as local
// activities inside the workflow task; a discarded attempt could write
// "cancelled" to tasks/get and seal the audit chain as cancelled while the
// committed attempt claimed the call and ran the tool.
//
// The rule: no side effect that states a decision or an outcome happens
// before the workflow task that made it has committed. The mechanism is an
// outbox (outbox.go):
//
//   - Every fact the workflow decides (a state for the read model, a step of
//     the audit chain, the terminal write that seals the chain) is appended
//     to an in-memory outbox, in the order the workflow decided it, with a
//     sequence number. Appending never yields, so the outbox follows the
//     state machine exactly.
//   - One coroutine writes the outbox in order, a batch at a time, through
//     the Publish activity: a regular activity, which Temporal dispatches
//     only once the workflow task that scheduled it has committed. A
//     discarded attempt's batch is never scheduled; the committed attempt's
//     batch holds the committed facts. Publish is idempotent per entry (the
//     read model ignores a sequence it has seen, audit steps are keyed by
//     step ID, the terminal write happens once), and retried until it lands.
//   - An update's answer waits until the entries it produced are written:
//     an approver's page, tasks/get and the audit chain agree with it.
//     A cancel or a deny answers once the end is written.
//   - Local activities remain only for steps that state nothing: passkey
//     verification (its one write, consuming the challenge, is keyed by the
//     update ID, and a retry with that ID gets the same answer) and policy
//     re-evaluation (a read).
//   - Notifications (Slack, NATS) read the read model when they run and wait
//     until the outbox has written the state they announce. One exception,
//     since the change "first-task-before-outbox": the request notice runs
//     inside the first workflow task, as a local activity, before the
//     outbox's first batch. It states no decision (the committed start is
//     the request; the notice reads the record written before the start),
//     a discarded first task may repeat it (the notifiers are idempotent per
//     task), and its outcome (notified, notify-failed) goes through the
//     outbox like every other fact. An approver who follows its link within
//     milliseconds may find the request not yet in the timeline.
//   - A second exception, since version 2 of that change
//     (versionFirstBatchLocal): an approval's first outbox batch, when it
//     holds only the request and the notice's outcome (requestOnly), is
//     written by a Publish local activity inside the first workflow task,
//     so a gated call's start commits in one workflow task with no
//     activity. Those facts are true from the committed start on, and
//     Publish is idempotent per entry, so a discarded first task that wrote
//     them changes nothing. Any other batch, and a first batch the local
//     activity cannot write in three quick attempts, goes through the
//     Publish activity.
//   - A third, since version 3 of that change (versionEndLocal): the
//     terminal batch of a task whose end follows from its ExecuteTool
//     attempt alone (endOnly, and nothing ended the task before the
//     attempt returned) is written by a Publish local activity inside the
//     workflow task that reads the attempt's outcome, and the workflow
//     completes in that task. The outcome is an event committed before that
//     task; after the claim no update can change the end, so a discarded
//     task, retried, decides the same end, and the terminal write happens
//     once. A verified call runs in two workflow tasks and two activities
//     (the first batch beside ExecuteTool), not three of each.
//
// The decision update's ID is a digest of the approver's request
// (tasks.DecisionUpdateID), and the challenge is consumed under it. A
// request sent again after the process died is the same update: if it had
// committed, Temporal answers with its result; if not, verification under the
// same consumer key succeeds again. A decision is counted once or cleanly
// rejected; it is never consumed and lost.
//
// Invalid evidence is turned away at the edge (web) before it reaches the
// workflow (passkey.VerifyRequest.CheckOnly), so it spends no budget that
// valid decisions share; the edge asks the workflow to record the rejection
// (tasks.UpdateRecordRejection), which it does for at most
// [MaxRecordedRejections] per task and refuses without history after that.
//
// # Safe upgrades
//
// A task can wait for its approvers for as long as its policy allows (24 h by
// default), and a worker of the next release then carries it on by
// replaying its history through the new code. Temporal checks, command by
// command, that the replay asks for what the history recorded: the same
// activities (by type name and ID), local activity markers, timers,
// update acceptances and completions, version markers and the workflow's
// completion, in the same order. A mismatch is a nondeterminism error: the
// workflow task fails and retries forever, and the task is stuck. A change
// that slips past the check is worse: the task takes another path than the
// one its timeline and audit chain recorded. The rules:
//
//   - Never reorder commands, even ones that look independent (an outbox
//     batch and a notification, a timer and a local activity): their order
//     is part of the history. Adding or removing one, or a branch that
//     issues another one for a history already recorded, is a change too.
//   - Guard every such change with workflow.GetVersion at the point where
//     old and new code part ways (the pattern below). A history recorded
//     before the change has no marker and takes the old branch; a new run
//     records the marker and takes the new one. The change ID names the
//     change (kebab-case) and is never reused. The Go SDK's GetVersion is
//     its patching API (it has no patched()/deprecatePatch()). A later
//     change to the same spot raises maxSupported to 2, keeping both older
//     branches.
//   - Names are part of the history and never change: the workflow type
//     ([tasks.WorkflowName]), the activity names (the method names of
//     activities.Activities: renaming a method renames the activity), the
//     update names (tasks.Update*), the task queue. Add a new name beside
//     the old one and keep the old handler until no history uses it.
//   - Payloads (inputs, update arguments, activity inputs and outputs) are
//     JSON in the history: add fields only, with a zero value that means
//     the old behaviour (see tasks.ApprovalInput.Normalized); never change a
//     field's type or meaning.
//   - Safe without a version: an activity's body (its result is in the
//     history, not re-run), an activity's timeouts and retry policy (the
//     history keeps those it was scheduled with), logging, and update
//     validators (the SDK does not run them on replay; they only judge new
//     updates).
//
// The pattern:
//
//	if workflow.GetVersion(ctx, "publish-in-batches", workflow.DefaultVersion, 1) == workflow.DefaultVersion {
//		// the old code, unchanged
//	} else {
//		// the new code
//	}
//
// The proof is the replay test, TestReleasedHistoriesReplay in
// replay_test.go, part of the normal test command: it replays, on today's
// code, the histories each release recorded in testdata/replay/<release>/
// (executed, denied, expired, cancelled, quorum 2, outcome-unknown, and one
// left pending with one of two approvals), and TestOldHistoriesReplay those
// of testdata/compat. A change that fails it needs GetVersion; never
// re-record the histories to make it pass.
//
// Recording: the histories come from real runs of `countersign dev` on the
// embedded Temporal server (internal/e2e TestRecordHistories, which runs in
// the test command too and checks that today's code replays its own
// histories). A release records its own:
//
//	COUNTERSIGN_RECORD_HISTORIES=<release> go test -count=1 -run '^TestRecordHistories$' ./internal/e2e
//
// and commits testdata/replay/<release>/ beside the older releases'.
//
// Retiring a version: once no workflow that a release started can still
// run (every task started before the next release has ended: the longest
// approval TTL, plus [NotifyDrainTimeout] and [ExecuteTimeout]; check with
// `temporal workflow count --query 'WorkflowType="Approval" AND
// ExecutionStatus="Running" AND StartTime < "<release time>"'`), delete
// its testdata/replay/<release>/ and, for each change ID it predates, set
// minSupported to the version after DefaultVersion and delete the old
// branch: a history without the marker then fails loudly instead of taking
// the new path. Keep the GetVersion call itself while a history with its
// marker may still run.
package workflows
