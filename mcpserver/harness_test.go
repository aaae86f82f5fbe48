package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/approvals/approvalstest"
	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/gateway/conformance"
	"github.com/countersign/countersign/internal/authn"
	"github.com/countersign/countersign/internal/natsrv"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
)

// testEnv is the backing of every test in this package: an embedded NATS
// with the task store and demo ledger, the default policy, the demo tools,
// and the in-memory approval engine (approvals/approvalstest), which runs
// the workflow's activities against them without Temporal. Each harness
// puts its own approvals.Service (its own limits) over it. It is shared:
// tests isolate themselves by principal. The real workflow is exercised in
// internal/e2e.
type testEnv struct {
	dir      string
	nats     *natsrv.Server
	nc       *nats.Conn
	store    *tasks.Store
	ledger   *gateway.Ledger
	tools    *gateway.Registry
	fixtures *conformance.Set // nil unless conformance
	engine   *pdp.Engine
	workflow *approvalstest.Engine
	passkeys *passkey.Service // the workflow's (approvers' groups)
}

var (
	envOnce sync.Once
	env     *testEnv
	envErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if env != nil {
		env.close()
	}
	if confEnv != nil {
		confEnv.close()
	}
	os.Exit(code)
}

// sharedEnv starts the environment on first use.
func sharedEnv(tb testing.TB) *testEnv {
	tb.Helper()
	envOnce.Do(func() { env, envErr = startEnv(false) })
	if envErr != nil {
		tb.Fatalf("test environment: %v", envErr)
	}
	return env
}

// startEnv starts an environment; withFixtures adds the conformance fixture
// tools and policy (what `countersign dev --conformance` serves).
func startEnv(withFixtures bool) (e *testEnv, err error) {
	e = &testEnv{}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.dir, err = os.MkdirTemp("", "mcpserver-test-"); err != nil {
		return nil, err
	}
	if e.nats, err = natsrv.Start(natsrv.Options{StoreDir: e.dir}); err != nil {
		return nil, err
	}
	if e.nc, err = nats.Connect(e.nats.URL()); err != nil {
		return nil, err
	}
	js, err := jetstream.New(e.nc)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	if e.store, err = tasks.NewStore(ctx, js, tasks.StoreOptions{}); err != nil {
		return nil, err
	}
	if e.ledger, err = gateway.NewLedger(ctx, js, gateway.LedgerOptions{}); err != nil {
		return nil, err
	}
	tools := gateway.DemoTools(e.ledger)
	policyDir := ""
	if withFixtures {
		e.fixtures = conformance.New()
		tools = append(tools, e.fixtures.Tools()...)
		policyDir = filepath.Join(e.dir, "policy")
		if err := pdp.WriteConformancePolicy(policyDir); err != nil {
			return nil, err
		}
	}
	if e.tools, err = gateway.NewRegistry(tools...); err != nil {
		return nil, err
	}
	if e.engine, err = pdp.New(ctx, pdp.Options{Dir: policyDir}); err != nil {
		return nil, err
	}
	if e.passkeys, err = passkey.New(ctx, js, passkey.Options{RPID: testRPID, RPOrigins: []string{testOrigin}}); err != nil {
		return nil, err
	}
	e.workflow = approvalstest.New(approvalstest.Options{
		Activities: &activities.Activities{Tasks: e.store, PDP: e.engine, Tools: e.tools, Passkeys: e.passkeys},
	})
	return e, nil
}

func (e *testEnv) close() {
	if e.workflow != nil {
		e.workflow.Close()
	}
	if e.nc != nil {
		e.nc.Close()
	}
	if e.nats != nil {
		e.nats.Shutdown()
	}
	if e.dir != "" {
		_ = os.RemoveAll(e.dir)
	}
}

// errToken is a bearer token Authenticate fails on with an internal error
// text that must never reach the client.
const errToken = "tok-broken"

// unavailableToken is a bearer token Authenticate cannot check: the token
// store did not answer (authn.ErrUnavailable).
const unavailableToken = "tok-store-down"

// disabledToken is the valid token of an agent an admin disabled
// (authn.ErrDisabled).
const disabledToken = "tok-disabled"

// testAuth accepts "tok:<principal>".
func testAuth(_ context.Context, bearer string) (string, error) {
	if bearer == errToken {
		return "", errors.New("identity provider exploded: secret detail")
	}
	if bearer == unavailableToken {
		return "", fmt.Errorf("%w: nats: timeout (secret detail)", authn.ErrUnavailable)
	}
	if bearer == disabledToken {
		return "", authn.ErrDisabled
	}
	p, ok := strings.CutPrefix(bearer, "tok:")
	if !ok || p == "" {
		return "", errors.New("unknown token")
	}
	return p, nil
}

// harness is one Countersign MCP endpoint, with its own approval service,
// over the shared environment.
type harness struct {
	env       *testEnv
	approvals *approvals.Service
	srv       *Server
	ts        *httptest.Server
	log       *lockedBuffer
}

