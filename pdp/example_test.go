package pdp_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/countersign/countersign/pdp"
)

func ExampleEngine_Evaluate() {
	ctx := context.Background()
	e, err := pdp.New(ctx, pdp.Options{}) // embedded default policy
	if err != nil {
		panic(err)
	}
	in := pdp.Input{
		Subject:  pdp.Entity{Type: "agent", ID: "agent-1"},
		Action:   pdp.Action{Name: "tools/call"},
		Resource: pdp.Resource{Type: "tool", ID: "transfer_funds"},
		Context:  pdp.Context{Arguments: json.RawMessage(`{"to":"acct-2","amount":5000,"currency":"USD"}`)},
	}
	d, err := e.Evaluate(ctx, in)
	if err != nil {
		panic(err) // the caller denies
	}
	fmt.Println(d.Effect, d.ApproverGroup, d.Quorum, d.ApprovalTTL)

	// After a passkey-verified approval, re-evaluate the same call.
	in.Context.Approvals = []pdp.Approval{{ApproverID: "u-alice", Name: "alice", Groups: []string{"approvers"}}}
	d, _ = e.Evaluate(ctx, in)
	fmt.Println(d.Effect, d.Reason)
	// Output:
	// requestable approvers 1 24h0m0s
	// allow approved by quorum
}
