package e2e

import (
	"bufio"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/tasks"
)

// crashChildEnv makes TestCrashChildProcess run countersign dev:
// "DIR|PORT" or "DIR|PORT|CONFIG_FILE".
const crashChildEnv = "COUNTERSIGN_CRASH_CHILD"

// crashChildHeartbeatEnv sets the child's app.Config.ExecuteHeartbeatTimeout
// (a duration; empty for the default).
const crashChildHeartbeatEnv = "COUNTERSIGN_CRASH_CHILD_HEARTBEAT"

// TestCrashChildProcess is not a test: TestCrashDecision runs this test
// binary again with crashChildEnv set, and this function then runs
// `countersign dev` (app.New in ModeDev, as devtest starts it, with SQLite
// synchronous=FULL as the command's default) until its stdin closes or it
// is killed.
func TestCrashChildProcess(t *testing.T) {
	spec := os.Getenv(crashChildEnv)
	if spec == "" {
		t.Skip("helper process of TestCrashDecision")
	}
	dir, rest, _ := strings.Cut(spec, "|")
	portStr, configFile, _ := strings.Cut(rest, "|")
	port, err := strconv.Atoi(portStr)
	if err != nil {
		t.Fatal(err)
	}
	cfg := app.Config{DataDir: dir, SQLiteSync: "FULL", ConfigFile: configFile}
	if v := os.Getenv(crashChildHeartbeatEnv); v != "" {
		if cfg.ExecuteHeartbeatTimeout, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	// The logs go to stderr, which the parent keeps in the child's log
	// file: a failing trial shows what the killed process was doing.
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	st := devtest.Start(t, devtest.Options{Config: cfg, Port: port, ClientName: "e2e-crash", Logger: logger})
	// Until the parent hangs up. "describe TASK" writes the task's workflow
	// state to stderr (the log file), for a failing trial's message.
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if id, ok := strings.CutPrefix(in.Text(), "describe "); ok {
			fmt.Fprintf(os.Stderr, "WORKFLOW %s\n%sEND WORKFLOW\n", id, describeWorkflow(st.App.Temporal(), id))
		}
	}
}

// TestCrashDecision: a decision is never lost when the process dies right
// after it was posted. Each trial creates a gated quorum-1 transfer, posts
// one valid passkey approval, kills the process (SIGKILL) 0–100 ms later,
// restarts it on the same data dir and posts the exact same request again.
// The decision must then be counted exactly once (the task ends
// approved-executed, one ledger effect, one accepted approval in the audit
// chain) or cleanly rejected with nothing recorded as counted. A retry that
// is refused while the task is still pending with no approval (a ghosted
// decision), or an audit chain holding a decision the task did not count,
// fails.
//
// Knobs (environment):
//
//	COUNTERSIGN_CRASH_TRIALS        trials (default 3)
//	COUNTERSIGN_CRASH_MIN_DELAY_MS  the kill comes at least this long after the POST (default 10)
//	COUNTERSIGN_CRASH_MAX_DELAY_MS  and at most this long (default 45): a decision takes
//	                                ~20-50 ms here, and this window is where the code
//	                                before the outbox lost decisions (3 of 20 trials;
//	                                1 of 23 with a 0-100 ms window)
//	COUNTERSIGN_BIN                 run this countersign binary (`countersign dev`)
//	                                instead of this test binary as the child
func TestCrashDecision(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("inside the helper process")
	}
	trials := envIntDefault(t, "COUNTERSIGN_CRASH_TRIALS", 3)
	minDelay := time.Duration(envIntDefault(t, "COUNTERSIGN_CRASH_MIN_DELAY_MS", 10)) * time.Millisecond
	maxDelay := max(minDelay, time.Duration(envIntDefault(t, "COUNTERSIGN_CRASH_MAX_DELAY_MS", 45))*time.Millisecond)
	dir := t.TempDir()
	port := devtest.FreePort(t)
	c := startCrashChild(t, dir, port)
	t.Cleanup(func() { c.stop() })

	s := &devtest.Stack{T: t, Dir: dir, Port: port, Base: fmt.Sprintf("http://localhost:%d", port),
		AgentToken: readFile(t, filepath.Join(dir, app.AgentTokenFile)), AdminToken: readFile(t, filepath.Join(dir, app.AdminTokenFile))}
	alice := s.Enroll("alice", "approvers")
	keys, err := audit.ParsePublicKeys([]byte(readFile(t, filepath.Join(dir, app.AuditPubKeyFile))))
	if err != nil {
		t.Fatal(err)
	}
	nonce := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)

	tally := map[string]int{}
	bad := 0
	for trial := range trials {
		hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}}
		task := createTask(t, hc, s.Base, s.AgentToken, "transfer_funds", map[string]any{
			"to": fmt.Sprintf("acct-crash-%s-%d", nonce, trial), "amount": 2000 + trial, "currency": "USD"})
		ref := s.RefOf(task)
		ch := s.Challenge(ref, "approve")
		body := decisionBody(ch.ChallengeID, "approve", alice.Sign(t, ch))
		post := func() httpAnswer {
			req, _ := http.NewRequest("POST", s.Base+"/approver/v1/approvals/"+ref+"/decision", strings.NewReader(string(body)))
			req.Header.Set("Content-Type", "application/json")
			return send(hc, req)
		}

		delay := minDelay + time.Duration(rand.Int64N(int64(maxDelay-minDelay)+1))
		first := make(chan httpAnswer, 1)
		go func() { first <- post() }()
		time.Sleep(delay)
		c.kill()
		a1 := <-first
		hc.CloseIdleConnections()
		c = startCrashChild(t, dir, port)

		// The approver's page retries what it posted; a restarted server
		// that is not quite ready may answer 5xx or drop the connection, and
		// the page then posts the same request again.
		a2 := post()
		for i := 0; i < 5 && (a2.err != nil || a2.code >= 500); i++ {
			time.Sleep(500 * time.Millisecond)
			a2 = post()
		}
		verdict, problems := judgeCrashTrial(t, hc, s, keys, task, ref, a1, a2)
		tally[verdict]++
		if len(problems) > 0 {
			bad++
			t.Errorf("trial %d (task %s, kill %v after the POST): %s\n  first POST: %s\n  retry:      %s\n  - %s",
				trial, task, delay.Round(time.Millisecond), verdict, describe(a1), describe(a2), strings.Join(problems, "\n  - "))
		} else {
			t.Logf("trial %d: kill %v after the POST: %s (first POST: %s; retry: %s)", trial, delay.Round(time.Millisecond), verdict, describe(a1), describe(a2))
		}
	}
	t.Logf("TestCrashDecision: %d trials, %d failed; outcomes %v", trials, bad, tally)
}