// newHarness serves an endpoint over the shared environment. tweak adjusts
// the endpoint's options; limits adjust its approval service's (creation
// rate, pending cap, poll interval, result retention).
func newHarness(tb testing.TB, tweak func(*Options), limits ...func(*approvals.Options)) *harness {
	tb.Helper()
	return sharedEnv(tb).serve(tb, func(o *Options) {
		o.PublicURL = "http://countersign.test"
		o.Authenticate = testAuth
		if tweak != nil {
			tweak(o)
		}
	}, limits...)
}

// serve builds an approval service over e and an endpoint over it, and
// serves the endpoint until the test ends.
func (e *testEnv) serve(tb testing.TB, tweak func(*Options), limits ...func(*approvals.Options)) *harness {
	tb.Helper()
	logs := &lockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ao := approvals.Options{Store: e.store, Engine: e.workflow, Logger: log}
	for _, f := range limits {
		f(&ao)
	}
	svc, err := approvals.New(ao)
	if err != nil {
		tb.Fatalf("approvals.New: %v", err)
	}
	opts := Options{
		ServerID:  "countersign-test",
		Approvals: svc,
		PDP:       e.engine,
		Tools:     e.tools,
		Fixtures:  e.fixtures,
		Logger:    log,
	}
	if tweak != nil {
		tweak(&opts)
	}
	srv, err := New(opts)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	ts := httptest.NewServer(srv.Handler())
	tb.Cleanup(func() {
		ts.Close()
		// The workflow starts the calls left in flight end with the test.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := svc.Drain(ctx); err != nil {
			tb.Error(err)
		}
	})
	return &harness{env: e, approvals: svc, srv: srv, ts: ts, log: logs}
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Reset()
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// principal returns a principal unique to the running test.
func principal(tb testing.TB, suffix string) string {
	return strings.NewReplacer("/", "-", " ", "_").Replace(tb.Name()) + "-" + suffix
}

