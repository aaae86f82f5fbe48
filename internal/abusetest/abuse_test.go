package abusetest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"golang.org/x/net/netutil"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/internal/authn"
	"github.com/countersign/countersign/internal/httplimit"
	"github.com/countersign/countersign/internal/testnats"
	"github.com/countersign/countersign/mcpserver"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/web"
)

// stack is the serving half of Countersign on loopback: the MCP endpoint
// and the approver site behind the body guard, on an http.Server with a
// connection cap, as internal/app builds it. The Temporal client is lazy
// and never used: nothing here reaches a workflow.
type stack struct {
	base   string
	addr   string
	store  *tasks.Store
	tokens *authn.Tokens
	guard  *httplimit.Bodies
	open   atomic.Int64 // server-side connections
}

type limits struct {
	body     httplimit.Options
	maxConns int
	mcp      mcpserver.Options // only the budget fields are read
}

func startStack(t *testing.T, l limits) *stack {
	t.Helper()
	ctx := context.Background()
	js, _ := testnats.Start(t)
	st := &stack{}
	var err error
	if st.store, err = tasks.NewStore(ctx, js, tasks.StoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if st.tokens, err = authn.Open(ctx, js, authn.Options{}); err != nil {
		t.Fatal(err)
	}
	ledger, err := gateway.NewLedger(ctx, js, gateway.LedgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tools, err := gateway.NewRegistry(gateway.DemoTools(ledger)...)
	if err != nil {
		t.Fatal(err)
	}
	engine, err := pdp.New(ctx, pdp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tc, err := client.NewLazyClient(client.Options{HostPort: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	orch := tasks.NewOrchestrator(tc)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	st.addr = ln.Addr().String()
	st.base = "http://" + st.addr
	_, port, _ := net.SplitHostPort(st.addr)
	publicURL := "http://localhost:" + port

	pk, err := passkey.New(ctx, js, passkey.Options{RPID: "localhost", RPOrigins: []string{publicURL}, RPDisplayName: "Countersign"})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := approvals.New(approvals.Options{Store: st.store, Engine: orch, Passkeys: pk})
	if err != nil {
		t.Fatal(err)
	}
	mcp, err := mcpserver.New(mcpserver.Options{
		ServerID: "abusetest", PublicURL: publicURL,
		Approvals: svc, PDP: engine, Tools: tools,
		Authenticate:            st.tokens.Agent,
		RequestsPerSecond:       l.mcp.RequestsPerSecond,
		RequestBurst:            l.mcp.RequestBurst,
		MaxInFlightPerPrincipal: l.mcp.MaxInFlightPerPrincipal,
	})
	if err != nil {
		t.Fatal(err)
	}
	site, err := web.New(web.Options{PublicURL: publicURL, Approvals: svc, Passkeys: pk, Tokens: st.tokens})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.Handler())
	mux.Handle("/", site)
	body := l.body
	body.Reject = func(w http.ResponseWriter, r *http.Request, status int, msg string) {
		if r.URL.Path == "/mcp" {
			mcpserver.WriteHTTPError(w, status, msg)
			return
		}
		httplimit.WriteJSONError(w, r, status, msg)
	}
	if st.guard, err = httplimit.NewBodies(body); err != nil {
		t.Fatal(err)
	}
	if l.maxConns > 0 {
		ln = netutil.LimitListener(ln, l.maxConns)
	}
	srv := &http.Server{
		Handler:           st.guard.Handler(mux),
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       30 * time.Second,
		ConnState: func(_ net.Conn, cs http.ConnState) {
			switch cs {
			case http.StateNew:
				st.open.Add(1)
			case http.StateClosed, http.StateHijacked:
				st.open.Add(-1)
			}
		},
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close(); tc.Close() })
	return st
}

// agent registers an agent token and a working task it owns.
func (st *stack) agent(t *testing.T, name string) (token, taskID string) {
	t.Helper()
	ctx := context.Background()
	token, err := st.tokens.Issue(ctx, name, authn.KindAgent)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	taskID = tasks.NewID("task_")
	if err := st.store.Create(ctx, tasks.Record{
		TaskID: taskID, Owner: name, Era: tasks.Era2025, Status: tasks.StatusWorking,
		CreatedAt: now, LastUpdatedAt: now, TTL: time.Hour, PollInterval: 2 * time.Second,
		Tool: "transfer_funds", Arguments: json.RawMessage(`{}`), ExpiresAt: now.Add(time.Hour),
	}); err != nil {
		t.Fatal(err)
	}
	return token, taskID
}

// tasksGet is a 2025-11-25 tasks/get over HTTP; it returns the status code
// and the decoded body.
func tasksGet(c *http.Client, base, token, taskID string, id int) (int, http.Header, rpcResponse, error) {
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tasks/get","params":{"taskId":%q}}`, id, taskID)
	req, _ := http.NewRequest(http.MethodPost, base+"/mcp", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, rpcResponse{}, err
	}
	defer resp.Body.Close()
	var out rpcResponse
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, resp.Header, out, err
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return resp.StatusCode, resp.Header, out, fmt.Errorf("body %q: %w", b, err)
	}
	return resp.StatusCode, resp.Header, out, nil
}

type rpcResponse struct {
	ID     json.RawMessage `json:"id"`
	Result struct {
		TaskID string `json:"taskId"`
		Status string `json:"status"`
	} `json:"result"`
	Error *struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func newClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns}, Timeout: 30 * time.Second}
}

