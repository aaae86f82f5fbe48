package countersign.authz_test

import data.countersign.authz

call(tool, args) := {
	"subject": {"type": "agent", "id": "agent-1"},
	"action": {"name": "tools/call"},
	"resource": {"type": "tool", "id": tool},
	"context": {"arguments": args},
}

approved(tool, args, approvals) := object.union(call(tool, args), {"context": {"approvals": approvals}})

approval(id) := {"approver_id": id, "name": id, "groups": ["approvers"]}

transfer(amount) := call("transfer_funds", {"to": "acct-2", "amount": amount, "currency": "USD"})

test_transfer_up_to_1000_allowed if {
	every amount in [0.01, 1, 999.99, 1000] {
		authz.decision.effect == "allow" with input as transfer(amount)
	}
}

test_transfer_over_1000_requestable if {
	every amount in [1000.01, 5000, 1000000] {
		d := authz.decision with input as transfer(amount)
		d == {
			"effect": "requestable",
			"reason": "Transfers over 1,000 require approval",
			"approver_group": "approvers",
			"quorum": 1,
			"approval_ttl_seconds": 86400,
			"authenticator_class": "platform",
		}
	}
}

test_transfer_over_1000000_denied if {
	every amount in [1000000.01, 1e12] {
		d := authz.decision with input as transfer(amount)
		d == {"effect": "deny", "reason": "Transfers over 1,000,000 are never allowed"}
	}
}

test_transfer_bad_amount_denied if {
	every amount in [0, -5, "500", null, true, {"value": 5}] {
		d := authz.decision with input as transfer(amount)
		d == {"effect": "deny", "reason": "transfer amount must be a positive number"}
	}
}

test_transfer_missing_amount_denied if {
	d := authz.decision with input as call("transfer_funds", {"to": "acct-2", "currency": "USD"})
	d.effect == "deny"
}

test_list_transfers_allowed if {
	authz.decision.effect == "allow" with input as call("list_transfers", {})
}

test_deploy_production_requestable if {
	d := authz.decision with input as call("deploy_service", {"service": "api", "version": "1.2.3", "environment": "production"})
	d.effect == "requestable"
	d.approver_group == "approvers"
	d.quorum == 1
	d.approval_ttl_seconds == 86400
}

test_deploy_elsewhere_allowed if {
	every env in ["staging", "Production ", ""] {
		d := authz.decision with input as call("deploy_service", {"service": "api", "version": "1.2.3", "environment": env})
		d.effect == "allow"
	}
}

test_delete_records_needs_two if {
	d := authz.decision with input as call("delete_records", {"table": "users", "filter": "id > 0"})
	d.effect == "requestable"
	d.approver_group == "approvers"
	d.quorum == 2
}

test_place_trade_needs_verified_approval if {
	d := authz.decision with input as call("place_trade", {"symbol": "AAPL", "side": "buy", "quantity": 100, "limit": 150})
	d.effect == "verify"
	d.authenticator_class == "cross-platform"
}

test_place_trade_approvals_do_not_allow if {
	# In-band verification is the caller's own passkey; task approvals never
	# turn it into a plain allow.
	d := authz.decision with input as approved("place_trade", {"symbol": "AAPL"}, [approval("alice")])
	d.effect == "verify"
}

test_unknown_tool_denied if {
	d := authz.decision with input as call("rm_rf", {})
	d == {"effect": "deny", "reason": "tool is not allowed by policy"}
}

test_quorum_met_allows if {
	d := authz.decision with input as approved("delete_records", {"table": "t"}, [approval("alice"), approval("bob")])
	d == {"effect": "allow", "reason": "approved by quorum"}
}

test_quorum_short_stays_requestable if {
	d := authz.decision with input as approved("delete_records", {"table": "t"}, [approval("alice")])
	d.effect == "requestable"
}

test_same_approver_counts_once if {
	d := authz.decision with input as approved("delete_records", {"table": "t"}, [approval("alice"), approval("alice")])
	d.effect == "requestable"
}

test_requester_cannot_approve if {
	d := authz.decision with input as approved("deploy_service", {"environment": "production"}, [approval("agent-1")])
	d.effect == "requestable"
}

test_requester_name_cannot_approve if {
	a := {"approver_id": "u-7", "name": "agent-1", "groups": ["approvers"]}
	d := authz.decision with input as approved("deploy_service", {"environment": "production"}, [a])
	d.effect == "requestable"
}

test_approver_outside_group_ignored if {
	a := {"approver_id": "mallory", "name": "mallory", "groups": ["interns"]}
	d := authz.decision with input as approved("deploy_service", {"environment": "production"}, [a])
	d.effect == "requestable"
}

test_hard_deny_survives_approvals if {
	d := authz.decision with input as approved("transfer_funds", {"amount": 2000000}, [approval("alice"), approval("bob")])
	d.effect == "deny"
}

test_single_approval_allows_transfer if {
	d := authz.decision with input as approved("transfer_funds", {"amount": 5000}, [approval("alice")])
	d.effect == "allow"
}

upstream_call(tool, annotations, approval) := object.union(call(concat("__", ["fs", tool]), {"path": "/tmp/x"}), {"resource": {
	"upstream": "fs",
	"tool": tool,
	"annotations": annotations,
	"approval": approval,
}})

test_upstream_read_only_allowed if {
	d := authz.decision with input as upstream_call("read_file", {"readOnlyHint": true}, "")
	d.effect == "allow"
	d.reason == "read_file is read-only (annotated by fs)"
}

test_upstream_other_tools_requestable if {
	every annotations in [{}, {"readOnlyHint": false}, {"destructiveHint": false}, {"readOnlyHint": "true"}] {
		d := authz.decision with input as upstream_call("write_file", annotations, "")
		d.effect == "requestable"
		d.approver_group == "approvers"
		d.quorum == 1
		d.approval_ttl_seconds == 86400
	}
}

test_upstream_approval_override if {
	authz.decision.effect == "requestable" with input as upstream_call("read_file", {"readOnlyHint": true}, "always")
	authz.decision.effect == "allow" with input as upstream_call("write_file", {}, "never")
}

test_upstream_tool_named_like_a_demo_tool_is_not_one if {
	d := authz.decision with input as object.union(upstream_call("transfer_funds", {}, ""), {"resource": {"id": "transfer_funds"}})
	d.effect == "requestable"
	d.reason == "transfer_funds on fs may change something and needs approval"
}
