package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/internal/testnats"
)

// TestRateLimitsAcrossProcesses: two countersign dev processes sharing one
// NATS, as replicas behind a load balancer do, admit one agent what one
// process would. Twenty gated calls at one instant, half to each, open
// exactly the burst of tasks; so do twenty in-band challenges; and forty
// approver challenges for one approval admit exactly that limit's burst.
func TestRateLimitsAcrossProcesses(t *testing.T) {
	const burst = 4
	_, nc := testnats.Start(t)
	cfg := app.Config{ServerID: "e2e-rates", NATSURL: nc.ConnectedUrl(), RatePerMinute: 1, RateBurst: burst}
	a := startStackConfig(t, cfg, 0)
	cfg.DataDir = t.TempDir()
	for _, f := range []string{app.AgentTokenFile, app.AdminTokenFile} {
		if err := os.WriteFile(filepath.Join(cfg.DataDir, f), []byte(readFile(t, filepath.Join(a.Dir, f))), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b := startStackConfig(t, cfg, 0)
	both := func(n int, call func(i int, s *stack) devtest.RPCResponse) []devtest.RPCResponse {
		out := make([]devtest.RPCResponse, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range out {
			s := a
			if i%2 == 1 {
				s = b
			}
			wg.Go(func() {
				<-start
				out[i] = call(i, s)
			})
		}
		close(start)
		wg.Wait()
		return out
	}

	calls := both(20, func(i int, s *stack) devtest.RPCResponse {
		args := map[string]any{"to": "acct-991", "amount": 50000 + i, "currency": "USD", "memo": fmt.Sprint("rate ", i)}
		return s.Call2026(s.AgentToken, "tools/call", "transfer_funds", map[string]any{"name": "transfer_funds", "arguments": args}, true)
	})
	var taskIDs []string
	refused := 0
	for i, r := range calls {
		var res struct {
			ResultType string `json:"resultType"`
			TaskID     string `json:"taskId"`
			Content    []struct {
				Text string `json:"text"`
			} `json:"content"`
		}
		if r.Error != nil {
			t.Fatalf("call %d: error %+v", i, r.Error)
		}
		json.Unmarshal(r.Result, &res)
		switch {
		case res.ResultType == "task" && res.TaskID != "":
			taskIDs = append(taskIDs, res.TaskID)
		case len(res.Content) > 0 && strings.Contains(res.Content[0].Text, "Too many approval requests from this caller"):
			refused++
		default:
			t.Fatalf("call %d: neither a task nor refused for the rate: %s", i, r.Result)
		}
	}
	if len(taskIDs) != burst || refused != 20-burst {
		t.Fatalf("20 gated calls across two processes: %d tasks, %d refused for the rate; want %d and %d", len(taskIDs), refused, burst, 20-burst)
	}

	challenges := both(20, func(i int, s *stack) devtest.RPCResponse {
		args := map[string]any{"symbol": "MSFT", "side": "buy", "quantity": 1 + i, "limit": 400}
		return s.Call2026(s.AgentToken, "approval/challenge/create", "", map[string]any{"toolName": "place_trade", "arguments": args}, false)
	})
	limited := 0
	for i, r := range challenges {
		switch {
		case r.Error == nil:
			t.Fatalf("challenge %d created with no passkey enrolled: %s", i, r.Result)
		case r.Error.Code == -31029 && strings.HasPrefix(r.Error.Message, "Too many approval challenges from this caller"):
			limited++
		case !bytes.Contains(r.Error.Data, []byte(`"no_eligible_credential"`)):
			t.Fatalf("challenge %d: %+v", i, r.Error)
		}
	}
	if limited != 20-burst {
		t.Fatalf("20 in-band challenges across two processes: %d refused for the rate, want %d", limited, 20-burst)
	}

	// An approval's challenges: 30 at once, then one every two seconds
	// (so a slow run may see one more admitted per two seconds it takes).
	ref := a.RefOf(taskIDs[0])
	var mu sync.Mutex
	codes := map[int]int{}
	began := time.Now()
	both(40, func(i int, s *stack) devtest.RPCResponse {
		code := s.HTTPJSON("POST", "/approver/v1/approvals/"+ref+"/challenge", "", map[string]any{"decision": "approve"}, nil)
		mu.Lock()
		codes[code]++
		mu.Unlock()
		return devtest.RPCResponse{}
	})
	refilled := int(time.Since(began) / (2 * time.Second))
	if codes[429] < 10-refilled || codes[429] > 10 || codes[429]+codes[409] != 40 {
		t.Fatalf("40 challenges for one approval across two processes in %v: HTTP codes %v; want 10 × 429 (%d with the refill), the rest 409 (no passkey enrolled)",
			time.Since(began), codes, 10-refilled)
	}
}