// rpc is one raw JSON-RPC exchange over HTTP.
type rpc struct {
	Status int
	Header http.Header
	Body   []byte

	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int64           `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
}

// call describes one request.
type call struct {
	token   string              // bearer token; "" sends none
	era     tasks.Era           // wire era
	tasks   bool                // 2026: declare the tasks extension
	caps    map[string]any      // 2026: more client capabilities
	method  string              // JSON-RPC method
	params  map[string]any      // params (a _meta is added for 2026)
	headers map[string]string   // extra or overriding headers
	raw     []byte              // raw body, overrides everything above
	edit    func([]byte) []byte // rewrites the body built from the fields above
}

var nextID atomic.Int64

func (h *harness) do(tb testing.TB, c call) rpc {
	tb.Helper()
	r, err := h.try(c)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// try sends one request; unlike do, it does not fail the test, so a
// goroutine other than the test's may use it.
func (h *harness) try(c call) (rpc, error) {
	body := c.raw
	hdr := http.Header{}
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Accept", "application/json, text/event-stream")
	if c.token != "" {
		hdr.Set("Authorization", "Bearer "+c.token)
	}
	if body == nil {
		params := map[string]any{}
		for k, v := range c.params {
			params[k] = v
		}
		switch c.era {
		case tasks.Era2026:
			caps := map[string]any{}
			for k, v := range c.caps {
				caps[k] = v
			}
			if c.tasks {
				caps["extensions"] = map[string]any{tasks.ExtTasks: map[string]any{}}
			}
			meta := map[string]any{}
			if m, ok := c.params["_meta"].(map[string]any); ok {
				for k, v := range m {
					meta[k] = v // the call's own _meta members (a transaction token, SEP-2672 evidence)
				}
			}
			meta["io.modelcontextprotocol/protocolVersion"] = string(tasks.Era2026)
			meta["io.modelcontextprotocol/clientCapabilities"] = caps
			meta["io.modelcontextprotocol/clientInfo"] = map[string]any{"name": "raw-test", "version": "1"}
			params["_meta"] = meta
			hdr.Set("Mcp-Protocol-Version", string(tasks.Era2026))
			hdr.Set("Mcp-Method", c.method)
			switch c.method {
			case "tools/call":
				hdr.Set("Mcp-Name", fmt.Sprint(c.params["name"]))
			case "tasks/get", "tasks/update", "tasks/cancel":
				hdr.Set("Mcp-Name", fmt.Sprint(c.params["taskId"]))
			}
		default:
			hdr.Set("Mcp-Protocol-Version", string(tasks.Era2025))
		}
		var err error
		body, err = json.Marshal(map[string]any{"jsonrpc": "2.0", "id": nextID.Add(1), "method": c.method, "params": params})
		if err != nil {
			return rpc{}, err
		}
		if c.edit != nil {
			body = c.edit(body)
		}
	}
	for k, v := range c.headers {
		if v == "" {
			hdr.Del(k)
		} else {
			hdr.Set(k, v)
		}
	}
	req, err := http.NewRequest(http.MethodPost, h.ts.URL, bytes.NewReader(body))
	if err != nil {
		return rpc{}, err
	}
	req.Header = hdr
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		return rpc{}, fmt.Errorf("%s: %w", c.method, err)
	}
	defer resp.Body.Close()
	out := rpc{Status: resp.StatusCode, Header: resp.Header}
	out.Body, _ = io.ReadAll(resp.Body)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") && len(out.Body) > 0 {
		if err := json.Unmarshal(out.Body, &out); err != nil {
			return rpc{}, fmt.Errorf("%s: decode %s: %w", c.method, out.Body, err)
		}
	}
	if out.Error != nil && out.Error.Code == CodeApproval {
		var data struct {
			Reason string `json:"reason"`
		}
		if err := json.Unmarshal(out.Error.Data, &data); err != nil || !sep2672Reasons[data.Reason] {
			return rpc{}, fmt.Errorf("%s: -32001 without a reason of SEP-2672 §4.10: %s", c.method, out.Body)
		}
	}
	return out, nil
}

// sep2672Reasons are the data.reason values of SEP-2672 §4.10, the only
// ones a -32001 may carry ("Servers MUST include a reason field in data
// from the enumerated set"). Every response a test reads is checked.
var sep2672Reasons = func() map[string]bool {
	m := map[string]bool{}
	for _, r := range []string{
		// Per-call assertion path.
		"missing_evidence", "unsupported_method", "challenge_unknown", "challenge_consumed",
		"challenge_expired", "challenge_wrong_tool", "unknown_credential", "authenticator_class_mismatch",
		"signature_verification_failed", "signature_counter_regression", "argument_hash_mismatch",
		// Challenge issuance.
		"tool_not_approved_required", "no_eligible_credential",
		// Enrollment finish.
		"credential_already_enrolled", "no_pending_enrollment", "verification_failed",
	} {
		m[r] = true
	}
	return m
}()

// ok asserts a successful response and decodes its result into v.
func (r rpc) ok(tb testing.TB, v any) {
	tb.Helper()
	if r.Status != http.StatusOK || r.Error != nil || r.Result == nil {
		tb.Fatalf("want a result, got HTTP %d: %s", r.Status, r.Body)
	}
	if v != nil {
		if err := json.Unmarshal(r.Result, v); err != nil {
			tb.Fatalf("decode result %s: %v", r.Result, err)
		}
	}
}

// fails asserts a JSON-RPC error with the code and HTTP status.
func (r rpc) fails(tb testing.TB, status int, code int64) {
	tb.Helper()
	if r.Status != status || r.Error == nil || r.Error.Code != code {
		tb.Fatalf("want HTTP %d with error %d, got HTTP %d: %s", status, code, r.Status, r.Body)
	}
}

// toolCallResult is a CallToolResult as a test reads it.
type toolCallResult struct {
	ResultType string `json:"resultType"`
	Content    []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StructuredContent json.RawMessage `json:"structuredContent"`
	IsError           bool            `json:"isError"`
	Meta              map[string]any  `json:"_meta"`
}

func (r toolCallResult) text() string {
	var parts []string
	for _, c := range r.Content {
		parts = append(parts, c.Text)
	}
	return strings.Join(parts, "\n")
}

// taskResult2026 is a SEP-2663 CreateTaskResult / tasks/get result.
type taskResult2026 struct {
	ResultType     string          `json:"resultType"`
	TaskID         string          `json:"taskId"`
	Status         string          `json:"status"`
	StatusMessage  string          `json:"statusMessage"`
	CreatedAt      string          `json:"createdAt"`
	LastUpdatedAt  string          `json:"lastUpdatedAt"`
	TTLMs          *int64          `json:"ttlMs"`
	PollIntervalMs *int64          `json:"pollIntervalMs"`
	Result         json.RawMessage `json:"result"`
	Meta           map[string]any  `json:"_meta"`
}

// legacyTask is a 2025-11-25 Task.
type legacyTask struct {
	TaskID        string `json:"taskId"`
	Status        string `json:"status"`
	StatusMessage string `json:"statusMessage"`
	CreatedAt     string `json:"createdAt"`
	LastUpdatedAt string `json:"lastUpdatedAt"`
	TTL           *int64 `json:"ttl"`
	PollInterval  *int64 `json:"pollInterval"`
}

// transferArgs builds transfer_funds arguments to a test-unique account.
func transferArgs(to string, amount float64) map[string]any {
	return map[string]any{"to": to, "amount": amount, "currency": "EUR"}
}

// transfersTo counts executed transfers to an account.
func (h *harness) transfersTo(tb testing.TB, to string) int {
	tb.Helper()
	ts, err := h.env.ledger.Transfers(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	n := 0
	for _, t := range ts {
		if t.To == to {
			n++
		}
	}
	return n
}

// waitStatus polls the store until the task has the status.
func (h *harness) waitStatus(tb testing.TB, id string, want tasks.Status) tasks.Record {
	tb.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		r, err := h.env.store.Get(context.Background(), id)
		if err == nil && r.Status == want {
			return r
		}
		if time.Now().After(deadline) {
			tb.Fatalf("task %s: status %q, want %q (err %v)", id, r.Status, want, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
