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
//     Arguments holding a number whose value JCS would change (one not
//     exactly representable as an IEEE-754 double, canon.ErrInexactNumber)
//     are -32602 as in step 2, naming the number; nothing runs. The same
//     check answers countersign/transactionToken and approval/challenge/create.
//  4. pdp.Evaluate. An evaluation error is a deny (cause logged, generic
//     reason sent).
//  5. allow: the tool runs once now (fresh idempotency key) and its result
//     is returned as is. A gateway error means the outcome is unknown: the
//     caller gets an outcome-unknown result, never an invitation to retry.
//     deny: an isError result built by tasks.Outcome(denied-not-executed)
//     with the policy's reason.
//     requestable: see below.
//     token: the call runs once now only with a valid single-use
//     transaction token (see "Transaction tokens" below).
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
//     creation rate (per principal, counted in NATS for every replica:
//     internal/ratelimit.Shared). Over either,
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
// received (the action hash, the arguments, the display text) and the tool
// as it served it to this call (its pin, gateway.Tool.Pin, which the
// execution checks: a tool changed meanwhile does not run), and renders the
// task it gets back in the caller's era. A call it runs itself (allowed, or
// with a transaction token) carries the pin of the tool policy decided on
// in the same way: a tool replaced between the decision and the run is not
// sent, and the answer is denied-not-executed saying what changed.
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
// begin working, and no client we know checks.) A 2025-11-25 tools/call
// with params.task on a tool that tools/list shows with taskSupport
// "forbidden" whatever the caller (Countersign's own tools, read-only
// tools) is -32601 before anything runs, as the 2025-11-25 tools text says
// a server should answer; in 2026-07-28 params.task is ignored (SEP-2663).
//
// # Clients without tasks
//
// Most clients in use do not speak MCP tasks. For them a requestable call
// opens the same task (same workflow, envelope, dedup, rate limit and
// pending cap) and answers with a CallToolResult that cannot pass for
// success: isError true, the first text block starting "[approval-pending]"
// and saying that the tool has NOT run, that a human was asked, and how to
// get the result; structuredContent {taskId, status, tool, approveUrl,
// expiresAt}, except for a tool with an outputSchema; _meta
// io.modelcontextprotocol/related-task and no disposition key (nothing is
// final). isError is true so that no client narrates success. A pending
// answer must never fail a client's schema check, and the Go SDK checks
// structuredContent against the tool's outputSchema only when isError is
// false, but the TypeScript SDK's Client.callTool (1.32, and so the MCP
// Inspector) checks it whenever it is present: the answer to a gated tool
// with an outputSchema has none, and its task ID is in the text and in
// related-task.
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
// tasks, and those that ended in the last 24 hours (so that an agent that
// never got a task's ID learns how its call ended; one that makes the call
// again anyway gets a new task once the first has ended, and its approvers
// are shown the first: tasks.Store.IdenticalCalls). Another principal's
// task answers exactly as an unknown one
// ([unknown-task]); bad arguments are -32602 naming the argument. A tool of
// the registry may not take one of these names (New refuses it; a later
// one is left out of tools/list and logged).
//
// Options.InlineWait (--inline-wait) holds such a call up to that long for
// the decision: decided in time, the call returns the final result itself.
// While it waits, a request with a progress token gets
// notifications/progress every 5 seconds. A client that hangs up ends only
// the wait; the task goes on, and countersign_pending finds it, also once
// it has ended. The wait
// holds one of the principal's in-flight request slots. Server.EndWaits
// (at shutdown) ends it, and every countersign_await and 2025-11-25
// tasks/result wait, at once: the call answers with how the task stands.
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
//   - InputRounds (2026-07-28, SEP-2322): input requests in rounds, each
//     asked once the previous is answered. Each InputRequiredResult carries
//     a requestState: the answers so far, bound to the principal, the tool
//     and the action hash, with a ten-minute expiry, HMAC-SHA256-signed
//     with a per-process key (inputstate.go). An echoed requestState that
//     fails any check is -32602 and nothing runs; it is honoured only by
//     the process that issued it, which is enough for fixtures.
//   - TaskInputRequests (2026-07-28, SEP-2663 + SEP-2322): the unattended
//     task of an allowed call starts input_required with these requests
//     (tasks/get shows inputRequests); tasks/update answers them (partial
//     answers leave the rest pending); once all are answered the workflow
//     waits the delay and runs the tool with the answers.
//
// A tool that fails with gateway.ProtocolError did not act: inline, the
// caller gets that JSON-RPC error; in a task, the task ends failed.
//
// # Transaction tokens
//
// With Options.Tokens set (package txtoken), policy may answer a
// tools/call with the effect "token": the call runs only if it carries, in
// params._meta["io.countersign/transaction-token"], a single-use token
// bound to this principal, this tool and the action hash of these exact
// arguments (the Zero-Trust MCP Handshake RFC's two phases).
//
// The server then advertises the capability extension
// "io.countersign/transaction-tokens" {method, metaKey}.
//
// Phase 1, the custom method countersign/transactionToken {name,
// arguments} (both eras; served only with Options.Tokens): the tool must
// exist and the arguments validate (else -32602, as tools/call), and
// policy is asked with action.name "transaction-token/issue" and the same
// subject, resource and context as the call. Only "allow" issues; anything
// else is the JSON-RPC error CodeTokenRefused (-31030) whose data is the
// RFC's error_handling object (error_type "permission_denied", reason
// "policy"). The result is {token, jti, kid, sub, tool, parameters_hash,
// issued_at, expires_at, metaKey}. Issuance is audited before the token is
// returned.
//
// Who may obtain a token is policy's, per principal, tool and arguments.
// A token proves the call it authorizes was authorized as that exact call
// before it was made; it does not prove a human meant it. An agent allowed
// to obtain its own tokens is a caller that can be talked into asking for
// one, so a policy that means "a human decides" must not allow
// transaction-token/issue for the agent: the operator then issues on the
// principal's behalf (POST /admin/v1/transaction-tokens) and hands the
// token to the agent's client, out of the model's reach. The method is a
// custom JSON-RPC method, not a tool, so it is not in tools/list and a
// model cannot call it through its tool interface; only the client's own
// code can.
//
// Phase 2, tools/call with the token: decided as any call (unknown tool,
// schema, action hash over the arguments as received, policy). Only when
// policy says "token" is the token read: verified and its jti consumed
// (txtoken.Service.Redeem: form, algorithm, key, signature, claims, key
// retirement, audience, issued-at, lifetime, expiry with a small skew, subject, tool,
// parameters hash, then the atomic consume). Then the call runs once on the
// same path as an allowed call (execute), and the run's disposition and
// result digest are audited. Once the token is consumed, the run and its
// records no longer follow the request's cancellation: a caller that sends
// notifications/cancelled, or whose connection fails, does not cut the
// authorized call half-way (an approved task's activity does not stop
// either); the run is bounded by the tool's own limit. A tool whose server
// cannot be reached is denied-not-executed, saying that the token is spent
// and a retry needs a new one. An allowed call ignores a token it carries
// (nothing is consumed); a denied one is denied whatever it carries.
//
// A missing or rejected token is an isError CallToolResult built by
// tasks.Outcome(denied-not-executed), its text naming the error type and
// reason, with _meta "io.countersign/transaction-token-error" holding the
// RFC's error_handling object (status_code, error_type, message,
// retry_allowed) plus the specific reason and, for a token that verified,
// its jti. It is a result and not a JSON-RPC error for the reason a denial
// is (below): the request was understood and answered "did not run". A
// missing token is error_type "permission_denied", reason "missing_token",
// retry_allowed true; it is not audited, since no token was issued or
// used. The token store or the audit log failing is -32603: nothing ran
// (the token may be spent), and the failure is audited as a
// "token-rejected" of type internal_error (package txtoken, "Audit").
//
// Exactly once: the jti consume is a create-only write to NATS KV, so of
// any number of calls with one token, on any replicas, one runs. No
// workflow claim is needed: no other path runs a token-mode call, and the
// consume happens before the run. A process that dies after the consume
// and before the call ends leaves the token spent; the call ran at most
// once (see package txtoken, "Crash semantics").
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
// call answers at once; 2026-07-28 gives the list, which now depends on
// the caller, cacheScope "private"); approval/challenge/create evaluates the exact
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
// (default 60 s, --verified-challenge-ttl). While the challenges bucket
// holds half its cap or more (passkey.AgentChallengeAdmitBytes; the rest
// up to seven eighths is the approver site's alone;
// passkey.ErrChallengeCapacity, --challenge-max-bytes),
// approval/challenge/create answers
// CodeTooManyRequests (-31029) "Server at capacity for approval
// challenges: …" and creates nothing. Each principal's challenges are
// bounded too, across replicas (Options.Rates, ChallengesPerMinute and
// ChallengeBurst; the server sets --rate-per-minute and --rate-burst,
// counted apart from task creations), since each challenge is stored until
// well after its lifetime even if never answered (twice its lifetime, at
// most five minutes more; a consumed one passkey.ChallengeRetention); over
// the bound the answer is CodeTooManyRequests (-31029) "Too many approval
// challenges from this caller: …", and nothing is created. Neither load
// refusal is -32001: SEP-2672 §4.10 keeps that code for the reasons of its
// list, and every -32001 this endpoint sends carries one of them.
//
// A tools/call whose decision is "verify" is checked in SEP-2672 §4.8
// order: evidence present and shaped {method, challengeId, response}
// (missing_evidence), method "webauthn" (unsupported_method), then
// passkey.Service.Verify: challenge_unknown, challenge_consumed,
// challenge_expired, challenge_wrong_tool, unknown_credential,
// authenticator_class_mismatch, signature_verification_failed,
// signature_counter_regression, argument_hash_mismatch; and only then the
// compare-and-set counter claim and consume (passkey's doc, "Signature
// counter"). Every rejection is JSON-RPC -32001 with the reason's fixed
// message and data.reason, and changes nothing: nothing is stored, run or
// consumed (an assertion that lost the consume race to another keeps its
// counter claim). A verified call then runs through the approval
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
// waits for its task by design, so it spends a token but holds no slot; so
// do the notification streams, which have a cap of their own (see
// Notification streams).
// Over budget the answer is HTTP 429 with Retry-After (whole seconds) and
// the JSON-RPC error CodeTooManyRequests (-31029) "Too many requests: …"
// with the request's id; nothing runs, and no other principal is slowed.
// The refusal is answered after a pause of one to one and a half seconds
// (or when the client hangs up): an agent that ignores Retry-After and retries in a tight loop
// would otherwise make refusals the flood. A bearer token that recently
// authenticated as a principal now over budget is refused before the token
// store is asked again; that cache only ever refuses, admission always
// authenticates.
// The same code answers HTTP 503 when the server-wide guard sheds a slow
// request body (internal/httplimit, through WriteHTTPError); a body that
// does not arrive within the read deadline is HTTP 408 with -32600. -31029
// is one code for "refused for load, retry later", distinct from every
// code that says something about the request itself; it is an application
// code outside -32768 to -32000, the range JSON-RPC reserves (MCP defines
// its own codes in -32020 to -32099 and forbids emitting others there).
// Buckets of idle principals are forgotten, so memory stays bounded. The
// budget is per process (the task creation rate is not: see Options.Rates).
//
// # Bridging the SDK
//
// HTTP wrapper. Server.Handler wraps the SDK's StreamableHTTPHandler. It
// authenticates the bearer token (401 with WWW-Authenticate: Bearer
// realm="countersign", plus error="invalid_token" for a rejected token),
// reads the body once under MaxBodyBytes (413 and a JSON-RPC -32600 when
// larger; nothing runs), answers framing errors itself (-32700 for invalid
// JSON, -32600 for batches and non-request values; the SDK would answer
// those in plain text), refuses with HTTP 400 and -32600, echoing it, a
// numeric id the SDK would answer as another (one with a fraction or
// beyond ±(2^53-1): the SDK reads ids as float64 and answers with the
// int64 conversion) and a notifications/ method that carries an id, and
// with id null an id that is null or neither a string nor a number (the
// SDK would answer those in plain text), reads members by their exact names as the SDK does
// (of duplicate keys the last) and answers HTTP 400 and -32600 to a key
// that differs only in letter case from a name it reads (jsonrpc, id,
// method, params; _meta, task and name in tools/call params; _meta and
// taskId in tasks/get, tasks/update and tasks/cancel params), so that no
// request is budgeted or checked as one message and run as another, checks
// the Mcp-Name rule for tasks/get, tasks/update and tasks/cancel in
// 2026-07-28 (the header must equal params.taskId, else HTTP 400 and
// -32020; the SDK checks Mcp-Name only for tools/call, prompts/get and
// resources/read), answers bad input the SDK would answer in its own words
// (see Malformed requests, below), and passes what it learned in the
// request context: the
// principal, the HTTP request's context, and whether a tools/call carried
// params.task, which mcp.CallToolParamsRaw drops. The SDK
// derives handler contexts from the HTTP request's context ("to allow
// middleware to add context values", as its transport says); every test here
// relies on it, and the middleware fails closed (-32603) if the values are
// missing.
//
// Malformed requests (params.go, answerWriter). Every answer to bad input
// is a JSON-RPC error with the request's id (null only when the id cannot
// be read), a code from the spec, and a message that names what is wrong
// and what it must be, never Go types or the SDK's decoder text; nothing
// runs and nothing is stored. HTTP statuses: 400 for framing errors
// (-32700, -32600), header mismatches (-32020) and an unsupported version
// (-32022); -32602 is 400 from 2026-07-28 and 200 before; -32601 is 404
// from 2026-07-28 and 200 before, as the SDK answers its own.
//
//   - Unsupported protocol version: an Mcp-Protocol-Version header naming
//     a version the SDK does not implement (mcp.SupportedProtocolVersions)
//     is HTTP 400 and -32022 "Unsupported protocol version: "<v>"; this
//     server supports …" with data {supported, requested}, as the
//     2026-07-28 transport requires. (The SDK answered versions before
//     2026-07-28 with a plain-text 400, which a modern client reads as a
//     legacy server, and later ones as requests of that era.)
//   - Unknown methods: -32601 worded by methodNotFound, the same in both
//     eras: "Method not found: <method>", plus " (this server has tools
//     only)" for prompts/*, resources/* and completion/complete, or " is
//     not available in protocol <era> (only in <other era>)" for a method
//     of the other era (initialize, ping, logging/setLevel, tasks/result,
//     tasks/list; server/discover, tasks/update). The HTTP wrapper answers
//     the last two kinds itself; the SDK's own texts for the rest
//     (`JSON RPC not handled: …`, a plain-text 400 before 2026-07-28, and
//     `method not found: "<method>"`) are replaced by answerWriter. The
//     SDK rewords every -32601 a handler returns as `method not found:
//     "<method>"`; wireError returns them as a methodError, which the SDK
//     leaves as it is, so a tools/call's -32601 still names the tool. A
//     notification of an unknown method keeps the SDK's 400.
//   - Invalid params: the HTTP wrapper checks the params of the methods
//     served (tools/call, tools/list, tasks/*, initialize, ping,
//     logging/setLevel, server/discover, subscriptions/listen) against
//     their shapes in the MCP schema, reading members by their exact
//     names: params must be an object; name (tools/call) and taskId
//     (tasks/*) are required strings; _meta, inputResponses,
//     capabilities, clientInfo and notifications are objects;
//     requestState, cursor, protocolVersion and level strings; the
//     2025-11-25 params.task an object. The answer is -32602 "Invalid
//     params: <member> must be <type>, not <type>" (nested members as
//     "clientInfo.name") or "Invalid params: <member> is required".
//     Members the schema does not define are ignored (no MCP request
//     forbids them; SEP-2322 says to ignore what is not recognized);
//     tools/call arguments are the tool's input schema's to check. An
//     error the SDK's decoder still raises deeper down (or, for
//     initialize, with code 0) is answered -32602 "Invalid params: the
//     params of <method> do not match the method's schema (a member has
//     the wrong type)".
//
// The lean tasks/get path. A tasks/get that the SDK would hand to the
// handler unchanged, and whose answer is a result, is answered by the HTTP
// wrapper itself (leanget.go): the same handler and caller facts, the same
// encoding and the same serverInfo _meta, without the SDK's per-request
// session and its repeated decoding (a third of the CPU per poll,
// BenchmarkTaskGet). Every other tasks/get (an error answer, odd headers,
// a version mismatch, keys the SDK's case-sensitive decoder reads
// differently) goes through the SDK as before. TestLeanTaskGetMatchesSDK
// sends the same requests both ways and requires the same bytes.
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
// With no session there are no server-to-client requests (sampling,
// elicitation) in 2025-11-25; in 2026-07-28 a tool asks through SEP-2322
// input requests instead.
//
// Responses are application/json, except the two notification streams
// (below) and a tools/call that can use a stream: its client accepts text/event-stream and it asks for
// notifications (a _meta progressToken, or a 2026-07-28 _meta log level),
// or it calls a conformance fixture that logs unasked
// (conformance.Fixture.Notifies). The HTTP wrapper hands such a call to a
// second StreamableHTTPHandler on the same mcp.Server with JSONResponse
// false, so the call's notifications travel on its response stream before
// its one result; everything else is unchanged.
//
// Progress and log notifications. Code on the tools/call path sends them
// with Server.progress(ctx, progress, total, message) and
// Server.logToClient(ctx, level, message), with the handler's context or
// one derived from it; a tool reaches them through
// gateway.Call.ReportProgress and gateway.Call.Log. Both are safe for
// concurrent use and no-ops when the client cannot hear them (no token, no
// stream, the response already written: the SDK refuses writes after the
// result, so nothing trails it); errors are logged at debug and never fail
// the call. Progress values strictly increase: one not above the last sent
// is dropped. Log messages follow the request's _meta log level in
// 2026-07-28 (none without one); a 2025-11-25 client's logging/setLevel
// went to another request's session, which a stateless server forgets, so
// a streamed 2025-11-25 call gets messages at info and above (MCP lets the
// server choose when no level is set).
//
// Tools only. Countersign declares no prompts, resources or completions
// capability, and answers prompts/*, resources/* and completion/complete
// with -32601 (the SDK would otherwise answer empty lists, as if it served
// them).
//
// Client capabilities (2026-07-28, SEP-2575). A fixture may need a client
// capability (conformance.Fixture.RequiresCapability): a call that does not
// declare it in its _meta gets -32021 with data.requiredCapabilities naming
// it ({"sampling": {}}), before policy runs. Input requests (SEP-2322) are
// sent only for what the request declares: elicitation/create needs
// elicitation, sampling/createMessage sampling, roots/list roots; the tool
// runs without answers to the rest, and a call that can answer none of its
// tool's requests gets -32021.
//
// Notification streams (listen.go). The tool list follows the registry
// (gateway.Registry.OnChange); a change of what tools/list shows, and only
// that, is told to clients, and capabilities say tools.listChanged:
//
//   - 2026-07-28: subscriptions/listen (SEP-2575) is the SDK's own; it
//     answers as an SSE stream even in JSONResponse mode, acknowledges
//     with notifications/subscriptions/acknowledged and sends
//     notifications/tools/list_changed (debounced) until the client
//     cancels. The HTTP wrapper adds what the SDK lacks: an SSE comment
//     every KeepAlive (15 s) while quiet, serialized with the SDK's writes
//     (it writes each event in one Write, so a comment never splits one),
//     X-Accel-Buffering: no, and an end at shutdown. No task status
//     notifications are sent (SEP-2663 makes them optional): a listen
//     that asks for them (notifications.taskIds) is acknowledged without
//     taskIds, so the client polls tasks/get, and one that asks without
//     declaring the tasks extension is HTTP 400 and -32021 naming it
//     (checkListen), as SEP-2663 requires.
//   - 2025-11-25: the stateless SDK answers GET with 405, so the wrapper
//     serves GET itself: after the same authentication and budget as a
//     POST, a standalone SSE stream that carries only
//     {"jsonrpc":"2.0","method":"notifications/tools/list_changed"}, with
//     the same keep-alives. Events have no IDs and nothing is replayed; a
//     client that reconnects lists the tools again. A GET whose Accept
//     lacks text/event-stream is 406; a GET that says
//     Mcp-Protocol-Version 2026-07-28 is 405 (that revision has no GET
//     stream).
//
// A stream lasts as long as its client, so it spends one request token but
// holds no in-flight slot, and a principal may hold MaxStreamsPerPrincipal
// (16) at once: the next is HTTP 429 with -31029 "Too many open
// notification streams…". The server sets no write deadline (no
// WriteTimeout in internal/app; internal/httplimit only sets read
// deadlines, which net/http clears once a body is read), so nothing cuts a
// stream but the client or Server.CloseStreams, which internal/app calls
// when the HTTP server shuts down (http.Server.Shutdown waits for handlers;
// a stream would not return on its own); after it, a new stream is 503.
// Server.EndStreams ends one principal's streams: internal/app calls it
// when the principal's token is disabled or revoked (a stream
// authenticated once, when it opened). Streams are per replica: each replica tells its own clients about its own
// registry, which follows the upstreams it is connected to.
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
// the call did not run; tasks/list pages through the caller's tasks only,
// leaving out those tasks/get answers expired (a page may be shorter than
// its size and still have a nextCursor: tasks.Store.List);
// tasks/cancel returns the task as cancelled once the workflow has accepted
// the cancel (waiting briefly for the read model), and -32602 for a terminal
// task or one whose execution has started.
package mcpserver
