package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/slack-go/slack/slacktest"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/internal/telemetry"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/txtoken"
)

// syncBuffer is a log sink shared by the process's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// One gated call to an HTTP upstream, approved with a passkey, on a real
// `countersign dev` with tracing to an in-memory exporter, JSON logs and the
// operations listener. Then: /metrics has moved with the right labels; one
// trace links tools/call → workflow → activity → the upstream call, whose
// traceparent reached the upstream; the task's log lines carry task_id and
// trace_id; no line holds a secret the process held: the agent and admin
// tokens, an enrollment invitation, the passkey challenge and assertion,
// the Slack token and signing secret, OAuth access tokens (accepted and
// forged), a transaction token and the embedded NATS's credentials.
func TestTelemetryGatedCall(t *testing.T) {
	var mu sync.Mutex
	var traceparents []string
	up := mcp.NewServer(&mcp.Implementation{Name: "obs", Version: "1"}, nil)
	up.AddTool(&mcp.Tool{Name: "echo", InputSchema: objectSchema}, pong)
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return up }, nil)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			if bytes.Contains(body, []byte(`"tools/call"`)) {
				mu.Lock()
				traceparents = append(traceparents, r.Header.Get("traceparent"))
				mu.Unlock()
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		sdk.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	path := filepath.Join(t.TempDir(), "countersign.yaml")
	if err := os.WriteFile(path, []byte("upstreams:\n  - name: obs\n    url: "+ts.URL+"\n    approval: always\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// Slack on (a slacktest server), and agents with OAuth tokens of the
	// real provider: both put secrets in the process.
	calls := &slackCalls{}
	fake := slacktest.NewTestServer(func(c slacktest.Customize) {
		c.Handle("/chat.postMessage", calls.handler("chat.postMessage"))
		c.Handle("/chat.update", calls.handler("chat.update"))
	})
	fake.Start()
	t.Cleanup(fake.Stop)
	const slackToken, slackSecret = "xoxb-telemetry-secret-7f3a", "telemetry-signing-secret-9c1d"
	node, modules := upstreamServers(t)
	port := freePort(t)
	resource := fmt.Sprintf("http://localhost:%d/mcp", port)
	idp := &oidcProvider{t: t, node: node, modules: modules, port: freePort(t), resource: resource}
	idp.start("key-1")
	t.Cleanup(idp.stop)

	spans := tracetest.NewInMemoryExporter()
	logs := &syncBuffer{}
	log, err := telemetry.NewLogger(logs, telemetry.LogJSON, -4) // debug
	if err != nil {
		t.Fatal(err)
	}
	s := &stack{devtest.Start(t, devtest.Options{
		Config: app.Config{ConfigFile: path, MetricsAddr: "127.0.0.1:0", TraceExporter: spans,
			SlackToken: slackToken, SlackChannel: "#approvals", SlackSigningSecret: slackSecret, SlackAPIURL: fake.GetAPIURL(),
			OAuthIssuer: idp.issuer(), OAuthPrincipalClaim: "client_id"},
		Logger: log,
		Port:   port,
	})}
	s.waitTool(t, "obs__echo")
	alice := s.Enroll("alice", "approvers")

	task := s.CreateTask(s.AgentToken, "obs__echo", map[string]any{"n": 1})
	ref := s.RefOf(task.TaskID)
	calls.waitFor(t, "chat.postMessage", ref)
	// The ceremony step by step, to keep its challenge and assertion.
	challenge := s.Challenge(ref, "approve")
	assertion := alice.Sign(t, challenge)
	if res := s.Decide(ref, challenge, "approve", assertion); !res.Accepted {
		t.Fatalf("approval rejected: %+v", res)
	}
	secrets := map[string]string{"agent token": s.AgentToken, "admin token": s.AdminToken,
		"Slack token": slackToken, "Slack signing secret": slackSecret}
	var opts struct {
		Challenge string `json:"challenge"`
	}
	var signed struct {
		Response struct {
			Signature string `json:"signature"`
		} `json:"response"`
	}
	if json.Unmarshal(challenge.RequestOptions, &opts) != nil || opts.Challenge == "" ||
		json.Unmarshal(assertion, &signed) != nil || signed.Response.Signature == "" {
		t.Fatalf("no challenge or signature in %s / %s", challenge.RequestOptions, assertion)
	}
	secrets["passkey challenge"], secrets["passkey assertion signature"] = opts.Challenge, signed.Response.Signature
	// An enrollment invitation that is never used.
	var invite struct {
		EnrollURL string `json:"enrollUrl"`
	}
	if code := s.HTTPJSON("POST", "/admin/v1/approvers", s.AdminToken, map[string]any{"name": "bob", "groups": []string{"approvers"}}, &invite); code != 201 && code != 200 {
		t.Fatalf("add approver: HTTP %d", code)
	}
	secrets["enrollment invitation"] = invite.EnrollURL[strings.LastIndexByte(invite.EnrollURL, '/')+1:]
	// OAuth: an accepted access token and a forged one (the rejection is
	// logged).
	oauthToken := idp.token("agent-a", "secret-a", resource, "mcp:tools")
	if code, www := s.MCPAuth(oauthToken); code != 200 {
		t.Fatalf("OAuth token: %d %q", code, www)
	}
	forged := oauthToken[:strings.LastIndexByte(oauthToken, '.')+1] + "AAAA"
	if code, _ := s.MCPAuth(forged); code != 401 {
		t.Fatalf("forged OAuth token: HTTP %d", code)
	}
	secrets["OAuth access token"] = oauthToken
	secrets["OAuth access token's signature"] = oauthToken[strings.LastIndexByte(oauthToken, '.')+1:]
	// A transaction token, issued by the operator and presented on a call.
	var issued struct {
		Token string `json:"token"`
	}
	txArgs := map[string]any{"to": "acct-telemetry", "amount": 5, "currency": "EUR"}
	if code := s.HTTPJSON("POST", "/admin/v1/transaction-tokens", s.AdminToken, map[string]any{"principal": "dev-agent", "tool": "transfer_funds", "arguments": txArgs}, &issued); code != 201 || issued.Token == "" {
		t.Fatalf("issue a transaction token: HTTP %d", code)
	}
	s.Call2026(s.AgentToken, "tools/call", "transfer_funds", map[string]any{"name": "transfer_funds", "arguments": txArgs,
		"_meta": map[string]any{txtoken.MetaKey: issued.Token}}, false)
	secrets["transaction token"] = issued.Token
	// The embedded NATS's client credentials.
	if u, err := url.Parse(s.App.NATSURL()); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			secrets["NATS password"] = pw
		}
	}
	if secrets["NATS password"] == "" {
		t.Fatalf("the embedded NATS URL %q carries no password to look for", s.App.NATSURL())
	}
	d := s.WaitTerminal(s.AgentToken, task.TaskID)
	if d.Status != tasks.StatusCompleted || disposition(d) != tasks.ApprovedExecuted {
		t.Fatalf("want completed/approved-executed, got %s/%s: %s", d.Status, disposition(d), d.Result)
	}

	ops := "http://" + s.App.MetricsAddr()
	t.Run("readyz", func(t *testing.T) {
		for _, base := range []string{ops, s.Base} {
			resp, err := http.Get(base + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("%s/readyz = %d %q", base, resp.StatusCode, body)
			}
		}
		if resp, err := http.Get(s.Base + "/metrics"); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if bytes.Contains(body, []byte("countersign_gated_calls_total")) {
				t.Error("/metrics is served on the agents' port")
			}
		}
	})

	t.Run("metrics", func(t *testing.T) {
		// The worker counts the end just after it writes the terminal
		// record, which the client may read first.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			resp, err := http.Get(ops + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if bytes.Contains(body, []byte(`countersign_executions_total{disposition="approved-executed"}`)) {
				break
			}
		}
		resp, err := http.Get(ops + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(resp.Body)
		if err != nil {
			t.Fatalf("parse /metrics: %v", err)
		}
		value := func(name string, labels map[string]string) float64 {
			f := families[name]
			if f == nil {
				return -1
			}
		next:
			for _, m := range f.GetMetric() {
				got := map[string]string{}
				for _, l := range m.GetLabel() {
					got[l.GetName()] = l.GetValue()
				}
				for k, v := range labels {
					if got[k] != v {
						continue next
					}
				}
				switch {
				case m.Counter != nil:
					return m.Counter.GetValue()
				case m.Histogram != nil:
					return float64(m.Histogram.GetSampleCount())
				case m.Gauge != nil:
					return m.Gauge.GetValue()
				}
			}
			return 0
		}
		for _, c := range []struct {
			name   string
			labels map[string]string
		}{
			{telemetry.MetricGatedCalls, map[string]string{"decision": "requestable"}},
			{telemetry.MetricTaskTransitions, map[string]string{"status": "working"}},
			{telemetry.MetricTaskTransitions, map[string]string{"status": "completed"}},
			{telemetry.MetricDecisions, map[string]string{"result": "accepted", "reason": ""}},
			{telemetry.MetricApprovalLatency, map[string]string{"outcome": "approved"}},
			{telemetry.MetricExecutions, map[string]string{"disposition": "approved-executed"}},
			{telemetry.MetricUpstreamCallSeconds, map[string]string{"upstream": "obs", "result": "ok"}},
			{telemetry.MetricUpstreamUp, map[string]string{"upstream": "obs"}},
			{telemetry.MetricBuildInfo, map[string]string{"go_version": runtime.Version()}},
		} {
			if v := value(c.name, c.labels); v != 1 {
				t.Errorf("%s%v = %v, want 1", c.name, c.labels, v)
			}
		}
		// The backlog: the one task, or none once it has ended (the value is
		// read at most every telemetry.PendingReadEvery).
		if v := value(telemetry.MetricPendingTasks, nil); v != 0 && v != 1 {
			t.Errorf("%s = %v, want 0 or 1", telemetry.MetricPendingTasks, v)
		}
		var temporal bool
		for name := range families {
			temporal = temporal || strings.HasPrefix(name, "temporal_")
		}
		if !temporal {
			t.Error("no temporal_* metric: the SDK's metrics are not exported")
		}
	})

	t.Run("trace", func(t *testing.T) {
		// The workflow's span ends when the workflow returns, a moment
		// after the terminal record is written.
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(spanChain(spans), "RunWorkflow:") && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		byID := map[string]tracetest.SpanStub{}
		var root, upstream tracetest.SpanStub
		for _, sp := range spans.GetSpans() {
			byID[sp.SpanContext.SpanID().String()] = sp
			for _, a := range sp.Attributes {
				if string(a.Key) == telemetry.AttrTaskID && a.Value.AsString() == task.TaskID && sp.Name == "tools/call" {
					root = sp
				}
			}
			if sp.Name == "upstream tools/call" {
				upstream = sp
			}
		}
		if !root.SpanContext.IsValid() || !upstream.SpanContext.IsValid() {
			t.Fatalf("no tools/call span for the task or no upstream span among %d spans", len(spans.GetSpans()))
		}
		if upstream.SpanContext.TraceID() != root.SpanContext.TraceID() {
			t.Fatalf("the upstream call is in trace %s, tools/call in %s", upstream.SpanContext.TraceID(), root.SpanContext.TraceID())
		}
		// Walk up from the upstream call: an activity, the workflow, then tools/call.
		var chain []string
		for sp, ok := upstream, true; ok; sp, ok = byID[sp.Parent.SpanID().String()] {
			chain = append(chain, sp.Name)
		}
		joined := strings.Join(chain, " <- ")
		for _, want := range []string{"RunActivity:ExecuteTool", "RunWorkflow:", "tools/call"} {
			if !strings.Contains(joined, want) {
				t.Errorf("span chain %q lacks %q", joined, want)
			}
		}
		// The approver's decision: a trace of its own, whose span links
		// to the tools/call that created the task, and holds the
		// workflow update.
		var decision tracetest.SpanStub
		for _, sp := range spans.GetSpans() {
			if sp.Name == "approval decision" {
				decision = sp
			}
		}
		if !decision.SpanContext.IsValid() || len(decision.Links) != 1 ||
			decision.Links[0].SpanContext.TraceID() != root.SpanContext.TraceID() || decision.Links[0].SpanContext.SpanID() != root.SpanContext.SpanID() {
			t.Fatalf("the approval decision span %q does not link to tools/call %s: %+v", decision.Name, root.SpanContext.SpanID(), decision.Links)
		}
		update := false
		for _, sp := range spans.GetSpans() {
			update = update || (strings.HasPrefix(sp.Name, "UpdateWorkflow") && sp.Parent.SpanID() == decision.SpanContext.SpanID())
		}
		if !update {
			t.Error("no UpdateWorkflow span under the approval decision")
		}
		mu.Lock()
		defer mu.Unlock()
		want := root.SpanContext.TraceID().String()
		found := false
		for _, tp := range traceparents {
			found = found || strings.Contains(tp, want)
		}
		if !found {
			t.Errorf("the upstream got traceparent %q, want trace %s", traceparents, want)
		}
	})

	t.Run("logs", func(t *testing.T) {
		out := logs.String()
		for name, secret := range secrets {
			if len(secret) < 8 {
				t.Fatalf("%s %q is too short to look for", name, secret)
			}
			if strings.Contains(out, secret) {
				t.Errorf("the logs hold the %s", name)
			}
		}
		var executed, traced int
		sc := bufio.NewScanner(strings.NewReader(out))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var line map[string]any
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				t.Fatalf("not a JSON log line: %q", sc.Text())
			}
			msg, _ := line["msg"].(string)
			if strings.Contains(msg, "tool executed") || strings.Contains(msg, "task ended") || strings.Contains(msg, "task opened") {
				executed++
				if line[telemetry.KeyTaskID] != task.TaskID {
					t.Errorf("line %q: task_id %v, want %s", msg, line[telemetry.KeyTaskID], task.TaskID)
				}
			}
			if line[telemetry.KeyTaskID] == task.TaskID && line[telemetry.KeyTraceID] != nil {
				traced++
			}
		}
		if executed < 3 {
			t.Errorf("found %d of the task's opened/executed/ended lines, want 3", executed)
		}
		if traced == 0 {
			t.Error("no line names both the task and its trace")
		}
	})
}

// spanChain names the spans from the upstream call up through its parents.
func spanChain(exp *tracetest.InMemoryExporter) string {
	byID := map[string]tracetest.SpanStub{}
	var upstream tracetest.SpanStub
	for _, sp := range exp.GetSpans() {
		byID[sp.SpanContext.SpanID().String()] = sp
		if sp.Name == "upstream tools/call" {
			upstream = sp
		}
	}
	var chain []string
	for sp, ok := upstream, upstream.SpanContext.IsValid(); ok; sp, ok = byID[sp.Parent.SpanID().String()] {
		chain = append(chain, sp.Name)
	}
	return strings.Join(chain, " <- ")
}