// TestOneAgentCannotStarveAnother: agent A polls tasks/get from 200
// goroutines in a tight loop while agent B polls sequentially, 40 times a
// second at most. B's median
// latency stays low and A is answered 429.
func TestOneAgentCannotStarveAnother(t *testing.T) {
	st := startStack(t, limits{}) // the default budget
	p50, aStatuses := starve(t, st, 5*time.Second)
	if aStatuses[http.StatusTooManyRequests] == 0 {
		t.Errorf("agent A was never refused: %v", aStatuses)
	}
	if p50 > 100*time.Millisecond {
		t.Errorf("agent B's p50 under agent A's load is %v, want under 100ms", p50)
	}
}

// TestStarvationWithoutBudget measures the same load with the budget lifted,
// for comparison (set COUNTERSIGN_MEASURE_UNBUDGETED=1; it asserts nothing).
func TestStarvationWithoutBudget(t *testing.T) {
	if os.Getenv("COUNTERSIGN_MEASURE_UNBUDGETED") == "" {
		t.Skip("a measurement, not a check: set COUNTERSIGN_MEASURE_UNBUDGETED=1")
	}
	st := startStack(t, limits{mcp: mcpserver.Options{RequestsPerSecond: 1e9, RequestBurst: 1e9, MaxInFlightPerPrincipal: 1e9}})
	starve(t, st, 5*time.Second)
}

