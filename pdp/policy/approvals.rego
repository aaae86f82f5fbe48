# Package countersign.approvals is the re-evaluation helper every policy can
# import: it turns a requestable decision into allow once the verified
# approvals in input.context.approvals meet the decision's quorum.
#
# Copy this file into a custom policy directory to reuse it:
#
#	import data.countersign.approvals
#	decision := approvals.resolve(my_decision)
package countersign.approvals

# resolve(d) returns allow when d is requestable and its quorum is met, and d
# unchanged otherwise, so hard denials stay denials whatever the approvals.
resolve(d) := {"effect": "allow", "reason": "approved by quorum"} if {
	d.effect == "requestable"
	quorum_met(d.approver_group, d.quorum)
} else := d

# quorum_met(group, quorum) holds when at least quorum distinct approvers in
# group have approved, not counting the requester.
quorum_met(group, quorum) if count(approvers(group)) >= quorum

# approvers(group) is the set of distinct approver ids in group that approved.
# An approval whose approver id or name equals the subject (the requester)
# never counts, and neither does one without an approver id.
approvers(group) := {a.approver_id |
	some a in input.context.approvals
	a.approver_id != ""
	group in a.groups
	a.approver_id != input.subject.id
	a.name != input.subject.id
}
