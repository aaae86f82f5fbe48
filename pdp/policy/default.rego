# Package countersign.authz is Countersign's default policy for the demo tools.
#
# The engine queries data.countersign.authz.decision. It must be an object with
# "effect" ("allow", "deny" or "requestable") and "reason"; a requestable
# decision also carries "approver_group", "quorum", "approval_ttl_seconds",
# "authenticator_class" and, optionally, "slack_channel". An undefined
# decision means deny.
package countersign.authz

import data.countersign.approvals

# decision is the base decision for the tool, resolved against any approvals.
decision := approvals.resolve(base)

tool := input.resource.id

args := input.context.arguments

base := transfer if tool == "transfer_funds"

base := allow("listing transfers is allowed") if tool == "list_transfers"

base := deploy if tool == "deploy_service"

base := requestable("Deleting records requires two approvers", 2) if tool == "delete_records"

default base := {"effect": "deny", "reason": "tool is not allowed by policy"}

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

requestable(reason, quorum) := {
	"effect": "requestable",
	"reason": reason,
	"approver_group": "approvers",
	"quorum": quorum,
	"approval_ttl_seconds": 86400, # 24h
	"authenticator_class": "platform",
}
