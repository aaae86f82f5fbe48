package pdp_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/countersign/countersign/pdp"
)

// newEngine loads the embedded default policy, or dir when given.
func newEngine(t testing.TB, dir string) *pdp.Engine {
	t.Helper()
	e, err := pdp.New(context.Background(), pdp.Options{Dir: dir})
	if err != nil {
		t.Fatalf("New(%q): %v", dir, err)
	}
	return e
}

// writePolicy writes files (relative path → content) into a fresh directory.
func writePolicy(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for rel, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func call(tool, args string, approvals ...pdp.Approval) pdp.Input {
	return pdp.Input{
		Subject:  pdp.Entity{Type: "agent", ID: "agent-1"},
		Action:   pdp.Action{Name: "tools/call"},
		Resource: pdp.Resource{Type: "tool", ID: tool},
		Context: pdp.Context{
			Arguments:  json.RawMessage(args),
			ActionHash: strings.Repeat("ab", 32),
			Time:       time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC),
			Approvals:  approvals,
		},
	}
}

func approval(id string, groups ...string) pdp.Approval {
	if groups == nil {
		groups = []string{"approvers"}
	}
	return pdp.Approval{ApproverID: id, Name: id, Groups: groups, CredentialID: "cred-" + id, ApprovedAt: time.Date(2026, 5, 1, 12, 30, 0, 0, time.UTC)}
}

func allow(reason string) pdp.Decision { return pdp.Decision{Effect: pdp.EffectAllow, Reason: reason} }
func deny(reason string) pdp.Decision  { return pdp.Decision{Effect: pdp.EffectDeny, Reason: reason} }

func requestable(reason string, quorum int) pdp.Decision {
	return pdp.Decision{
		Effect:             pdp.EffectRequestable,
		Reason:             reason,
		ApproverGroup:      "approvers",
		Quorum:             quorum,
		ApprovalTTL:        24 * time.Hour,
		AuthenticatorClass: pdp.AuthenticatorPlatform,
	}
}

type evalCase struct {
	name string
	in   pdp.Input
	want pdp.Decision
}

