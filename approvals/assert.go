package approvals

import (
	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// The production implementations of the interfaces the service consumes.
// (The in-memory engine of the adapters' tests asserts its own, in package
// approvalstest.)
var (
	_ Engine      = (*tasks.Orchestrator)(nil)
	_ Passkeys    = (*passkey.Service)(nil)
	_ AuditChains = (*audit.Log)(nil)
)
