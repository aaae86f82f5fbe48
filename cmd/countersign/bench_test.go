package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	enumspb "go.temporal.io/api/enums/v1"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/bench"
	"github.com/countersign/countersign/internal/devtest"
)

// TestBenchEndToEnd runs every scenario, the flood too, for a few
// operations at two concurrencies against a real `countersign dev` with an
// upstream to gate, with the baseline on the stack's Temporal, and checks
// the JSON report, what the run left on the server, and compare and plot on
// the report.
func TestBenchEndToEnd(t *testing.T) {
	echo, err := bench.StartEchoUpstream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { echo.Close() })
	dir := t.TempDir()
	cfg := filepath.Join(dir, "countersign.yaml")
	if err := os.WriteFile(cfg, []byte("upstreams:\n  - name: up\n    url: "+echo.URL+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := devtest.Start(t, devtest.Options{Config: app.Config{ConfigFile: cfg}})

	const requests = 3
	report := filepath.Join(dir, "report.json")
	var out, errb bytes.Buffer
	err = runBenchWith(context.Background(), []string{
		"--server", s.Base, "--agent-token", s.AgentToken, "--admin-token", s.AdminToken,
		"--baseline", "--scenario", strings.Join(bench.AllScenarios, ","), "--concurrency", "1,2",
		"--requests", "3", "--warmup", "1", "--flood-workers", "2",
		"--upstream-url", echo.URL, "--upstream-tool", "echo", "--gateway-tool", "up__echo",
		"--json", report, "--note", "e2e",
	}, &out, &errb, benchEnv{temporal: s.App.Temporal()})
	if err != nil {
		t.Fatalf("bench: %v\n%s\n%s", err, out.String(), errb.String())
	}
	r, err := bench.ReadReport(report)
	if err != nil {
		t.Fatal(err)
	}
	if r.Server != s.Base || r.Note != "e2e" || !r.Settings.Baseline || r.Machine.Cores < 1 || len(r.Skipped) != 0 || len(r.CleanupErrors) != 0 {
		t.Errorf("report header: server %q note %q baseline %v cores %d skipped %v cleanup %v",
			r.Server, r.Note, r.Settings.Baseline, r.Machine.Cores, r.Skipped, r.CleanupErrors)
	}
	// Every series of the measured scenarios, at both concurrencies, with
	// exactly the operations asked for and no error.
	measured := []string{"temporal-start", "gated-call", "tasks-get-pending", "tasks-get-completed",
		"approval", "approval-decision", "approval-accepted-to-executed", "await-decision-to-result", "await-completed",
		"gateway-direct", "gateway-through", "sep2672-ceremony", "sep2672-challenge", "sep2672-call"}
	for _, series := range measured {
		for _, c := range []int{1, 2} {
			x, ok := r.Find(series, c)
			switch {
			case !ok:
				t.Errorf("%s c=%d: missing", series, c)
			case x.Count != requests || x.Errors != 0:
				t.Errorf("%s c=%d: %d ok, %d errors %v; want %d, 0", series, c, x.Count, x.Errors, x.ErrorKinds, requests)
			case len(x.QuantilesMs) != 101 || x.Throughput <= 0 ||
				!(x.LatencyMs.Min <= x.LatencyMs.P50 && x.LatencyMs.P50 <= x.LatencyMs.P95 && x.LatencyMs.P95 <= x.LatencyMs.P99 && x.LatencyMs.P99 <= x.LatencyMs.Max):
				t.Errorf("%s c=%d: inconsistent summary %+v, throughput %v, %d quantiles", series, c, x.LatencyMs, x.Throughput, len(x.QuantilesMs))
			}
		}
	}
	// The flood: B's calls alone and under A's flood all answered (limits
	// are lifted on this stack), A made some.
	for _, series := range []string{"flood-b-alone", "flood-b-under-flood"} {
		if x, ok := r.Find(series, 2); !ok || x.Count != requests || x.Errors != 0 {
			t.Errorf("%s: %+v", series, x)
		}
	}
	if x, ok := r.Find("flood-a", 2); !ok || x.Count == 0 {
		t.Errorf("flood-a: %+v", x)
	}
	var names []string
	for _, x := range r.Targets {
		names = append(names, x.Name)
		if x.Verdict != "met" && x.Verdict != "missed" {
			t.Errorf("target %s: verdict %q", x.Name, x.Verdict)
		}
	}
	if len(r.Targets) != 8 || !slices.Contains(names, "gated call throughput vs raw start, c=2") {
		t.Errorf("targets: %v", names)
	}
	if !strings.Contains(out.String(), "gated-call") || !strings.Contains(out.String(), "Issue 14 targets:") {
		t.Errorf("text report:\n%s", out.String())
	}

	// The run cancelled every task it left pending, and revoked the
	// approvers and agents it added.
	var pending []map[string]any
	if code := s.HTTPJSON("GET", "/admin/v1/approvals?status=pending", s.AdminToken, nil, &pending); code != 200 || len(pending) != 0 {
		t.Errorf("pending approvals after the run: HTTP %d, %d left", code, len(pending))
	}
	var approvers []struct {
		Name   string `json:"name"`
		Status string `json:"status"`
	}
	s.HTTPJSON("GET", "/admin/v1/approvers", s.AdminToken, nil, &approvers)
	var agents []struct {
		Name   string `json:"name"`
		Status string `json:"status"`
	}
	s.HTTPJSON("GET", "/admin/v1/agents", s.AdminToken, nil, &agents)
	added := 0
	for _, p := range append(approvers, agents...) {
		if strings.HasPrefix(p.Name, "bench-"+r.RunID) {
			added++
			if p.Status != "revoked" {
				t.Errorf("%s is %s after the run", p.Name, p.Status)
			}
		}
	}
	if added != 4 { // 2 approvers (one per worker), flood's agents A and B
		t.Errorf("%d approvers and agents of the run, want 4: %+v %+v", added, approvers, agents)
	}

	// The baseline's waiting workflows were terminated.
	for _, c := range []int{1, 2} {
		id := fmt.Sprintf("bench-%s-wait-c%d-1", r.RunID, c)
		d, err := s.App.Temporal().DescribeWorkflowExecution(context.Background(), id, "")
		if err != nil || d.WorkflowExecutionInfo.Status != enumspb.WORKFLOW_EXECUTION_STATUS_TERMINATED {
			t.Errorf("baseline workflow %s: %v %v", id, err, d.GetWorkflowExecutionInfo().GetStatus())
		}
	}

	// compare and plot read the report.
	code, cmpOut, cmpErr := runCLI("bench", "compare", report, report)
	if code != 0 || !strings.Contains(cmpOut, "gated-call") || !strings.Contains(cmpOut, "1.00") {
		t.Errorf("bench compare: exit %d\n%s%s", code, cmpOut, cmpErr)
	}
	svg := filepath.Join(dir, "report.svg")
	code, _, plotErr := runCLI("bench", "plot", report, "-o", svg)
	if b, err := os.ReadFile(svg); code != 0 || err != nil || !bytes.HasPrefix(b, []byte("<svg")) || !bytes.Contains(b, []byte("sep2672-call c=2")) {
		t.Errorf("bench plot: exit %d, %v, %s", code, err, plotErr)
	}
}

// TestBenchBadTarget: a wrong token, a server that is not Countersign, a
// wrong URL and a missing tool are each named, before anything is measured.
func TestBenchBadTarget(t *testing.T) {
	s := devtest.Start(t, devtest.Options{})
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--server", s.Base, "--agent-token", "csag_wrong", "--scenario", "gated-call"}, "refused the agent token"},
		{[]string{"--server", s.Base + "/mcp", "--agent-token", s.AgentToken, "--scenario", "gated-call"}, "without /mcp"},
		{[]string{"--server", "http://127.0.0.1:1", "--agent-token", s.AgentToken, "--scenario", "gated-call"}, "cannot reach http://127.0.0.1:1"},
		{[]string{"--server", "localhost:8080", "--agent-token", "x"}, "with its scheme"},
		{[]string{"--server", s.Base, "--agent-token", s.AgentToken, "--scenario", "gateway", "--upstream-url", "http://127.0.0.1:1/mcp", "--gateway-tool", "nope__echo"}, `no tool "nope__echo"`},
		{[]string{"--server", s.Base, "--agent-token", s.AgentToken, "--scenario", "approval"}, "needs the admin token"},
		{[]string{"--server", s.Base, "--agent-token", s.AgentToken, "--baseline"}, "--temporal-address"},
		{[]string{"--server", s.Base, "--agent-token", s.AgentToken, "--concurrency", "1,x"}, `"x" is not a positive number`},
		{[]string{"compare", filepath.Join(dir, "missing.json"), filepath.Join(dir, "missing.json")}, "no such file"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			unsetEnv(t, "COUNTERSIGN_ADMIN_TOKEN", "COUNTERSIGN_ADMIN_TOKEN_FILE", "TEMPORAL_ADDRESS")
			var out, errb bytes.Buffer
			args := tc.args
			if args[0] != "compare" {
				args = append(args, "--data-dir", dir, "--requests", "1")
			}
			err := runBenchWith(context.Background(), args, &out, &errb, benchEnv{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestBenchBadEnv: a bench variable that does not parse is an error naming
// the variable and what it wants, not a silent default; a flag given on the
// command line wins over it.
func TestBenchBadEnv(t *testing.T) {
	for _, tc := range []struct{ name, value, want string }{
		{"COUNTERSIGN_BENCH_REQUESTS", "lots", "environment variable COUNTERSIGN_BENCH_REQUESTS (for --requests): not a whole number"},
		{"COUNTERSIGN_BENCH_DURATION", "10", "environment variable COUNTERSIGN_BENCH_DURATION (for --duration): not a duration"},
		{"COUNTERSIGN_BENCH_DEV", "yes", "environment variable COUNTERSIGN_BENCH_DEV (for --dev): not a boolean"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(tc.name, tc.value)
			var out, errb bytes.Buffer
			err := runBenchWith(context.Background(), []string{"--server", "http://127.0.0.1:1", "--agent-token", "x"}, &out, &errb, benchEnv{})
			var ue usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want a usage error %q", err, tc.want)
			}
		})
	}
	t.Setenv("COUNTERSIGN_BENCH_REQUESTS", "lots")
	err := runBenchWith(context.Background(), []string{"--server", "localhost:8080", "--agent-token", "x", "--requests", "1"}, io.Discard, io.Discard, benchEnv{})
	if err == nil || !strings.Contains(err.Error(), "with its scheme") {
		t.Errorf("with --requests given: error %v, want the server URL's", err)
	}
}
