package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/tasks"
)

// TestRace is the concurrency test of issue 8: rounds of N valid passkey
// approvals, M invalid decisions and one tasks/cancel (or one valid passkey
// deny) released at the same instant against a real `countersign dev`,
// through the MCP endpoint, the approver API and the approval workflow.
// After each round every view of the task must tell the same story: the
// demo ledger's effects, 2026 tasks/get, 2025-11-25 tasks/result, the read
// model behind the approver page, the signed audit chain's outcome record
// and the offline verifier (what `countersign audit verify` runs).
//
// Knobs (environment):
//
//	COUNTERSIGN_RACE_ROUNDS    rounds per variant (default 3)
//	COUNTERSIGN_RACE_VARIANTS  comma-separated subset of cancel,deny,quorum2 (default all)
//	COUNTERSIGN_RACE_INVALID   invalid decision POSTs per round (default 15)
//
// The long run:
//
//	COUNTERSIGN_RACE_ROUNDS=100 go test ./internal/e2e -run TestRace -count=1 -timeout 30m -v
func TestRace(t *testing.T) {
	rounds := envIntDefault(t, "COUNTERSIGN_RACE_ROUNDS", 3)
	invalid := envIntDefault(t, "COUNTERSIGN_RACE_INVALID", 15)
	want := map[string]bool{"cancel": true, "deny": true, "quorum2": true, "plaincancel": true}
	if v := os.Getenv("COUNTERSIGN_RACE_VARIANTS"); v != "" {
		want = map[string]bool{}
		for _, name := range strings.Split(v, ",") {
			want[strings.TrimSpace(name)] = true
		}
	}

	s := startStack(t, "", 0)
	r := &racer{s: s, nonce: strconv.FormatInt(time.Now().UnixNano()%1e9, 36)}
	for i := range 20 {
		r.approvers = append(r.approvers, s.Enroll(fmt.Sprintf("approver-%02d", i+1), "approvers"))
	}
	r.denier = s.Enroll("frank", "approvers")
	r.outsider = s.Enroll("olga", "finance")
	keys, err := audit.ParsePublicKeys([]byte(readFile(t, filepath.Join(s.Dir, app.AuditPubKeyFile))))
	if err != nil {
		t.Fatal(err)
	}
	r.keys = keys
	r.init2025(t)

	variants := []raceVariant{
		// The attacker's and the busy team's round: five valid approvals of a
		// quorum-1 transfer, M invalid decisions and the agent's cancel.
		{name: "cancel", tool: "transfer_funds", quorum: 1, approvals: 5, invalid: invalid, ender: enderCancel},
		// The same with a sixth approver's valid passkey deny instead.
		{name: "deny", tool: "transfer_funds", quorum: 1, approvals: 5, invalid: invalid, ender: enderDeny},
		// Honest traffic only: twenty approvals of a quorum-2 delete and a cancel.
		{name: "quorum2", tool: "delete_records", quorum: 2, approvals: 20, invalid: 0, ender: enderCancel},
		// A client without tasks: its countersign_cancel tool call races
		// twenty approvals of a quorum-2 delete, and what the tool answered
		// (cancelled or not) must agree with every view.
		{name: "plaincancel", tool: "delete_records", quorum: 2, approvals: 20, invalid: 0, ender: enderPlainCancel},
	}
	var total, failed atomic.Int64
	views := map[string]string{} // task ID → the end tasks/get reported
	for _, v := range variants {
		if !want[v.name] {
			continue
		}
		t.Run(v.name, func(t *testing.T) {
			// The stack's helpers fail the test they are given: this one.
			st := *r.s.Stack
			st.T = t
			r := *r
			r.s = &stack{&st}
			tally := map[string]int{}
			bad := 0
			start := time.Now()
			for round := range rounds {
				out := r.round(t, v, round)
				total.Add(1)
				if out.view != "" {
					views[out.taskID] = out.view
				}
				tally[out.view]++
				if len(out.problems) > 0 {
					bad++
					failed.Add(1)
					t.Errorf("round %d (%s, task %s): %d disagreement(s):\n  - %s\n  chain: %s",
						round, v.name, out.taskID, len(out.problems), strings.Join(out.problems, "\n  - "), out.chain)
				}
			}
			t.Logf("%s: %d rounds in %v, %d with disagreements; outcomes %v", v.name, rounds, time.Since(start).Round(time.Millisecond), bad, tally)
		})
	}
	r.checkExport(t, views)
	t.Logf("TestRace: %d rounds, %d with disagreements", total.Load(), failed.Load())
}

