package gateway_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/tasks"
)

func tool(name, schema string) gateway.Tool {
	return gateway.Tool{Name: name, InputSchema: json.RawMessage(schema),
		Run: func(context.Context, gateway.Call) (tasks.CallToolResult, error) { return tasks.CallToolResult{}, nil }}
}

func names(r *gateway.Registry) string {
	var out []string
	for _, t := range r.List() {
		out = append(out, t.Name)
	}
	return strings.Join(out, ",")
}

// An upstream's tools are swapped as a whole; a bad or colliding tool is left
// out and named, the rest are served, and listeners hear of every change.
func TestRegistryReplace(t *testing.T) {
	r, err := gateway.NewRegistry(tool("own", `{"type":"object"}`))
	if err != nil {
		t.Fatal(err)
	}
	var changes atomic.Int32
	r.OnChange(func() { changes.Add(1) })

	if err := r.Replace("fs", []gateway.Tool{tool("fs__read", `{"type":"object"}`), tool("fs__write", `{"type":"object"}`)}); err != nil {
		t.Fatal(err)
	}
	if got := names(r); got != "fs__read,fs__write,own" {
		t.Fatalf("tools = %s", got)
	}
	err = r.Replace("gh", []gateway.Tool{tool("own", `{"type":"object"}`), tool("fs__read", `{"type":"object"}`),
		tool("gh__bad", `{"type":"string"}`), tool("gh__issue", `{"type":"object"}`)})
	for _, want := range []string{`"own" collides with one of Countersign's own tools`, `"fs__read" collides with one of upstream fs`, "gh__bad"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Replace error %v, want it to name %s", err, want)
		}
	}
	if got := names(r); got != "fs__read,fs__write,gh__issue,own" {
		t.Fatalf("tools = %s", got)
	}
	// The upstream's list shrinks: its gone tool is gone, the others stay.
	if err := r.Replace("fs", []gateway.Tool{tool("fs__read", `{"type":"object"}`)}); err != nil {
		t.Fatal(err)
	}
	if got := names(r); got != "fs__read,gh__issue,own" {
		t.Fatalf("tools = %s", got)
	}
	if _, ok := r.Lookup("fs__write"); ok {
		t.Fatal("a removed tool is still found")
	}
	if err := r.Replace("fs", nil); err != nil {
		t.Fatal(err)
	}
	if got := names(r); got != "gh__issue,own" {
		t.Fatalf("tools after the upstream went down = %s", got)
	}
	if n := changes.Load(); n != 4 {
		t.Fatalf("OnChange ran %d times, want 4", n)
	}
	if err := r.Replace("", nil); err == nil {
		t.Fatal("Countersign's own tools were replaceable")
	}
}
