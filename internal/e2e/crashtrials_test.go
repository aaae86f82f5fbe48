package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/descope/virtualwebauthn"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// TestCrashTrials kills `countersign dev` (SIGKILL) again and again while
// it holds, approves and runs gated calls, restarts it on the same data dir
// each time, and then checks that nothing was lost or done twice.
//
// The child is the real binary, built once by the test with
// `-tags crashpoints` (internal/app/crashpoints.go: a release build has no
// crash points). A trial is one death of the process. Trials alternate:
//
//   - a crash point: the child runs with one point of
//     activities.CrashPoints armed (decide: the approver's challenge
//     consumed, the decision not committed; claim: before the claim
//     commits; execute: between the claim and the tool; tool: the tool
//     acted, its result not reported; publish: an outbox batch half
//     written; record: the audit chain sealed, the terminal read model not
//     written), which kills it, with probability 1/2 at each pass, at the
//     first task that passes it; the points take turns. When the point is
//     not reached before the wave's tasks have ended, the parent kills the
//     child (a random kill);
//   - a random kill: the parent kills the child 0–800 ms after the wave
//     began.
//
// Each wave creates COUNTERSIGN_CRASH_WAVE new gated transfers (quorum 1)
// as an MCP client without tasks does, and approves them with a passkey as
// the approver's page does (page, challenge, signed decision); a request
// that got no answer is sent again, the same bytes, after the restart, and
// a challenge that died with the process is asked for again. After the last
// trial the child runs without crash points until every task has ended.
// Then, for every task (those the harness created and any other the audit
// log or the ledger names):
//
//   - exactly one terminal disposition: tasks/get is terminal, the approver
//     page shows the same end, the audit export holds one sealed chain
//     with one outcome record that names the same end;
//   - the tool ran at most once (the crash-point log counts ExecuteTool
//     attempts that reached the tool; the demo ledger itself is idempotent
//     and would hide a second call): once for approved-executed, never for
//     a task that ended otherwise than outcome-unknown;
//   - the ledger holds exactly one effect per approved-executed task, none
//     for a task that did not run, at most one for outcome-unknown; in
//     total, approved-executed plus the outcome-unknown tasks whose tool
//     acted before the crash;
//   - outcome-unknown only where a death came after the claim and before
//     the end;
//   - an approval the API answered accepted is in its task's chain, once,
//     and such a task ran (or ended outcome-unknown);
//
// and `countersign audit verify` accepts the whole export.
//
// Knobs (environment):
//
//	COUNTERSIGN_CRASH_TRIALS  deaths (default 30; docs/benchmarks.md has 1,000)
//	COUNTERSIGN_CRASH_WAVE    new calls per trial (default 3)
//	COUNTERSIGN_CRASH_BIN     a countersign binary built with -tags crashpoints,
//	                          instead of building one (batches of long runs)
func TestCrashTrials(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("inside the helper process")
	}
	trials := envIntDefault(t, "COUNTERSIGN_CRASH_TRIALS", 30)
	wave := max(1, envIntDefault(t, "COUNTERSIGN_CRASH_WAVE", 3))
	began := time.Now()
	h := newTrialHarness(t, crashTrialBinary(t))
	built := time.Since(began)
	defer func() { h.child.stop() }()

	var restarts []time.Duration
	for trial := 0; len(h.deaths) < trials; trial++ {
		var point activities.CrashPoint
		if trial%2 == 1 {
			point = activities.CrashPoints[(trial/2)%len(activities.CrashPoints)]
		}
		up := time.Now()
		h.restart(point)
		restarts = append(restarts, time.Since(up))
		if len(h.deaths) >= trials {
			break // it died while starting: that was the last trial
		}
		trialStart := time.Now()
		before := len(h.tasks)
		for range wave {
			h.tasks = append(h.tasks, h.newTask())
		}
		stopDriving := make(chan struct{})
		var wg sync.WaitGroup
		for _, tk := range h.tasks {
			if !tk.settled {
				wg.Add(1)
				go func() { defer wg.Done(); h.drive(tk, stopDriving) }()
			}
		}
		cause := ""
		if point != "" {
			select {
			case <-h.child.done:
				cause = "crash point " + string(point)
				if !h.firedSince(point, trialStart) {
					t.Errorf("trial %d: the child died, but not at crash point %s:\n%s", trial, point, tail(readChildLog(h.child), 4000))
					cause = "died by itself"
				}
			case <-h.allEnded(h.child.done):
				h.child.kill()
				cause = "kill (point " + string(point) + " not reached)"
			case <-time.After(30 * time.Second):
				h.child.kill()
				cause = "kill (point " + string(point) + " not reached in 30s)"
			}
		} else {
			delay := time.Duration(rand.Int64N(int64(randomKillWindow)))
			select {
			case <-h.child.done:
				t.Errorf("trial %d: a child without crash points died by itself:\n%s", trial, tail(readChildLog(h.child), 4000))
				cause = "died by itself"
			case <-time.After(delay):
				h.child.kill()
				cause = fmt.Sprintf("kill %v after the wave began", delay.Round(time.Millisecond))
			case <-h.allEnded(h.child.done):
				h.child.kill()
				cause = "kill once the wave had ended"
			}
		}
		close(stopDriving)
		h.deaths = append(h.deaths, death{at: time.Now(), cause: cause})
		wg.Wait()
		t.Logf("trial %d: %s; %d new calls, %d not yet approved; up in %v", trial, cause, len(h.tasks)-before, h.unsettled(), restarts[len(restarts)-1].Round(10*time.Millisecond))
	}
	h.restart("")
	killed := time.Now()

	// No more crashes. Every call gets its approval through, then every
	// task ends (a workflow task that died with the process resumes after
	// its timeout, a claimed call whose worker died ends outcome-unknown
	// after the heartbeat timeout, a Publish that died is retried after its
	// 30 s timeout).
	h.settleAll(45*time.Second, false)
	if h.unsettled() > 0 {
		// What is left is, normally, orphans: calls whose record was
		// created but whose workflow was never started (the process died
		// between the two). The client's repeated call joins such a record,
		// and no approver can decide it; the reconciler fails it (tasks
		// .Reconcile) at the next start once it is a minute old, or within
		// 5 minutes. Restart once it is.
		wait := time.Until(h.deaths[len(h.deaths)-1].at.Add(65 * time.Second))
		t.Logf("%d calls could not be approved; restarting in %v so that the reconciler ends the orphans among them", h.unsettled(), wait.Round(time.Second))
		time.Sleep(wait)
		h.restart("")
		h.settleAll(90*time.Second, true)
	}
	h.adoptPending()
	ended := h.waitEnded(4 * time.Minute)
	h.judge()

	t.Logf("TestCrashTrials: %d trials in %v (binary %v, %v to settle after the last); %d tasks; deaths %v; crash points fired %v; dispositions %v; %.2fs per trial; restart p50 %v max %v",
		len(h.deaths), time.Since(began).Round(time.Second), built.Round(time.Second), ended.Sub(killed).Round(time.Second),
		len(h.tasks), h.causes(), h.fired, h.histogram, (time.Since(began)-built).Seconds()/float64(len(h.deaths)),
		percentile(restarts, 0.5).Round(10*time.Millisecond), percentile(restarts, 1).Round(10*time.Millisecond))
}

