// Package audit writes and verifies Countersign's audit records: one
// append-only chain of signed records per task, stored in a NATS JetStream
// stream, verifiable offline with nothing but the export and the server's
// audit public key.
//
// # Record
//
// A record is one JSON object in RFC 8785 (JCS) canonical form:
//
//	{"at":…,"body":{…},"keyId":"ed25519-…","kind":"requested","prev":"","seq":0,
//	 "sig":"…","stepId":"requested","taskId":"tsk_…","v":1}
//
// sig is the Ed25519 signature (base64url, no padding) over the JCS form of
// the record without its sig member. The record's hash is SHA-256 over its
// complete canonical form (sig included), hex; prev is the hash of the
// previous record of the same task ("" for seq 0). keyId names the signing
// key: "ed25519-" and the first 16 bytes of SHA-256(public key), hex, so a
// verifier derives it from the key itself.
//
// # Invariants
//
//   - A task's chain starts with "requested" at seq 0 and has consecutive
//     seqs; each record's prev is the previous record's hash.
//   - Appends are idempotent per step: a step ID already in the chain
//     returns the record written before, and every publish carries the
//     JetStream Nats-Msg-Id header (task/step) and the expected last
//     sequence of the task's subject, so retries never duplicate a step and
//     concurrent writers never fork the chain.
//   - A Log reads a chain only when it does not know it: after its own
//     append it keeps the chain's tail (length, the last record's kind,
//     hash and sequence, the receipt of every step) and appends after
//     that, under the same expected-sequence guard. A tail another writer
//     made stale fails the guard; the Log then forgets it and reads the
//     chain whole.
//   - A Log counts only the records it verifies. A chain it reads to
//     append to must hold the chain's own records (task, seq, prev), or
//     it is not appended to ([ErrBrokenChain]); a record there that the
//     Log cannot verify with its [Keyring] (whose directory it reads again
//     for a key it lacks) stays in the chain for the verifier to report,
//     but is neither a step written nor the seal, so the Log's own record
//     follows it. Nobody without a key can keep a step out of a chain by
//     copying or forging a record into the stream.
//   - The chain is sealed by a terminal step (executed, execution-error,
//     outcome-unknown, denied, expired, cancelled) followed by the "outcome"
//     record, which [BuildOutcome] derives from the chain; nothing is
//     appended after it.
//   - A "cancel-refused" record (empty body) says a cancel arrived once the
//     call was claimed and was refused; it is not a cancel.
//   - The stream uses file storage and denies delete and purge.
//   - Only the process holding the [Keyring] (the worker) signs; the private
//     keys never leave their directory.
//
// # Transaction-token chains
//
// A single-use transaction token (package txtoken) has a chain of its own,
// named by its jti: "token-issued", any "token-rejected", at most one
// "token-consumed" and, after it, at most one "token-result"; an unverified
// token's rejection is a one-record chain. The verifier checks their
// grammar and binding, and that the token was used within its lifetime
// ([RuleToken]); they carry no outcome record. See txtoken.go.
//
// # Admin chains
//
// An admin's action on an identity (an admin token created or rotated; an
// agent, an approver or a passkey disabled, enabled or revoked; a Slack
// user linked to an approver or unlinked from it; the transaction-token
// signing key rotated) is an "admin" record in that identity's own chain
// ([AdminChainID]; an approver's passkeys and Slack links share its chain),
// written by the process that acted. The verifier checks that a chain
// holds only its identity's actions, that each action leaves its status,
// that a Slack user is only linked and unlinked, and that nothing acts on
// a revoked target ([RuleAdmin]).
// See admin.go.
//
// # Verification
//
// [Verify] checks each record (canonical form, signature, links) and then
// the story the chain tells, naming the rule (Rule* constants) of every
// problem. Among them: an execution (a "claimed" record, or an end saying
// the tool ran) needs a quorum of distinct approvers whose approvals were
// accepted before the claim ([RuleQuorumBeforeClaim],
// [RuleExecutionWithoutClaim]); no decision is accepted after the claim
// ([RuleDecisionAfterClaim]), after a deny ([RuleDecisionAfterDeny]) or
// once the quorum is met ([RuleApprovalBeyondQuorum]), while rejected
// decisions may stand anywhere before the end; an approver, a credential
// and a public key count once ([RuleApproverCountedTwice]); after the claim
// no end says the call was cancelled, expired, or not run while recording
// its result ([RuleStoppedAfterClaim]); and the outcome lists exactly the
// chain's accepted decisions ([RuleOutcomeApprovals]).
//
// [CheckChain] applies the same rules to one task's chain; it is the one
// implementation of them, which [Verify] uses for every task of an export.
// A holder of no public keys (the web server, showing a chain as a task's
// timeline) asks for [CheckOptions.SkipSignatures] explicitly and gets
// every check but the records' signatures.
package audit