// judgeCrashTrial waits for the task after the retry and checks that the
// decision was counted once or cleanly rejected.
func judgeCrashTrial(t *testing.T, hc *http.Client, s *devtest.Stack, keys []ed25519.PublicKey, taskID, ref string, a1, a2 httpAnswer) (string, []string) {
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	var r1, r2 decisionResult
	json.Unmarshal(a1.body, &r1)
	json.Unmarshal(a2.body, &r2)

	// The approval page (the read model the workflow writes) says whether
	// the decision counted.
	type approvalView struct {
		Status    string `json:"status"`
		Approved  int    `json:"approved"`
		Approvals []struct {
			Decision string `json:"decision"`
		} `json:"approvals"`
	}
	page := func() approvalView {
		var v approvalView
		s.HTTPJSON("GET", "/approver/v1/approvals/"+ref, "", nil, &v)
		return v
	}

	// A task that counted the decision runs at once, or within the workflow
	// task timeout (10 s) when its workflow task died with the process. If
	// the process died after the claim, the attempt is lost with it and the
	// task stays working until the attempt's heartbeat runs out (then
	// outcome-unknown). One that did not count it stays pending. Give each
	// 12 s.
	var d devtest.DetailedTask
	var view approvalView
	start := time.Now()
	for {
		var rpc devtest.RPCResponse
		d, rpc = s.GetTask(s.AgentToken, taskID)
		if rpc.Error != nil {
			fail("tasks/get: %d %s", rpc.Error.Code, rpc.Error.Message)
			return "error", problems
		}
		view = page()
		waited := time.Since(start)
		if d.Status.Terminal() || waited > 12*time.Second {
			break
		}
		if waited > 3*time.Second && listTransfers(t, hc, s.Base, s.AgentToken, taskID) > 0 {
			break // the tool ran; only its lost attempt's timeout is left
		}
		time.Sleep(50 * time.Millisecond)
	}
	effects := listTransfers(t, hc, s.Base, s.AgentToken, taskID)

	if !d.Status.Terminal() && view.Approved == 0 {
		// Still pending: the decision must have been refused cleanly, and
		// nothing may say it counted.
		verdict := "rejected (" + describe(a2) + ")"
		switch {
		case r2.Accepted:
			fail("the retry was accepted but the task is pending with no approval (%s)", d.StatusMessage)
		case r1.Accepted:
			fail("the first POST was answered accepted before the crash, but the task is pending with no approval: an acknowledged decision was lost")
		case r2.Reason == "challenge_consumed":
			verdict = "GHOSTED"
			fail("the retry got challenge_consumed while the task is pending with no approval: the decision was consumed but never counted")
		}
		if effects != 0 {
			fail("pending task has %d ledger effects", effects)
		}
		// End the task so its chain is sealed, then look for a decision the
		// task never counted.
		cancel := s.Call2026(s.AgentToken, "tasks/cancel", taskID, map[string]any{"taskId": taskID}, true)
		if cancel.Error != nil {
			fail("tasks/cancel: %d %s", cancel.Error.Code, cancel.Error.Message)
		}
		lines := waitSealed(t, hc, s, taskID, 10*time.Second)
		cf := readChain(lines)
		if n := len(cf.accepted); n > 0 {
			fail("the audit chain holds %d accepted decision(s) the task never counted", n)
		}
		if rep := audit.Verify(lines, keys, audit.VerifyOptions{}); !rep.OK {
			fail("the chain does not verify: %s", verifyProblems(rep))
		}
		if len(problems) > 0 {
			problems = append(problems, "chain: "+cf.summary())
		}
		return verdict, problems
	}

	// Counted: exactly once, everywhere.
	verdict := viewOf(d.Status, disposition(d))
	sealWait := 10 * time.Second
	switch {
	case d.Status.Terminal() && verdict == string(tasks.OutcomeUnknown):
		// The kill fell after the claim, during or just before the tool,
		// and the attempt's heartbeat ran out (workflows.Options): an
		// honest outcome-unknown, whose tool ran at most once. The chain
		// must show the claim (checked below).
		if effects > 1 {
			fail("%d ledger effects, want at most 1", effects)
		}
	case d.Status.Terminal():
		if verdict != string(tasks.ApprovedExecuted) {
			fail("the task ended %s (%s), want approved-executed", verdict, d.StatusMessage)
		}
		if effects != 1 {
			fail("%d ledger effects, want 1", effects)
		}
	default:
		// The kill fell while the tool ran; it ends outcome-unknown when
		// the attempt's heartbeat runs out. The decision counted, which is
		// what this test is about.
		verdict = fmt.Sprintf("executing (%s, %d ledger effects: its ExecuteTool attempt died with the process)", view.Status, effects)
		sealWait = 0
		if effects > 1 {
			fail("%d ledger effects", effects)
		}
	}
	if view.Approved != 1 || len(view.Approvals) != 1 {
		fail("the approval page shows %d approvals (%d entries), want 1", view.Approved, len(view.Approvals))
	}
	note := ""
	if !r2.Accepted && r2.Reason != "task_not_pending" && r2.Reason != "challenge_consumed" {
		// Counted once, which is what matters; the answer is still odd.
		note = "; note: the retry was answered " + describe(a2)
	}
	lines := waitSealed(t, hc, s, taskID, sealWait)
	cf := readChain(lines)
	if rep := audit.Verify(lines, keys, audit.VerifyOptions{AllowIncomplete: sealWait == 0}); !rep.OK {
		fail("the chain does not verify: %s", verifyProblems(rep))
	}
	if verdict == string(tasks.OutcomeUnknown) && !cf.claimed {
		fail("the task ended outcome-unknown but its chain has no claim: outcome-unknown only after the claim")
	}
	if n := cf.acceptedApprovals(); n != 1 || len(cf.accepted) != 1 {
		fail("the audit chain holds %d accepted decisions (%d distinct approvals), want 1", len(cf.accepted), n)
	}
	if sealWait > 0 {
		if ov := viewOf(tasks.Status(cf.outcome.Status), tasks.Disposition(cf.outcome.Disposition)); ov != verdict || len(cf.outcome.Approvals) != 1 {
			fail("the audit outcome says %s with %d approvals", ov, len(cf.outcome.Approvals))
		}
	}
	if len(problems) > 0 {
		problems = append(problems, "chain: "+cf.summary())
	}
	if r2.Accepted {
		return "counted, " + verdict + " (retry accepted" + note + ")", problems
	}
	return "counted, " + verdict + " (retry: " + r2.Reason + note + ")", problems
}

