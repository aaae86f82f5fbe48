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
// # Pending cap
//
// A principal may have at most a fixed number of non-terminal tasks. The cap
// is exact under concurrency and costs a few key operations per call, however
// many tasks are pending. Two kinds of key in the bucket hold it (store.go):
// p.<owner>.<taskID>, one per reservation, and n.<owner>, the owner's count.
//
//   - [Store.ReservePending] runs before the record is created: it writes the
//     task's p key as "held", then raises n by compare-and-set, refusing
//     with [ErrPendingCapReached] when n would pass the cap.
//   - [Store.ReleasePending] gives the reservation back: the caller whose
//     compare-and-set turns the key from "held" to "releasing" lowers n, then
//     deletes the key. Any other call, concurrent or repeated, changes
//     nothing. It runs when the record becomes terminal (once: only the
//     writer whose [Store.Update] made it terminal retires it, so every
//     terminal write must go through Update), in [Store.Delete], and in the
//     MCP endpoint when the record could not be created.
//
// So, apart from the steps in flight, n equals the number of "held" keys, and
// it never exceeds the cap. Because a key is written before its increment and
// deleted only after its decrement, n never counts a reservation that has no
// key. A crash can only leave n too high: a reservation whose record was never
// created, a task that became terminal but was not released, a release cut
// short. [Reconcile] (at startup, then every few minutes) drops such keys once
// they are older than its grace period and recounts n from the keys that
// remain, by compare-and-set, so that work in flight is never undone. (The
// one assumption: no step of a reservation or release stalls for longer than
// the grace period, a minute in the server.) Reconcile reads each pending
// task's record once for both of its jobs (failing orphans, dropping dead
// keys), many reads in flight at a time: at 10,000 pending tasks a round
// costs ~0.55 s of CPU, a quarter of what reading every record twice, one
// at a time, cost (BenchmarkReconcile).
//
// # Retention
//
// A task is readable until CreatedAt+TTL; after that tasks/get answers it
// expired and [Store.List] leaves it out. [RetentionGrace] later, and that
// long after its last write, [Store.Sweep] deletes the record of a
// finished task with all its keys (t, o, r, d, h, and a p key a crash left),
// by compare-and-delete on the revisions it read, so a record written
// since stays. A task that has not ended is never deleted. retention.go
// says why nothing writes to or relies on a record that old.
//
// # Timeline vocabulary
//
// events.go names what can happen to a task: the timeline's [EventKind]s,
// the workflow's update error types and its own rejection reason (the
// passkey package names the rest). The workflows and the web edge share
// these constants; their strings are wire and never change.
// An [Event] carries structured fields (approver and count, rejection
// reason, policy version) beside Detail, and [Event.Text] is the one place
// that turns an event into words. Records written before the structured
// fields have only Detail, which Text then returns as is.
//
// # Identical calls
//
// [Store.IdenticalCalls] (identical.go) lists, for an approval, the other
// tasks of its owner for the same call (same tool, same action hash) that
// have not ended or ended within [IdenticalWindow], at most
// [MaxIdenticalCalls], each named by its approval reference, never its
// task ID. It scans the index of that call (an h key per task, under a
// prefix of owner and action hash, written by [Store.Index]) and reads at
// most 200 of its records, newest first, so its cost follows how often the
// call was made, not how many tasks the owner has. It is information for
// approvers only: no decision reads it.
//
// # Ownership
//
// Every record names the principal that created it. [Store.GetOwned] answers a
// task owned by someone else exactly as it answers an unknown one.
package tasks