// roundStall bounds the time a round's burst of requests may take; rounds
// take 0.1 to 0.5 s on a loaded 2-core machine.
const roundStall = 15 * time.Second

type ender int

const (
	enderCancel ender = iota
	enderDeny
	// enderPlainCancel is the countersign_cancel tool of a client
	// without tasks.
	enderPlainCancel
)

type raceVariant struct {
	name      string
	tool      string
	quorum    int
	approvals int // valid approvals sent in each round
	invalid   int
	ender     ender
}

type racer struct {
	s         *stack
	approvers []*approver
	denier    *approver
	outsider  *approver
	keys      []ed25519.PublicKey
	nonce     string
}

// raceHTTP sends the round's requests; it keeps enough idle connections for
// a round so that the burst does not wait on connection setup.
var raceHTTP = &http.Client{
	Timeout:   60 * time.Second,
	Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second},
}

// httpAnswer is one request's outcome; err is a transport failure.
type httpAnswer struct {
	code int
	body []byte
	err  error
}

func send(c *http.Client, req *http.Request) httpAnswer {
	resp, err := c.Do(req)
	if err != nil {
		return httpAnswer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b = lastDataLine(b)
	}
	return httpAnswer{code: resp.StatusCode, body: b, err: err}
}

func lastDataLine(raw []byte) []byte {
	var last []byte
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		if d, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:")); ok {
			last = append([]byte(nil), bytes.TrimSpace(d)...)
		}
	}
	return last
}

var raceRPCID atomic.Int64

