package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/descope/virtualwebauthn"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/internal/testnats"
	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/tasks"
)

// TestVerifiedInBandTwoProcesses runs SEP-2672 in-band approval against two
// real countersign dev processes sharing one NATS (the second uses the
// first's, with the same server ID, as replicas do): a passkey enrolled on
// one works on the other, a signed place_trade sent to both at once runs
// exactly once (the rest are challenge_consumed), and the audit chain of
// the call that ran holds the approval with its assertion and verifies
// offline.
func TestVerifiedInBandTwoProcesses(t *testing.T) {
	serverID := "e2e-verified-" + strings.ReplaceAll(t.Name(), "/", "-")
	_, nc := testnats.Start(t)
	a := startStackConfig(t, app.Config{ServerID: serverID, NATSURL: nc.ConnectedUrl()}, 0)
	// The second process shares the first's tokens (they live in NATS; the
	// files only name them), as a replica does.
	bDir := t.TempDir()
	for _, f := range []string{app.AgentTokenFile, app.AdminTokenFile} {
		if err := os.WriteFile(filepath.Join(bDir, f), []byte(readFile(t, filepath.Join(a.Dir, f))), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b := startStackConfig(t, app.Config{DataDir: bDir, ServerID: serverID, NATSURL: nc.ConnectedUrl()}, 0)
	rp := virtualwebauthn.RelyingParty{ID: "localhost", Name: "Countersign", Origin: app.DevVerifiedOrigin}

	// In-band enrollment through a.
	r := a.Call2026(a.AgentToken, "approval/enroll/begin", "", nil, false)
	if r.Error != nil {
		t.Fatalf("enroll/begin: %+v", r.Error)
	}
	var begin struct {
		Options json.RawMessage `json:"options"`
	}
	json.Unmarshal(r.Result, &begin)
	opts, err := virtualwebauthn.ParseAttestationOptions(string(begin.Options))
	if err != nil {
		t.Fatal(err)
	}
	auth := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(opts.UserID)})
	cred := testpasskey.NewEC2Credential()
	var att map[string]any
	json.Unmarshal([]byte(virtualwebauthn.CreateAttestationResponse(rp, auth, cred, *opts)), &att)
	att["response"].(map[string]any)["transports"] = []string{"hybrid", "internal"}
	if r := a.Call2026(a.AgentToken, "approval/enroll/finish", "", map[string]any{"response": att}, false); r.Error != nil {
		t.Fatalf("enroll/finish: %+v", r.Error)
	}
	auth.AddCredential(cred)

	args := map[string]any{"symbol": "MSFT", "side": "sell", "quantity": 7, "limit": 412.5}
	r = b.Call2026(b.AgentToken, "approval/challenge/create", "", map[string]any{"toolName": "place_trade", "arguments": args}, false)
	if r.Error != nil {
		t.Fatalf("challenge/create on the other process: %+v", r.Error)
	}
	var env struct {
		ChallengeID    string `json:"challengeId"`
		DisplayText    string `json:"displayText"`
		RequestOptions struct {
			Challenge string `json:"challenge"`
		} `json:"requestOptions"`
	}
	json.Unmarshal(r.Result, &env)
	if env.DisplayText != "Sell 7 MSFT at $412.5" {
		t.Errorf("displayText %q", env.DisplayText)
	}
	challenge, _ := base64.RawURLEncoding.DecodeString(env.RequestOptions.Challenge)
	cred.Counter++
	var assertion map[string]any
	json.Unmarshal([]byte(virtualwebauthn.CreateAssertionResponse(rp, auth, cred, virtualwebauthn.AssertionOptions{Challenge: challenge, RelyingPartyID: "localhost"})), &assertion)
	evidence := map[string]any{"io.modelcontextprotocol/verified-approval": map[string]any{"method": "webauthn", "challengeId": env.ChallengeID, "response": assertion}}

	var wg sync.WaitGroup
	results := make([]devtest.RPCResponse, 6)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := a
			if i%2 == 1 {
				s = b
			}
			meta := map[string]any{}
			for k, v := range evidence {
				meta[k] = v
			}
			results[i] = s.Call2026(s.AgentToken, "tools/call", "place_trade", map[string]any{"name": "place_trade", "arguments": args, "_meta": meta}, false)
		}()
	}
	wg.Wait()
	var ran *devtest.RPCResponse
	for i := range results {
		r := results[i]
		if r.Error == nil {
			if ran != nil {
				t.Fatalf("two calls ran: %s and %s", ran.Result, r.Result)
			}
			ran = &results[i]
			continue
		}
		if r.Error.Code != -32001 || !bytes.Contains(r.Error.Data, []byte(`"challenge_consumed"`)) {
			t.Fatalf("loser answered %+v", r.Error)
		}
	}
	if ran == nil {
		t.Fatal("no call ran")
	}
	var res struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		IsError bool           `json:"isError"`
		Meta    map[string]any `json:"_meta"`
	}
	json.Unmarshal(ran.Result, &res)
	if res.IsError || len(res.Content) != 2 || !strings.HasPrefix(res.Content[1].Text, "Placed sell 7 MSFT @ 412.5 (id ") ||
		res.Meta[tasks.MetaDisposition] != string(tasks.ApprovedExecuted) {
		t.Fatalf("result %s", ran.Result)
	}
	entries, err := a.App.Ledger.Entries(context.Background(), "trade")
	if err != nil || len(entries) != 1 {
		t.Fatalf("ledger trades = %d (%v), want 1", len(entries), err)
	}
	related, _ := res.Meta[tasks.MetaRelatedTask].(map[string]any)
	taskID, _ := related["taskId"].(string)
	if taskID == "" {
		t.Fatalf("no related task in %s", ran.Result)
	}

	// The audit chain: the same steps as an approved task, the approval
	// with its assertion, and it verifies offline.
	code, lines := a.exportAudit(a.AdminToken)
	if code != 200 {
		t.Fatalf("export: HTTP %d", code)
	}
	var kinds []string
	var chain [][]byte
	withAssertion := false
	for _, l := range lines {
		var rec audit.Record
		json.Unmarshal(l, &rec)
		if rec.TaskID != taskID {
			continue
		}
		chain = append(chain, l)
		kinds = append(kinds, rec.Kind)
		if rec.Kind == audit.KindDecision && bytes.Contains(l, []byte(env.ChallengeID)) && bytes.Contains(l, []byte(`"clientDataJSON"`)) && bytes.Contains(l, []byte(`"signature"`)) {
			withAssertion = true
		}
	}
	if got, want := strings.Join(kinds, " "), "requested decision reevaluated claimed executed outcome"; got != want {
		t.Errorf("audit steps:\n got %s\nwant %s", got, want)
	}
	if !withAssertion {
		t.Error("the decision record lacks the assertion")
	}
	// Whichever process ran the call signed its records.
	keys, err := audit.ParsePublicKeys([]byte(readFile(t, a.Dir+"/"+app.AuditPubKeyFile) + "\n" + readFile(t, b.Dir+"/"+app.AuditPubKeyFile)))
	if err != nil {
		t.Fatal(err)
	}
	if rep := audit.Verify(chain, keys, audit.VerifyOptions{}); !rep.OK || len(rep.Tasks) != 1 || rep.Tasks[0].Approvals != 1 || unboundDecision(rep.Tasks[0]) != "" {
		out, _ := json.MarshalIndent(rep, "", "  ")
		t.Fatalf("audit does not verify, or its assertion shows no decision:\n%s", out)
	}
}
