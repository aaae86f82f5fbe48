// Package tasks is Countersign's task model: the immutable envelope of a held
// tool call, the task statuses and terminal dispositions, the read model that
// answers tasks/get, and the mapping of both to the MCP wire in its two eras.
//
// # State machine
//
// A task is created in status working and moves only along these edges:
//
//	working ──► completed  (disposition approved-executed, denied-not-executed,
//	                        execution-error or outcome-unknown)
//	working ──► cancelled  (tasks/cancel before the execution claim)
//	working ──► failed     (a protocol-level failure before the execution claim)
//
// A terminal status (completed, cancelled, failed) never changes again;
// [Store.Update] refuses any write that would leave one.
//
// # Who writes what
//
// The MCP endpoint creates the record (before it returns CreateTaskResult, so
// a tasks/get for the returned ID always resolves). From then on only the
// approval workflow, through its activities, writes it. The workflow's history
// is the source of truth; the record is a read model, kept in NATS JetStream
// key-value so that a poll is a key read rather than a Temporal query.
//
// # Ownership
//
// Every record names the principal that created it. [Store.GetOwned] answers a
// task owned by someone else exactly as it answers an unknown one.
package tasks
