# Package countersign.authz is Countersign's default policy: the demo tools,
# and the tools of the upstream MCP servers Countersign gates.
#
# The engine queries data.countersign.authz.decision. It must be an object with
# "effect" ("allow", "deny", "requestable", "verify" or "token") and "reason"; a verify
# decision may carry "authenticator_class" (default "cross-platform"); a requestable
# decision also carries "approver_group", "quorum", "approval_ttl_seconds",
# "authenticator_class" and, optionally, "slack_channel". An undefined
# decision means deny.
package countersign.authz

import data.countersign.approvals

# decision is the base decision for the tool, resolved against any approvals.
decision := approvals.resolve(base)

# The demo tools are Countersign's own: an upstream's tool is never one,
# whatever it is called.
tool := input.resource.id if not input.resource.upstream

args := input.context.arguments

base := transfer if tool == "transfer_funds"

base := allow("listing transfers is allowed") if tool == "list_transfers"

base := deploy if tool == "deploy_service"

base := requestable("Deleting records requires two approvers", 2) if tool == "delete_records"

# place_trade (the SEP-2672 reference's demo tool) runs only with the
# caller's own passkey over this exact call, verified in-band.
base := verify("Each trade is signed by the caller's own passkey", "cross-platform") if tool == "place_trade"

default base := {"effect": "deny", "reason": "tool is not allowed by policy"}

# A tool of an upstream MCP server. The upstream's configured approval
# override wins ("never": runs at once; "always": needs approval); otherwise
# a tool the upstream annotates read-only runs at once and every other one
# needs one approver. Annotations are hints the upstream chose: to pin a
# tool whatever its annotations say, override base for it in your policy.
base := upstream_call if input.resource.upstream

upstream_call := allow(sprintf("the %s upstream's calls need no approval (configured)", [input.resource.upstream])) if {
	input.resource.approval == "never"
} else := requestable(sprintf("Calls to %s need approval (configured)", [input.resource.upstream]), 1) if {
	input.resource.approval == "always"
} else := allow(sprintf("%s is read-only (annotated by %s)", [input.resource.tool, input.resource.upstream])) if {
	input.resource.annotations.readOnlyHint == true
} else := requestable(sprintf("%s on %s may change something and needs approval", [input.resource.tool, input.resource.upstream]), 1)

transfer := deny("transfer amount must be a positive number") if {
	not positive_amount
} else := deny("Transfers over 1,000,000 are never allowed") if {
	args.amount > 1000000
} else := requestable("Transfers over 1,000 require approval", 1) if {
	args.amount > 1000
} else := allow("Transfers up to 1,000 are allowed")

positive_amount if {
	is_number(args.amount)
	args.amount > 0
}

deploy := requestable("Deploying to production requires approval", 1) if {
	args.environment == "production"
} else := allow("Deploying outside production is allowed")

allow(reason) := {"effect": "allow", "reason": reason}

deny(reason) := {"effect": "deny", "reason": reason}

verify(reason, class) := {"effect": "verify", "reason": reason, "authenticator_class": class}

requestable(reason, quorum) := {
	"effect": "requestable",
	"reason": reason,
	"approver_group": "approvers",
	"quorum": quorum,
	"approval_ttl_seconds": 86400, # 24h
	"authenticator_class": "platform",
}
