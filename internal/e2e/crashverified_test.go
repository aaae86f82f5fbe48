package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/descope/virtualwebauthn"
	"go.temporal.io/sdk/client"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/tasks"
)

// inBandKey is a software passkey enrolled in-band for a stack's agent.
type inBandKey struct {
	rp   virtualwebauthn.RelyingParty
	auth virtualwebauthn.Authenticator
	cred virtualwebauthn.Credential
}

func enrollInBand(t *testing.T, s *devtest.Stack) *inBandKey {
	t.Helper()
	k := &inBandKey{rp: virtualwebauthn.RelyingParty{ID: "localhost", Name: "Countersign", Origin: app.DevVerifiedOrigin}}
	r := s.Call2026(s.AgentToken, "approval/enroll/begin", "", nil, false)
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
	k.auth = virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(opts.UserID)})
	k.cred = testpasskey.NewEC2Credential()
	var att map[string]any
	json.Unmarshal([]byte(virtualwebauthn.CreateAttestationResponse(k.rp, k.auth, k.cred, *opts)), &att)
	att["response"].(map[string]any)["transports"] = []string{"usb"}
	if r := s.Call2026(s.AgentToken, "approval/enroll/finish", "", map[string]any{"response": att}, false); r.Error != nil {
		t.Fatalf("enroll/finish: %+v", r.Error)
	}
	k.auth.AddCredential(k.cred)
	return k
}

// evidence asks s for a challenge for args and signs it.
func (k *inBandKey) evidence(t *testing.T, s *devtest.Stack, args map[string]any) map[string]any {
	t.Helper()
	r := s.Call2026(s.AgentToken, "approval/challenge/create", "", map[string]any{"toolName": "place_trade", "arguments": args}, false)
	if r.Error != nil {
		t.Fatalf("challenge/create: %+v", r.Error)
	}
	var env struct {
		ChallengeID    string `json:"challengeId"`
		RequestOptions struct {
			Challenge string `json:"challenge"`
		} `json:"requestOptions"`
	}
	json.Unmarshal(r.Result, &env)
	challenge, _ := base64.RawURLEncoding.DecodeString(env.RequestOptions.Challenge)
	k.cred.Counter++
	var assertion map[string]any
	json.Unmarshal([]byte(virtualwebauthn.CreateAssertionResponse(k.rp, k.auth, k.cred, virtualwebauthn.AssertionOptions{Challenge: challenge, RelyingPartyID: "localhost"})), &assertion)
	return map[string]any{"method": "webauthn", "challengeId": env.ChallengeID, "response": assertion}
}

// postVerified sends place_trade with evidence as a raw 2026-07-28 POST
// that may fail in transit (the server is being killed).
func postVerified(hc *http.Client, base, token string, args, evidence map[string]any) httpAnswer {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{
		"name": "place_trade", "arguments": args,
		"_meta": map[string]any{
			"io.modelcontextprotocol/protocolVersion":    "2026-07-28",
			"io.modelcontextprotocol/clientCapabilities": map[string]any{},
			"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "e2e-crash", "version": "1"},
			"io.modelcontextprotocol/verified-approval":  evidence,
		}}})
	req, _ := http.NewRequest("POST", base+"/mcp", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "tools/call")
	req.Header.Set("Mcp-Name", "place_trade")
	req.Header.Set("Authorization", "Bearer "+token)
	return send(hc, req)
}

// ranTask is the task a successful answer names; "" for any other answer.
func ranTask(a httpAnswer) string {
	var r struct {
		Result *struct {
			IsError bool           `json:"isError"`
			Meta    map[string]any `json:"_meta"`
		} `json:"result"`
	}
	if a.err != nil || a.code != 200 || json.Unmarshal(a.body, &r) != nil || r.Result == nil || r.Result.IsError {
		return ""
	}
	related, _ := r.Result.Meta[tasks.MetaRelatedTask].(map[string]any)
	id, _ := related["taskId"].(string)
	return id
}

