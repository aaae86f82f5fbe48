package app

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/txtoken"
)

// tokenIssuer serves the admin API's transaction-token issuance: the call
// is checked as tools/call checks it (a tool of the registry, arguments
// that validate), then issued on the principal's behalf.
type tokenIssuer struct {
	tools *gateway.Registry
	svc   *txtoken.Service
}

func (t tokenIssuer) IssueFor(ctx context.Context, principal, tool string, args json.RawMessage, issuedBy string) (txtoken.Issued, error) {
	tl, ok := t.tools.Lookup(tool)
	if !ok {
		return txtoken.Issued{}, fmt.Errorf("%w: unknown tool %q", txtoken.ErrInvalidRequest, tool)
	}
	if err := t.tools.Validate(tl.Name, args); err != nil {
		return txtoken.Issued{}, fmt.Errorf("%w: %v", txtoken.ErrInvalidRequest, err)
	}
	return t.svc.Issue(ctx, txtoken.Request{Principal: principal, Tool: tl.Name, Arguments: args, IssuedBy: issuedBy})
}

func (t tokenIssuer) Rotate(ctx context.Context) (txtoken.Rotation, error) { return t.svc.Rotate(ctx) }
