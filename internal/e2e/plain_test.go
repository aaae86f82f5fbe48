package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	mcpgoclient "github.com/mark3labs/mcp-go/client"
	mcpgotransport "github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/tasks"
)

// Clients that do not speak MCP tasks, through the real endpoint of a real
// `countersign dev`: the official go-sdk client (2026-07-28, no tasks
// extension declared) and mcp-go (2025-11-25, no params.task). A gated call
// answers [approval-pending] with a task ID; the approver approves with a
// passkey; countersign_await returns the final result. The TypeScript SDK's
// Client runs the same flow in scripts/interop (sdk-plain.mjs).

// toolAnswer is a CallToolResult as both clients give it.
type toolAnswer struct {
	Text       string
	IsError    bool
	Structured json.RawMessage
	Meta       map[string]any
}

func (a toolAnswer) pending(t *testing.T) (taskID, approveURL string) {
	t.Helper()
	var st struct {
		TaskID     string `json:"taskId"`
		Status     string `json:"status"`
		ApproveURL string `json:"approveUrl"`
		ExpiresAt  string `json:"expiresAt"`
	}
	if !a.IsError || !strings.HasPrefix(a.Text, "[approval-pending]") || !strings.Contains(a.Text, "has NOT run") {
		t.Fatalf("want an [approval-pending] result, got %+v", a)
	}
	if err := json.Unmarshal(a.Structured, &st); err != nil || st.TaskID == "" || st.Status != "working" || st.ApproveURL == "" || st.ExpiresAt == "" {
		t.Fatalf("structuredContent %s: %v", a.Structured, err)
	}
	if a.Meta[tasks.MetaDisposition] != nil {
		t.Fatalf("a disposition before anything is final: %v", a.Meta)
	}
	return st.TaskID, st.ApproveURL
}

// plainClient is an MCP client that does not hold tasks. try makes a
// call; it does not fail the test, so a goroutine may use it.
type plainClient interface {
	try(tool string, args map[string]any) (toolAnswer, error)
}

// call makes a call through c and fails the test if it does not answer.
func call(t *testing.T, c plainClient, tool string, args map[string]any) toolAnswer {
	t.Helper()
	a, err := c.try(tool, args)
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return a
}

// goSDKClient is github.com/modelcontextprotocol/go-sdk's client.
type goSDKClient struct{ cs *mcp.ClientSession }

func newGoSDKClient(t *testing.T, s *stack, token string) plainClient {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "go-sdk-plain", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.Base + "/mcp", HTTPClient: &http.Client{Transport: bearer(token)}}, nil)
	if err != nil {
		t.Fatalf("go-sdk connect: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return goSDKClient{cs}
}

func (c goSDKClient) try(tool string, args map[string]any) (toolAnswer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := c.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return toolAnswer{}, fmt.Errorf("go-sdk: %w", err)
	}
	a := toolAnswer{IsError: res.IsError, Meta: res.Meta}
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	a.Text = strings.Join(parts, "\n")
	if res.StructuredContent != nil {
		a.Structured, _ = json.Marshal(res.StructuredContent)
	}
	return a, nil
}

// mcpGoClient is github.com/mark3labs/mcp-go's client on 2025-11-25.
type mcpGoClient struct{ c *mcpgoclient.Client }

func newMCPGoClient(t *testing.T, s *stack, token string) plainClient {
	t.Helper()
	tr, err := mcpgotransport.NewStreamableHTTP(s.Base+"/mcp", mcpgotransport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}))
	if err != nil {
		t.Fatal(err)
	}
	c := mcpgoclient.NewClient(tr, mcpgoclient.WithProtocolVersion(mcpgo.LATEST_LEGACY_PROTOCOL_VERSION))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	init, err := c.Initialize(ctx, mcpgo.InitializeRequest{Params: mcpgo.InitializeParams{
		ProtocolVersion: "2025-11-25", ClientInfo: mcpgo.Implementation{Name: "mcp-go-plain", Version: "1"},
	}})
	if err != nil || init.ProtocolVersion != "2025-11-25" {
		t.Fatalf("mcp-go initialize: %v %+v", err, init)
	}
	return mcpGoClient{c}
}

