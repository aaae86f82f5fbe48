package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/tasks"
)

// unboundDecision returns the verifier's note on an approver's assertion
// that does not show which decision it was made for, or "": every
// challenge Countersign issues for a decision binds it
// (canon.DecisionNonce).
func unboundDecision(v audit.TaskVerdict) string {
	for _, n := range v.Notes {
		if strings.Contains(n, "does not show which decision") {
			return n
		}
	}
	return ""
}

// exportAudit fetches GET /admin/v1/audit as JSON Lines.
func (s *stack) exportAudit(token string) (int, [][]byte) {
	s.T.Helper()
	req, _ := http.NewRequest("GET", s.Base+"/admin/v1/audit", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.T.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		s.T.Errorf("export content type %q", ct)
	}
	return resp.StatusCode, bytes.Split(bytes.TrimSpace(b), []byte("\n"))
}

func TestAuditExportVerifiesOfflineAndTamperingFails(t *testing.T) {
	s := startStack(t, "", 0)
	alice := s.Enroll("alice", "approvers")
	bob := s.Enroll("bob", "approvers")

	// One executed task (with a rejected decision on the way), one denied,
	// one cancelled.
	executed := s.CreateTask(s.AgentToken, "transfer_funds", transferArgs)
	ref := s.RefOf(executed.TaskID)
	c := s.Challenge(ref, "approve")
	if r := s.Decide(ref, c, "approve", testpasskey.FlipSignature(t, alice.Sign(t, c))); r.Accepted {
		t.Fatalf("forged assertion accepted: %+v", r)
	}
	if r := s.Approve(alice, ref, "approve"); !r.Accepted {
		t.Fatalf("approval rejected: %+v", r)
	}
	d := s.WaitTerminal(s.AgentToken, executed.TaskID)
	if disposition(d) != tasks.ApprovedExecuted {
		t.Fatalf("disposition %s", disposition(d))
	}
	var receipt audit.Receipt
	raw, _ := json.Marshal(metaOf(t, d.Result)[audit.MetaKey])
	if err := json.Unmarshal(raw, &receipt); err != nil || receipt.Hash == "" || receipt.Signature == "" || receipt.KeyID == "" ||
		!strings.HasPrefix(receipt.RecordRef, executed.TaskID+"/") {
		t.Fatalf("result _meta[%s] = %s", audit.MetaKey, raw)
	}

	denied := s.CreateTask(s.AgentToken, "transfer_funds", transferArgs2())
	if r := s.Approve(bob, s.RefOf(denied.TaskID), "deny"); !r.Accepted {
		t.Fatalf("deny rejected: %+v", r)
	}
	if d := s.WaitTerminal(s.AgentToken, denied.TaskID); disposition(d) != tasks.DeniedNotExecuted {
		t.Fatalf("denied task: %s", disposition(d))
	}

	// The admin API needs the admin token.
	if code, _ := s.exportAudit(s.AgentToken); code != http.StatusUnauthorized {
		t.Fatalf("export with the agent token: HTTP %d", code)
	}
	var show struct {
		Records []json.RawMessage `json:"records"`
	}
	if code := s.HTTPJSON("GET", "/admin/v1/audit/"+executed.TaskID, s.AdminToken, nil, &show); code != 200 || len(show.Records) < 6 {
		t.Fatalf("show: HTTP %d, %d records", code, len(show.Records))
	}
	if code := s.HTTPJSON("GET", "/admin/v1/audit/tsk_nosuchtask", s.AdminToken, nil, nil); code != http.StatusNotFound {
		t.Fatalf("show unknown task: HTTP %d", code)
	}
	if code := s.HTTPJSON("GET", "/admin/v1/audit?since=yesterday", s.AdminToken, nil, nil); code != http.StatusBadRequest {
		t.Fatalf("export with a bad since: HTTP %d", code)
	}

	code, lines := s.exportAudit(s.AdminToken)
	if code != http.StatusOK {
		t.Fatalf("export: HTTP %d", code)
	}
	keys, err := audit.ParsePublicKeys([]byte(readFile(t, filepath.Join(s.Dir, app.AuditPubKeyFile))))
	if err != nil {
		t.Fatal(err)
	}
	rep := audit.Verify(lines, keys, audit.VerifyOptions{})
	chains := map[string]int{}
	for _, v := range rep.Tasks {
		chains[audit.ChainKindOf(v.TaskID)]++
	}
	// The two tasks, and the admin chains of dev's agent and the two
	// approvers, who were recorded from their creation on.
	if !rep.OK || chains[audit.ChainTask] != 2 || chains[audit.ChainAdmin] != 3 || len(rep.Tasks) != 5 {
		b, _ := json.MarshalIndent(rep, "", "  ")
		t.Fatalf("export does not verify offline:\n%s", b)
	}
	var aliceChain []string
	for _, l := range lines {
		var r struct {
			TaskID string            `json:"taskId"`
			Body   audit.AdminAction `json:"body"`
		}
		json.Unmarshal(l, &r)
		if r.TaskID == "admin-approver-"+alice.ID {
			aliceChain = append(aliceChain, r.Body.Action+" "+r.Body.Target.Type+" by "+r.Body.By)
		}
	}
	if want := []string{"create approver by admin:admin", "invite approver by admin:admin", "enroll passkey by approver:" + alice.ID}; !slices.Equal(aliceChain, want) {
		t.Errorf("alice's admin chain %q, want %q", aliceChain, want)
	}
	byTask := map[string]audit.TaskVerdict{}
	for _, v := range rep.Tasks {
		byTask[v.TaskID] = v
		if n := unboundDecision(v); n != "" {
			t.Errorf("task %s: %s", v.TaskID, n)
		}
	}
	if v := byTask[executed.TaskID]; v.Disposition != "approved-executed" || v.Approvals != 1 || !v.Complete {
		t.Fatalf("executed task verdict: %+v", v)
	}
	if v := byTask[denied.TaskID]; v.Disposition != "denied-not-executed" {
		t.Fatalf("denied task verdict: %+v", v)
	}
	// The receipt is the outcome record of the export.
	found := false
	var kinds []string
	for _, l := range lines {
		var r audit.Record
		json.Unmarshal(l, &r)
		if r.TaskID == executed.TaskID && r.Kind != audit.KindNotified {
			kinds = append(kinds, r.Kind) // notified races the decisions
		}
		if audit.Hash(l) == receipt.Hash && r.Kind == audit.KindOutcome && r.Sig == receipt.Signature {
			found = true
		}
	}
	if !found {
		t.Error("the result's receipt is not the outcome record in the export")
	}
	want := "requested decision decision reevaluated claimed executed outcome"
	if got := strings.Join(kinds, " "); got != want {
		t.Errorf("steps of the executed task:\n got %s\nwant %s", got, want)
	}

	// Tampering: raise the amount in the recorded arguments; drop the
	// approval; both fail verification.
	tampered := make([][]byte, len(lines))
	copy(tampered, lines)
	for i, l := range tampered {
		if bytes.Contains(l, []byte(`"amount":50000`)) {
			tampered[i] = bytes.Replace(l, []byte(`"amount":50000`), []byte(`"amount":90000`), 1)
			break
		}
	}
	if audit.Verify(tampered, keys, audit.VerifyOptions{}).OK {
		t.Fatal("export with a changed amount verifies")
	}
	var dropped [][]byte
	for _, l := range lines {
		if !bytes.Contains(l, []byte(`"accepted":true`)) || !bytes.Contains(l, []byte(executed.TaskID)) {
			dropped = append(dropped, l)
		}
	}
	if len(dropped) != len(lines)-1 || audit.Verify(dropped, keys, audit.VerifyOptions{}).OK {
		t.Fatal("export without the approval verifies")
	}
	// Written to a file, as an auditor gets it, it verifies the same way.
	f := filepath.Join(t.TempDir(), "audit.jsonl")
	if err := os.WriteFile(f, append(bytes.Join(lines, []byte("\n")), '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	fh, _ := os.Open(f)
	defer fh.Close()
	if rep, err := audit.VerifyReader(fh, keys, audit.VerifyOptions{}); err != nil || !rep.OK {
		t.Fatalf("file verify: %v %+v", err, rep)
	}
}

func transferArgs2() map[string]any {
	return map[string]any{"to": "acct-2", "amount": 7777, "currency": "USD"}
}