// TestCrashVerified: a SEP-2672 verified call is never executed twice and
// never lost. Each trial signs a place_trade, posts it, kills countersign
// dev (SIGKILL) 0–60 ms later, restarts it on the same data dir and posts
// the same signed call again, as a client whose connection died does.
// Then, for that trial's arguments, exactly one task has run (or may have:
// outcome-unknown); if an answer said the call ran, it names that task; and
// a retry refused as challenge_consumed comes only after the call ran.
// COUNTERSIGN_CRASH_TRIALS sets the number of trials (default 3).
func TestCrashVerified(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("inside the helper process")
	}
	trials := envIntDefault(t, "COUNTERSIGN_CRASH_TRIALS", 3)
	dir := t.TempDir()
	port := devtest.FreePort(t)
	c := startCrashChild(t, dir, port)
	t.Cleanup(func() { c.stop() })
	s := &devtest.Stack{T: t, Dir: dir, Port: port, Base: fmt.Sprintf("http://localhost:%d", port),
		AgentToken: readFile(t, filepath.Join(dir, app.AgentTokenFile)), AdminToken: readFile(t, filepath.Join(dir, app.AdminTokenFile))}
	k := enrollInBand(t, s)
	symbol := "C" + strings.ToUpper(strconv.FormatInt(time.Now().UnixNano()%1e6, 36))

	for trial := range trials {
		hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}}
		args := map[string]any{"symbol": symbol, "side": "buy", "quantity": 100 + trial, "limit": 10}
		ev := k.evidence(t, s, args)
		delay := time.Duration(rand.Int64N(61)) * time.Millisecond
		first := make(chan httpAnswer, 1)
		go func() { first <- postVerified(hc, s.Base, s.AgentToken, args, ev) }()
		time.Sleep(delay)
		c.kill()
		killed := time.Now()
		a1 := <-first
		hc.CloseIdleConnections()
		killedLog := c.log
		c = startCrashChild(t, dir, port)
		// A client retries after its connection died; a task record the
		// crash left without a workflow is resumed once it is 2 s old.
		time.Sleep(max(0, 2500*time.Millisecond-time.Since(killed)))
		a2 := postVerified(hc, s.Base, s.AgentToken, args, ev)
		for i := 0; i < 5 && (a2.err != nil || a2.code >= 500); i++ {
			time.Sleep(500 * time.Millisecond)
			a2 = postVerified(hc, s.Base, s.AgentToken, args, ev)
		}
		told := ranTask(a1)
		named := "" // the task a challenge_consumed answer names
		if id := ranTask(a2); id != "" {
			if told != "" {
				t.Errorf("trial %d: both answers said the call ran (%s, %s)", trial, told, id)
			}
			told = id
		} else if !bytes.Contains(a2.body, []byte(`"challenge_consumed"`)) {
			t.Errorf("trial %d: retry answered %s", trial, describe(a2))
		} else if told == "" {
			// The answer to the same signed call sent again names its
			// task: the client reads the outcome it lost.
			var e struct {
				Error struct {
					Data struct {
						TaskID string `json:"taskId"`
					} `json:"data"`
				} `json:"error"`
			}
			if json.Unmarshal(a2.body, &e) != nil || e.Error.Data.TaskID == "" {
				t.Errorf("trial %d: challenge_consumed for the same signed call names no task: %s", trial, describe(a2))
			}
			named = e.Error.Data.TaskID
		}

		// Let a workflow that started before the kill run and finish: a
		// workflow task the killed worker held times out after 10 s, an
		// activity after 30 s (Publish's attempt; ExecuteTool's heartbeat),
		// one after the other, and a loaded machine adds to that. Then read
		// the audit chain.
		var ran []string
		var ended, started int
		var requestedAfter time.Duration // from the kill to the task's first audit record
		deadline := time.Now().Add(150 * time.Second)
		for {
			ran, ended, started = tradesInAudit(t, s, symbol, 100+trial)
			if started > 0 && requestedAfter == 0 {
				requestedAfter = time.Since(killed)
			}
			if (started > 0 && ended == started) || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if named != "" && len(ran) == 1 && ran[0] != named {
			t.Errorf("trial %d: challenge_consumed named task %s, the audit chain shows %v ran", trial, named, ran)
		}
		switch {
		case len(ran) > 1:
			t.Errorf("trial %d: the call ran %d times: %v", trial, len(ran), ran)
		case told != "" && (len(ran) != 1 || ran[0] != told):
			t.Errorf("trial %d: the client was told task %s ran, the audit chain shows %v", trial, told, ran)
		case told == "" && started == 0:
			t.Errorf("trial %d: the retry of the signed call was refused (%s) and no task of it exists: a signed call lost\nkilled child, %v after the POST:\n%s\nrestarted child:\n%s\nworkflow:\n%s",
				trial, describe(a2), delay, childLines(killedLog, named), childLines(c.log, named), c.describe(named)+"\ntasks/get: "+taskView(s, named))
		default:
			// A task whose call was claimed before the kill ends only when
			// that attempt times out (outcome-unknown, never re-run): it is
			// in flight, not lost.
			t.Logf("trial %d: kill %v after the POST; first: %s; retry: %s; ran: %v; %d of %d started tasks ended; requested in the audit %v after the kill, %v to the end",
				trial, delay, short(describe(a1)), short(describe(a2)), ran, ended, started, requestedAfter.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
		}
	}
}