// crashTrialBinary builds countersign with -tags crashpoints, once per
// test binary, or returns COUNTERSIGN_CRASH_BIN.
func crashTrialBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("COUNTERSIGN_CRASH_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "countersign")
	cmd := exec.Command("go", "build", "-tags", "crashpoints", "-o", bin, "github.com/countersign/countersign/cmd/countersign")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags crashpoints: %v\n%s", err, out)
	}
	return bin
}

// death is one end of the child process.
type death struct {
	at    time.Time
	cause string
}

// trialTask is one gated call and its approval, as the client and the
// approver see them. Only its driver goroutine touches it while a trial
// runs.
type trialTask struct {
	args   map[string]any
	taskID string
	ref    string
	// body is the signed decision, posted again unchanged while no answer
	// comes (the same request, the same update).
	body []byte
	// accepted: an answer said the decision was accepted; settled: the
	// approver is done (accepted, or the task is no longer pending).
	accepted bool
	settled  bool
	answers  []string
	problems []string
	adopted  bool // found by the judge, not made by the harness
}

type trialHarness struct {
	t        *testing.T
	bin      string
	dir      string
	port     int
	base     string
	pointLog string
	agent    string
	admin    string
	approver *devtest.Approver
	child    *crashChild
	hc       *http.Client
	nonce    string

	tasks     []*trialTask
	deaths    []death
	histogram map[string]int
	adopted   int // tasks the client never created or learned of
	fired     map[activities.CrashPoint]int
}