func starve(t *testing.T, st *stack, d time.Duration) (time.Duration, map[int]int) {
	t.Helper()
	tokA, taskA := st.agent(t, "agent-a")
	tokB, taskB := st.agent(t, "agent-b")
	const pollers = 200
	cA, cB := newClient(pollers), newClient(1)
	defer cA.CloseIdleConnections()
	defer cB.CloseIdleConnections()

	// B alone, for reference.
	var alone []time.Duration
	for i := range 20 {
		t0 := time.Now()
		if code, _, _, err := tasksGet(cB, st.base, tokB, taskB, i); err != nil || code != http.StatusOK {
			t.Fatalf("agent B alone: %d %v", code, err)
		}
		alone = append(alone, time.Since(t0))
	}

	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var mu sync.Mutex
	aStatuses := map[int]int{}
	var wg sync.WaitGroup
	var checked atomic.Bool
	for g := range pollers {
		wg.Go(func() {
			local := map[int]int{}
			for i := 0; ctx.Err() == nil; i++ {
				code, h, resp, err := tasksGet(cA, st.base, tokA, taskA, g*1_000_000+i)
				if err != nil {
					local[-1]++
					continue
				}
				local[code]++
				if code == http.StatusTooManyRequests && checked.CompareAndSwap(false, true) {
					if h.Get("Retry-After") == "" || resp.Error == nil || resp.Error.Code != mcpserver.CodeTooManyRequests ||
						string(resp.ID) != fmt.Sprint(g*1_000_000+i) {
						t.Errorf("429 answer: Retry-After %q, id %s, error %+v; want Retry-After, the request's id and code %d",
							h.Get("Retry-After"), resp.ID, resp.Error, mcpserver.CodeTooManyRequests)
					}
				}
			}
			mu.Lock()
			for k, v := range local {
				aStatuses[k] += v
			}
			mu.Unlock()
		})
	}
	// Past A's initial burst (the budget's burst is spent at once), into
	// the steady state.
	time.Sleep(1500 * time.Millisecond)
	var under []time.Duration
	for i := 0; ctx.Err() == nil; i++ {
		t0 := time.Now()
		code, _, resp, err := tasksGet(cB, st.base, tokB, taskB, i)
		if ctx.Err() != nil {
			break
		}
		if err != nil || code != http.StatusOK || resp.Result.TaskID != taskB {
			t.Fatalf("agent B under load: %d %+v %v", code, resp, err)
		}
		under = append(under, time.Since(t0))
		time.Sleep(25 * time.Millisecond) // a brisk poller, well within its budget
	}
	wg.Wait()
	p := func(ds []time.Duration, q float64) time.Duration {
		slices.Sort(ds)
		return ds[int(float64(len(ds)-1)*q)]
	}
	p50 := p(under, 0.5)
	t.Logf("agent B: alone p50 %v; under agent A's %d pollers p50 %v p90 %v (%d requests); agent A: %v",
		p(alone, 0.5).Round(10*time.Microsecond), pollers, p50.Round(10*time.Microsecond), p(under, 0.9).Round(10*time.Microsecond), len(under), aStatuses)
	return p50, aStatuses
}