// tradesInAudit returns the tasks of place_trade(symbol, quantity) that
// ran or may have run (executed, outcome-unknown), how many ended, and how
// many were started at all.
func tradesInAudit(t *testing.T, s *devtest.Stack, symbol string, quantity int) (ran []string, ended, started int) {
	t.Helper()
	code, lines := (&stack{s}).exportAudit(s.AdminToken)
	if code != 200 {
		t.Logf("audit export answered HTTP %d", code)
		return nil, 0, 0
	}
	mine := map[string]bool{}
	done := map[string]bool{}
	end := map[string]bool{}
	for _, l := range lines {
		var rec audit.Record
		if json.Unmarshal(l, &rec) != nil {
			continue
		}
		switch rec.Kind {
		case audit.KindRequested:
			if bytes.Contains(l, []byte(`"symbol":"`+symbol+`"`)) && bytes.Contains(l, []byte(`"quantity":`+strconv.Itoa(quantity))) {
				mine[rec.TaskID] = true
			}
		case audit.KindExecuted, audit.KindOutcomeUnknown:
			done[rec.TaskID] = true
		case audit.KindOutcome:
			end[rec.TaskID] = true
		}
	}
	for id := range mine {
		if done[id] {
			ran = append(ran, id)
		}
		if end[id] {
			ended++
		}
	}
	return ran, ended, len(mine)
}

// childLines is what a child's log says about a task and about verified
// calls, for a failure message.
func childLines(path, taskID string) string {
	b, _ := os.ReadFile(path)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if (taskID != "" && strings.Contains(l, taskID)) || strings.Contains(l, "verified") || strings.Contains(l, "level=ERROR") || strings.Contains(l, "level=WARN") {
			out = append(out, l)
		}
	}
	if len(out) > 80 {
		out = out[len(out)-80:]
	}
	return strings.Join(out, "\n")
}

// short is s cut to 160 bytes, for a log line.
func short(s string) string {
	if len(s) > 160 {
		return s[:160] + "…"
	}
	return s
}

// describe asks the child to write taskID's workflow state to its log
// (TestCrashChildProcess) and returns it.
func (c *crashChild) describe(taskID string) string {
	if _, err := fmt.Fprintf(c.stdin, "describe %s\n", taskID); err != nil {
		return err.Error()
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(c.log)
		if i := bytes.Index(b, []byte("WORKFLOW "+taskID+"\n")); i >= 0 {
			if j := bytes.Index(b[i:], []byte("END WORKFLOW")); j >= 0 {
				return string(b[i : i+j])
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return "the child did not describe the workflow"
}

// describeWorkflow is a task's workflow as Temporal holds it: its status,
// pending workflow task and activities, and its history's events.
func describeWorkflow(c client.Client, taskID string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out strings.Builder
	d, err := c.DescribeWorkflowExecution(ctx, taskID, "")
	if err != nil {
		return "describe: " + err.Error() + "\n"
	}
	fmt.Fprintf(&out, "status %s; pending workflow task: %v\n", d.WorkflowExecutionInfo.GetStatus(), d.GetPendingWorkflowTask())
	for _, a := range d.GetPendingActivities() {
		fmt.Fprintf(&out, "pending activity %s %s: state %s, attempt %d, scheduled %v, last started %v, last failure %v\n",
			a.GetActivityId(), a.GetActivityType().GetName(), a.GetState(), a.GetAttempt(),
			a.GetScheduledTime().AsTime().Format(time.StampMilli), a.GetLastStartedTime().AsTime().Format(time.StampMilli), a.GetLastFailure().GetMessage())
	}
	it := c.GetWorkflowHistory(ctx, taskID, "", false, 0)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			fmt.Fprintf(&out, "history: %v\n", err)
			break
		}
		fmt.Fprintf(&out, "  %d %s %s\n", e.GetEventId(), e.GetEventTime().AsTime().Format(time.StampMilli), e.GetEventType())
	}
	return out.String()
}

// taskView is tasks/get of taskID as the stack's agent, for a failure
// message.
func taskView(s *devtest.Stack, taskID string) string {
	r := s.Call2026(s.AgentToken, "tasks/get", "", map[string]any{"taskId": taskID}, false)
	if r.Error != nil {
		return fmt.Sprintf("error %+v", r.Error)
	}
	return string(r.Result)
}
