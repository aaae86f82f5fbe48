package activities_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.temporal.io/sdk/temporal"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/gateway/upstream"
	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
)

const (
	pathSchema  = `{"type":"object","properties":{"path":{"type":"string"}}}`
	bytesSchema = `{"type":"object","properties":{"path":{"type":"string"},"bytes":{"type":"string"}}}`
)

// fsServer is an upstream MCP server (go-sdk over Streamable HTTP, in
// process) with one tool, write, that counts its effects.
type fsServer struct {
	srv    *mcp.Server
	url    string
	writes atomic.Int32
}

func newFSServer(t *testing.T, schema string) *fsServer {
	t.Helper()
	f := &fsServer{srv: mcp.NewServer(&mcp.Implementation{Name: "fs", Version: "1"}, nil)}
	f.setWrite(schema)
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return f.srv }, nil))
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
	})
	f.url = ts.URL
	return f
}

// setWrite defines the write tool, replacing the one of that name; the
// server tells its clients that its tool list changed.
func (f *fsServer) setWrite(schema string) {
	f.srv.AddTool(&mcp.Tool{Name: "write", InputSchema: json.RawMessage(schema)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			f.writes.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "wrote"}}}, nil
		})
}

// serveUpstream connects reg to an upstream as internal/app does: the
// upstream's tool list, each time it is listed, replaces reg's tools of
// that upstream.
func serveUpstream(t *testing.T, reg *gateway.Registry, opts upstream.Options) {
	t.Helper()
	opts.Logger = slog.New(slog.DiscardHandler)
	opts.OnChange = func(tools []upstream.Tool) {
		out := make([]gateway.Tool, 0, len(tools))
		for _, tl := range tools {
			out = append(out, tl.Tool)
		}
		if err := reg.Replace(opts.Name, out); err != nil {
			t.Errorf("replace: %v", err)
		}
	}
	u := upstream.Start(context.Background(), opts)
	t.Cleanup(func() { _ = u.Close() })
}

// awaitTool waits until reg serves name with a pin for which ok holds, and
// returns that pin.
func awaitTool(t *testing.T, reg *gateway.Registry, name string, ok func(tasks.ToolPin) bool) tasks.ToolPin {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if tl, found := reg.Lookup(name); found && ok(tl.Pin()) {
			return tl.Pin()
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the registry never served %s as expected", name)
	return tasks.ToolPin{}
}

func anyPin(tasks.ToolPin) bool { return true }

// pinnedEnvelope builds a bound envelope for tool, pinned as pin (nil: an
// envelope made before pins existed).
func pinnedEnvelope(t *testing.T, tool, args string, pin *tasks.ToolPin) tasks.Envelope {
	t.Helper()
	h, err := canon.Hash(tool, []byte(args), testServerID)
	if err != nil {
		t.Fatal(err)
	}
	return tasks.Envelope{
		Version: tasks.EnvelopeVersion, TaskID: tasks.NewID("tsk_"), Tool: tool, Arguments: json.RawMessage(args),
		ActionHash: h.String(), Principal: "agent-1", Resource: "tool:" + tool, ServerID: testServerID,
		CreatedAt: time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC), ToolPin: pin,
	}
}

