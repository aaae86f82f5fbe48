// Package pdp is Countersign's policy decision point: it evaluates one
// AuthZEN-shaped tool call ([Input]) against an OPA policy set and returns a
// validated [Decision]: allow, deny, requestable (approver group, quorum,
// approval TTL, authenticator class), verify (SEP-2672 in-band verified
// approval by the caller's own passkey, with an authenticator class), or
// token (a single-use transaction token is required).
//
// # Invariants
//
//   - Undefined means deny. When the policy defines no decision for an input,
//     [Engine.Evaluate] returns a deny decision with reason [ReasonUndefined].
//     A decision that breaks the contract below (unknown effect, requestable
//     without a group, quorum < 1, TTL ≤ 0, unknown authenticator class) is a
//     deny decision whose reason starts "malformed policy decision". An
//     evaluation error (for example conflicting outputs of a complete rule,
//     or a built-in function that fails at run time, such as to_number on a
//     string that is no number) is returned as an error, and the caller must
//     deny. Built-in errors are strict: OPA's default would make the failing
//     expression undefined and drop the rule it is in, so arguments chosen
//     by the caller could skip a deny rule. An evaluation that runs past
//     [Options.EvalTimeout] (default [DefaultEvalTimeout]) is stopped and
//     is such an error too.
//   - Every decision records the policy version it was made under:
//     Decision.PolicyVersion is [Engine.Version], "sha256:" and the hex SHA-256
//     over each loaded file, in sorted order of relative path, as
//     path ‖ 0x00 ‖ content ‖ 0x00. Loaded files are every *.rego and *.json file
//     in the directory tree, minus *_test.rego (tests never decide, so they are
//     not hashed) and minus names starting with ".". Same bytes, same version.
//   - Policy is compiled and prepared once, in [New]: a parse or compile error
//     (reported as file:line), a directory without .rego files ([ErrNoPolicy])
//     or a policy set without a data.countersign.authz.decision rule stops
//     startup instead of failing requests. An [Engine] is immutable and safe
//     for concurrent use.
//   - Re-evaluation: once approvers have approved, the caller evaluates the
//     same input again with Context.Approvals set. A policy turns a
//     requestable decision into allow only when at least quorum distinct
//     approver ids from the required group approved, none of them the subject
//     (the requester); hard denials stay denials. The embedded policy does this
//     with resolve in package countersign.approvals (policy/approvals.rego),
//     which custom policy sets can copy and reuse.
//   - Policies see the tool arguments as a JSON object whose numbers keep their
//     exact decimal value (json.Number), and time.now_ns() is Context.Time when
//     it is set, so re-evaluating the same input is deterministic.
//   - Raw tool arguments are never logged.
//
// # Rego contract
//
// The engine queries data.countersign.authz.decision, an object:
//
//	{
//	  "effect": "allow" | "deny" | "requestable" | "verify" | "token",
//	  "reason": string,
//	  # verify only:
//	  "authenticator_class": "platform" | "cross-platform", # default "cross-platform"
//	  # requestable only:
//	  "approver_group": string,       # required
//	  "quorum": int ≥ 1,              # required
//	  "approval_ttl_seconds": int > 0, # required, capped at Options.MaxApprovalTTL
//	  "authenticator_class": "platform" | "cross-platform", # default "platform"
//	  "slack_channel": string,        # optional
//	}
//
// "token" means the call runs once, now, only with a valid single-use
// transaction token (package txtoken) bound to its principal, tool and
// arguments; it carries only a reason. A request for such a token is
// evaluated with action.name [ActionIssueToken] and the same subject,
// resource and context as the call: only "allow" lets the agent obtain the
// token itself, so a policy that never allows that action leaves issuance
// to operators (the admin API).
//
// Policies are Rego v1 (the OPA 1.x syntax, with `if` and `contains`). The
// input document is the JSON encoding of [Input], with
// context.arguments decoded to an object (an absent one becomes {}).
//
// # Default policy
//
// With an empty [Options.Dir] the engine loads the embedded policy in
// policy/: transfer_funds is allowed up to 1,000, requestable up to 1,000,000
// and denied above; list_transfers is allowed; deploy_service needs approval
// for production; delete_records needs two approvers; every other tool is
// denied. policy/default_test.rego holds its unit tests (`opa test pdp/`).
package pdp
