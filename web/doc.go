// Package web is the approver's site and the admin API: enroll a passkey,
// review a held tool call, approve or deny it with the passkey.
//
// # A thin adapter
//
// The site changes no task itself: it shows and decides approvals through
// the approvals service ([Approvals], *approvals.Service), the one place a
// task changes, and answers with the approver API's wire contract, package
// internal/approverapi: its JSON bodies, its request checks and its one
// mapping of the service's verdicts and errors to statuses and bodies. The
// NATS decision service (package notify) speaks the same contract over the
// same service; neither edge calls the other. What is not a task change
// stays here over the passkey service: enrollment, the inbox's login
// challenges and the admin API's approver management.
//
// # Endpoints
//
// Admin API (Authorization: Bearer <admin token>; anything else is 401):
//
//	POST /admin/v1/approvers              {name, groups} → 201 {approverId, enrollUrl}
//	POST /admin/v1/approvers/{id}/invites                → 201 {enrollUrl}
//	POST /admin/v1/agents                 {name}         → 201 {name, token}
//	GET  /admin/v1/approvals?status=pending              → 200 [{ref, taskId, tool, status, approveUrl, …}]
//
// Approver API (no login: an enrollment token or an approval reference in
// the path, and a passkey for anything that changes state):
//
//	POST /approver/v1/enrollments/{token}/begin              → 200 {options}
//	POST /approver/v1/enrollments/{token}/finish {response}  → 201 {credentialId}
//	GET  /approver/v1/approvals/{ref}                        → 200 {ref, tool, arguments, …}
//	POST /approver/v1/approvals/{ref}/challenge {decision}   → 200 {challengeId, decision, displayText, expiresAt, requestOptions}
//	POST /approver/v1/approvals/{ref}/decision {challengeId, decision, comment?, response}
//	                                                         → 200 {accepted: true, status, approved, needed}
//
// Pages: GET /, GET /enroll/{token}, GET /approve/{ref}, and the two files
// under /static/.
//
// # Approval references, not task IDs
//
// Approvers address a call by its approval reference (Record.ApprovalRef),
// never by its MCP task ID: the task ID is the agent's handle and appears in
// no approver response or page. The requester's identical calls, which the
// approval page and GET /approver/v1/approvals/{ref} show (looked up each
// time they are served, with a warning when one ran or may have run), are
// named by their references too. A reference that is not shaped like one
// ([tasks.ValidID]) is answered 404 before any store access, like an unknown
// one. Seeing a reference lets one read the call; only a passkey assertion
// from an eligible approver moves it.
//
// # Errors and status codes
//
// Every API error is JSON {"error": code, "message": text}, written in one
// place: the message is fixed or names the rule the request broke, and the
// cause of a 5xx goes only to the log ("internal error" to the client).
//
//	400 invalid_request         malformed JSON (with the byte offset), unknown
//	                            field, wrong type, trailing data, bad field value;
//	                            passkey verification_failed at enrollment
//	401 unauthorized            admin endpoint without an admin token
//	403 cross_origin_request    state-changing request whose Origin is not PublicURL's
//	404 not_found               unknown or malformed approval reference or approver;
//	                            no_pending_enrollment for a malformed enrollment token
//	405 method_not_allowed      known API path, other method (Allow is set)
//	409 conflict                task_not_pending (challenge on a decided or expired
//	                            approval), no_eligible_credential,
//	                            credential_already_enrolled, name_taken
//	410 no_pending_enrollment   the invite is unknown, used or expired
//	413 body_too_large          body over MaxBodyBytes
//	415 unsupported_media_type  a body that is not Content-Type application/json
//	429 rate_limited            too many challenges for one approval or inbox
//	500 internal                anything else, including a recovered panic
//
// A decision answers with the decision shape, {accepted, reason?, status,
// approved, needed}, in every outcome the workflow reaches:
//
//	200 accepted
//	422 evidence rejected: reason is the SEP-2672 name (challenge_consumed,
//	    challenge_expired, unknown_credential, signature_verification_failed,
//	    argument_hash_mismatch, …) or challenge_wrong_decision,
//	    approver_not_eligible, self_approval, already_approved. 422 rather
//	    than 200 so that every accepted:false is a non-2xx and a client cannot
//	    mistake a rejection for success.
//	409 the workflow refused the update without looking at the evidence
//	    (*tasks.UpdateRejected, reason from it), or the task is no longer
//	    running or pending (reason task_not_pending).
//	400 the workflow found the decision malformed (malformed_decision; the
//	    handler's own checks make this unreachable in practice).
//	503 verification_unavailable: the evidence could not be checked
//	    (infrastructure); nothing was recorded: fetch a new challenge and retry.
//
// and one error body: 503 decision_in_progress (Retry-After: 2) when the
// outcome did not arrive in time; the same request again is the same
// decision and gets its outcome.
//
// A challenge is bound to one decision: the page asks for it when the
// approver taps Approve or Deny, and an assertion over an "approve"
// challenge is rejected on a deny (and the reverse) with
// challenge_wrong_decision. The comment is not signed.
//
// # Browser safety
//
// Every response carries a strict Content-Security-Policy (only this
// origin's script and style files; no inline script or style anywhere),
// X-Content-Type-Options nosniff, Referrer-Policy no-referrer (enrollment
// tokens and references live in URLs), X-Frame-Options DENY and
// Cache-Control no-store (static files excepted); Strict-Transport-Security
// when PublicURL is https. Any POST carrying an Origin other than PublicURL's
// (or Sec-Fetch-Site cross-site/same-site without Origin) is refused before
// routing. Pages show arguments as JSON with invisible and bidirectional
// control characters made visible, so a crafted argument cannot disguise
// itself; so are they in the display text, tool and requester, on the
// approval page and in the inbox's list alike.
package web