func (c mcpGoClient) try(tool string, args map[string]any) (toolAnswer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := c.c.CallTool(ctx, mcpgo.CallToolRequest{Params: mcpgo.CallToolParams{Name: tool, Arguments: args}})
	if err != nil {
		return toolAnswer{}, fmt.Errorf("mcp-go: %w", err)
	}
	a := toolAnswer{IsError: res.IsError}
	if res.Meta != nil {
		a.Meta = res.Meta.AdditionalFields
	}
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(mcpgo.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	a.Text = strings.Join(parts, "\n")
	if res.StructuredContent != nil {
		a.Structured, _ = json.Marshal(res.StructuredContent)
	}
	return a, nil
}

// addAgent makes another agent principal and returns its token.
func addAgent(t *testing.T, s *stack, name string) string {
	t.Helper()
	var out struct {
		Token string `json:"token"`
	}
	if code := s.HTTPJSON("POST", "/admin/v1/agents", s.AdminToken, map[string]any{"name": name}, &out); code != 201 || out.Token == "" {
		t.Fatalf("add agent: HTTP %d", code)
	}
	return out.Token
}

func gated(to string) map[string]any {
	return map[string]any{"to": to, "amount": 5000, "currency": "EUR"}
}

func TestPlainClients(t *testing.T) {
	s := startStack(t, "", 0)
	alice := s.Enroll("alice", "approvers")
	mallory := addAgent(t, s, "mallory")
	for _, kind := range []struct {
		name string
		new  func(*testing.T, *stack, string) plainClient
	}{{"go-sdk 2026-07-28", newGoSDKClient}, {"mcp-go 2025-11-25", newMCPGoClient}} {
		t.Run(kind.name, func(t *testing.T) {
			c := kind.new(t, s, s.AgentToken)
			other := kind.new(t, s, mallory)

			t.Run("approved", func(t *testing.T) {
				before := s.Transfers()
				id, url := call(t, c, "transfer_funds", gated(acctName(t, "ok"))).pending(t)
				ref := s.RefOf(id)
				if !strings.HasSuffix(url, "/approve/"+ref) || !strings.HasPrefix(url, s.Base) {
					t.Errorf("approveUrl %s, ref %s", url, ref)
				}
				if n := s.Transfers(); n != before {
					t.Fatalf("%d transfers before approval", n-before)
				}
				// Another principal's await answers as for an unknown task.
				foreign := call(t, other, "countersign_await", map[string]any{"taskId": id, "waitSeconds": 0})
				unknown := call(t, other, "countersign_await", map[string]any{"taskId": tasks.NewID("tsk_"), "waitSeconds": 0})
				if !foreign.IsError || !strings.HasPrefix(foreign.Text, "[unknown-task]") || !strings.HasPrefix(unknown.Text, "[unknown-task]") {
					t.Errorf("foreign await %+v, unknown %+v", foreign, unknown)
				}
				if r := s.Approve(alice, ref, "approve"); !r.Accepted {
					t.Fatalf("approve: %+v", r)
				}
				final := call(t, c, "countersign_await", map[string]any{"taskId": id, "waitSeconds": 30})
				if final.IsError || !strings.HasPrefix(final.Text, "[approved-executed]") || !strings.Contains(final.Text, "Transferred 5,000.00 EUR") ||
					final.Meta[tasks.MetaDisposition] != string(tasks.ApprovedExecuted) {
					t.Fatalf("await: %+v", final)
				}
				if n := s.Transfers(); n != before+1 {
					t.Errorf("%d transfers, want 1", n-before)
				}
				// The result stays readable and the call never runs again.
				again := call(t, c, "countersign_await", map[string]any{"taskId": id})
				if again.Text != final.Text || s.Transfers() != before+1 {
					t.Errorf("second await: %+v", again)
				}
			})

			t.Run("denied", func(t *testing.T) {
				before := s.Transfers()
				id, _ := call(t, c, "transfer_funds", gated(acctName(t, "no"))).pending(t)
				if r := s.Approve(alice, s.RefOf(id), "deny"); !r.Accepted {
					t.Fatalf("deny: %+v", r)
				}
				final := call(t, c, "countersign_await", map[string]any{"taskId": id, "waitSeconds": 30})
				if !final.IsError || !strings.HasPrefix(final.Text, "[denied-not-executed]") {
					t.Fatalf("await: %+v", final)
				}
				if s.Transfers() != before {
					t.Error("a denied call ran")
				}
			})

			t.Run("cancelled", func(t *testing.T) {
				before := s.Transfers()
				id, _ := call(t, c, "transfer_funds", gated(acctName(t, "cxl"))).pending(t)
				if r := call(t, other, "countersign_cancel", map[string]any{"taskId": id}); !strings.HasPrefix(r.Text, "[unknown-task]") {
					t.Fatalf("foreign cancel: %+v", r)
				}
				if r := call(t, c, "countersign_cancel", map[string]any{"taskId": id}); r.IsError || !strings.HasPrefix(r.Text, "[cancelled]") {
					t.Fatalf("cancel: %+v", r)
				}
				final := call(t, c, "countersign_await", map[string]any{"taskId": id, "waitSeconds": 10})
				if !final.IsError || !strings.HasPrefix(final.Text, "[cancelled]") {
					t.Fatalf("await: %+v", final)
				}
				if s.Transfers() != before {
					t.Error("a cancelled call ran")
				}
			})

			t.Run("pending list", func(t *testing.T) {
				id, _ := call(t, c, "transfer_funds", gated(acctName(t, "list"))).pending(t)
				list := call(t, c, "countersign_pending", nil)
				if list.IsError || !strings.Contains(list.Text, id) {
					t.Fatalf("pending: %+v", list)
				}
				if o := call(t, other, "countersign_pending", nil); strings.Contains(o.Text, id) {
					t.Errorf("another principal sees the task: %+v", o)
				}
				call(t, c, "countersign_cancel", map[string]any{"taskId": id})
			})
		})
	}
}

// TestPlainClientExpiry: an approval that nobody gives expires, and the
// await says the call did not run.
func TestPlainClientExpiry(t *testing.T) {
	s := startStackWithPolicy(t, devtest.ShortApprovalPolicy(t))
	c := newGoSDKClient(t, s, s.AgentToken)
	id, _ := call(t, c, "transfer_funds", gated(acctName(t, "exp"))).pending(t)
	final := call(t, c, "countersign_await", map[string]any{"taskId": id, "waitSeconds": 30})
	if !final.IsError || !strings.HasPrefix(final.Text, "[denied-not-executed]") || !strings.Contains(strings.ToLower(final.Text), "expired") {
		t.Fatalf("await: %+v", final)
	}
	if s.Transfers() != 0 {
		t.Error("an expired call ran")
	}
}

// TestInlineWaitEndToEnd: with --inline-wait, a client without tasks is
// held for the decision.
func TestInlineWaitEndToEnd(t *testing.T) {
	s := startStackConfig(t, app.Config{InlineWait: 3 * time.Second}, 0)
	alice := s.Enroll("alice", "approvers")
	c := newMCPGoClient(t, s, s.AgentToken)

	t.Run("approved in the window", func(t *testing.T) {
		before := s.Transfers()
		// The call waits in a goroutine; this one approves.
		type answer struct {
			a   toolAnswer
			err error
		}
		done := make(chan answer, 1)
		go func() {
			a, err := c.try("transfer_funds", gated(acctName(t, "in")))
			done <- answer{a, err}
		}()
		ref, _ := pendingRef(t, s)
		if r := s.Approve(alice, ref, "approve"); !r.Accepted {
			t.Fatalf("approve: %+v", r)
		}
		got := <-done
		if got.err != nil || got.a.IsError || !strings.HasPrefix(got.a.Text, "[approved-executed]") {
			t.Fatalf("the call's own answer: %+v (%v)", got.a, got.err)
		}
		if s.Transfers() != before+1 {
			t.Errorf("%d transfers, want 1", s.Transfers()-before)
		}
	})

	t.Run("window passes, then approved", func(t *testing.T) {
		before := s.Transfers()
		start := time.Now()
		id, _ := call(t, c, "transfer_funds", gated(acctName(t, "late"))).pending(t)
		if el := time.Since(start); el < 3*time.Second {
			t.Errorf("answered after %v, inside the window", el)
		}
		if r := s.Approve(alice, s.RefOf(id), "approve"); !r.Accepted {
			t.Fatalf("approve: %+v", r)
		}
		final := call(t, c, "countersign_await", map[string]any{"taskId": id, "waitSeconds": 30})
		if final.IsError || !strings.HasPrefix(final.Text, "[approved-executed]") || s.Transfers() != before+1 {
			t.Fatalf("await: %+v (%d transfers)", final, s.Transfers()-before)
		}
	})

	t.Run("client hangs up during the wait", func(t *testing.T) {
		before := s.Transfers()
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": "tools/call",
			"params": map[string]any{"name": "transfer_funds", "arguments": gated(acctName(t, "gone"))}})
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.Base+"/mcp", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		req.Header.Set("Authorization", "Bearer "+s.AgentToken)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			t.Fatalf("answered inside the window: HTTP %d", resp.StatusCode)
		}
		ref, id := pendingRef(t, s)
		if r := s.Approve(alice, ref, "approve"); !r.Accepted {
			t.Fatalf("approve: %+v", r)
		}
		final := call(t, c, "countersign_await", map[string]any{"taskId": id, "waitSeconds": 30})
		if final.IsError || !strings.HasPrefix(final.Text, "[approved-executed]") || s.Transfers() != before+1 {
			t.Fatalf("await after the hang-up: %+v (%d transfers)", final, s.Transfers()-before)
		}
	})
}