// runCases evaluates each case on e and compares the whole decision.
func runCases(t *testing.T, e *pdp.Engine, tests []evalCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := e.Evaluate(context.Background(), tt.in)
			if err != nil {
				t.Fatalf("Evaluate: %v", err)
			}
			tt.want.PolicyVersion = e.Version()
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDefaultPolicy(t *testing.T) {
	const (
		overThousand = "Transfers over 1,000 require approval"
		overMillion  = "Transfers over 1,000,000 are never allowed"
		badAmount    = "transfer amount must be a positive number"
	)
	transfer := func(amount string) pdp.Input {
		return call("transfer_funds", `{"to":"acct-2","amount":`+amount+`,"currency":"USD","memo":"x"}`)
	}
	runCases(t, newEngine(t, ""), []evalCase{
		{"transfer small", transfer("12.50"), allow("Transfers up to 1,000 are allowed")},
		{"transfer 1000", transfer("1000"), allow("Transfers up to 1,000 are allowed")},
		{"transfer just over 1000", transfer("1000.01"), requestable(overThousand, 1)},
		{"transfer 1000000", transfer("1000000"), requestable(overThousand, 1)},
		{"transfer just over 1000000", transfer("1000000.000000000000000001"), deny(overMillion)},
		{"transfer huge", transfer("1e400"), deny(overMillion)},
		{"transfer big integer", transfer("123456789012345678901234567890"), deny(overMillion)},
		{"transfer zero", transfer("0"), deny(badAmount)},
		{"transfer negative", transfer("-5"), deny(badAmount)},
		{"transfer string amount", transfer(`"500"`), deny(badAmount)},
		{"transfer null amount", transfer("null"), deny(badAmount)},
		{"transfer missing amount", call("transfer_funds", `{"to":"acct-2","currency":"USD"}`), deny(badAmount)},
		{"transfer no arguments", call("transfer_funds", ``), deny(badAmount)},
		{"list transfers", call("list_transfers", `{}`), allow("listing transfers is allowed")},
		{"deploy production", call("deploy_service", `{"service":"api","version":"1.2.3","environment":"production"}`), requestable("Deploying to production requires approval", 1)},
		{"deploy staging", call("deploy_service", `{"service":"api","version":"1.2.3","environment":"staging"}`), allow("Deploying outside production is allowed")},
		{"deploy no environment", call("deploy_service", `{"service":"api","version":"1.2.3"}`), allow("Deploying outside production is allowed")},
		{"delete records", call("delete_records", `{"table":"users","filter":"id > 0"}`), requestable("Deleting records requires two approvers", 2)},
		{"place trade", call("place_trade", `{"symbol":"AAPL","side":"buy","quantity":100,"limit":150}`), pdp.Decision{Effect: pdp.EffectVerify, Reason: "Each trade is signed by the caller's own passkey", AuthenticatorClass: pdp.AuthenticatorCrossPlatform}},
		{"place trade without arguments", call("place_trade", `{}`), pdp.Decision{Effect: pdp.EffectVerify, Reason: "Each trade is signed by the caller's own passkey", AuthenticatorClass: pdp.AuthenticatorCrossPlatform}},
		{"unknown tool", call("drop_database", `{}`), deny("tool is not allowed by policy")},
		{"empty tool", call("", `{}`), deny("tool is not allowed by policy")},
	})
}

func TestReevaluation(t *testing.T) {
	const del = `{"table":"users","filter":"id > 0"}`
	deleteNeedsTwo := requestable("Deleting records requires two approvers", 2)
	quorum := allow("approved by quorum")
	self := approval("agent-1")
	selfByName := pdp.Approval{ApproverID: "u-9", Name: "agent-1", Groups: []string{"approvers"}}
	runCases(t, newEngine(t, ""), []evalCase{
		{"quorum 2, one approval", call("delete_records", del, approval("alice")), deleteNeedsTwo},
		{"quorum 2, two distinct", call("delete_records", del, approval("alice"), approval("bob")), quorum},
		{"quorum 2, same approver twice", call("delete_records", del, approval("alice"), approval("alice")), deleteNeedsTwo},
		{"quorum 2, requester counted out", call("delete_records", del, approval("alice"), self), deleteNeedsTwo},
		{"quorum 2, requester by name counted out", call("delete_records", del, approval("alice"), selfByName), deleteNeedsTwo},
		{"quorum 2, one outside group", call("delete_records", del, approval("alice"), approval("eve", "interns")), deleteNeedsTwo},
		{"quorum 2, empty approver id", call("delete_records", del, approval("alice"), pdp.Approval{Name: "bob", Groups: []string{"approvers"}}), deleteNeedsTwo},
		{"quorum 2, three approvals", call("delete_records", del, approval("alice"), approval("bob"), self), quorum},
		{"quorum 1, one approval", call("deploy_service", `{"environment":"production"}`, approval("alice")), quorum},
		{"quorum 1, requester only", call("deploy_service", `{"environment":"production"}`, self), requestable("Deploying to production requires approval", 1)},
		{"transfer approved", call("transfer_funds", `{"amount":5000}`, approval("alice")), quorum},
		{"hard deny stays deny", call("transfer_funds", `{"amount":2000000}`, approval("alice"), approval("bob")), deny("Transfers over 1,000,000 are never allowed")},
		{"unknown tool stays deny", call("drop_database", `{}`, approval("alice"), approval("bob")), deny("tool is not allowed by policy")},
	})
}

// customPolicy exercises data files in subdirectories, the approvals helper,
// optional decision fields, TTL capping and the evaluation time.
const customPolicy = `package countersign.authz

import data.countersign.approvals

decision := approvals.resolve(base)

base := {
	"effect": "requestable",
	"reason": "payments need finance",
	"approver_group": data.teams.finance.group,
	"quorum": 1,
	"approval_ttl_seconds": 30 * 86400,
	"authenticator_class": "cross-platform",
	"slack_channel": "#payments",
} if input.resource.id == "pay"

base := {"effect": "allow", "reason": sprintf("now=%d", [time.now_ns()])} if input.resource.id == "clock"
`

func TestCustomPolicyDir(t *testing.T) {
	helper, err := os.ReadFile("policy/approvals.rego")
	if err != nil {
		t.Fatal(err)
	}
	dir := writePolicy(t, map[string]string{
		"authz.rego":              customPolicy,
		"lib/approvals.rego":      string(helper),
		"teams/finance/data.json": `{"group": "finance"}`,
		"teams/other.json":        `{"ops": {"group": "ops"}}`,
	})
	e, err := pdp.New(context.Background(), pdp.Options{Dir: dir, MaxApprovalTTL: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	pay := pdp.Decision{
		Effect:             pdp.EffectRequestable,
		Reason:             "payments need finance",
		ApproverGroup:      "finance",
		Quorum:             1,
		ApprovalTTL:        48 * time.Hour, // 30 days asked, capped
		AuthenticatorClass: pdp.AuthenticatorCrossPlatform,
		SlackChannel:       "#payments",
	}
	now := call("clock", `{}`).Context.Time
	runCases(t, e, []evalCase{
		{"requestable with all fields", call("pay", `{}`), pay},
		{"approver from other group", call("pay", `{}`, approval("alice")), pay},
		{"approved by finance", call("pay", `{}`, approval("fred", "finance")), allow("approved by quorum")},
		{"time.now_ns is context time", call("clock", `{}`), allow("now=" + itoa(now.UnixNano()))},
		{"undefined means deny", call("other", `{}`), deny(pdp.ReasonUndefined)},
	})
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

func TestMalformedDecisions(t *testing.T) {
	// Each case is a decision object, picked by tool name from data.
	cases := map[string]json.RawMessage{
		"unknown_effect":     json.RawMessage(`{"effect": "maybe", "reason": "x"}`),
		"missing_effect":     json.RawMessage(`{"reason": "x"}`),
		"no_group":           json.RawMessage(`{"effect": "requestable", "quorum": 1, "approval_ttl_seconds": 60}`),
		"in_band_group":      json.RawMessage(`{"effect": "requestable", "approver_group": "in-band", "quorum": 1, "approval_ttl_seconds": 60}`),
		"quorum_zero":        json.RawMessage(`{"effect": "requestable", "approver_group": "a", "quorum": 0, "approval_ttl_seconds": 60}`),
		"quorum_fraction":    json.RawMessage(`{"effect": "requestable", "approver_group": "a", "quorum": 1.5, "approval_ttl_seconds": 60}`),
		"ttl_zero":           json.RawMessage(`{"effect": "requestable", "approver_group": "a", "quorum": 1, "approval_ttl_seconds": 0}`),
		"ttl_string":         json.RawMessage(`{"effect": "requestable", "approver_group": "a", "quorum": 1, "approval_ttl_seconds": "60"}`),
		"bad_authenticator":  json.RawMessage(`{"effect": "requestable", "approver_group": "a", "quorum": 1, "approval_ttl_seconds": 60, "authenticator_class": "usb"}`),
		"bad_slack_channel":  json.RawMessage(`{"effect": "requestable", "approver_group": "a", "quorum": 1, "approval_ttl_seconds": 60, "slack_channel": 7}`),
		"reason_not_string":  json.RawMessage(`{"effect": "allow", "reason": 7}`),
		"not_an_object":      json.RawMessage(`"allow"`),
		"ok_minimal":         json.RawMessage(`{"effect": "requestable", "approver_group": "a", "quorum": 3, "approval_ttl_seconds": 60}`),
		"ok_huge_ttl":        json.RawMessage(`{"effect": "requestable", "approver_group": "a", "quorum": 1, "approval_ttl_seconds": 1e30}`),
		"ok_max_int64_ttl":   json.RawMessage(`{"effect": "requestable", "approver_group": "a", "quorum": 1, "approval_ttl_seconds": 9223372036854775807}`),
		"ok_float_quorum":    json.RawMessage(`{"effect": "requestable", "approver_group": "a", "quorum": 2.0, "approval_ttl_seconds": 60}`),
		"ok_allow_no_reason": json.RawMessage(`{"effect": "allow"}`),
		"verify_default":     json.RawMessage(`{"effect": "verify", "reason": "v"}`),
		"verify_platform":    json.RawMessage(`{"effect": "verify", "reason": "v", "authenticator_class": "platform"}`),
		"verify_bad_class":   json.RawMessage(`{"effect": "verify", "reason": "v", "authenticator_class": "usb"}`),
		"verify_class_num":   json.RawMessage(`{"effect": "verify", "reason": "v", "authenticator_class": 1}`),
	}
	data, err := json.Marshal(map[string]any{"cases": cases})
	if err != nil {
		t.Fatal(err)
	}
	dir := writePolicy(t, map[string]string{
		"p.rego":    "package countersign.authz\n\ndecision := data.cases[input.resource.id]\n",
		"data.json": string(data),
	})
	e := newEngine(t, dir)

	malformed := func(why string) pdp.Decision { return deny("malformed policy decision: " + why) }
	ok := func(quorum int, ttl time.Duration) pdp.Decision {
		return pdp.Decision{Effect: pdp.EffectRequestable, ApproverGroup: "a", Quorum: quorum, ApprovalTTL: ttl, AuthenticatorClass: pdp.AuthenticatorPlatform}
	}
	runCases(t, e, []evalCase{
		{"unknown effect", call("unknown_effect", `{}`), malformed(`unknown effect "maybe"`)},
		{"missing effect", call("missing_effect", `{}`), malformed("effect must be a non-empty string")},
		{"no group", call("no_group", `{}`), malformed("approver_group must be a non-empty string")},
		{"in-band group", call("in_band_group", `{}`), malformed(`approver_group "in-band" is the group of in-band enrolled passkeys, which any agent can join; name a group of approvers`)},
		{"quorum zero", call("quorum_zero", `{}`), malformed("quorum must be an integer ≥ 1")},
		{"quorum fraction", call("quorum_fraction", `{}`), malformed("quorum must be an integer ≥ 1")},
		{"ttl zero", call("ttl_zero", `{}`), malformed("approval_ttl_seconds must be an integer ≥ 1")},
		{"ttl string", call("ttl_string", `{}`), malformed("approval_ttl_seconds must be an integer ≥ 1")},
		{"bad authenticator", call("bad_authenticator", `{}`), malformed(`unknown authenticator_class "usb"`)},
		{"bad slack channel", call("bad_slack_channel", `{}`), malformed("slack_channel must be a string")},
		{"reason not string", call("reason_not_string", `{}`), malformed("reason must be a string")},
		{"not an object", call("not_an_object", `{}`), malformed("decision is not an object")},
		{"minimal requestable", call("ok_minimal", `{}`), ok(3, time.Minute)},
		{"max int64 ttl capped", call("ok_max_int64_ttl", `{}`), ok(1, pdp.DefaultMaxApprovalTTL)},
		{"ttl beyond int64 capped", call("ok_huge_ttl", `{}`), ok(1, pdp.DefaultMaxApprovalTTL)},
		{"integral float quorum", call("ok_float_quorum", `{}`), ok(2, time.Minute)},
		{"allow without reason", call("ok_allow_no_reason", `{}`), allow("")},
		{"verify defaults to cross-platform", call("verify_default", `{}`), pdp.Decision{Effect: pdp.EffectVerify, Reason: "v", AuthenticatorClass: pdp.AuthenticatorCrossPlatform}},
		{"verify platform", call("verify_platform", `{}`), pdp.Decision{Effect: pdp.EffectVerify, Reason: "v", AuthenticatorClass: pdp.AuthenticatorPlatform}},
		{"verify unknown class", call("verify_bad_class", `{}`), malformed(`unknown authenticator_class "usb"`)},
		{"verify class not a string", call("verify_class_num", `{}`), malformed("authenticator_class must be a string")},
		{"undefined", call("nothing", `{}`), deny(pdp.ReasonUndefined)},
	})
}

func TestEvaluateErrors(t *testing.T) {
	dir := writePolicy(t, map[string]string{"p.rego": `package countersign.authz

decision := {"effect": "allow"} if input.resource.id == "both"
decision := {"effect": "deny"} if input.resource.id == "both"
`})
	e := newEngine(t, dir)
	if _, err := e.Evaluate(context.Background(), call("both", `{}`)); err == nil {
		t.Error("conflicting outputs: want an error")
	}
	for _, args := range []string{`[1,2]`, `"x"`, `null`, `{"a":`} {
		if _, err := e.Evaluate(context.Background(), call("x", args)); !errors.Is(err, pdp.ErrInvalidInput) {
			t.Errorf("arguments %s: got %v, want ErrInvalidInput", args, err)
		}
	}
}

// TestBuiltinErrorDenies: a built-in function that fails at run time on the
// caller's arguments is an evaluation error (so the call is denied), not an
// undefined expression that quietly drops the rule it sits in. Otherwise an
// agent could send an amount to_number cannot parse, skip the deny rule and
// fall through to the policy's default allow.
func TestBuiltinErrorDenies(t *testing.T) {
	dir := writePolicy(t, map[string]string{"p.rego": `package countersign.authz

default decision := {"effect": "allow", "reason": "small amounts are allowed"}

decision := {"effect": "deny", "reason": "over 1000"} if to_number(input.context.arguments.amount) > 1000
`})
	e := newEngine(t, dir)
	runCases(t, e, []evalCase{
		{"parsed, small", call("x", `{"amount": "5"}`), allow("small amounts are allowed")},
		{"parsed, large", call("x", `{"amount": "5000"}`), deny("over 1000")},
	})
	for _, amount := range []string{`"5e3x"`, `"0x2000"`, `"1,000,000"`} {
		d, err := e.Evaluate(context.Background(), call("x", `{"amount": `+amount+`}`))
		if err == nil || !strings.Contains(err.Error(), "to_number") {
			t.Errorf("amount %s: got %+v, %v; want an evaluation error naming to_number", amount, d, err)
		}
	}
}

// TestEvalTimeout: an evaluation that runs past Options.EvalTimeout (here
// a rule that tries ten billion pairs, as a policy walking an agent's
// arguments could) is stopped at the deadline and is an error, which every
// caller treats as deny; the engine then still evaluates the next call.
func TestEvalTimeout(t *testing.T) {
	dir := writePolicy(t, map[string]string{"p.rego": `package countersign.authz

default decision := {"effect": "allow", "reason": "quick"}

decision := {"effect": "deny", "reason": "slow"} if {
	input.context.arguments.slow
	some i in numbers.range(1, 100000)
	some j in numbers.range(1, 100000)
	i * j < 0
}
`})
	e, err := pdp.New(context.Background(), pdp.Options{Dir: dir, EvalTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	d, err := e.Evaluate(ctx, call("x", `{"slow": true}`))
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "--policy-timeout") {
		t.Fatalf("got %+v, %v; want the evaluation timeout", d, err)
	}
	if took > 5*time.Second {
		t.Fatalf("the evaluation was stopped after %v, want about 200ms", took)
	}
	runCases(t, e, []evalCase{{"after a timeout", call("x", `{"slow": false}`), allow("quick")}})
}

func TestNewErrors(t *testing.T) {
	tests := []struct {
		name    string
		files   map[string]string
		want    string // substring of the error
		wantErr error
	}{
		{
			name:  "syntax error",
			files: map[string]string{"ok.rego": "package countersign.authz\n\ndecision := {}\n", "sub/broken.rego": "package countersign.authz\n\nx := )\n\ny := 1\n"},
			want:  filepath.Join("sub", "broken.rego") + ":3",
		},
		{
			name:  "unsafe variable",
			files: map[string]string{"unsafe.rego": "package countersign.authz\n\ndecision := {\"effect\": y}\n"},
			want:  "unsafe.rego:3",
		},
		{
			name:  "unknown import",
			files: map[string]string{"p.rego": "package countersign.authz\n\nimport data.countersign.approvals\n\ndecision := approvals.resolve({})\n"},
			want:  "p.rego:5: rego_type_error: undefined function data.countersign.approvals.resolve (copy pdp/policy/approvals.rego into the policy directory too)",
		},
		{
			name:  "no decision rule",
			files: map[string]string{"p.rego": "package countersign.authz\n\ndecisions := {}\n"},
			want:  "defines no data.countersign.authz.decision rule",
		},
		{
			name:    "no rego files",
			files:   map[string]string{"data.json": `{}`, "p_test.rego": "package countersign.authz_test\n", ".hidden/p.rego": "package countersign.authz\n\ndecision := {}\n"},
			wantErr: pdp.ErrNoPolicy,
		},
		{
			name:  "bad json",
			files: map[string]string{"p.rego": "package countersign.authz\n\ndecision := {}\n", "conf/data.json": `[1]`},
			want:  filepath.Join("conf", "data.json"),
		},
		{
			name:  "conflicting data",
			files: map[string]string{"p.rego": "package countersign.authz\n\ndecision := {}\n", "a.json": `{"k": 1}`, "b.json": `{"k": 2}`},
			want:  `data key "k" is defined twice`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := pdp.New(context.Background(), pdp.Options{Dir: writePolicy(t, tt.files)})
			if err == nil {
				t.Fatal("New: want an error")
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("New: got %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New: got %q, want it to contain %q", err, tt.want)
			}
		})
	}
	t.Run("missing dir", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "nope")
		_, err := pdp.New(context.Background(), pdp.Options{Dir: dir})
		if err == nil || !strings.Contains(err.Error(), "stat "+dir+": no such file or directory") {
			t.Errorf("New: %v, want an error naming %s", err, dir)
		}
	})
	t.Run("a file, not a dir", func(t *testing.T) {
		dir := writePolicy(t, map[string]string{"p.rego": "package countersign.authz\n\ndecision := {}\n"})
		file := filepath.Join(dir, "p.rego")
		_, err := pdp.New(context.Background(), pdp.Options{Dir: file})
		if err == nil || !strings.Contains(err.Error(), file+" is not a directory") {
			t.Errorf("New: %v, want an error saying %s is not a directory", err, file)
		}
	})
}

func TestVersion(t *testing.T) {
	shape := regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	embedded1, embedded2 := newEngine(t, ""), newEngine(t, "")
	if v := embedded1.Version(); !shape.MatchString(v) || v != embedded2.Version() {
		t.Errorf("embedded versions %q, %q: want equal sha256:<hex>", v, embedded2.Version())
	}

	files := map[string]string{
		"p.rego":    "package countersign.authz\n\ndecision := {\"effect\": \"allow\"}\n",
		"data.json": `{"limit": 1}`,
	}
	base := newEngine(t, writePolicy(t, files)).Version()
	if again := newEngine(t, writePolicy(t, files)).Version(); again != base {
		t.Errorf("same content in another dir: %s, want %s", again, base)
	}
	changed := func(rel, content string) string {
		m := map[string]string{}
		for k, v := range files {
			m[k] = v
		}
		m[rel] = content
		return newEngine(t, writePolicy(t, m)).Version()
	}
	if v := changed("p.rego", files["p.rego"]+"# comment\n"); v == base {
		t.Error("rego change kept the version")
	}
	if v := changed("data.json", `{"limit": 2}`); v == base {
		t.Error("data change kept the version")
	}
	if v := changed("p_test.rego", "package countersign.authz_test\n"); v != base {
		t.Error("adding a _test.rego file changed the version")
	}

	e := newEngine(t, "")
	d, err := e.Evaluate(context.Background(), call("list_transfers", `{}`))
	if err != nil || d.PolicyVersion != e.Version() {
		t.Errorf("decision version %q (%v), want %q", d.PolicyVersion, err, e.Version())
	}
}

// TestExamples evaluates the JSON inputs in testdata, which also show the
// wire shape of an Input.
func TestExamples(t *testing.T) {
	b, err := os.ReadFile("testdata/inputs.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Examples []struct {
			Name  string     `json:"name"`
			Want  pdp.Effect `json:"want"`
			Input pdp.Input  `json:"input"`
		} `json:"examples"`
	}
	if err := json.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, "")
	for _, ex := range file.Examples {
		t.Run(ex.Name, func(t *testing.T) {
			got, err := e.Evaluate(context.Background(), ex.Input)
			if err != nil {
				t.Fatal(err)
			}
			if got.Effect != ex.Want {
				t.Errorf("effect %q (%s), want %q", got.Effect, got.Reason, ex.Want)
			}
		})
	}
}

