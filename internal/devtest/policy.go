package devtest

import (
	"os"
	"path/filepath"
	"testing"
)

// shortApprovalRego makes transfer_funds requestable by one approver of
// "approvers", with approvals that expire after one second.
const shortApprovalRego = `package countersign.authz

decision := {"effect": "requestable", "reason": "short-lived approval", "approver_group": "approvers",
	"quorum": 1, "approval_ttl_seconds": 1, "authenticator_class": "platform"} if {
	input.resource.id == "transfer_funds"
	count(object.get(input.context, "approvals", [])) == 0
}
`

// ShortApprovalPolicy writes, in a fresh temp dir, a policy whose
// transfer_funds approvals expire after one second, and returns the dir (for
// Options.Config.PolicyDir).
func ShortApprovalPolicy(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "short.rego"), []byte(shortApprovalRego), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}