func verifyProblems(rep audit.Report) string {
	var why []string
	for _, tv := range rep.Tasks {
		why = append(why, tv.Problems...)
	}
	return strings.Join(append(why, rep.Problems...), "; ")
}

// waitSealed returns the task's chain once it is sealed, or after within.
func waitSealed(t *testing.T, hc *http.Client, s *devtest.Stack, taskID string, within time.Duration) [][]byte {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		lines := showChain(t, hc, s.Base, s.AdminToken, taskID)
		if readChain(lines).sealed || !time.Now().Before(deadline) {
			return lines
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func describe(a httpAnswer) string {
	if a.err != nil {
		return "transport error: " + a.err.Error()
	}
	return fmt.Sprintf("HTTP %d %s", a.code, strings.TrimSpace(string(a.body)))
}

// createTask makes a gated call as a tasks-declaring 2026 client.
func createTask(t *testing.T, hc *http.Client, base, token, tool string, args map[string]any) string {
	t.Helper()
	rpc, err := decodeRPC(send(hc, mcpRequest(base, token, tasks.Era2026, "tools/call", tool, map[string]any{"name": tool, "arguments": args})))
	if err != nil || rpc.Error != nil {
		t.Fatalf("tools/call %s: %v %+v", tool, err, rpc.Error)
	}
	var ct struct {
		ResultType string `json:"resultType"`
		TaskID     string `json:"taskId"`
	}
	if json.Unmarshal(rpc.Result, &ct) != nil || ct.ResultType != "task" || ct.TaskID == "" {
		t.Fatalf("tools/call %s: want a CreateTaskResult, got %s", tool, rpc.Result)
	}
	return ct.TaskID
}

// crashChild is a `countersign dev` child process.
type crashChild struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	log   string
}

// startCrashChild starts countersign dev on dir and port and waits until it
// answers HTTP.
func startCrashChild(t *testing.T, dir string, port int) *crashChild {
	t.Helper()
	return startCrashChildConfig(t, dir, port, "")
}

// startCrashChildConfig is startCrashChild with a configuration file
// (--config; "" for none).
func startCrashChildConfig(t *testing.T, dir string, port int, configFile string) *crashChild {
	t.Helper()
	c, err := launchCrashChild(t, crashChildOptions{dir: dir, port: port, configFile: configFile})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// crashChildOptions say how to run a `countersign dev` child.
type crashChildOptions struct {
	dir        string
	port       int
	configFile string // --config; "" for none
	// heartbeat is the child's ExecuteTool heartbeat timeout (the
	// default when zero). Only the re-executed test binary takes it.
	heartbeat time.Duration
}

// launchCrashChild starts countersign dev and waits until it answers HTTP.
func launchCrashChild(t *testing.T, o crashChildOptions) (*crashChild, error) {
	t.Helper()
	var cmd *exec.Cmd
	if bin := os.Getenv("COUNTERSIGN_BIN"); bin != "" {
		if o.heartbeat != 0 {
			return nil, fmt.Errorf("a heartbeat timeout needs the test binary as the child; unset COUNTERSIGN_BIN")
		}
		cmd = exec.Command(bin, "dev", "--data-dir", o.dir, "--addr", fmt.Sprintf("127.0.0.1:%d", o.port),
			"--rate-per-minute", "1000000", "--rate-burst", "1000000", "--max-pending", "1000000", "--config", o.configFile)
	} else {
		cmd = exec.Command(os.Args[0], "-test.run=^TestCrashChildProcess$", "-test.count=1", "-test.timeout=0")
		spec := fmt.Sprintf("%s|%d", o.dir, o.port)
		if o.configFile != "" {
			spec += "|" + o.configFile
		}
		hb := ""
		if o.heartbeat != 0 {
			hb = o.heartbeat.String()
		}
		// Set even when empty, so that a value in the parent's
		// environment never reaches another test's child.
		cmd.Env = append(os.Environ(), crashChildEnv+"="+spec, crashChildHeartbeatEnv+"="+hb)
	}
	return runCrashChild(t, cmd, o.dir, o.port)
}

// runCrashChild starts cmd, a `countersign dev` on dir and port, and waits
// until it answers HTTP and has written its tokens. A child that exits
// while starting is an error.
func runCrashChild(t *testing.T, cmd *exec.Cmd, dir string, port int) (*crashChild, error) {
	logPath := filepath.Join(t.TempDir(), "child.log")
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &crashChild{t: t, cmd: cmd, stdin: stdin, done: make(chan struct{}), log: logPath}
	go func() { cmd.Wait(); lf.Close(); close(c.done) }()
	deadline := time.Now().Add(90 * time.Second)
	for {
		select {
		case <-c.done:
			b, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("countersign dev exited during start (%s):\n%s", cmd.ProcessState, tail(b, 4000))
		default:
		}
		if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port)); err == nil {
			resp.Body.Close()
			if _, err := os.Stat(filepath.Join(dir, app.AdminTokenFile)); err == nil {
				return c, nil
			}
		}
		if time.Now().After(deadline) {
			c.kill()
			b, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("countersign dev not up after 90s:\n%s", tail(b, 4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tail is the last n bytes of b.
func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// kill sends SIGKILL to this child only and waits until it is gone.
func (c *crashChild) kill() {
	c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// stop ends the child gracefully (stdin closed), killing it after 30 s.
func (c *crashChild) stop() {
	c.stdin.Close()
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		c.kill()
	}
}