// mcpRequest builds a JSON-RPC POST to /mcp in the given era: 2026-07-28
// (stateless, per-request _meta declaring the tasks extension) or
// 2025-11-25 (Mcp-Protocol-Version header after an initialize).
func mcpRequest(base, token string, era tasks.Era, method, name string, params map[string]any) *http.Request {
	p := map[string]any{}
	for k, v := range params {
		p[k] = v
	}
	if era == tasks.Era2026 {
		p["_meta"] = map[string]any{
			"io.modelcontextprotocol/protocolVersion":    string(tasks.Era2026),
			"io.modelcontextprotocol/clientCapabilities": map[string]any{"extensions": map[string]any{tasks.ExtTasks: map[string]any{}}},
			"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "e2e-race", "version": "1"},
		}
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": raceRPCID.Add(1), "method": method, "params": p})
	req, _ := http.NewRequest("POST", base+"/mcp", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", string(era))
	if era == tasks.Era2026 {
		req.Header.Set("Mcp-Method", method)
		if name != "" {
			req.Header.Set("Mcp-Name", name)
		}
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return req
}

// rpcAnswer decodes a JSON-RPC answer.
type rpcAnswer struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func decodeRPC(a httpAnswer) (rpcAnswer, error) {
	var r rpcAnswer
	if a.err != nil {
		return r, a.err
	}
	if err := json.Unmarshal(a.body, &r); err != nil {
		return r, fmt.Errorf("HTTP %d, undecodable %q", a.code, a.body)
	}
	return r, nil
}

// init2025 checks that the endpoint answers a 2025-11-25 initialize, as a
// client of that era starts (the handler is stateless: later requests only
// carry the Mcp-Protocol-Version header).
func (r *racer) init2025(t *testing.T) {
	t.Helper()
	a := send(raceHTTP, mcpRequest(r.s.Base, r.s.AgentToken, tasks.Era2025, "initialize", "", map[string]any{
		"protocolVersion": string(tasks.Era2025), "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "e2e-race-2025", "version": "1"}}))
	rpc, err := decodeRPC(a)
	if err != nil || rpc.Error != nil || !bytes.Contains(rpc.Result, []byte(tasks.Era2025)) {
		t.Fatalf("2025-11-25 initialize: %v %+v %s", err, rpc.Error, rpc.Result)
	}
}

// decisionBody is a decision POST's body.
func decisionBody(challengeID, decision string, resp json.RawMessage) []byte {
	b, _ := json.Marshal(map[string]any{"challengeId": challengeID, "decision": decision, "response": resp})
	return b
}

func (r *racer) decisionRequest(ref string, body []byte) *http.Request {
	req, _ := http.NewRequest("POST", r.s.Base+"/approver/v1/approvals/"+ref+"/decision", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	return req
}

// raceOp is one request of a round.
type raceOp struct {
	kind string // approve, deny, cancel, or the kind of invalid decision
	who  string // approver ID for decisions carrying a valid assertion
	key  string // the challenge ID of a valid decision (a replay shares it)
	req  *http.Request
	ans  httpAnswer
}

// roundOutcome is what a round found.
type roundOutcome struct {
	taskID   string
	view     string // the disposition tasks/get reports
	chain    string
	problems []string
}

func (r *racer) round(t *testing.T, v raceVariant, round int) (out roundOutcome) {
	t.Helper()
	s := r.s
	fail := func(format string, args ...any) { out.problems = append(out.problems, fmt.Sprintf(format, args...)) }

	var args map[string]any
	switch v.tool {
	case "transfer_funds":
		args = map[string]any{"to": fmt.Sprintf("acct-race-%s-%s-%d", r.nonce, v.name, round), "amount": 1001 + round, "currency": "USD"}
	default:
		args = map[string]any{"table": "race_" + v.name, "filter": fmt.Sprintf("batch = '%s-%d'", r.nonce, round)}
	}
	task := s.CreateTask(s.AgentToken, v.tool, args)
	out.taskID = task.TaskID
	ref := s.RefOf(task.TaskID)

	// Every approver fetches a challenge and signs before the barrier.
	type signed struct {
		a    *approver
		c    challenge
		resp json.RawMessage
	}
	var valid []signed
	for _, a := range r.approvers[:v.approvals] {
		c := s.Challenge(ref, "approve")
		valid = append(valid, signed{a, c, a.Sign(t, c)})
	}
	var ops []*raceOp
	for _, sg := range valid {
		ops = append(ops, &raceOp{kind: "approve", who: sg.a.ID, key: sg.c.ChallengeID, req: r.decisionRequest(ref, decisionBody(sg.c.ChallengeID, "approve", sg.resp))})
	}
	switch v.ender {
	case enderDeny:
		c := s.Challenge(ref, "deny")
		ops = append(ops, &raceOp{kind: "deny", who: r.denier.ID, key: c.ChallengeID, req: r.decisionRequest(ref, decisionBody(c.ChallengeID, "deny", r.denier.Sign(t, c)))})
	case enderCancel:
		era := tasks.Era2026
		if round%2 == 1 {
			era = tasks.Era2025 // its tasks/cancel says whether it cancelled
		}
		ops = append(ops, &raceOp{kind: "cancel-" + string(era), req: mcpRequest(s.Base, s.AgentToken, era, "tasks/cancel", task.TaskID, map[string]any{"taskId": task.TaskID})})
	case enderPlainCancel:
		era := tasks.Era2026
		if round%2 == 1 {
			era = tasks.Era2025
		}
		ops = append(ops, &raceOp{kind: "plaincancel", req: mcpRequest(s.Base, s.AgentToken, era, "tools/call", "countersign_cancel",
			map[string]any{"name": "countersign_cancel", "arguments": map[string]any{"taskId": task.TaskID}})})
	}
	// Invalid decisions, cycling through the kinds an attacker holding the
	// link (and sniffing the approvers' traffic) can send.
	for i := range v.invalid {
		sg := valid[i%len(valid)]
		switch i % 5 {
		case 0: // a flipped byte in a valid assertion's signature
			ops = append(ops, &raceOp{kind: "forged", req: r.decisionRequest(ref, decisionBody(sg.c.ChallengeID, "approve", testpasskey.FlipSignature(t, sg.resp)))})
		case 1: // a signed approval posted as a deny
			ops = append(ops, &raceOp{kind: "wrong-decision", req: r.decisionRequest(ref, decisionBody(sg.c.ChallengeID, "deny", sg.resp))})
		case 2: // an unknown challenge ID
			ops = append(ops, &raceOp{kind: "unknown-challenge", req: r.decisionRequest(ref, decisionBody(otherID(sg.c.ChallengeID), "approve", sg.resp))})
		case 3: // an approver outside the group signs an approver's challenge
			ops = append(ops, &raceOp{kind: "outsider", who: r.outsider.ID, req: r.decisionRequest(ref, decisionBody(sg.c.ChallengeID, "approve", r.outsider.Sign(t, sg.c)))})
		case 4: // a replay of a valid approval, byte for byte
			ops = append(ops, &raceOp{kind: "replay", who: sg.a.ID, key: sg.c.ChallengeID, req: r.decisionRequest(ref, decisionBody(sg.c.ChallengeID, "approve", sg.resp))})
		}
	}
	rand.Shuffle(len(ops), func(i, j int) { ops[i], ops[j] = ops[j], ops[i] })

	// Release everything at the same instant.
	barrier := make(chan struct{})
	var ready, wg sync.WaitGroup
	for _, op := range ops {
		ready.Add(1)
		wg.Go(func() {
			ready.Done()
			<-barrier
			op.ans = send(raceHTTP, op.req)
		})
	}
	ready.Wait()
	released := time.Now()
	close(barrier)
	wg.Wait()
	// Every request of the round is answered well within a second on this
	// machine. An answer that takes many seconds is a stalled task: its
	// approvers waited, then got a 503 (see tasks.Orchestrator).
	if took := time.Since(released); took > roundStall {
		fail("the round's %d requests took %v to be answered (a stall: the bound is %v)", len(ops), took.Round(time.Millisecond), roundStall)
	}

	// What the requests were told.
	// Approver ID → the decisions answered accepted. A byte-for-byte replay
	// is the same decision: it may be refused (challenge_consumed) or, if
	// retries are idempotent, get the same answer; it must not count twice.
	accepted := map[string]map[string]bool{}
	indeterminate := map[string]bool{}
	denyAccepted := false
	var cancel2025 *rpcAnswer
	var plainCancelled *bool // what countersign_cancel answered
	for _, op := range ops {
		switch {
		case op.kind == "plaincancel":
			rpc, err := decodeRPC(op.ans)
			var res struct {
				StructuredContent struct {
					Cancelled bool `json:"cancelled"`
				} `json:"structuredContent"`
			}
			switch {
			case err != nil:
				fail("countersign_cancel: %v", err)
			case rpc.Error != nil:
				fail("countersign_cancel answered an error: %d %s", rpc.Error.Code, rpc.Error.Message)
			case json.Unmarshal(rpc.Result, &res) != nil:
				fail("countersign_cancel: undecodable %s", rpc.Result)
			default:
				plainCancelled = &res.StructuredContent.Cancelled
			}
			continue
		case strings.HasPrefix(op.kind, "cancel"):
			rpc, err := decodeRPC(op.ans)
			if err != nil {
				fail("tasks/cancel: %v", err)
			} else if op.kind == "cancel-"+string(tasks.Era2025) {
				cancel2025 = &rpc
			} else if rpc.Error != nil {
				fail("2026 tasks/cancel answered an error: %d %s", rpc.Error.Code, rpc.Error.Message)
			}
			continue
		case op.ans.err != nil:
			fail("%s decision: transport error %v", op.kind, op.ans.err)
			indeterminate[op.who] = true
			continue
		}
		var d decisionResult
		json.Unmarshal(op.ans.body, &d)
		switch op.ans.code {
		case 200, 409, 422:
		default: // 5xx: the workflow may or may not have taken it
			indeterminate[op.who] = true
		}
		if !d.Accepted {
			continue
		}
		switch op.kind {
		case "approve", "replay", "deny":
			if accepted[op.who] == nil {
				accepted[op.who] = map[string]bool{}
			}
			accepted[op.who][op.key] = true
			denyAccepted = denyAccepted || op.kind == "deny"
		default:
			fail("invalid decision (%s) accepted: HTTP %d %s", op.kind, op.ans.code, op.ans.body)
		}
	}
	for who, keys := range accepted {
		if len(keys) > 1 {
			fail("approver %s had %d different decisions accepted", who, len(keys))
		}
	}
	acceptedApprovals := 0
	for who := range accepted {
		if who != r.denier.ID {
			acceptedApprovals++
		}
	}
	if acceptedApprovals > v.quorum {
		fail("%d approvals answered accepted, quorum %d", acceptedApprovals, v.quorum)
	}

	// 2026 tasks/get, once terminal.
	d, ok := r.waitTerminal(task.TaskID, 30*time.Second)
	if !ok {
		fail("task not terminal 30s after the round (status %s: %s)", d.Status, d.StatusMessage)
		return out
	}
	view := viewOf(d.Status, disposition(d))
	out.view = view

	// 2025-11-25 tasks/result.
	legacy := r.result2025(task.TaskID)
	if legacy != view {
		fail("tasks/get says %s, 2025 tasks/result says %s", view, legacy)
	}

	// The read model behind the approver page and the agent's views.
	rec, err := s.App.Store.Get(context.Background(), task.TaskID)
	if err != nil {
		fail("read model: %v", err)
	} else if rv := viewOf(rec.Status, rec.Disposition); rv != view {
		fail("tasks/get says %s, the read model record %s", view, rv)
	}
	rmDecisions := map[string]string{} // approver ID → decision
	rmApprovals := 0
	for _, e := range rec.Approvals {
		if prev, dup := rmDecisions[e.ApproverID]; dup && prev == e.Decision {
			fail("read model lists %s's %s twice", e.ApproverName, e.Decision)
		}
		rmDecisions[e.ApproverID] = e.Decision
		if e.Decision == tasks.DecisionApprove {
			rmApprovals++
		}
	}
	if rmApprovals > v.quorum {
		fail("read model counts %d approvals, quorum %d", rmApprovals, v.quorum)
	}
	steps := 0
	for _, e := range rec.Timeline {
		if m := ofRe.FindStringSubmatch(e.Detail); e.Kind == "approval" && m != nil {
			steps++
			if k, _ := strconv.Atoi(m[1]); k > v.quorum {
				fail("timeline: %q", e.Detail)
			}
		}
	}
	if steps > v.quorum {
		fail("timeline has %d approval steps, quorum %d", steps, v.quorum)
	}

	// The ledger: the effect happened once if and only if the task says it
	// ran.
	effects := r.effects(t, task.TaskID, v.tool)
	switch view {
	case string(tasks.ApprovedExecuted):
		if effects != 1 {
			fail("disposition %s but %d ledger effects", view, effects)
		}
	default:
		if effects != 0 {
			fail("the tool ran (%d ledger effects) but the task says %s", effects, view)
		}
	}
	if denyAccepted && view != string(tasks.DeniedNotExecuted) {
		fail("the deny was answered accepted but the task says %s", view)
	}
	if cancel2025 != nil {
		switch {
		case cancel2025.Error == nil && view != string(tasks.StatusCancelled):
			fail("2025 tasks/cancel answered %s but the task says %s", cancel2025.Result, view)
		case cancel2025.Error != nil && cancel2025.Error.Code == -32602 && view == string(tasks.StatusCancelled):
			fail("2025 tasks/cancel refused (%s) but the task says cancelled", cancel2025.Error.Message)
		}
	}

	if plainCancelled != nil && *plainCancelled != (view == string(tasks.StatusCancelled)) {
		fail("countersign_cancel answered cancelled=%t but the task says %s", *plainCancelled, view)
	}

	// The audit chain, as an auditor exports it, and the offline verifier.
	lines := r.chainLines(task.TaskID)
	ch := readChain(lines)
	out.chain = ch.summary()
	if !ch.sealed {
		fail("audit chain not sealed by an outcome record 10s after the task ended")
		return out
	}
	rep := audit.Verify(lines, r.keys, audit.VerifyOptions{})
	if len(rep.Tasks) != 1 {
		fail("verifier saw %d chains", len(rep.Tasks))
	} else {
		tv := rep.Tasks[0]
		if !rep.OK {
			fail("audit verify FAILED: %s", strings.Join(append(tv.Problems, rep.Problems...), "; "))
		}
		if n := unboundDecision(tv); n != "" {
			fail("%s", n)
		}
		if vv := viewOf(tasks.Status(tv.Status), tasks.Disposition(tv.Disposition)); vv != view {
			fail("tasks/get says %s, audit verify %s (verify ok=%t)", view, vv, rep.OK)
		}
		if tv.Approvals != rmApprovals {
			fail("audit verify counts %d approvals, the workflow (read model) %d", tv.Approvals, rmApprovals)
		}
	}
	if ov := viewOf(tasks.Status(ch.outcome.Status), tasks.Disposition(ch.outcome.Disposition)); ov != view {
		fail("tasks/get says %s, the audit outcome record %s", view, ov)
	}
	if tv := ch.terminalView(); tv != view {
		fail("tasks/get says %s, the audit chain's terminal record %q", view, ch.terminal)
	}
	if n := ch.acceptedApprovals(); n > v.quorum {
		fail("audit chain holds %d accepted approvals, quorum %d", n, v.quorum)
	}
	if n := ch.acceptedApprovals(); n != rmApprovals {
		fail("audit chain holds %d accepted approvals, the workflow (read model) counted %d", n, rmApprovals)
	}
	if n := len(ch.outcome.Approvals); n != len(ch.accepted) {
		fail("outcome record lists %d approvals, the chain holds %d accepted passkey decisions", n, len(ch.accepted))
	}
	auditDecisions := map[string]string{}
	for _, a := range ch.accepted {
		if prev, dup := auditDecisions[a.approverID]; dup && prev == a.decision {
			fail("audit chain holds %s's accepted %s twice", a.approverID, a.decision)
		}
		auditDecisions[a.approverID] = a.decision
		if a.afterClaim {
			fail("accepted %s by %s recorded after the claim", a.decision, a.approverID)
		}
	}
	if !mapsEqual(auditDecisions, rmDecisions) {
		fail("accepted decisions: audit chain %v, read model %v", auditDecisions, rmDecisions)
	}
	for who := range auditDecisions {
		if len(accepted[who]) == 0 && !indeterminate[who] {
			fail("audit chain holds an accepted decision by %s, whose POSTs were all answered not accepted", who)
		}
	}
	for who := range accepted {
		if _, ok := auditDecisions[who]; !ok {
			fail("%s's decision was answered accepted but the audit chain has no accepted decision by them", who)
		}
	}
	if ch.claimed {
		if ch.terminal == audit.KindCancelled {
			fail("the chain has a claim but ends cancelled")
		}
		if ch.approvalsBeforeClaim < v.quorum {
			fail("claimed with %d accepted approvals before the claim, quorum %d", ch.approvalsBeforeClaim, v.quorum)
		}
	} else if effects != 0 {
		fail("the tool ran but the chain has no claim")
	}
	return out
}

var ofRe = regexp.MustCompile(`\((\d+) of (\d+)\)`)

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// otherID changes the last character of a challenge ID.
func otherID(id string) string {
	if id == "" {
		return "x"
	}
	last := id[len(id)-1]
	repl := byte('A')
	if last == 'A' {
		repl = 'B'
	}
	return id[:len(id)-1] + string(repl)
}

// viewOf names a task's end the way all views can be compared: the
// disposition of a completed task, else the status.
func viewOf(st tasks.Status, d tasks.Disposition) string {
	if st == tasks.StatusCompleted {
		return string(d)
	}
	return string(st)
}

// waitTerminal polls 2026 tasks/get until the task is terminal.
func (r *racer) waitTerminal(taskID string, within time.Duration) (devtest.DetailedTask, bool) {
	deadline := time.Now().Add(within)
	for {
		d, rpc := r.s.GetTask(r.s.AgentToken, taskID)
		if rpc.Error == nil && d.Status.Terminal() {
			return d, true
		}
		if time.Now().After(deadline) {
			return d, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// result2025 calls 2025-11-25 tasks/result and names the end it reports.
func (r *racer) result2025(taskID string) string {
	a := send(raceHTTP, mcpRequest(r.s.Base, r.s.AgentToken, tasks.Era2025, "tasks/result", "", map[string]any{"taskId": taskID}))
	rpc, err := decodeRPC(a)
	switch {
	case err != nil:
		return "unreadable: " + err.Error()
	case rpc.Error != nil:
		return string(tasks.StatusFailed) // a failed task's stored JSON-RPC error
	}
	if d := tasks.DispositionOf(rpc.Result); d != "" {
		return string(d)
	}
	var res struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	json.Unmarshal(rpc.Result, &res)
	for _, c := range res.Content {
		// Today: "[cancelled] The call to T was cancelled before it ran.
		// It did NOT run."
		if strings.Contains(strings.ToLower(c.Text), "cancelled") {
			return string(tasks.StatusCancelled)
		}
	}
	return "unrecognized: " + string(rpc.Result)
}

// effects counts the task's effects in the demo ledger; for transfers it
// also asks list_transfers, as an agent would, and both must agree.
func (r *racer) effects(t *testing.T, taskID, tool string) int {
	t.Helper()
	entries, err := r.s.App.Ledger.Entries(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if e.Key == taskID {
			n++
		}
	}
	if tool == "transfer_funds" {
		if m := listTransfers(t, raceHTTP, r.s.Base, r.s.AgentToken, taskID); m != n {
			t.Errorf("task %s: list_transfers shows %d transfers, the ledger %d", taskID, m, n)
		}
	}
	return n
}

// listTransfers counts the transfers list_transfers reports for taskID.
func listTransfers(t *testing.T, c *http.Client, base, token, taskID string) int {
	t.Helper()
	a := send(c, mcpRequest(base, token, tasks.Era2026, "tools/call", "list_transfers", map[string]any{"name": "list_transfers", "arguments": map[string]any{}}))
	rpc, err := decodeRPC(a)
	if err != nil || rpc.Error != nil {
		t.Fatalf("list_transfers: %v %+v", err, rpc.Error)
	}
	var res struct {
		StructuredContent struct {
			Transfers []struct {
				ID string `json:"id"`
			} `json:"transfers"`
		} `json:"structuredContent"`
	}
	if err := json.Unmarshal(rpc.Result, &res); err != nil {
		t.Fatalf("list_transfers: %v: %s", err, rpc.Result)
	}
	n := 0
	for _, tr := range res.StructuredContent.Transfers {
		if tr.ID == taskID {
			n++
		}
	}
	return n
}

// chainLines returns the task's audit chain through the admin API (what
// `countersign audit show TASK --json` prints: the records exactly as
// signed), waiting up to 10 s for it to be sealed by its outcome record.
// The whole export, as an auditor gets it, is verified once at the end of
// the test (checkExport).
func (r *racer) chainLines(taskID string) [][]byte {
	deadline := time.Now().Add(10 * time.Second)
	for {
		lines := showChain(r.s.T, raceHTTP, r.s.Base, r.s.AdminToken, taskID)
		if readChain(lines).sealed || time.Now().After(deadline) {
			return lines
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// showChain fetches GET /admin/v1/audit/{taskId}; nil when there is none.
// The records are JSON objects inside a JSON answer; none of the race's
// arguments holds a character Go's encoder would escape (<, >, &), so they
// are the signed lines byte for byte.
func showChain(t testing.TB, c *http.Client, base, adminToken, taskID string) [][]byte {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/admin/v1/audit/"+taskID, nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	a := send(c, req)
	if a.err == nil && a.code == http.StatusNotFound {
		return nil
	}
	var show struct {
		Records []json.RawMessage `json:"records"`
	}
	if a.err != nil || a.code != 200 || json.Unmarshal(a.body, &show) != nil {
		t.Errorf("audit show %s: HTTP %d %v %.200s", taskID, a.code, a.err, a.body)
		return nil
	}
	out := make([][]byte, len(show.Records))
	for i, rec := range show.Records {
		out[i] = rec
	}
	return out
}

// checkExport exports the whole audit log as `countersign audit export`
// does, verifies it as `countersign audit verify` does, and checks that each
// race task's verdict there names the end tasks/get reported.
func (r *racer) checkExport(t *testing.T, views map[string]string) {
	t.Helper()
	req, _ := http.NewRequest("GET", r.s.Base+"/admin/v1/audit", nil)
	req.Header.Set("Authorization", "Bearer "+r.s.AdminToken)
	a := send(raceHTTP, req)
	if a.err != nil || a.code != 200 {
		t.Errorf("audit export of %d race tasks: HTTP %d %v %.200s", len(views), a.code, a.err, a.body)
		return
	}
	rep, err := audit.VerifyReader(bytes.NewReader(a.body), r.keys, audit.VerifyOptions{AllowIncomplete: true})
	if err != nil {
		t.Errorf("audit export: %v", err)
		return
	}
	seen := 0
	for _, tv := range rep.Tasks {
		want, ok := views[tv.TaskID]
		if !ok {
			continue
		}
		seen++
		if got := viewOf(tasks.Status(tv.Status), tasks.Disposition(tv.Disposition)); got != want || !tv.OK {
			t.Errorf("export: task %s: tasks/get says %s, `audit verify` of the export says %s (ok=%t) %s", tv.TaskID, want, got, tv.OK, strings.Join(tv.Problems, "; "))
		}
	}
	if seen != len(views) {
		t.Errorf("export holds %d of the %d race tasks", seen, len(views))
	}
	t.Logf("export: %d records, %d chains, %d race tasks checked", bytes.Count(a.body, []byte("\n")), len(rep.Tasks), seen)
}

// chainFacts is what the race checks read from one task's audit chain.
type chainFacts struct {
	kinds                []string
	sealed               bool
	claimed              bool
	terminal             string
	outcome              audit.Outcome
	accepted             []acceptedDecision
	approvalsBeforeClaim int
}

type acceptedDecision struct {
	approverID, decision string
	afterClaim           bool
}

func readChain(lines [][]byte) chainFacts {
	var f chainFacts
	for _, l := range lines {
		var rec audit.Record
		if err := json.Unmarshal(l, &rec); err != nil {
			f.kinds = append(f.kinds, "unreadable")
			continue
		}
		kind := rec.Kind
		switch {
		case rec.Kind == audit.KindDecision:
			var d audit.Decision
			json.Unmarshal(rec.Body, &d)
			if d.Accepted {
				who := ""
				switch {
				case d.Approval != nil:
					who = d.Approval.ApproverID
					kind = fmt.Sprintf("decision(%s✓ %s)", d.Decision, d.Approval.ApproverName)
				case d.Unsigned != nil:
					who = d.Unsigned.ApproverID
					kind = fmt.Sprintf("decision(%s✓ %s unsigned)", d.Decision, d.Unsigned.ApproverName)
				}
				f.accepted = append(f.accepted, acceptedDecision{approverID: who, decision: d.Decision, afterClaim: f.claimed})
				if d.Decision == tasks.DecisionApprove && !f.claimed {
					f.approvalsBeforeClaim++
				}
			} else {
				kind = "decision(✗ " + d.Reason + ")"
			}
		case rec.Kind == audit.KindClaimed:
			f.claimed = true
		case rec.Kind == audit.KindOutcome:
			f.sealed = true
			json.Unmarshal(rec.Body, &f.outcome)
		case audit.IsTerminalKind(rec.Kind):
			f.terminal = rec.Kind
		}
		f.kinds = append(f.kinds, kind)
	}
	return f
}

// acceptedApprovals counts distinct approvers with an accepted approval.
func (f chainFacts) acceptedApprovals() int {
	var seen []string
	for _, a := range f.accepted {
		if a.decision == tasks.DecisionApprove && !slices.Contains(seen, a.approverID) {
			seen = append(seen, a.approverID)
		}
	}
	return len(seen)
}

// terminalView names the chain's terminal record the way viewOf does.
func (f chainFacts) terminalView() string {
	switch f.terminal {
	case audit.KindExecuted:
		return string(tasks.ApprovedExecuted)
	case audit.KindExecutionError:
		return string(tasks.ExecutionError)
	case audit.KindOutcomeUnknown:
		return string(tasks.OutcomeUnknown)
	case audit.KindDenied, audit.KindExpired:
		return string(tasks.DeniedNotExecuted)
	case audit.KindCancelled:
		return string(tasks.StatusCancelled)
	case audit.KindFailed:
		return string(tasks.StatusFailed)
	}
	return "none"
}

// summary lists the chain's steps, rejected decisions folded into a count.
func (f chainFacts) summary() string {
	var out []string
	rejected := 0
	flush := func() {
		if rejected > 0 {
			out = append(out, fmt.Sprintf("%d rejected decisions", rejected))
			rejected = 0
		}
	}
	for _, k := range f.kinds {
		if strings.HasPrefix(k, "decision(✗") {
			rejected++
			continue
		}
		flush()
		out = append(out, k)
	}
	flush()
	return strings.Join(out, ", ")
}

func envIntDefault(t testing.TB, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a non-negative integer", name, v)
	}
	return n
}
