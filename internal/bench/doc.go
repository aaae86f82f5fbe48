// Package bench measures a running Countersign server from the outside, as
// its clients use it (`countersign bench`): latency percentiles (p50, p95,
// p99) and throughput of each scenario at each concurrency, optionally next
// to a baseline of the same Temporal, so that every figure reads as a ratio.
//
// # Scenarios
//
//   - gated-call: a requestable tools/call (transfer_funds over 1,000) from a
//     client that holds MCP tasks, to its CreateTaskResult.
//   - tasks-get-pending, tasks-get-completed: tasks/get of a pending task and
//     of a completed (approved and executed) one.
//   - approval: an approver's whole ceremony (challenge, assertion, decision)
//     until tasks/get shows the task approved-executed; also the decision
//     POST alone and accepted → executed.
//   - await: a client without MCP tasks: countersign_await waiting on a
//     pending task that an approver then approves (from the decision POST
//     to the await's answer), and countersign_await of a completed task
//     (the tool's round trip).
//   - gateway: an allowed call of an upstream MCP server's tool, directly
//     (go-sdk client) and through Countersign, alternately.
//   - sep2672: the SEP-2672 in-band ceremony: approval/challenge/create, then
//     the place_trade tools/call carrying the passkey's assertion.
//   - flood (not in the default set): agent A floods requestable calls while
//     agent B makes paced ones; B's latency alone and under the flood, and
//     how A was answered.
//
// The baseline (Options.Temporal) is a raw Temporal StartWorkflow of a
// trivial workflow that waits, on its own task queue, with eager start and
// a worker in this process: what a gated call's durable start costs at the
// least, since the gated call also answers once its workflow has started.
// Its phase at each concurrency runs right before the gated calls' at the
// same concurrency, so that a shared machine's drift weighs on both alike.
// What a phase leaves behind (pending tasks, waiting workflows) is
// cancelled and terminated at the end of the run, not between phases,
// where that work would land in the next phase's numbers.
//
// # What a run needs and leaves on the server
//
// Any deployment: the server's base URL, and an agent token (or none: with
// the admin token the run adds an agent of its own). Every scenario but
// gated-call, tasks-get-pending, gateway and sep2672 needs the admin token
// (Options.AdminToken): the run adds one approver per worker in the
// policy's approver group (Options.ApproverGroup), named bench-RUN-N, and
// enrolls for each a software passkey (internal/testpasskey,
// virtualwebauthn) through the approver API at the enroll link's origin,
// as the enrollment page does; flood adds two agents. The sep2672 scenario
// enrolls one passkey per worker in-band for the agent, from
// Options.VerifiedOrigin, which must be among the server's verified
// origins. The scenarios call the demo tools (transfer_funds over 1,000,
// requestable for the approver group; place_trade, verified) with the
// default policy; a missing tool is named before anything is measured.
//
// Private keys exist only in the bench process. At the end the run
// cancels every task it left pending and revokes (audited, permanent) the
// approvers and agents it added; what it could not is listed in
// Report.CleanupErrors. Approved transfers stay in the demo ledger, and
// each task leaves its audit chain.
package bench
