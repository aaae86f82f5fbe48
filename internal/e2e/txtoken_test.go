package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/internal/natsrv"
)

// tokenRego puts transfer_funds in the token mode and lets the dev agent
// obtain its own tokens for it.
const tokenRego = `package countersign.authz

decision := {"effect": "token", "reason": "transfers need a transaction token"} if {
	input.action.name == "tools/call"
	input.resource.id == "transfer_funds"
}

decision := {"effect": "allow", "reason": "the dev agent may ask"} if {
	input.action.name == "transaction-token/issue"
	input.resource.id == "transfer_funds"
	input.subject.id == "dev-agent"
}
`

// TestTransactionTokensTwoProcesses runs two Countersign processes (two
// `countersign dev` apps, each with its own Temporal, HTTP listener and
// audit key) on one NATS, with one server ID, as two replicas: a token
// issued by one verifies on the other; twenty calls racing one token on
// both run the transfer exactly once; an operator's token (admin API)
// works once; and every issuance and use is in the signed audit chains.
func TestTransactionTokensTwoProcesses(t *testing.T) {
	ns, err := natsrv.Start(natsrv.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	policy := t.TempDir()
	if err := os.WriteFile(filepath.Join(policy, "authz.rego"), []byte(tokenRego), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := app.Config{NATSURL: ns.URL(), ServerID: "countersign-e2e-tokens", PolicyDir: policy}
	a := devtest.Start(t, devtest.Options{Config: cfg})
	// The second process shares the first one's agent and admin tokens
	// (they live in the shared NATS; the files only say which they are).
	dirB := t.TempDir()
	for _, f := range []string{app.AgentTokenFile, app.AdminTokenFile} {
		if err := os.WriteFile(filepath.Join(dirB, f), []byte(devtest.ReadFile(t, filepath.Join(a.Dir, f))+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfgB := cfg
	cfgB.DataDir = dirB
	b := devtest.Start(t, devtest.Options{Config: cfgB})
	if a.App.Transactions == nil || b.App.Transactions == nil || a.App.Transactions.CurrentKeyID() != b.App.Transactions.CurrentKeyID() {
		t.Fatal("the two processes do not share one token key")
	}

	to := "acct-token-race"
	args := map[string]any{"to": to, "amount": 5000, "currency": "EUR"}
	var issued struct {
		Token string `json:"token"`
		JTI   string `json:"jti"`
	}
	r := b.Call2026(a.AgentToken, "countersign/transactionToken", "", map[string]any{"name": "transfer_funds", "arguments": args}, false)
	if r.Error != nil || json.Unmarshal(r.Result, &issued) != nil || issued.Token == "" {
		t.Fatalf("issue: HTTP %d %+v %s", r.HTTPStatus, r.Error, r.Result)
	}

	call := func(s *devtest.Stack, token string) (isError bool, errorType string) {
		r := s.Call2026(a.AgentToken, "tools/call", "transfer_funds",
			map[string]any{"name": "transfer_funds", "arguments": args, "_meta": map[string]any{"io.countersign/transaction-token": token}}, false)
		var res struct {
			IsError bool `json:"isError"`
			Meta    struct {
				Err struct {
					ErrorType string `json:"error_type"`
				} `json:"io.countersign/transaction-token-error"`
			} `json:"_meta"`
		}
		if r.Error != nil || json.Unmarshal(r.Result, &res) != nil {
			t.Errorf("tools/call: HTTP %d %+v %s", r.HTTPStatus, r.Error, r.Result)
			return true, ""
		}
		return res.IsError, res.Meta.Err.ErrorType
	}

	before := a.Transfers()
	var wg sync.WaitGroup
	var mu sync.Mutex
	ran, consumed := 0, 0
	for i := range 20 {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			isErr, typ := call(s, issued.Token)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case !isErr:
				ran++
			case typ == "token_consumed":
				consumed++
			default:
				t.Errorf("unexpected answer: isError %v, error_type %q", isErr, typ)
			}
		}()
	}
	wg.Wait()
	if ran != 1 || consumed != 19 {
		t.Fatalf("%d ran, %d token_consumed; want 1 and 19", ran, consumed)
	}
	if n := a.Transfers() - before; n != 1 {
		t.Fatalf("%d transfers, want 1", n)
	}

	// An operator's token, issued on process B for the dev agent, runs once
	// on process A.
	var op struct {
		Token string `json:"token"`
		JTI   string `json:"jti"`
	}
	args["to"] = "acct-token-admin"
	if st := b.HTTPJSON("POST", "/admin/v1/transaction-tokens", a.AdminToken, map[string]any{"principal": "dev-agent", "tool": "transfer_funds", "arguments": args}, &op); st != 201 || op.Token == "" {
		t.Fatalf("admin issue: HTTP %d", st)
	}
	if isErr, typ := call(a, op.Token); isErr {
		t.Fatalf("operator's token: %s", typ)
	}
	if isErr, typ := call(b, op.Token); !isErr || typ != "token_consumed" {
		t.Fatalf("operator's token replayed: %v %s", isErr, typ)
	}
	if n := a.Transfers() - before; n != 2 {
		t.Fatalf("%d transfers, want 2", n)
	}

	// A token that never verifies: rejected, audited in a chain of its own.
	if isErr, typ := call(b, "not-a-token"); !isErr || typ != "permission_denied" {
		t.Fatalf("garbage token: %v %s", isErr, typ)
	}
	if n := a.Transfers() - before; n != 2 {
		t.Fatalf("%d transfers, want 2", n)
	}

	// The audit chains, signed by the two processes' keys.
	var keys []byte
	for _, s := range []*devtest.Stack{a, b} {
		keys = append(keys, []byte(devtest.ReadFile(t, filepath.Join(s.Dir, app.AuditPubKeyFile))+"\n")...)
	}
	pubs, err := audit.ParsePublicKeys(keys)
	if err != nil {
		t.Fatal(err)
	}
	// The whole export verifies offline, as `countersign audit verify` does.
	var export [][]byte
	if err := a.App.Audit.Export(context.Background(), time.Time{}, func(line []byte) error {
		export = append(export, append([]byte(nil), line...))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rep := audit.Verify(export, pubs, audit.VerifyOptions{})
	lone := 0
	for _, v := range rep.Tasks {
		if strings.HasPrefix(v.TaskID, "txr_") {
			lone++
		}
	}
	if !rep.OK || lone != 1 {
		t.Fatalf("export: ok %v, %d lone rejections, %+v", rep.OK, lone, rep)
	}
	for _, jti := range []string{issued.JTI, op.JTI} {
		lines, err := a.App.Audit.Chain(context.Background(), jti)
		if err != nil {
			t.Fatal(err)
		}
		v, recs, err := audit.CheckChain(jti, lines, audit.CheckOptions{Keys: pubs})
		if err != nil || !v.OK {
			t.Fatalf("chain %s: %v %v", jti, err, v.Problems)
		}
		count := map[string]int{}
		for _, r := range recs {
			count[r.Kind]++
		}
		if count[audit.KindTokenIssued] != 1 || count[audit.KindTokenConsumed] != 1 || count[audit.KindTokenResult] != 1 || count[audit.KindTokenRejected] < 1 {
			t.Fatalf("chain %s kinds %v", jti, count)
		}
	}
}