// TestSlowBodiesToSiteAndMCP: 300 connections send headers and one byte of
// a body, to a made-up enrollment token and to /mcp, without credentials,
// and stall. Each is answered (408, or 503 once the slow-reader slots are
// taken) and closed within the body deadline; a prompt client is served
// meanwhile; descriptors and goroutines come back.
func TestSlowBodiesToSiteAndMCP(t *testing.T) {
	const (
		slow     = 300
		timeout  = 2 * time.Second
		maxSlow  = 32
		deadline = timeout + 2*time.Second
	)
	st := startStack(t, limits{
		body:     httplimit.Options{BodyTimeout: timeout, SlowAfter: 250 * time.Millisecond, MaxSlowBodies: maxSlow},
		maxConns: 1024,
	})
	tok, taskID := st.agent(t, "agent-prompt")
	// The stalled /mcp bodies carry another agent's token: each holds one
	// of that agent's working slots while its token is looked up, so on a
	// loaded machine they may fill its share (by design, an agent's flood
	// costs that agent); the prompt client is another agent, not starved.
	slowTok, _ := st.agent(t, "agent-slow")
	c := newClient(1)
	defer c.CloseIdleConnections()
	if code, _, _, err := tasksGet(c, st.base, tok, taskID, 1); err != nil || code != http.StatusOK {
		t.Fatalf("before: %d %v", code, err)
	}
	c.CloseIdleConnections()
	waitFor(t, 2*time.Second, func() bool { return st.open.Load() == 0 })
	fds0, gor0 := openFDs(t), runtime.NumGoroutine()

	start := time.Now()
	// Three targets: a made-up enrollment token (no credentials needed to
	// reach the body), /mcp with an agent's token, /mcp without one (401 at
	// once, the body unread).
	type target struct{ label, path, auth string }
	targets := []target{
		{"enrollment", "/approver/v1/enrollments/made-up-token/begin", ""},
		{"mcp", "/mcp", "Authorization: Bearer " + slowTok + "\r\n"},
		{"mcp-anonymous", "/mcp", ""},
	}
	conns := make([]net.Conn, slow)
	for i := range conns {
		nc, err := net.Dial("tcp", st.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		tg := targets[i%len(targets)]
		fmt.Fprintf(nc, "POST %s HTTP/1.1\r\nHost: localhost\r\n%sContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", tg.path, tg.auth)
		conns[i] = nc
	}
	time.Sleep(100 * time.Millisecond)
	peakFDs, peakConns := openFDs(t), st.open.Load()

	// A prompt client is served meanwhile, with and without a body.
	if code, _, resp, err := tasksGet(c, st.base, tok, taskID, 2); err != nil || code != http.StatusOK || resp.Result.TaskID != taskID {
		t.Fatalf("prompt client during the attack: %d %+v %v", code, resp, err)
	}
	if resp, err := c.Get(st.base + "/healthz-does-not-exist"); err != nil {
		t.Fatalf("prompt GET during the attack: %v", err)
	} else {
		resp.Body.Close()
	}

	var mu sync.Mutex
	statuses := map[string]int{}
	var wg sync.WaitGroup
	for i, nc := range conns {
		wg.Go(func() {
			nc.SetReadDeadline(time.Now().Add(deadline))
			resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
			key := targets[i%len(targets)].label
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				statuses[key+" error"]++
				t.Errorf("slow client on %s: %v", key, err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			statuses[fmt.Sprintf("%s %d", key, resp.StatusCode)]++
			if !checkSlowAnswer(t, key, resp, b) {
				return
			}
			if _, err := nc.Read(make([]byte, 1)); err != io.EOF {
				t.Errorf("connection on %s not closed after the answer: %v", key, err)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if elapsed > deadline {
		t.Errorf("slow clients held for %v, want under %v", elapsed, deadline)
	}
	for _, nc := range conns {
		nc.Close()
	}
	c.CloseIdleConnections()
	waitFor(t, 5*time.Second, func() bool {
		return st.open.Load() == 0 && openFDs(t) <= fds0+2 && runtime.NumGoroutine() <= gor0+5
	})
	t.Logf("%d slow connections answered in %v: %v; server connections %d at peak; fds %d → peak %d → %d; goroutines %d → %d",
		slow, elapsed.Round(10*time.Millisecond), statuses, peakConns, fds0, peakFDs, openFDs(t), gor0, runtime.NumGoroutine())
}

// checkSlowAnswer checks the guard's answer to a slow body: 408 or 503
// with Retry-After, in the endpoint's JSON shape.
func checkSlowAnswer(t *testing.T, path string, resp *http.Response, body []byte) bool {
	t.Helper()
	if path == "mcp-anonymous" {
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: status %d %s, want 401", path, resp.StatusCode, body)
			return false
		}
		return true
	}
	switch resp.StatusCode {
	case http.StatusRequestTimeout:
	case http.StatusServiceUnavailable:
		if resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s: 503 without Retry-After", path)
		}
	default:
		t.Errorf("%s: status %d %s, want 408 or 503", path, resp.StatusCode, body)
		return false
	}
	if path == "mcp" {
		var r rpcResponse
		if err := json.Unmarshal(body, &r); err != nil || r.Error == nil {
			t.Errorf("mcp: body %s is not a JSON-RPC error", body)
			return false
		}
		want := int64(-32600)
		if resp.StatusCode == http.StatusServiceUnavailable {
			want = mcpserver.CodeTooManyRequests
		}
		if r.Error.Code != want {
			t.Errorf("mcp %d: code %d, want %d", resp.StatusCode, r.Error.Code, want)
		}
		return true
	}
	var e struct{ Error, Message string }
	if err := json.Unmarshal(body, &e); err != nil || e.Error == "" || e.Message == "" {
		t.Errorf("%s: body %s is not an API error", path, body)
		return false
	}
	return true
}

func openFDs(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd: cannot count file descriptors")
	}
	return len(ents)
}

func waitFor(t *testing.T, d time.Duration, ok func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !ok(); {
		if time.Now().After(end) {
			t.Fatalf("not released after %v", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