// An approved call runs only against the tool it was made against: an
// upstream that changed the tool's input schema meanwhile, or a prefix that
// now leads to another upstream, and the call does not run, saying why,
// before anything is claimed. An envelope without a pin runs as before.
func TestExecuteToolChecksToolPin(t *testing.T) {
	const tool, args = "fs__write", `{"path":"/srv/a"}`
	tests := []struct {
		name string
		// change alters what serves tool after the call was made (w.acts.Tools
		// is the registry the call was pinned against) and returns the
		// server that serves it now.
		change     func(t *testing.T, w *world, first *fsServer) *fsServer
		unpinned   bool   // the envelope has no pin
		wantReason string // "" = the call runs
	}{
		{name: "unchanged", change: func(_ *testing.T, _ *world, first *fsServer) *fsServer { return first }},
		{
			name:       "schema changed",
			change:     changeSchema,
			wantReason: "The tool changed after the call was made: upstream fs now serves fs__write with another input schema.",
		},
		{
			name:     "schema changed, unpinned envelope",
			change:   changeSchema,
			unpinned: true,
		},
		{
			// The worker restarts with a configuration in which upstream fs
			// is another server, with the same tool.
			name: "same upstream name, another URL",
			change: func(t *testing.T, w *world, _ *fsServer) *fsServer {
				now := newFSServer(t, pathSchema)
				w.acts.Tools = restart(t, upstream.Options{Name: "fs", URL: now.url})
				return now
			},
			wantReason: "The tool changed after the call was made: upstream fs now serves fs__write from another endpoint (its URL or command changed).",
		},
		{
			// ... or in which the prefix fs belongs to another upstream.
			name: "prefix of another upstream",
			change: func(t *testing.T, w *world, _ *fsServer) *fsServer {
				now := newFSServer(t, pathSchema)
				w.acts.Tools = restart(t, upstream.Options{Name: "files", Prefix: "fs", URL: now.url})
				return now
			},
			wantReason: "The tool changed after the call was made: fs__write was served by upstream fs and is now served by upstream files.",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld(t)
			first := newFSServer(t, pathSchema)
			serveUpstream(t, w.acts.Tools, upstream.Options{Name: "fs", URL: first.url})
			// The call is made: the MCP endpoint pins the tool it looked up.
			pin := awaitTool(t, w.acts.Tools, tool, anyPin)
			env := pinnedEnvelope(t, tool, args, &pin)
			if tt.unpinned {
				env.ToolPin = nil
			}
			w.createTask(t, env)

			now := tt.change(t, w, first)
			_, err := w.env.ExecuteActivity(w.acts.ExecuteTool, activities.ExecuteToolInput{Version: activities.Version, Envelope: env})

			rec, gerr := w.store.Get(context.Background(), env.TaskID)
			if gerr != nil {
				t.Fatal(gerr)
			}
			if tt.wantReason == "" {
				if err != nil {
					t.Fatalf("ExecuteTool: %v", err)
				}
				if n := now.writes.Load(); n != 1 {
					t.Errorf("the tool ran %d times, want 1", n)
				}
				return
			}
			var appErr *temporal.ApplicationError
			if !errors.As(err, &appErr) || appErr.Type() != activities.ErrTypeUnknownTool || !appErr.NonRetryable() {
				t.Fatalf("err = %v, want a non-retryable %s", err, activities.ErrTypeUnknownTool)
			}
			var reason string
			if derr := appErr.Details(&reason); derr != nil || reason != tt.wantReason {
				t.Errorf("details = %q (%v), want %q", reason, derr, tt.wantReason)
			}
			if n := first.writes.Load() + now.writes.Load(); n != 0 {
				t.Errorf("the tool ran %d times, want 0", n)
			}
			if !rec.ExecutionClaimedAt.IsZero() {
				t.Errorf("the refused execution claimed the task at %v; a refusal claims nothing", rec.ExecutionClaimedAt)
			}
		})
	}
}

// A tool that changes after ExecuteTool checked its pin, while it takes the
// execution fence, does not run either: the pin is checked again on the
// tool that runs.
func TestExecuteToolChecksToolPinAfterClaim(t *testing.T) {
	const tool, args = "fs__write", `{"path":"/srv/a"}`
	w := newWorld(t)
	fs := newFSServer(t, pathSchema)
	serveUpstream(t, w.acts.Tools, upstream.Options{Name: "fs", URL: fs.url})
	pin := awaitTool(t, w.acts.Tools, tool, anyPin)
	env := pinnedEnvelope(t, tool, args, &pin)
	w.createTask(t, env)
	w.acts.Crash = func(point activities.CrashPoint, _ string) {
		if point == activities.CrashExecute {
			changeSchema(t, w, fs)
		}
	}
	_, err := w.env.ExecuteActivity(w.acts.ExecuteTool, activities.ExecuteToolInput{Version: activities.Version, Envelope: env})
	var appErr *temporal.ApplicationError
	if !errors.As(err, &appErr) || appErr.Type() != activities.ErrTypeUnknownTool || !appErr.NonRetryable() {
		t.Fatalf("err = %v, want a non-retryable %s", err, activities.ErrTypeUnknownTool)
	}
	var reason string
	want := "The tool changed after the call was made: upstream fs now serves fs__write with another input schema."
	if derr := appErr.Details(&reason); derr != nil || reason != want {
		t.Errorf("details = %q (%v), want %q", reason, derr, want)
	}
	if n := fs.writes.Load(); n != 0 {
		t.Errorf("the tool ran %d times, want 0", n)
	}
}

