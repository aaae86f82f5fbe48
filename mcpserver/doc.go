// Package mcpserver is Countersign's MCP endpoint: Streamable HTTP on one
// path, both protocol eras, bearer-token authentication, tools/call as the
// policy enforcement point, and the tasks/* methods of SEP-2663 (2026-07-28)
// and of the experimental 2025-11-25 tasks (SEP-1686).
//
// It is built on the official Go SDK (github.com/modelcontextprotocol/go-sdk
// v1.8.0), which has no tasks support. The SDK keeps the transport, JSON-RPC
// framing, server/discover, initialize, tools/list, per-request protocol
// detection and Mcp-Method/Mcp-Name checks for tools/call; this package adds
// the rest through the SDK's hooks, as described below.
//
// # The tools/call pipeline
//
// For every tools/call, in this order, and with nothing run or stored before
// the decision:
//
//  1. Unknown tool: JSON-RPC -32602.
//  2. Arguments that fail the tool's input schema: -32602 with the
//     gateway's message (it names the field); nothing runs.
//  3. The action hash canon.Hash(tool, arguments, ServerID), over the
//     arguments exactly as received: no defaults, no coercion. The policy
//     input, the envelope and the approver's challenge all bind these bytes.
//  4. pdp.Evaluate. An evaluation error is a deny (cause logged, generic
//     reason sent).
//  5. allow: the tool runs once now (fresh idempotency key) and its result
//     is returned as is. A gateway error means the outcome is unknown: the
//     caller gets an outcome-unknown result, never an invitation to retry.
//     deny: an isError result built by tasks.Outcome(denied-not-executed)
//     with the policy's reason.
//     requestable: see below.
//
// A requestable call always becomes a task. A client that can hold one (a
// 2026-07-28 request that declares io.modelcontextprotocol/tasks in its
// _meta client capabilities, or a 2025-11-25 tools/call carrying params.task
// on a tool whose execution.taskSupport is "optional") gets the task itself;
// any other client gets it behind an [approval-pending] tool result (see
// "Clients without tasks" below). The call goes to the approval service
// (Options.Approvals, package approvals: the one place that changes a task),
// which:
//
//   - Dedup: tasks.Store.ClaimDedup on (principal, action hash). An identical
//     call while the first is pending returns the same task, in the caller's
//     era, without spending rate or pending budget.
//   - Limits: the per-principal pending cap (Store.ReservePending: exact,
//     O(1), released when the task ends) and the
//     creation rate (a token bucket per principal, per process). Over either,
//     it refuses (*approvals.Refused) and the answer is a plain denial
//     result, not a task (SEP-2848).
//   - The record (status working, approval reference, display text, expiry =
//     now + approval TTL, TTL = approval TTL + the service's result
//     retention) is written before the workflow starts, so a tasks/get for
//     the returned ID always resolves (SEP-2663). If the start fails the
//     record is deleted and the caller gets -32603. From then on only the
//     workflow writes the record.
//
// This package computes what the service records from the bytes it
// received (the action hash, the arguments, the display text) and renders
// the task it gets back in the caller's era.
//
// A 2025-11-25 client that sent params.task gets a task even when the call
// is decided at once (allowed or denied): the TypeScript SDK 1.x fails with
// "Task creation did not return a task" on anything else, and the
// 2025-11-25 spec says a receiver that accepts a task-augmented request
// returns a CreateTaskResult. Such a task is stored already completed, with
// the result, and no workflow (approvals.Service.Completed); tasks/result
// returns that result. These creations also spend the per-principal rate
// (approvals.Service.Charge, before the call runs), which bounds the
// storage a caller can cause. (Their CreateTaskResult shows status completed at once;
// SEP-2663 allows a non-working seed status, the 2025-11-25 text says tasks
// begin working, and no client we know checks.)
//
// # Clients without tasks
//
// Most clients in use do not speak MCP tasks. For them a requestable call
// opens the same task (same workflow, envelope, dedup, rate limit and
// pending cap) and answers with a CallToolResult that cannot pass for
// success: isError true, the first text block starting "[approval-pending]"
// and saying that the tool has NOT run, that a human was asked, and how to
// get the result; structuredContent {taskId, status, tool, approveUrl,
// expiresAt}; _meta io.modelcontextprotocol/related-task and no disposition
// key (nothing is final). isError is true so that no client narrates
// success, and because SDK clients check structuredContent against the
// tool's outputSchema only when isError is false: a pending answer must
// never fail a client's schema check.
//
// Three tools of Countersign's own, listed to every client in both eras and
// answered here before any policy (followup.go), take it from there:
// countersign_await {taskId, waitSeconds?} waits on the read model (a KV
// watch: approvals.Service.Await, no polling) up to waitSeconds (0-55,
// default 25) and returns the task's final result, exactly the
// CallToolResult tasks/get carries (a cancelled or failed task, which
// stored none, gets an isError result saying the call did not run), or
// another [approval-pending] result; countersign_cancel {taskId} has
// tasks/cancel's rules; countersign_pending {} lists the caller's open
// tasks. Another principal's task answers exactly as an unknown one
// ([unknown-task]); bad arguments are -32602 naming the argument. A tool of
// the registry may not take one of these names (New refuses it; a later
// one is left out of tools/list and logged).
//
// Options.InlineWait (--inline-wait) holds such a call up to that long for
// the decision: decided in time, the call returns the final result itself.
// While it waits, a request with a progress token gets
// notifications/progress every 5 seconds. A client that hangs up ends only
// the wait; the task goes on, and countersign_await finds it. The wait
// holds one of the principal's in-flight request slots.
//
// # Asynchronous tools, required tasks and input requests
//
// Only the conformance fixtures of `countersign dev --conformance`
// (Options.Fixtures, package gateway/conformance) have these properties; a
// gateway.Tool has none of them, and without Fixtures every tool is
// synchronous:
//
//   - TaskRequired: a client that cannot hold a task gets -32021 with
//     data.requiredCapabilities (2026-07-28) or -32601 (2025-11-25, whose
//     tools/list shows execution.taskSupport "required"), before policy runs.
//   - Async with Delay: when policy ALLOWS the call and Delay(arguments) > 0,
//     a client that can hold a task gets one: the same record and approval
//     workflow, started in tasks.ModeUnattended with a requirement without
//     approvers (no group, quorum 0; pdp rejects quorum 0 from policy, so
//     only this path creates one). The workflow waits until StartAt = now +
//     delay (tasks/cancel meanwhile ends it cancelled), re-evaluates policy
//     and runs the tool once; the task's result is the tool's own, without a
//     disposition. No dedup: two identical jobs are two jobs; the rate and
//     pending limits apply. Other clients wait the delay in the request
//     (conformance.Fixture.Wait) and get the result inline.
//   - InputRequests (2026-07-28, SEP-2322 MRTR): for an allowed call whose
//     request lacks answers, the answer is an InputRequiredResult
//     (resultType "input_required", no requestState); the call that carries
//     every answer proceeds, and the answers reach the tool
//     (gateway.Call.Inputs; Envelope.InputResponses for a task). Never for a
//     requestable call: the answers are not in the action hash.
//   - TaskInputRequests (2026-07-28, SEP-2663 + SEP-2322): the unattended
//     task of an allowed call starts input_required with these requests
//     (tasks/get shows inputRequests); tasks/update answers them (partial
//     answers leave the rest pending); once all are answered the workflow
//     waits the delay and runs the tool with the answers.
//
// A tool that fails with gateway.ProtocolError did not act: inline, the
// caller gets that JSON-RPC error; in a task, the task ends failed.
//
// # In-band verified approval (SEP-2672)
//
// With Options.Passkeys set, the endpoint implements SEP-2672 in both eras:
// capabilities.extensions.verifiedApproval = {} in initialize and
// server/discover; the methods approval/enroll/begin, approval/enroll/finish
// and approval/challenge/create (without a passkey service they answer
// -32601); evidence in tools/call params._meta under
// io.modelcontextprotocol/verified-approval. Policy chooses the mode per call:
// a "verify" decision (pdp.EffectVerify, with an authenticator class) puts
// the call under in-band approval. tools/list annotates a tool with
// _meta["io.modelcontextprotocol/verified-approval"] = {required:
// "verified", authenticatorClass} when its decision for the caller and empty
// arguments is "verify" (2025-11-25 lists it taskSupport "forbidden": the
// call answers at once); approval/challenge/create evaluates the exact
// arguments and answers tool_not_approved_required unless the decision is
// "verify".
//
// The caller is its bearer principal: its passkeys are those of the
// approvers mapped to it (package passkey, "In-band verified approval"), so
// a passkey enrolled in-band is an approver credential admins see, and one
// enrolled on the approver site works in-band once its approver is mapped to
// the principal. Challenges are bound to (tool, action hash of the arguments
// as received, ServerID), listed only for the principal's passkeys that the
// class allows (no_eligible_credential when none), and usable only by the
// same principal; they expire after passkey.Options.InBandChallengeTTL
// (default 60 s, --verified-challenge-ttl).
//
// A tools/call whose decision is "verify" is checked in SEP-2672 §4.8
// order: evidence present and shaped {method, challengeId, response}
// (missing_evidence), method "webauthn" (unsupported_method), then
// passkey.Service.Verify: challenge_unknown, challenge_consumed,
// challenge_expired, challenge_wrong_tool, unknown_credential,
// authenticator_class_mismatch, signature_verification_failed,
// signature_counter_regression, argument_hash_mismatch; and only then the
// compare-and-set consume. Every rejection is JSON-RPC -32001 with the
// reason's fixed message and data.reason, and changes nothing: nothing is
// stored, run or consumed. A verified call then runs through the approval
// workflow in tasks.ModeVerified (see callVerified for why a workflow and
// why it is crash-safe) and the caller gets the result of an approved call:
// the [approved-executed] line, then the tool's own content and
// structuredContent, the disposition and the audit receipt in _meta, and the
// task in io.modelcontextprotocol/related-task; the audit chain holds the
// approval with its assertion.
//
// # Why a policy denial is a tool result, not a JSON-RPC error
//
// A denial is the outcome of a well-formed call, not a protocol failure: the
// request was understood, authorized to be asked, and answered. MCP reserves
// JSON-RPC errors for malformed requests and unknown tools and says tool
// failures belong in the result with isError, so the model can see them and
// adjust. SEP-2848 requires the body of a denial to say that the call did
// NOT run, with the disposition in _meta, so that a client reading only
// content learns it; a JSON-RPC error has no such body and clients commonly
// surface it as a transport problem and retry. So: denials,
// [approval-pending] and limit denials are CallToolResults with isError;
// only malformed input, unknown tools, schema failures, unknown tasks and
// internal faults are JSON-RPC errors.
//
// # Errors
//
// Every error a handler returns goes through one function, Server.wireError:
// protocol and validation failures keep their code and a fixed, safe message;
// anything else is logged with its cause and answered -32603 "Internal
// error". Panics are recovered in the receiving middleware (-32603) and in
// the HTTP wrapper (HTTP 500 with a JSON-RPC -32603 body); no stack trace or
// cause reaches the client. A task owned by someone else is answered exactly
// as an unknown one: -32602 "Failed to retrieve task: Task not found".
//
// # Request budget
//
// After authentication, every request of a principal, whatever its method
// and whether or not it is well formed, is charged to that principal's
// budget (internal/ratelimit.Budget): a token bucket (RequestsPerSecond,
// RequestBurst; default 50 a second, burst 100) and a cap on its concurrent
// requests (MaxInFlightPerPrincipal, default 16). 2025-11-25 tasks/result
// waits for its task by design, so it spends a token but holds no slot.
// Over budget the answer is HTTP 429 with Retry-After (whole seconds) and
// the JSON-RPC error CodeTooManyRequests (-32029) "Too many requests: …"
// with the request's id; nothing runs, and no other principal is slowed.
// The refusal is answered after a pause of one to one and a half seconds
// (or when the client hangs up): an agent that ignores Retry-After and retries in a tight loop
// would otherwise make refusals the flood. A bearer token that recently
// authenticated as a principal now over budget is refused before the token
// store is asked again; that cache only ever refuses, admission always
// authenticates.
// The same code answers HTTP 503 when the server-wide guard sheds a slow
// request body (internal/httplimit, through WriteHTTPError); a body that
// does not arrive within the read deadline is HTTP 408 with -32600. -32029
// is one code for "refused for load, retry later", distinct from every
// code that says something about the request itself; it is in JSON-RPC's
// implementation-defined range and unused by the SDKs and the
// specification. Buckets of idle principals are forgotten, so memory stays
// bounded. The budget is per process, like the task creation rate.
//
// # Bridging the SDK
//
// HTTP wrapper. Server.Handler wraps the SDK's StreamableHTTPHandler. It
// authenticates the bearer token (401 with WWW-Authenticate: Bearer
// realm="countersign", plus error="invalid_token" for a rejected token),
// reads the body once under MaxBodyBytes (413 and a JSON-RPC -32600 when
// larger; nothing runs), answers framing errors itself (-32700 for invalid
// JSON, -32600 for batches and non-request values; the SDK would answer
// those in plain text), checks the Mcp-Name rule for tasks/get, tasks/update
// and tasks/cancel in 2026-07-28 (the header must equal params.taskId, else
// HTTP 400 and -32020; the SDK checks Mcp-Name only for tools/call,
// prompts/get and resources/read), and passes what it learned in the
// request context: the principal, the HTTP request's context, and whether a
// tools/call carried params.task, which mcp.CallToolParamsRaw drops. The SDK
// derives handler contexts from the HTTP request's context ("to allow
// middleware to add context values", as its transport says); every test here
// relies on it, and the middleware fails closed (-32603) if the values are
// missing.
//
// Why not auth.RequireBearerToken: it sends WWW-Authenticate only when a
// resource-metadata URL or scopes are configured, turns a verifier error
// that is not auth.ErrInvalidToken into a 500 carrying the error text, and
// rejects tokens without an expiry. Countersign's Authenticate is a plain
// token-to-principal function, so the wrapper does the RFC 6750 challenge
// itself.
//
// Stateless transport. The SDK serves 2026-07-28 only in stateless mode, so
// the handler is stateless for both eras: a 2025-11-25 client's initialize
// is answered without a session ID, later requests carry
// Mcp-Protocol-Version, and no session state ties a client to a replica.
// Responses are application/json (nothing is streamed).
//
// Receiving middleware. It resolves the era per request (the _meta protocol
// version in 2026-07-28, the session's before) and whether the request
// declares the tasks extension (its _meta client capabilities), and:
//
//   - answers tools/call itself. A CreateTaskResult is not a
//     CallToolResult, so the result is this package's own type; the SDK
//     stamps resultType "complete" only on its own result types, so a
//     2026-07-28 CreateTaskResult keeps resultType "task", and our other
//     2026-07-28 results set "complete" themselves;
//   - rewrites the initialize result to add capabilities.tasks
//     ({list, cancel, requests.tools.call}), which mcp.ServerCapabilities
//     cannot express;
//   - rewrites a 2025-11-25 tools/list result to add execution.taskSupport
//     to each tool, "optional" for tools policy may gate and "forbidden" for
//     read-only tools (gateway.Tool.ReadOnly), which mcp.Tool lacks.
//
// Custom methods. tasks/get, tasks/update, tasks/cancel, tasks/result and
// tasks/list are registered with mcp.AddReceivingCustomMethod and the
// mcp.Result interface as their result type, so one handler answers in
// either era's shape. Era rules: tasks/result and tasks/list are -32601 in
// 2026-07-28 (HTTP 404), tasks/update is -32601 in 2025-11-25; every
// 2026-07-28 tasks/* from a request that does not declare the tasks
// extension is -32021 with data.requiredCapabilities naming it. A "task"
// member inside tasks/get or tasks/result params (the TypeScript SDK sends
// one) is ignored. The SDK hands these handlers a typed nil for missing
// params, on which its own per-request accessors would dereference nil, so
// the middleware checks for params before calling them.
//
// # Task methods
//
// 2026-07-28 (SEP-2663): tasks/get returns the detailed task, result inline
// once completed; tasks/update delivers inputResponses to an input_required
// task's workflow and acknowledges once they are recorded (unknown request
// IDs and tasks that do not wait are acknowledged and ignored; only
// unattended tasks ever ask); tasks/cancel acknowledges and asks the workflow to
// cancel (eventually consistent; tasks/get shows the outcome).
//
// 2025-11-25: tasks/get returns the task; tasks/result blocks until the task
// is terminal (or the client hangs up) and returns the stored CallToolResult
// with _meta "io.modelcontextprotocol/related-task", the stored JSON-RPC
// error for a failed task, and for a cancelled task an isError result saying
// the call did not run; tasks/list pages through the caller's tasks only;
// tasks/cancel returns the task as cancelled once the workflow has accepted
// the cancel (waiting briefly for the read model), and -32602 for a terminal
// task or one whose execution has started.
package mcpserver
