package e2e

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/tasks"
)

// TestCrashUpstreamWrite: an approved write to the official filesystem
// server is never made twice when the whole `countersign dev` is killed
// (SIGKILL) around its claim. Each trial creates a gated fs__write_file,
// approves it, kills the process 10–80 ms after the approval was posted
// (the claim and the write happen in that window), restarts it on the same
// data dir, and waits for the task to end. Then:
//
//   - approved-executed: the file holds exactly the content;
//   - outcome-unknown, or still running its claimed call (the attempt died
//     with the process: the task says so when the attempt's timeout
//     passes): the file holds the content or does not exist;
//   - denied-not-executed, or still waiting for approval: no file;
//
// and, whatever the end, after the file is overwritten with a marker, no
// write comes later: the call is never sent again after the restart.
//
//	COUNTERSIGN_CRASH_TRIALS  trials (default 3)
func TestCrashUpstreamWrite(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("inside the helper process")
	}
	node, modules := upstreamServers(t)
	trials := envIntDefault(t, "COUNTERSIGN_CRASH_TRIALS", 3)
	data := t.TempDir()
	configFile := writeFSConfig(t, node, modules, data)
	dir := t.TempDir()
	port := devtest.FreePort(t)
	c := startCrashChildConfig(t, dir, port, configFile)
	t.Cleanup(func() { c.stop() })
	s := &devtest.Stack{T: t, Dir: dir, Port: port, Base: fmt.Sprintf("http://localhost:%d", port),
		AgentToken: readFile(t, filepath.Join(dir, app.AgentTokenFile)), AdminToken: readFile(t, filepath.Join(dir, app.AdminTokenFile))}
	st := &stack{s}
	alice := s.Enroll("alice", "approvers")

	tally := map[tasks.Disposition]int{}
	for trial := range trials {
		st.waitTool(t, "fs__write_file")
		target := filepath.Join(data, fmt.Sprintf("crash-%d.txt", trial))
		content := fmt.Sprintf("trial %d\nwritten once\n", trial)
		hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}}
		task := createTask(t, hc, s.Base, s.AgentToken, "fs__write_file", map[string]any{"path": target, "content": content})
		ref := s.RefOf(task)
		ch := s.Challenge(ref, "approve")
		body := decisionBody(ch.ChallengeID, "approve", alice.Sign(t, ch))
		post := func() httpAnswer {
			req, _ := http.NewRequest("POST", s.Base+"/approver/v1/approvals/"+ref+"/decision", strings.NewReader(string(body)))
			req.Header.Set("Content-Type", "application/json")
			return send(hc, req)
		}
		delay := 10*time.Millisecond + time.Duration(rand.Int64N(int64(70*time.Millisecond)))
		first := make(chan httpAnswer, 1)
		go func() { first <- post() }()
		time.Sleep(delay)
		c.kill()
		<-first
		hc.CloseIdleConnections()
		c = startCrashChildConfig(t, dir, port, configFile)
		// The approver's page posts the same request again.
		for i := 0; i < 6; i++ {
			if a := post(); a.err == nil && a.code < 500 {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}

		// A task that counted the approval runs at once, or after the
		// workflow task timeout (10 s) when its workflow task died with the
		// process. A claimed call whose attempt died with the process stays
		// running until the attempt's timeout, then ends outcome-unknown:
		// judge it as running after 15 s.
		var d devtest.DetailedTask
		var state tasks.ApprovalState
		deadline := time.Now().Add(15 * time.Second)
		for {
			var rpc devtest.RPCResponse
			d, rpc = s.GetTask(s.AgentToken, task)
			if rpc.Error != nil {
				t.Fatalf("trial %d: tasks/get: %d %s", trial, rpc.Error.Code, rpc.Error.Message)
			}
			var view struct {
				Status tasks.ApprovalState `json:"status"`
			}
			s.HTTPJSON("GET", "/approver/v1/approvals/"+ref, "", nil, &view)
			state = view.Status
			if d.Status.Terminal() || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		disp := devtest.Disposition(d)
		if !d.Status.Terminal() && state == tasks.ApprovalApproved {
			disp = "running (claimed)"
		}
		tally[disp]++
		got, err := os.ReadFile(target)
		exists := err == nil
		switch {
		case disp == tasks.ApprovedExecuted:
			if string(got) != content {
				t.Errorf("trial %d: approved-executed but the file is %q (err %v)", trial, got, err)
			}
		case disp == tasks.DeniedNotExecuted, !d.Status.Terminal() && state == tasks.ApprovalPending:
			if exists {
				t.Errorf("trial %d: the task is %s/%s but the file was written", trial, d.Status, state)
			}
		case disp == tasks.OutcomeUnknown, disp == "running (claimed)":
			if exists && string(got) != content {
				t.Errorf("trial %d: outcome-unknown and the file is %q", trial, got)
			}
		default:
			t.Errorf("trial %d: unexpected end %s/%s (approval %s): %s", trial, d.Status, disp, state, d.Result)
		}
		// Nothing writes it after this point.
		if err := os.WriteFile(target, []byte("marker"), 0o600); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		if got, _ := os.ReadFile(target); string(got) != "marker" {
			t.Errorf("trial %d: the file was written again after the task ended (%s): %q", trial, disp, got)
		}
		t.Logf("trial %d: kill %v after the POST: %s/%s (approval %s), file written: %t", trial, delay.Round(time.Millisecond), d.Status, disp, state, exists)
	}
	t.Logf("TestCrashUpstreamWrite: %d trials; outcomes %v", trials, tally)
}