// pendingRef waits for the one pending approval and returns its reference
// and task.
func pendingRef(t *testing.T, s *stack) (ref, taskID string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var list []struct {
			Ref    string `json:"ref"`
			TaskID string `json:"taskId"`
		}
		s.HTTPJSON("GET", "/admin/v1/approvals?status=pending", s.AdminToken, nil, &list)
		if len(list) == 1 {
			return s.RefOf(list[0].TaskID), list[0].TaskID
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("no pending approval")
	return "", ""
}

// acctName is an account unique to the test (the schema caps it at 64).
func acctName(t *testing.T, suffix string) string {
	sum := sha256.Sum256([]byte(t.Name() + "/" + suffix))
	return "acct-" + hex.EncodeToString(sum[:8])
}

// An agent that never got its answer makes the same call again after the
// first ran: the second opens a new approval (the first no longer holds
// the dedup slot), and its approver is shown the first, approved-executed,
// with the warning, in the API and on the page; a call with other
// arguments, or another principal's same call, is not shown.
func TestIdenticalCallShownAfterRun(t *testing.T) {
	s := startStack(t, "", 0)
	alice := s.Enroll("alice", "approvers")
	c := newGoSDKClient(t, s, s.AgentToken)
	other := newGoSDKClient(t, s, addAgent(t, s, "mallory"))
	args := gated(acctName(t, "twice"))

	first, _ := call(t, c, "transfer_funds", args).pending(t)
	firstRef := s.RefOf(first)
	if r := s.Approve(alice, firstRef, "approve"); !r.Accepted {
		t.Fatalf("approve: %+v", r)
	}
	if final := call(t, c, "countersign_await", map[string]any{"taskId": first, "waitSeconds": 30}); !strings.HasPrefix(final.Text, "[approved-executed]") {
		t.Fatalf("await: %+v", final)
	}

	second, _ := call(t, c, "transfer_funds", args).pending(t)
	if second == first {
		t.Fatal("the identical call joined the ended task")
	}
	otherArgs, _ := call(t, c, "transfer_funds", gated(acctName(t, "other"))).pending(t)
	foreign, _ := call(t, other, "transfer_funds", args).pending(t)

	var view struct {
		IdenticalCalls struct {
			Checked bool   `json:"checked"`
			Warning string `json:"warning"`
			Calls   []struct {
				Ref         string            `json:"ref"`
				Disposition tasks.Disposition `json:"disposition"`
				MayHaveRun  bool              `json:"mayHaveRun"`
			} `json:"calls"`
		} `json:"identicalCalls"`
	}
	ref := s.RefOf(second)
	if code := s.HTTPJSON("GET", "/approver/v1/approvals/"+ref, "", nil, &view); code != http.StatusOK {
		t.Fatalf("approval: %d", code)
	}
	ic := view.IdenticalCalls
	if !ic.Checked || !strings.Contains(ic.Warning, "already ran or may have run") || len(ic.Calls) != 1 ||
		ic.Calls[0].Ref != firstRef || ic.Calls[0].Disposition != tasks.ApprovedExecuted || !ic.Calls[0].MayHaveRun {
		t.Fatalf("identical calls of the second: %+v", ic)
	}
	res, err := http.Get(s.Base + "/approve/" + ref)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var page bytes.Buffer
	if _, err := page.ReadFrom(res.Body); err != nil {
		t.Fatal(err)
	}
	html := page.String()
	if !strings.Contains(html, "This call may already have run") || !strings.Contains(html, "/approve/"+firstRef) || !strings.Contains(html, "approved-executed") {
		t.Errorf("the page of the second does not show the first:\n%s", html)
	}
	for _, id := range []string{otherArgs, foreign} {
		if r := s.RefOf(id); strings.Contains(html, r) {
			t.Errorf("the page lists %s (%s)", r, id)
		}
	}
}
