// Package txtoken issues, verifies and consumes single-use transaction
// tokens: the ephemeral tokens of the Zero-Trust MCP Handshake RFC, which
// bind one principal to one exact tool call, for a tool policy puts in the
// "token" mode.
//
// # Token
//
// A token is a compact JWS (JWT), signed EdDSA (Ed25519) with a kid header:
//
//	{"alg":"EdDSA","kid":"ed25519-<hex>","typ":"JWT"}
//	{"iss":<serverId>,"sub":<principal>,"aud":<serverId>,"exp":…,"iat":…,
//	 "jti":"txt_<32 hex>","mcp":{"tool":<tool>,"parameters_hash":<action hash>}}
//
// parameters_hash is the SEP-2672 §4.6 action hash of the tool, the
// arguments exactly as the call will send them, and the server ID, so the
// token is also bound to this server. exp - iat is at most 60 s.
//
// # Keys
//
// The signing keys live in NATS KV (KeyBucket), not in a data directory:
// every replica must verify any replica's tokens and any replica may issue,
// and the bucket is in the same Countersign NATS account that already holds
// what a token grants no more than (the agent and admin token digests, the
// approvers and their credentials), so it adds no new secret to protect.
// Each key is two records: its public half ("pub.<kid>", PKIX), the only
// one verification reads, and its private half ("key.<kid>", PKCS#8), which
// only signing reads; a kid is the hash of the public key, and both are
// checked against it on read. The first replica to start creates the key
// (a create-only write of "current"); the others load it. A kid this
// process has not seen is looked up in the bucket, so a key added later
// verifies everywhere. [Service.Rotate] makes a new key current
// (compare-and-set) and retires the old one ("retired.<kid>" = when);
// every replica follows "current" when it next issues, and a retired key's
// token verifies only if issued before the retirement, so once those have
// expired (MaxLifetime plus the skew) the old key mints nothing that
// passes. A failed compare-and-set is judged by what "current" holds
// afterwards (a timeout may come after the write landed): only a revision
// conflict with another new key current means another rotation won, and a
// key that is current is never retired.
//
// A retired key's private half is purged PurgeAfter (MaxLifetime plus
// MaxSkew) after its retirement, by [Service.PurgeRetired] (at Open, and
// periodically in a server), so a later copy of the bucket (a backup, a
// mis-scoped NATS user) no longer holds it. Its public half stays: a token
// of it is still refused precisely (expired, or retired_key), not as
// unknown_key. The purge stores the public half first, and skips a key
// whose public half cannot be stored, and the current key. Before that it
// retires any key left unretired that can never be current again (written
// before "current" last moved): the old key of a rotation that moved
// "current" and then failed to write the retirement, dated when "current"
// moved, and the unused key of a rotation whose compare-and-set failed.
//
// Keys stored before the split (a private half alone) keep working: Open
// stores the public half of each; a key an older replica adds later is
// migrated when this process first verifies one of its tokens, the only
// case in which verification reads a private half.
//
// # Verification, in order
//
//  1. form: at most MaxTokenBytes, three base64url parts, a JSON header;
//  2. alg: EdDSA only (none, HS256 and the rest are refused);
//  3. kid: present and known (its public half in this server's bucket);
//  4. signature;
//  5. claims: exactly the claims above, all present (unknown claims refused);
//     then the key's retirement: a retired key's token must be issued
//     before it was retired;
//  6. iss and aud: this server ID;
//  7. iat not beyond now + skew; exp - iat at most 60 s;
//  8. exp: now not past exp + skew (Options.Skew, default 5 s);
//  9. sub: the authenticated caller;
//  10. mcp.tool: the called tool;
//  11. mcp.parameters_hash: the action hash of the call's arguments;
//  12. use: the jti is consumed by a create-only write to UsedBucket (TTL
//     UsedTTL, longer than any token lives plus the skew). Of any number of
//     concurrent uses, on any replicas, exactly one create succeeds. A
//     write answered by another error (a timeout) may have landed: the
//     entry is read back, and is this request's if it holds this
//     redemption's nonce.
//
// The first failing check is the answer, as an *Error: the RFC's
// error_handling object (status_code, error_type, message, retry_allowed)
// plus the specific reason:
//
//	reason                 error_type          status  retry_allowed
//	malformed              permission_denied   401     false
//	unsupported_algorithm  permission_denied   401     false
//	unknown_key            permission_denied   401     false
//	bad_signature          permission_denied   401     false
//	bad_claims             permission_denied   401     false
//	retired_key            permission_denied   401     false
//	wrong_audience         permission_denied   403     false
//	not_yet_valid          permission_denied   403     false
//	lifetime_too_long      permission_denied   403     false
//	expired                token_expired       401     true (a new token)
//	wrong_subject          permission_denied   403     false
//	wrong_tool             permission_denied   403     false
//	parameters_changed     parameter_mismatch  400     false
//	already_used           token_consumed      409     false
//
// The RFC's other types do not arise here: oauth_validation_error is the
// bearer token's (HTTP 401 before any of this), rate_limit_exceeded the
// request budget's (HTTP 429). A rejection changes nothing but the audit
// log; nothing runs.
//
// # Audit
//
// Every issuance and every use is recorded in the audit log (package
// audit, "Transaction-token chains"): a chain per jti with "token-issued"
// (the envelope: tool, arguments or their digest, action hash, principal,
// server ID; who asked; kid; expiry), "token-rejected" for each refusal of
// the verified token presented by its own principal, "token-consumed" and
// "token-result". A token that never verified, or that another principal
// presented, gets a one-record "token-rejected" chain of its own (naming
// the jti when the token verified): nobody but the token's principal can
// grow its chain, so nobody else can fill it and block the token's use.
// A token whose issuance cannot be recorded is not returned; a consumption
// that cannot be recorded does not run the call. Once the jti is consumed,
// its records (the consumption, the result, a failure) are written
// without the request's cancellation, within a bound (settleTimeout): a
// caller that hangs up or cancels does not leave a spent token without
// them. A redemption a store failure stops (the key, its retirement or
// the consume could not be read or written) is a "token-rejected" of
// type TypeInternal (reason "internal"), in the token's chain for a
// failed consume, else in a chain of its own; the caller gets an error,
// not a rejection. A rejection's record is best effort (logged when it
// fails; the rejection stands), and the records a caller can cause with
// garbage tokens are bounded by its request budget (mcpserver).
//
// # Crash semantics
//
// The jti is consumed before the call runs, and the call runs only in the
// request that consumed it, to its end even if the caller goes away
// (mcpserver detaches it from the request's cancellation). A process that
// dies after the consume and before (or during) the call leaves the token
// spent and a chain ending in "token-consumed" without a "token-result":
// the call ran at most once, possibly not at all, and the same token can
// never run it again. The caller then needs a new token. "Ran twice" is
// impossible by construction; "did not run, token spent" is the price.
package txtoken