// randomKillWindow bounds a random kill's moment.
const randomKillWindow = 6 * time.Second

func newTrialHarness(t *testing.T, bin string) *trialHarness {
	tmp := t.TempDir()
	h := &trialHarness{t: t, bin: bin, dir: filepath.Join(tmp, "data"), port: devtest.FreePort(t),
		pointLog: filepath.Join(tmp, "crashpoints.log"),
		hc:       &http.Client{Timeout: 20 * time.Second}, nonce: fmt.Sprintf("%x", time.Now().UnixNano()%1e9)}
	h.base = fmt.Sprintf("http://localhost:%d", h.port)
	h.restart("")
	h.agent = readFile(t, filepath.Join(h.dir, app.AgentTokenFile))
	h.admin = readFile(t, filepath.Join(h.dir, app.AdminTokenFile))
	s := &devtest.Stack{T: t, Dir: h.dir, Port: h.port, Base: h.base, AgentToken: h.agent, AdminToken: h.admin}
	h.approver = s.Enroll("alice", "approvers")
	return h
}

// restart starts a child with point armed ("" for none) once the last one
// is gone (a running one is stopped gracefully), until one is up. A child
// that dies while starting (an armed point reached while recovering) is a
// death, and the next start is unarmed.
func (h *trialHarness) restart(point activities.CrashPoint) {
	h.t.Helper()
	if h.child != nil {
		h.child.stop()
	}
	for attempt := 1; ; attempt++ {
		spec := ""
		if point != "" {
			spec = string(point) + "=0.5"
		}
		cmd := exec.Command(h.bin, "dev", "--data-dir", h.dir, "--addr", fmt.Sprintf("127.0.0.1:%d", h.port),
			"--rate-per-minute", "1000000", "--rate-burst", "1000000", "--max-pending", "1000000",
			"--requests-per-second", "1000000", "--request-burst", "1000000", "--max-in-flight", "1000000")
		// The default ExecuteTool heartbeat timeout (30 s): a lower one
		// (COUNTERSIGN_CRASHPOINTS_HEARTBEAT) cut live calls short on a
		// heavily loaded machine (3 s: 3 of 90 calls ended outcome-unknown
		// with no death), which this test rightly counts as a failure.
		cmd.Env = append(os.Environ(), "COUNTERSIGN_CRASHPOINTS="+spec, "COUNTERSIGN_CRASHPOINTS_LOG="+h.pointLog,
			"COUNTERSIGN_CRASHPOINTS_HEARTBEAT=")
		c, err := runCrashChild(h.t, cmd, h.dir, h.port)
		if err == nil {
			h.child = c
			h.hc.CloseIdleConnections()
			return
		}
		if attempt == 10 {
			h.t.Fatalf("countersign dev does not start: %v", err)
		}
		h.deaths = append(h.deaths, death{at: time.Now(), cause: "crash point " + string(point) + " while starting"})
		h.t.Logf("died while starting (point %q): %.300s", point, err)
		point = ""
	}
}

// firedSince reports whether point fired after start.
func (h *trialHarness) firedSince(point activities.CrashPoint, start time.Time) bool {
	passes, _ := readPointLog(h.pointLog)
	for _, p := range passes {
		if p.fired && p.point == point && !p.at.Before(start) {
			return true
		}
	}
	return false
}

// readChildLog is what the child wrote so far.
func readChildLog(c *crashChild) []byte {
	b, _ := os.ReadFile(c.log)
	return b
}

func (h *trialHarness) causes() map[string]int {
	out := map[string]int{}
	for _, d := range h.deaths {
		c := d.cause
		if strings.HasPrefix(c, "kill ") && (strings.HasSuffix(c, "after the wave began") || strings.HasSuffix(c, "had ended")) {
			c = "random kill"
		}
		out[c]++
	}
	return out
}

func (h *trialHarness) newTask() *trialTask {
	n := len(h.tasks)
	return &trialTask{args: map[string]any{
		"to": fmt.Sprintf("acct-trial-%s-%d", h.nonce, n), "amount": 5000 + n, "currency": "USD"}} // over 1,000: approval
}

