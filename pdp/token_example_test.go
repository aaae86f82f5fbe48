package pdp_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/countersign/countersign/pdp"
)

// readmeTokenPolicy is the worked policy of the README's "Single-use
// transaction tokens" section; the test completes it with the default
// policy's base, as its comment says.
const readmeTokenPolicy = `package countersign.authz

import data.countersign.approvals

decision := {"effect": "token", "reason": "refunds need a transaction token"} if {
	input.action.name == "tools/call"
	input.resource.id == "create_refund"
} else := {"effect": "allow", "reason": "small refunds: the agent may ask"} if {
	input.action.name == "transaction-token/issue"
	input.resource.id == "create_refund"
	input.context.arguments.amount <= 500
} else := {"effect": "deny", "reason": "ask an operator"} if {
	input.action.name == "transaction-token/issue"
} else := approvals.resolve(base)
`

func TestReadmeTokenPolicy(t *testing.T) {
	def, err := os.ReadFile("policy/default.rego")
	if err != nil {
		t.Fatal(err)
	}
	helper, err := os.ReadFile("policy/approvals.rego")
	if err != nil {
		t.Fatal(err)
	}
	// The default policy without its decision rule (and its package and
	// import lines, which the worked policy has).
	var rest []string
	for _, l := range strings.Split(string(def), "\n") {
		if strings.HasPrefix(l, "decision :=") || strings.HasPrefix(l, "package ") || strings.HasPrefix(l, "import ") {
			continue
		}
		rest = append(rest, l)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), strings.TrimSpace(strings.SplitN(readmeTokenPolicy, "} else := approvals.resolve(base)", 2)[0])) {
		t.Fatal("the README's worked token policy differs from this test's")
	}
	dir := writePolicy(t, map[string]string{
		"authz.rego":         readmeTokenPolicy + strings.Join(rest, "\n"),
		"lib/approvals.rego": string(helper),
	})
	e := newEngine(t, dir)
	for _, tc := range []struct {
		action, tool, args string
		want               pdp.Effect
	}{
		{"tools/call", "create_refund", `{"amount": 9000}`, pdp.EffectToken},
		{pdp.ActionIssueToken, "create_refund", `{"amount": 500}`, pdp.EffectAllow},
		{pdp.ActionIssueToken, "create_refund", `{"amount": 501}`, pdp.EffectDeny},
		{pdp.ActionIssueToken, "transfer_funds", `{"amount": 5}`, pdp.EffectDeny},
		{"tools/call", "transfer_funds", `{"amount": 5}`, pdp.EffectAllow},
		{"tools/call", "transfer_funds", `{"amount": 5000}`, pdp.EffectRequestable},
	} {
		in := call(tc.tool, tc.args)
		in.Action.Name = tc.action
		d, err := e.Evaluate(context.Background(), in)
		if err != nil || d.Effect != tc.want {
			t.Errorf("%s %s %s: %+v %v, want %s", tc.action, tc.tool, tc.args, d, err, tc.want)
		}
	}
}