// changeSchema has the first server change its tool's input schema, and
// waits until the registry serves the new one.
func changeSchema(t *testing.T, w *world, first *fsServer) *fsServer {
	before, _ := w.acts.Tools.Lookup("fs__write")
	first.setWrite(bytesSchema)
	awaitTool(t, w.acts.Tools, "fs__write", func(p tasks.ToolPin) bool { return p.Schema != before.Pin().Schema })
	return first
}

// restart is a worker's registry after a restart with one upstream
// configured as opts, once that upstream's tools are served.
func restart(t *testing.T, opts upstream.Options) *gateway.Registry {
	t.Helper()
	reg, err := gateway.NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	serveUpstream(t, reg, opts)
	awaitTool(t, reg, "fs__write", anyPin)
	return reg
}

// Re-evaluation judges the tool the call was made against. When its
// upstream no longer serves it (restarting, down), policy would see a bare
// {type, id} resource, without the upstream: one that looks like
// Countersign's own tool, which this policy allows at once. The
// re-evaluation fails instead, retryably, so an upstream back within the
// workflow's retries is judged as it is, and one still gone denies.
func TestReevaluateToolNotServed(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	engine, err := pdp.New(ctx, pdp.Options{Dir: writeRego(t, `package countersign.authz

default decision := {"effect": "allow", "reason": "Countersign's own tools run"}

decision := {"effect": "requestable", "reason": "upstream calls need approval", "approver_group": "approvers",
	"quorum": 1, "approval_ttl_seconds": 3600} if input.resource.upstream
`)})
	if err != nil {
		t.Fatal(err)
	}
	w.acts.PDP = engine
	write := gateway.Tool{
		Name: "fs__write", Upstream: "fs", UpstreamTool: "write", InputSchema: json.RawMessage(pathSchema),
		Run: func(context.Context, gateway.Call) (tasks.CallToolResult, error) {
			return tasks.CallToolResult{}, errors.New("must not run")
		},
	}
	if err := w.acts.Tools.Replace("fs", []gateway.Tool{write}); err != nil {
		t.Fatal(err)
	}
	pin := awaitTool(t, w.acts.Tools, "fs__write", anyPin)
	env := pinnedEnvelope(t, "fs__write", `{"path":"/srv/a"}`, &pin)
	reevaluate := func() (activities.ReevaluateOutput, error) {
		var out activities.ReevaluateOutput
		val, err := w.env.ExecuteActivity(w.acts.Reevaluate, activities.ReevaluateInput{
			Version: activities.Version, Envelope: env, At: env.CreatedAt.Add(time.Hour)})
		if err == nil {
			err = val.Get(&out)
		}
		return out, err
	}

	out, err := reevaluate()
	if err != nil || out.Allow || out.Effect != string(pdp.EffectRequestable) {
		t.Fatalf("served, no approvals: got %+v, %v; want requestable, not allowed", out, err)
	}
	if err := w.acts.Tools.Replace("fs", nil); err != nil {
		t.Fatal(err)
	}
	out, err = reevaluate()
	if err == nil {
		t.Fatalf("not served: got %+v; want an error, not a decision on another resource", out)
	}
	if _, nonRetryable := appErrType(err); nonRetryable {
		t.Errorf("not served: err = %v is non-retryable; the upstream may be back at the next attempt", err)
	}
}

// writeRego writes one policy file into a fresh directory and returns it.
func writeRego(t *testing.T, rego string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "policy.rego"), []byte(rego), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}