func (h *trialHarness) unsettled() int {
	n := 0
	for _, tk := range h.tasks {
		if !tk.settled {
			n++
		}
	}
	return n
}

// allEnded is closed once every task is terminal; it stops looking when
// stop is closed.
func (h *trialHarness) allEnded(stop <-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			open := false
			for _, tk := range h.tasks {
				if !tk.settledSnapshot() {
					open = true
					break
				}
			}
			if open {
				continue
			}
			for _, tk := range h.tasks {
				if d, err := h.getTask(tk.idSnapshot()); err != nil || !d.Status.Terminal() {
					open = true
					break
				}
			}
			if !open {
				close(done)
				return
			}
		}
	}()
	return done
}

// drive takes the task as far as it goes: the call, the challenge, the
// decision. A request without an answer (the process is dying) ends the
// attempt; the next trial sends it again.
func (h *trialHarness) drive(tk *trialTask, stop <-chan struct{}) {
	for i := 0; i < 200 && !tk.settledSnapshot(); i++ {
		select {
		case <-stop:
			return
		default:
		}
		if err := h.step(tk); err != nil {
			if n := len(tk.answers); n == 0 || tk.answers[n-1] != err.Error() {
				tk.answers = append(tk.answers, err.Error())
			}
			return
		}
	}
}

var trialMu sync.Mutex // guards trialTask fields read by allEnded

func (tk *trialTask) settledSnapshot() bool {
	trialMu.Lock()
	defer trialMu.Unlock()
	return tk.settled
}

func (tk *trialTask) idSnapshot() string {
	trialMu.Lock()
	defer trialMu.Unlock()
	return tk.taskID
}

func (tk *trialTask) set(f func()) {
	trialMu.Lock()
	defer trialMu.Unlock()
	f()
}

// step does the next thing the client or the approver would do.
func (h *trialHarness) step(tk *trialTask) error {
	if tk.taskID == "" {
		// An MCP client without tasks: the answer names the task and the
		// approver's page. Sent again after a lost answer, the same call
		// joins its pending task.
		a := send(h.hc, h.plainCall("transfer_funds", tk.args))
		rpc, err := decodeRPC(a)
		if err != nil || rpc.Error != nil || a.code != 200 {
			return fmt.Errorf("tools/call: %v %s", err, describe(a))
		}
		var res struct {
			StructuredContent struct {
				TaskID     string `json:"taskId"`
				ApproveURL string `json:"approveUrl"`
			} `json:"structuredContent"`
		}
		if json.Unmarshal(rpc.Result, &res) != nil || res.StructuredContent.TaskID == "" || res.StructuredContent.ApproveURL == "" {
			tk.problems = append(tk.problems, fmt.Sprintf("tools/call answered without a pending task: %s", rpc.Result))
			tk.set(func() { tk.settled = true })
			return fmt.Errorf("no task")
		}
		u := res.StructuredContent.ApproveURL
		tk.set(func() { tk.taskID, tk.ref = res.StructuredContent.TaskID, u[strings.LastIndexByte(u, '/')+1:] })
		return nil
	}
	if tk.body == nil {
		// The page asks for a challenge once it shows the request.
		var view struct {
			Status   string `json:"status"`
			Timeline []struct {
				Kind string `json:"kind"`
			} `json:"timeline"`
		}
		a := send(h.hc, h.request("GET", "/approver/v1/approvals/"+tk.ref, "", nil))
		if a.err != nil || a.code >= 500 {
			return fmt.Errorf("approval page: %s", describe(a))
		}
		if a.code == 200 && json.Unmarshal(a.body, &view) == nil && view.Status != "" && view.Status != string(tasks.ApprovalPending) {
			tk.answers = append(tk.answers, "page: "+view.Status)
			tk.set(func() { tk.settled = true }) // decided by an earlier post whose answer was lost
			return nil
		}
		requested := slices.ContainsFunc(view.Timeline, func(e struct {
			Kind string `json:"kind"`
		}) bool {
			return e.Kind == "requested"
		})
		if a.code != 200 || !requested {
			// Not shown yet, or never (an orphan the reconciler has
			// failed: its page may not exist).
			if d, err := h.getTask(tk.taskID); err == nil && d.Status.Terminal() {
				tk.answers = append(tk.answers, "task: "+string(d.Status))
				tk.set(func() { tk.settled = true })
				return nil
			}
			time.Sleep(100 * time.Millisecond)
			return nil
		}
		a = send(h.hc, h.request("POST", "/approver/v1/approvals/"+tk.ref+"/challenge", "", map[string]any{"decision": "approve"}))
		if a.err != nil || a.code >= 500 {
			return fmt.Errorf("challenge: %s", describe(a))
		}
		var ch devtest.Challenge
		if (a.code != 200 && a.code != 201) || json.Unmarshal(a.body, &ch) != nil || ch.ChallengeID == "" {
			tk.answers = append(tk.answers, "challenge: "+describe(a))
			time.Sleep(50 * time.Millisecond)
			return nil
		}
		resp, err := h.sign(ch)
		if err != nil {
			tk.problems = append(tk.problems, err.Error())
			tk.set(func() { tk.settled = true })
			return err
		}
		tk.body = decisionBody(ch.ChallengeID, "approve", resp)
		return nil
	}
	a := send(h.hc, h.request("POST", "/approver/v1/approvals/"+tk.ref+"/decision", "", json.RawMessage(tk.body)))
	if a.err != nil || a.code >= 500 {
		return fmt.Errorf("decision: %s", describe(a))
	}
	var r devtest.DecisionResult
	_ = json.Unmarshal(a.body, &r)
	tk.answers = append(tk.answers, describe(a))
	switch {
	case r.Accepted:
		tk.set(func() { tk.accepted, tk.settled = true, true })
	case r.Reason == tasks.ErrTypeTaskNotPending || r.Reason == passkey.ReasonChallengeConsumed || r.Reason == tasks.ReasonAlreadyApproved:
		tk.set(func() { tk.settled = true }) // the judge checks that the task counted it
	case r.Reason == passkey.ReasonChallengeExpired || r.Reason == passkey.ReasonChallengeUnknown:
		tk.body = nil // a new challenge, a new signature
	default:
		tk.problems = append(tk.problems, "decision answered "+describe(a))
		tk.set(func() { tk.settled = true })
	}
	return nil
}

