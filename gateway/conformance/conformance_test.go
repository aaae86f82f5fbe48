package conformance_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"image/png"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/gateway/conformance"
	"github.com/countersign/countersign/pdp"
)

func conformanceRegistry(t *testing.T) *gateway.Registry {
	t.Helper()
	r, err := gateway.NewRegistry(conformance.New().Tools()...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func run(t *testing.T, r *gateway.Registry, tool, args string) (string, bool, error) {
	t.Helper()
	if err := r.Validate(tool, json.RawMessage(args)); err != nil {
		t.Fatalf("%s %s: %v", tool, args, err)
	}
	res, err := r.Execute(context.Background(), tool, gateway.Call{IdempotencyKey: "tsk_test", Arguments: json.RawMessage(args)})
	var text []string
	for _, c := range res.Content {
		var b struct{ Text string }
		_ = json.Unmarshal(c, &b)
		text = append(text, b.Text)
	}
	return strings.Join(text, "\n"), res.IsError, err
}

func TestConformanceFixtures(t *testing.T) {
	r := conformanceRegistry(t)
	if text, isErr, err := run(t, r, "greet", `{"name":"World"}`); err != nil || isErr || text != "Hello, World!" {
		t.Errorf("greet: %q %v %v", text, isErr, err)
	}
	if text, isErr, err := run(t, r, "slow_compute", `{"seconds":2,"label":"x"}`); err != nil || isErr || !strings.Contains(text, "x") {
		t.Errorf("slow_compute: %q %v %v", text, isErr, err)
	}
	if _, isErr, err := run(t, r, "failing_job", `{}`); err != nil || !isErr {
		t.Errorf("failing_job must be a tool error: %v %v", isErr, err)
	}
	_, _, err := run(t, r, "protocol_error_job", `{}`)
	var pe *gateway.ProtocolError
	if !errors.As(err, &pe) || pe.Code != -32603 || pe.Message == "" {
		t.Errorf("protocol_error_job must fail with a protocol error, got %v", err)
	}
}

func TestConformanceFixtureShapes(t *testing.T) {
	fx := conformance.New()
	greet, _ := fx.Lookup("greet")
	slow, _ := fx.Lookup("slow_compute")
	failing, _ := fx.Lookup("failing_job")
	proto, _ := fx.Lookup("protocol_error_job")
	switch {
	case greet.Async || !greet.Tool.ReadOnly:
		t.Error("greet is synchronous and read-only")
	case !slow.Async || slow.TaskRequired:
		t.Error("slow_compute supports tasks without requiring them")
	case !failing.Async || !failing.TaskRequired:
		t.Error("failing_job requires a task")
	case !proto.Async || proto.TaskRequired:
		t.Error("protocol_error_job supports tasks")
	}
	for args, want := range map[string]time.Duration{
		`{"seconds":0}`:   0,
		`{"seconds":2}`:   2 * time.Second,
		`{"seconds":0.2}`: 200 * time.Millisecond,
	} {
		if got := slow.Delay(json.RawMessage(args)); got != want {
			t.Errorf("slow_compute delay for %s = %v, want %v", args, got, want)
		}
	}
	if failing.Delay(nil) != time.Second || proto.Delay(nil) != time.Second {
		t.Error("the failing jobs wait about a second")
	}
}

func TestConformanceFixturesRejectBadArguments(t *testing.T) {
	r := conformanceRegistry(t)
	for tool, args := range map[string]string{
		"slow_compute": `{"seconds":-1}`,
		"greet":        `{}`,
		"failing_job":  `{"x":1}`,
	} {
		if err := r.Validate(tool, json.RawMessage(args)); err == nil {
			t.Errorf("%s %s validated", tool, args)
		}
	}
	if err := r.Validate("slow_compute", json.RawMessage(`{"seconds":3601}`)); err == nil {
		t.Error("slow_compute accepts more than an hour")
	}
}

func TestConformanceInputFixtures(t *testing.T) {
	r := conformanceRegistry(t)
	exec := func(tool, args, inputs string) string {
		t.Helper()
		res, err := r.Execute(context.Background(), tool, gateway.Call{IdempotencyKey: "tsk_test", Arguments: json.RawMessage(args), Inputs: json.RawMessage(inputs)})
		if err != nil || len(res.Content) == 0 {
			t.Fatalf("%s: %v %v", tool, res, err)
		}
		var b struct{ Text string }
		_ = json.Unmarshal(res.Content[0], &b)
		return b.Text
	}
	fx := conformance.New()
	cd, _ := fx.Lookup("confirm_delete")
	if req := cd.TaskInputRequests(json.RawMessage(`{"filename":"a.txt"}`)); len(req) != 1 || !strings.Contains(string(req["confirm"]), "elicitation/create") {
		t.Errorf("confirm_delete asks one confirmation: %s", req)
	}
	if got := exec("confirm_delete", `{"filename":"a.txt"}`, `{"confirm":{"action":"accept","content":{"confirm":true}}}`); !strings.HasPrefix(got, "Deleted a.txt") {
		t.Errorf("confirmed: %q", got)
	}
	if got := exec("confirm_delete", `{"filename":"a.txt"}`, `{"confirm":{"action":"decline"}}`); !strings.HasPrefix(got, "Kept a.txt") {
		t.Errorf("declined: %q", got)
	}
	mi, _ := fx.Lookup("multi_input")
	if req := mi.TaskInputRequests(nil); len(req) != 2 {
		t.Errorf("multi_input asks two questions: %v", req)
	}
	tw, _ := fx.Lookup("test_tool_with_task")
	if req := tw.InputRequests(nil); req["user_name"] == nil || !tw.TaskRequired {
		t.Errorf("test_tool_with_task asks user_name first and requires a task: %v", req)
	}
	if got := exec("test_tool_with_task", `{}`, `{"user_name":{"action":"accept","content":{"name":"Alice"}}}`); !strings.Contains(got, "Hello, Alice!") {
		t.Errorf("test_tool_with_task: %q", got)
	}
	if res, _ := r.Execute(context.Background(), "test_tool_with_task", gateway.Call{IdempotencyKey: "tsk_test", Arguments: json.RawMessage(`{}`)}); !res.IsError {
		t.Error("test_tool_with_task without an answer must be a tool error")
	}
}

func TestFixtureWaitAndLookup(t *testing.T) {
	fx := conformance.New()
	var none *conformance.Set
	if _, ok := none.Lookup("slow_compute"); ok {
		t.Error("a nil set has no fixtures")
	}
	if _, ok := fx.Lookup("transfer_funds"); ok {
		t.Error("a real tool is not a fixture")
	}
	if got, want := len(fx.Tools()), 29; got != want {
		t.Errorf("%d fixture tools, want %d", got, want)
	}
	slow, _ := fx.Lookup("slow_compute")
	if err := slow.Wait(context.Background(), json.RawMessage(`{"seconds":0}`)); err != nil {
		t.Errorf("no delay, no wait: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := slow.Wait(ctx, json.RawMessage(`{"seconds":60}`)); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled wait returns the context's error, got %v", err)
	}
	greet, _ := fx.Lookup("greet")
	if greet.Delay(nil) != 0 || greet.InputRequests(nil) != nil || greet.TaskInputRequests(nil) != nil {
		t.Error("greet neither waits nor asks")
	}
}

// Every fixture is allowed by the conformance policy, and by nothing else.
func TestConformancePolicyAllowsEveryFixture(t *testing.T) {
	dir := t.TempDir()
	if err := pdp.WriteConformancePolicy(dir); err != nil {
		t.Fatal(err)
	}
	e, err := pdp.New(context.Background(), pdp.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	def, err := pdp.New(context.Background(), pdp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range conformance.New().Tools() {
		in := pdp.Input{
			Subject:  pdp.Entity{Type: "agent", ID: "anonymous"},
			Action:   pdp.Action{Name: "tools/call"},
			Resource: tool.PolicyResource(),
			Context:  pdp.Context{Arguments: json.RawMessage(`{}`), ActionHash: strings.Repeat("ab", 32), Time: time.Now()},
		}
		if d, err := e.Evaluate(context.Background(), in); err != nil || d.Effect != pdp.EffectAllow {
			t.Errorf("conformance policy on %s: %+v %v", tool.Name, d, err)
		}
		if d, _ := def.Evaluate(context.Background(), in); d.Effect == pdp.EffectAllow {
			t.Errorf("the default policy allows fixture %s", tool.Name)
		}
	}
}

func TestBaseFixturesContent(t *testing.T) {
	r := conformanceRegistry(t)
	res, err := r.Execute(context.Background(), "test_multiple_content_types", gateway.Call{IdempotencyKey: "call_test", Arguments: json.RawMessage(`{}`)})
	if err != nil || len(res.Content) != 3 {
		t.Fatalf("%+v %v", res, err)
	}
	var img struct{ Type, Data, MimeType string }
	if err := json.Unmarshal(res.Content[1], &img); err != nil || img.Type != "image" || img.MimeType != "image/png" {
		t.Fatalf("image content %s: %v", res.Content[1], err)
	}
	b, err := base64.StdEncoding.DecodeString(img.Data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(bytes.NewReader(b)); err != nil {
		t.Errorf("the fixture image is not a PNG: %v", err)
	}
	var progress []float64
	var logs []string
	res, err = r.Execute(context.Background(), "test_tool_with_progress", gateway.Call{IdempotencyKey: "call_test",
		ProgressFunc: func(p, _ float64, _ string) { progress = append(progress, p) }})
	if err != nil || res.IsError || len(progress) != 3 || progress[2] != 100 {
		t.Errorf("progress fixture: %v %+v %v", progress, res, err)
	}
	if _, err := r.Execute(context.Background(), "test_tool_with_logging", gateway.Call{IdempotencyKey: "call_test"}); err != nil {
		t.Errorf("a fixture that logs to no one: %v", err)
	}
	if _, err := r.Execute(context.Background(), "test_tool_with_logging", gateway.Call{IdempotencyKey: "call_test",
		LogFunc: func(_, m string) { logs = append(logs, m) }}); err != nil || len(logs) != 3 {
		t.Errorf("logging fixture: %v %v", logs, err)
	}
	if err := r.Validate("json_schema_2020_12_tool", json.RawMessage(`{"contactMethod":"phone"}`)); err == nil {
		t.Error("json_schema_2020_12_tool: if/then must require phone")
	}
	if err := r.Validate("json_schema_2020_12_tool", json.RawMessage(`{"contactMethod":"phone","phone":"1"}`)); err != nil {
		t.Errorf("json_schema_2020_12_tool: %v", err)
	}
}

// TestTriggerToolChange: the server-stateless scenario's hook adds the
// dynamic tool and removes it again, each a change of the served list.
func TestTriggerToolChange(t *testing.T) {
	fx := conformance.New()
	r, err := gateway.NewRegistry(fx.Tools()...)
	if err != nil {
		t.Fatal(err)
	}
	call := func() string {
		t.Helper()
		res, err := r.Execute(context.Background(), conformance.TriggerToolChange, gateway.Call{IdempotencyKey: "k", Arguments: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatalf("trigger: %v", err)
		}
		var c struct{ Text string }
		_ = json.Unmarshal(res.Content[0], &c)
		return c.Text
	}
	if _, err := r.Execute(context.Background(), conformance.TriggerToolChange, gateway.Call{IdempotencyKey: "k", Arguments: json.RawMessage(`{}`)}); err == nil {
		t.Fatal("an unbound trigger changed something")
	}
	fx.Bind(r)
	changes := 0
	r.OnChange(func() { changes++ })
	if got := call(); got != conformance.DynamicTool+" added" {
		t.Fatalf("first call: %q", got)
	}
	if _, ok := r.Lookup(conformance.DynamicTool); !ok || changes != 1 {
		t.Fatalf("after adding: present %t, %d changes", ok, changes)
	}
	if got := call(); got != conformance.DynamicTool+" removed" {
		t.Fatalf("second call: %q", got)
	}
	if _, ok := r.Lookup(conformance.DynamicTool); ok || changes != 2 {
		t.Fatalf("after removing: present %t, %d changes", ok, changes)
	}
}
