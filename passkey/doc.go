// Package passkey holds approvers' WebAuthn passkeys and turns a passkey
// assertion into a verified, single-use approval of one exact tool call
// (SEP-2672 §4.4–§4.10).
//
// # Lifecycle
//
//   - [Service.AddApprover] creates an approver in one or more groups and
//     returns an invite token; [Service.NewInvite] issues another.
//   - [Service.BeginEnrollment] and [Service.FinishEnrollment] register a
//     passkey with the token. User verification is required; the credential's
//     transports are stored for the authenticator-class filter.
//   - [Service.IssueChallenge] binds a fresh challenge to a task, tool and
//     action hash; the approver's browser signs it with navigator.credentials.get().
//   - [Service.Verify] checks the assertion and consumes the challenge.
//
// # In-band verified approval
//
// SEP-2672 on the MCP endpoint itself: the caller's own passkey signs its
// own call. The caller is the bearer principal, and its passkeys are those of
// the approvers mapped to it ([Approver.MappedTo]: explicitly, never by
// display name, byte for byte). [Service.BeginPrincipalEnrollment] and
// [Service.FinishPrincipalEnrollment] enroll one (approval/enroll/begin and
// finish) onto the principal's own in-band approver (derived id, group
// [InBandGroup], created on first use), never onto an approver an admin
// created: enrollment needs only the bearer token, and an admin's approver
// may hold groups that decide other principals' tasks. The passkey is then
// an approver credential like any other, visible to admins. The
// pending registration lives 5 minutes in the invites bucket under a key
// derived from the principal. A challenge with ChallengeRequest.Principal
// lists only that principal's passkeys (class-filtered), and Verify with
// VerifyRequest.Principal accepts it only from the same principal (another
// one gets challenge_unknown) and only with a passkey of an approver mapped
// to it (else unknown_credential); group and self-approval checks do not
// apply, since the user approves their own agent's call. A task challenge
// is challenge_unknown to an in-band call and vice versa.
//
// # Disable and revoke
//
// An admin disables (reversibly) or revokes (permanently) an approver or
// one passkey ([Service.SetApproverStatus], [Service.SetPasskeyStatus]).
// The status lives in the approver's or credential's record and is read at
// every verification, with no cache, so it takes effect at once on every
// replica, for a challenge issued before too; an inactive passkey or
// approver is not offered in challenges and cannot enroll. A revoked
// passkey's record stays, so the same credential cannot be enrolled again.
//
// # Invariants
//
// Wire challenge. The challenge an authenticator signs is nonce ‖ actionHash
// (64 bytes, 86 base64url characters). The 32-byte nonce comes from
// protocol.CreateChallenge (crypto/rand) and is unique per challenge; the
// action hash binds the call. A challenge for a decision
// (ChallengeRequest.Decision: the approver site, its inbox and NATS
// service) keeps 16 of those random bytes as a salt and ends with a tag of
// the decision (canon.DecisionNonce), so its assertion shows offline
// whether the approver approved or denied; an in-band challenge keeps all
// 32 random bytes (SEP-2672 §4.4.3). The server keeps its own record of the
// challenge (task, tool, action hash, group, class, expiry, consumer) and
// verifies against that record, never against what the client sends.
//
// Verify before consume. Verify runs every check of SEP-2672 §4.8, in the
// normative order, before it touches the challenge or the credential. An
// assertion that fails any check changes nothing: the challenge stays usable
// for the legitimate approver. Only then is the signature counter claimed,
// and only then is the challenge consumed.
//
// Compare-and-set everywhere. All state is in NATS JetStream key-value
// buckets (countersign_approvers, countersign_invites, countersign_credentials,
// countersign_challenges) on file storage. Every write is a Create (key must
// not exist) or an Update at the revision that was read, so any number of
// server replicas can share the buckets: of two concurrent consumers of one
// challenge exactly one wins, and the loser gets challenge_consumed. Counter
// updates retry their compare-and-set and never lower the counter.
//
// Signature counter. An assertion's counter must exceed the stored one,
// unless both are zero: authenticators that always report 0 (synced
// passkeys) keep working, and any number of their assertions may be verified
// at once. A non-zero counter is claimed before the challenge is consumed: it
// is stored, with the id of the challenge it answers, by compare-and-set at
// the credential revision the checks read. A claim that loses the race reads
// the credential again and checks again, so of assertions with the same
// counter over different challenges (a cloned authenticator), however many
// and on whatever replicas, at most one is accepted; the others get
// signature_counter_regression and their challenges stay usable. An
// assertion whose counter equals the stored one is accepted only over the
// challenge that claimed it: it is that assertion again (a retry after a
// claim whose consume failed), or one competing with it for the single
// consume. A claim stays when its consume is lost to another consumer of the
// same challenge or fails: the authenticator did make that assertion, and a
// higher stored counter only makes a clone easier to detect.
//
// Idempotent consume. A Verify that consumed a challenge records its
// ConsumerKey and result; a retry with the same key, for the same call and
// credential, returns the same result (and re-applies the counter update), so
// an activity may retry after a crash or timeout without losing the approval.
//
// Single-use invites. An invite is consumed by compare-and-set at the
// revision its registration session was verified against, only after the
// registration verified and the credential id was found not yet enrolled. A
// failed registration leaves the invite usable. Invites are stored under the
// SHA-256 of the token, so the bucket alone does not let anyone enroll.
//
// Expiry is checked on read against the injected clock; NATS only purges.
// A challenge is written with a per-key TTL of twice its lifetime (at
// most five minutes more), so one never answered is gone soon after it
// expires; a consume rewrites it without one, so a consumed challenge
// stays for the bucket's MaxAge (ChallengeRetention, 48 h) and its replay
// is challenge_consumed. A purged challenge reads as unknown, which still
// rejects. Per-key TTLs need NATS server 2.11 or later: New refuses an
// older one, naming its version.
//
// Bounded challenges. The challenges bucket has a size cap
// (Options.ChallengeMaxBytes, applied to an existing bucket at New) and,
// as every NATS KV bucket, discards new writes, never old ones, when
// full: a consumed challenge is never evicted to make room, so it never
// becomes replayable. IssueChallenge refuses with ErrChallengeCapacity,
// storing nothing, once the bucket holds the admission limit of who asks
// (ChallengeRequest.Asker, set by each caller): AgentChallengeAdmitBytes
// (half the cap) for an agent's in-band challenge, ChallengeAdmitBytes
// (seven eighths) for the approver site's (an approval's page, the NATS
// decision service, an approver's inbox). Agents choose how many
// challenges they ask for, so the room from half to seven eighths is the
// approver site's alone: agents,
// however many, cannot starve approvers of challenges. The last eighth
// is for the consumes of challenges already issued (a consume rewrites
// its record, larger, and NATS needs room for the whole new record). A
// consume that finds no room is ErrChallengeCapacity too and consumes
// nothing. A record holds no display text (which an agent chooses through
// the arguments): each takes the same room, under 1 KiB. Admission counts
// each record at its encoded size and reads the bucket's size
// from NATS at most once a second while it is an eighth of the cap or
// more below the limit; nearer, at every challenge.
//
// # Reasons
//
// Rejections are *[Error] with a Reason from the SEP-2672 §4.10 set
// (missing_evidence, unsupported_method, challenge_unknown,
// challenge_consumed, challenge_expired, challenge_wrong_tool,
// unknown_credential, authenticator_class_mismatch,
// signature_verification_failed, signature_counter_regression,
// argument_hash_mismatch, no_eligible_credential,
// credential_already_enrolled, no_pending_enrollment, verification_failed)
// plus Countersign's challenge_wrong_task, challenge_wrong_decision (a challenge
// issued for a deny cannot carry an approve), approver_not_eligible,
// self_approval, and credential_revoked, credential_disabled,
// approver_revoked and approver_disabled (an admin's action, admin.go;
// these Countersign reasons are the approver site's: on the in-band path
// Verify reports them as unknown_credential, a reason of the SEP's list). Reason
// and Message are safe for clients; the cause, which may quote library
// diagnostics, stays behind Unwrap and in the logs. An *Error is final. Any other error is an infrastructure failure and may be
// retried; ErrInvalidArgument and ErrNotFound are caller errors.
//
// Authenticator class (§4.7): "cross-platform" (also the meaning of an empty
// class) admits only credentials whose stored transports include hybrid,
// usb, nfc or ble, so it excludes those that are exclusively "internal" and
// those enrolled without transports; "platform" accepts every credential.
// Verify applies the stricter of the caller's class and the challenge's.
//
// Tokens, assertions and tool arguments are never logged.
package passkey