// sign makes alice's assertion with her enrolment's signature counter, as
// authenticators without counters do (always 0): decisions of many tasks
// are in flight at once, in any order.
func (h *trialHarness) sign(c devtest.Challenge) (json.RawMessage, error) {
	opts, err := virtualwebauthn.ParseAssertionOptions(string(c.RequestOptions))
	if err != nil {
		return nil, fmt.Errorf("parse request options: %w", err)
	}
	a := h.approver
	return json.RawMessage(virtualwebauthn.CreateAssertionResponse(a.RP, a.Auth, a.Cred, *opts)), nil
}

func (h *trialHarness) request(method, path, token string, body any) *http.Request {
	var b []byte
	switch v := body.(type) {
	case nil:
	case json.RawMessage:
		b = v
	default:
		b, _ = json.Marshal(v)
	}
	req, _ := http.NewRequest(method, h.base+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return req
}

// plainCall is a 2026-07-28 tools/call from a client that does not declare
// the tasks extension.
func (h *trialHarness) plainCall(tool string, args map[string]any) *http.Request {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{
		"name": tool, "arguments": args,
		"_meta": map[string]any{
			"io.modelcontextprotocol/protocolVersion":    string(tasks.Era2026),
			"io.modelcontextprotocol/clientCapabilities": map[string]any{},
			"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "e2e-trials", "version": "1"},
		}}})
	req, _ := http.NewRequest("POST", h.base+"/mcp", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", string(tasks.Era2026))
	req.Header.Set("Mcp-Method", "tools/call")
	req.Header.Set("Mcp-Name", tool)
	req.Header.Set("Authorization", "Bearer "+h.agent)
	return req
}

// settleAll drives every unsettled task on a child without crash points;
// last reports those that are still not settled.
func (h *trialHarness) settleAll(within time.Duration, last bool) {
	deadline := time.Now().Add(within)
	for h.unsettled() > 0 && time.Now().Before(deadline) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for _, tk := range h.tasks {
			if !tk.settled {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sem <- struct{}{}
					defer func() { <-sem }()
					h.drive(tk, nil)
				}()
			}
		}
		wg.Wait()
		if h.unsettled() > 0 {
			time.Sleep(500 * time.Millisecond)
		}
	}
	for _, tk := range h.tasks {
		if !tk.settled && last {
			h.t.Errorf("task %s (%v): the approver could not get a decision through: %v", tk.taskID, tk.args["to"], tk.answers)
		}
	}
}

