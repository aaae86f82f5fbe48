// Package activities holds every side effect the approval workflow needs:
// writing the task read model, notifying approvers, verifying a passkey
// assertion, re-evaluating policy, running the tool once, and writing the
// terminal record. The workflow in package workflows calls them by method
// reference on a nil *[Activities]; the worker registers one instance holding
// the dependencies.
//
// # Invariants
//
//   - Each activity takes one versioned input struct and, when it has a
//     result, returns one versioned output struct (messages.go).
//   - [Activities.RecordState] and [Activities.Complete] are idempotent: a
//     retry writes the same record. Timeline events carry the workflow's time,
//     so a retried event is recognised and not appended twice.
//     RecordState never touches a terminal record.
//   - Rejections are results, not errors: an invalid passkey assertion is a
//     [VerifyDecisionOutput] with Accepted false and a SEP-2672 reason, and a
//     policy denial is a [ReevaluateOutput] with Allow false. Errors are
//     infrastructure failures and are retried by the workflow's retry policy,
//     except the non-retryable application errors whose types are the ErrType
//     constants.
//   - [Activities.ExecuteTool] recomputes the action hash of the envelope
//     before it runs anything; on a mismatch the tool does not run. Nor does
//     it when the tool served under the envelope's tool name is not the one
//     its pin (tasks.Envelope.ToolPin) names: another upstream or endpoint,
//     or another input schema. An envelope without a pin (made before pins
//     existed) runs as it always did. Both checks come before the execution
//     fence, so a refusal claims nothing. It passes
//     the task ID as the idempotency key so a backend that honours keys applies
//     the call once. The workflow gives it a single attempt.
//   - Nothing here logs raw tool arguments, tokens or assertions.
package activities