func TestConcurrentEvaluate(t *testing.T) {
	e := newEngine(t, "")
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			in := call("delete_records", `{"table":"t"}`, approval("alice"), approval("bob"))
			if i%2 == 0 {
				in = call("delete_records", `{"table":"t"}`)
			}
			for range 50 {
				d, err := e.Evaluate(context.Background(), in)
				if err != nil || (d.Effect == pdp.EffectAllow) != (i%2 == 1) {
					t.Errorf("worker %d: %+v, %v", i, d, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func BenchmarkEvaluate(b *testing.B) {
	e := newEngine(b, "")
	ctx := context.Background()
	for _, bc := range []struct {
		name string
		in   pdp.Input
	}{
		{"allow", call("transfer_funds", `{"to":"acct-2","amount":250,"currency":"USD","memo":"lunch"}`)},
		{"requestable", call("delete_records", `{"table":"users","filter":"id > 0"}`)},
		{"reevaluate", call("delete_records", `{"table":"users","filter":"id > 0"}`, approval("alice"), approval("bob"))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.Evaluate(ctx, bc.in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("parallel", func(b *testing.B) {
		in := call("transfer_funds", `{"to":"acct-2","amount":5000,"currency":"USD"}`)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := e.Evaluate(ctx, in); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// TestTokenEffect: "token" is a decision of its own, with only a reason,
// and the issuance action is evaluated like any other input.
func TestTokenEffect(t *testing.T) {
	dir := writePolicy(t, map[string]string{"authz.rego": `package countersign.authz

decision := {"effect": "token", "reason": "refunds need a transaction token"} if {
	input.action.name == "tools/call"
	input.resource.id == "refund"
}

decision := {"effect": "allow", "reason": "agents may ask for refund tokens"} if {
	input.action.name == "transaction-token/issue"
	input.resource.id == "refund"
}
`})
	e := newEngine(t, dir)
	in := call("refund", `{"amount": 5}`)
	d, err := e.Evaluate(context.Background(), in)
	if err != nil || d.Effect != pdp.EffectToken || d.Reason != "refunds need a transaction token" || d.Quorum != 0 || d.PolicyVersion == "" {
		t.Fatalf("tools/call: %+v %v", d, err)
	}
	in.Action.Name = pdp.ActionIssueToken
	if d, err = e.Evaluate(context.Background(), in); err != nil || d.Effect != pdp.EffectAllow {
		t.Fatalf("issue: %+v %v", d, err)
	}
	in = call("other", `{}`)
	in.Action.Name = pdp.ActionIssueToken
	if d, err = e.Evaluate(context.Background(), in); err != nil || d.Effect != pdp.EffectDeny {
		t.Fatalf("issue for another tool: %+v %v", d, err)
	}
}

// readmeVerifyPolicy is the worked policy of the README's "In-band verified
// approval (SEP-2672)" section, verbatim.
const readmeVerifyPolicy = `package countersign.authz

import data.countersign.approvals

decision := approvals.resolve(base)

args := input.context.arguments

# Small trades run; large ones need the trader's own passkey, now; huge
# ones need two approvers from the risk desk.
base := {"effect": "allow", "reason": "small trade"} if {
	input.resource.id == "place_trade"
	args.quantity * args.limit <= 1000
} else := {"effect": "verify", "reason": "sign this trade with your passkey",
	"authenticator_class": "cross-platform"} if {
	input.resource.id == "place_trade"
	args.quantity * args.limit <= 1000000
} else := {"effect": "requestable", "reason": "very large trade", "approver_group": "risk",
	"quorum": 2, "approval_ttl_seconds": 3600} if {
	input.resource.id == "place_trade"
}

default base := {"effect": "deny", "reason": "not allowed"}
`

// TestReadmeVerifyPolicy compiles the README's worked policy and checks
// the three modes it picks for place_trade.
func TestReadmeVerifyPolicy(t *testing.T) {
	helper, err := os.ReadFile("policy/approvals.rego")
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, writePolicy(t, map[string]string{"authz.rego": readmeVerifyPolicy, "approvals.rego": string(helper)}))
	trade := func(qty, limit string) pdp.Input {
		return call("place_trade", `{"symbol":"AAPL","side":"buy","quantity":`+qty+`,"limit":`+limit+`}`)
	}
	runCases(t, e, []evalCase{
		{"small trade runs", trade("2", "150"), allow("small trade")},
		{"large trade is signed in-band", trade("100", "150"), pdp.Decision{Effect: pdp.EffectVerify, Reason: "sign this trade with your passkey", AuthenticatorClass: pdp.AuthenticatorCrossPlatform}},
		{"huge trade needs the risk desk", trade("100000", "150"), pdp.Decision{Effect: pdp.EffectRequestable, Reason: "very large trade", ApproverGroup: "risk", Quorum: 2, ApprovalTTL: time.Hour, AuthenticatorClass: pdp.AuthenticatorPlatform}},
		{"other tools denied", call("transfer_funds", `{}`), deny("not allowed")},
	})
}