// adoptPending approves pending tasks the harness does not know (none is
// expected: a call sent again joins its pending task), so that every task
// ends and is judged.
func (h *trialHarness) adoptPending() {
	var list []struct {
		Ref    string `json:"ref"`
		TaskID string `json:"taskId"`
	}
	a := send(h.hc, h.request("GET", "/admin/v1/approvals?status=pending", h.admin, nil))
	if a.err != nil || a.code != 200 || json.Unmarshal(a.body, &list) != nil {
		h.t.Errorf("pending approvals: %s", describe(a))
		return
	}
	known := map[string]bool{}
	for _, tk := range h.tasks {
		known[tk.taskID] = true
	}
	for _, p := range list {
		if !known[p.TaskID] {
			h.t.Logf("adopting pending task %s the client never learned of", p.TaskID)
			tk := &trialTask{taskID: p.TaskID, ref: p.Ref, adopted: true}
			h.tasks = append(h.tasks, tk)
			h.drive(tk, nil)
		}
	}
}

// waitEnded polls tasks/get until every task is terminal.
func (h *trialHarness) waitEnded(within time.Duration) time.Time {
	deadline := time.Now().Add(within)
	for {
		open := 0
		for _, tk := range h.tasks {
			if tk.taskID == "" {
				continue
			}
			if d, err := h.getTask(tk.taskID); err != nil || !d.Status.Terminal() {
				open++
			}
		}
		if open == 0 {
			return time.Now()
		}
		if time.Now().After(deadline) {
			h.t.Errorf("%d tasks not ended %v after the last crash", open, within)
			return time.Now()
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (h *trialHarness) getTask(id string) (devtest.DetailedTask, error) {
	var d devtest.DetailedTask
	if id == "" {
		return d, fmt.Errorf("no task yet")
	}
	rpc, err := decodeRPC(send(h.hc, mcpRequest(h.base, h.agent, tasks.Era2026, "tasks/get", id, map[string]any{"taskId": id})))
	if err != nil {
		return d, err
	}
	if rpc.Error != nil {
		return d, fmt.Errorf("tasks/get %s: %d %s", id, rpc.Error.Code, rpc.Error.Message)
	}
	return d, json.Unmarshal(rpc.Result, &d)
}

// pointPass is one line of the crash-point log.
type pointPass struct {
	at     time.Time
	point  activities.CrashPoint
	taskID string
	fired  bool
}

// readPointLog reads the crash-point log (internal/app/crashpoints.go).
func readPointLog(path string) ([]pointPass, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []pointPass
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 4 {
			return nil, fmt.Errorf("crash-point log line %q", sc.Text())
		}
		ns, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("crash-point log line %q", sc.Text())
		}
		out = append(out, pointPass{at: time.Unix(0, ns), point: activities.CrashPoint(fields[1]), taskID: fields[2], fired: fields[3] == "fired"})
	}
	return out, sc.Err()
}

// judge checks the invariants of the test's doc comment.
func (h *trialHarness) judge() {
	t := h.t
	h.histogram = map[string]int{}
	passes, err := readPointLog(h.pointLog)
	if err != nil {
		t.Fatalf("the crash-point log (is %s a -tags crashpoints build?): %v", h.bin, err)
	}
	toolCalls := map[string]int{}
	fired := map[string][]activities.CrashPoint{}
	h.fired = map[activities.CrashPoint]int{}
	for _, p := range passes {
		if p.point == activities.CrashExecute && !p.fired {
			toolCalls[p.taskID]++ // passed the point right before the tool
		}
		if p.fired {
			fired[p.taskID] = append(fired[p.taskID], p.point)
			h.fired[p.point]++
		}
	}
	// The ledger.
	effects := map[string]int{}
	{
		a := send(h.hc, mcpRequest(h.base, h.agent, tasks.Era2026, "tools/call", "list_transfers", map[string]any{"name": "list_transfers", "arguments": map[string]any{}}))
		rpc, err := decodeRPC(a)
		var res struct {
			StructuredContent struct {
				Transfers []struct {
					ID string `json:"id"`
				} `json:"transfers"`
			} `json:"structuredContent"`
		}
		if err != nil || rpc.Error != nil || json.Unmarshal(rpc.Result, &res) != nil {
			t.Fatalf("list_transfers: %v %s", err, describe(a))
		}
		for _, tr := range res.StructuredContent.Transfers {
			effects[tr.ID]++
		}
	}
	// The audit export, verified by `countersign audit verify` and read.
	a := send(h.hc, h.request("GET", "/admin/v1/audit", h.admin, nil))
	if a.err != nil || a.code != 200 {
		t.Fatalf("audit export: %s", describe(a))
	}
	exportFile := filepath.Join(t.TempDir(), "audit.jsonl")
	if err := os.WriteFile(exportFile, a.body, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(h.bin, "audit", "verify", exportFile, "--key", filepath.Join(h.dir, app.AuditPubKeyFile)).CombinedOutput(); err != nil {
		t.Errorf("countersign audit verify: %v\n%s", err, tail(out, 4000))
	}
	keys, err := audit.ParsePublicKeys([]byte(readFile(t, filepath.Join(h.dir, app.AuditPubKeyFile))))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := audit.VerifyReader(bytes.NewReader(a.body), keys, audit.VerifyOptions{})
	if err != nil {
		t.Fatalf("audit export: %v", err)
	}
	if !rep.OK {
		t.Errorf("the audit export does not verify: %s", verifyProblems(rep))
	}
	chains := map[string][][]byte{}
	for l := range bytes.SplitSeq(bytes.TrimSpace(a.body), []byte("\n")) {
		var rec audit.Record
		if json.Unmarshal(l, &rec) == nil && rec.TaskID != "" {
			chains[rec.TaskID] = append(chains[rec.TaskID], l)
		}
	}
	verdicts := map[string]audit.TaskVerdict{}
	for _, tv := range rep.Tasks {
		verdicts[tv.TaskID] = tv
	}
	// Every task anything names is judged.
	known := map[string]bool{}
	for _, tk := range h.tasks {
		known[tk.taskID] = true
	}
	for _, ids := range []map[string]int{effects, toolCalls} {
		for id := range ids {
			if !known[id] {
				known[id] = true
				h.tasks = append(h.tasks, &trialTask{taskID: id, adopted: true})
			}
		}
	}
	for id := range chains {
		if !known[id] && strings.HasPrefix(id, "tsk_") {
			known[id] = true
			h.tasks = append(h.tasks, &trialTask{taskID: id, adopted: true})
		}
	}

	executed, unknownActed, total := 0, 0, 0
	for _, tk := range h.tasks {
		if tk.taskID == "" {
			t.Errorf("call %v never got a task", tk.args["to"])
			continue
		}
		var problems []string
		fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
		if tk.adopted {
			h.adopted++
		}
		d, err := h.getTask(tk.taskID)
		if err != nil {
			fail("%v", err)
		}
		view := viewOf(d.Status, disposition(d))
		cf := readChain(chains[tk.taskID])
		tv, ok := verdicts[tk.taskID]
		if view == string(tasks.StatusFailed) && len(chains[tk.taskID]) == 0 && !tk.accepted &&
			effects[tk.taskID] == 0 && toolCalls[tk.taskID] == 0 {
			// An orphan (see the end of TestCrashTrials): a record without
			// a workflow, failed by the reconciler. Nothing was decided or
			// run, so there is nothing in the audit log.
			h.histogram["failed (orphan: no workflow)"]++
			continue
		}
		h.histogram[view]++
		switch {
		case !d.Status.Terminal():
			fail("not terminal: %s (%s)", d.Status, d.StatusMessage)
		case !ok || !cf.sealed || !tv.Complete:
			fail("no sealed audit chain")
		case viewOf(tasks.Status(tv.Status), tasks.Disposition(tv.Disposition)) != view:
			fail("tasks/get says %s, the audit outcome %s/%s", view, tv.Status, tv.Disposition)
		case cf.terminalView() != view:
			fail("tasks/get says %s, the chain's terminal record %s", view, cf.terminalView())
		}
		if n := countKind(chains[tk.taskID], audit.KindOutcome); n != 1 {
			fail("%d outcome records", n)
		}
		if tk.ref != "" {
			var page struct {
				Status tasks.ApprovalState `json:"status"`
			}
			pa := send(h.hc, h.request("GET", "/approver/v1/approvals/"+tk.ref, "", nil))
			if pa.code != 200 || json.Unmarshal(pa.body, &page) != nil {
				fail("approval page: %s", describe(pa))
			} else if want := pageState(view); page.Status != want {
				fail("tasks/get says %s, the approver page %s (want %s)", view, page.Status, want)
			}
		}
		if tk.accepted && cf.acceptedApprovals() != 1 {
			fail("the decision was answered accepted; the chain holds %d accepted approvals", cf.acceptedApprovals())
		}
		if len(cf.accepted) > 1 {
			fail("%d accepted decisions in the chain, want at most 1", len(cf.accepted))
		}
		n, calls := effects[tk.taskID], toolCalls[tk.taskID]
		total += n
		if calls > 1 {
			fail("the tool was called %d times", calls)
		}
		switch view {
		case string(tasks.ApprovedExecuted):
			executed++
			if n != 1 || calls != 1 {
				fail("approved-executed with %d ledger effects and %d tool calls", n, calls)
			}
			if !cf.claimed || cf.acceptedApprovals() != 1 {
				fail("approved-executed without a claim and one approval in the chain")
			}
		case string(tasks.OutcomeUnknown):
			if n > 0 {
				unknownActed++
			}
			if n > calls {
				fail("outcome-unknown with %d ledger effects and %d tool calls", n, calls)
			}
			if !cf.claimed {
				fail("outcome-unknown without a claim")
			}
			claimedAt, endAt := recordTime(chains[tk.taskID], audit.KindClaimed), recordTime(chains[tk.taskID], audit.KindOutcome)
			if !slices.ContainsFunc(h.deaths, func(d death) bool {
				return !d.at.Before(claimedAt.Add(-time.Second)) && !d.at.After(endAt.Add(time.Second))
			}) {
				fail("outcome-unknown, but no death came between its claim at %v and its end at %v", claimedAt.Format(time.StampMilli), endAt.Format(time.StampMilli))
			}
		default:
			if n != 0 || calls != 0 {
				fail("%s with %d ledger effects and %d tool calls", view, n, calls)
			}
			if len(cf.accepted) > 0 || tk.accepted {
				fail("an approval was accepted but the task ended %s: a lost approval", view)
			}
		}
		problems = append(problems, tk.problems...)
		if len(problems) > 0 {
			t.Errorf("task %s (%v): %s\n  answers: %v\n  crash points fired: %v\n  chain: %s\n  - %s",
				tk.taskID, tk.args["to"], view, tk.answers, fired[tk.taskID], cf.summary(), strings.Join(problems, "\n  - "))
		}
	}
	if total != executed+unknownActed {
		t.Errorf("the ledger holds %d effects for %d approved-executed tasks and %d outcome-unknown tasks whose tool acted", total, executed, unknownActed)
	}
	sort.Slice(h.tasks, func(i, j int) bool { return h.tasks[i].taskID < h.tasks[j].taskID })
	t.Logf("judged %d tasks (%d the client never learned of): %d ledger effects = %d approved-executed + %d outcome-unknown whose tool acted (%d outcome-unknown in all); %d chains verified",
		len(h.tasks), h.adopted, total, executed, unknownActed, h.histogram[string(tasks.OutcomeUnknown)], len(rep.Tasks))
}

// pageState is the approver page's status for a task's end.
func pageState(view string) tasks.ApprovalState {
	switch view {
	case string(tasks.ApprovedExecuted):
		return tasks.ApprovalExecuted
	case string(tasks.OutcomeUnknown), string(tasks.ExecutionError), string(tasks.StatusFailed):
		return tasks.ApprovalFailed
	case string(tasks.StatusCancelled):
		return tasks.ApprovalCancelled
	}
	return tasks.ApprovalDenied
}

func countKind(lines [][]byte, kind string) int {
	n := 0
	for _, l := range lines {
		var rec audit.Record
		if json.Unmarshal(l, &rec) == nil && rec.Kind == kind {
			n++
		}
	}
	return n
}

// recordTime is when the chain's first record of kind was made.
func recordTime(lines [][]byte, kind string) time.Time {
	for _, l := range lines {
		var rec audit.Record
		if json.Unmarshal(l, &rec) == nil && rec.Kind == kind {
			return rec.At
		}
	}
	return time.Time{}
}
