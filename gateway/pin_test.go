package gateway_test

import (
	"errors"
	"testing"

	"github.com/countersign/countersign/gateway"
)

func TestPin(t *testing.T) {
	up := func(name, url, schema string) gateway.Tool {
		tl := tool("fs__write", schema)
		tl.Upstream, tl.UpstreamTool, tl.Endpoint = name, "write", gateway.Endpoint{URL: url}
		return tl
	}
	base := up("fs", "https://fs.example/mcp", `{"type":"object","properties":{"path":{"type":"string"}}}`)
	pin := base.Pin()
	if pin.Source != "fs" || len(pin.Origin) != 64 || len(pin.Schema) != 64 {
		t.Fatalf("pin = %+v", pin)
	}
	if own := tool("transfer_funds", `{"type":"object"}`).Pin(); own.Source != gateway.OwnSource {
		t.Errorf("own tool's source = %q, want %q", own.Source, gateway.OwnSource)
	}
	stdio := base
	stdio.Endpoint = gateway.Endpoint{Command: []string{"npx", "server-fs", "/srv"}}
	otherDir := base
	otherDir.Endpoint = gateway.Endpoint{Command: []string{"npx", "server-fs", "/tmp"}}
	tests := []struct {
		name    string
		now     gateway.Tool
		wantErr error
		wantWhy string // ToolChangedError.Reason; "" = the pin holds
	}{
		{name: "same tool", now: base},
		{name: "schema in another key order and spacing",
			now: up("fs", "https://fs.example/mcp", `{ "properties":{"path":{"type":"string"}}, "type":"object" }`)},
		{name: "another schema", now: up("fs", "https://fs.example/mcp", `{"type":"object"}`),
			wantWhy: "upstream fs now serves fs__write with another input schema"},
		{name: "another URL", now: up("fs", "https://evil.example/mcp", string(base.InputSchema)),
			wantWhy: "upstream fs now serves fs__write from another endpoint (its URL or command changed)"},
		{name: "a command instead", now: stdio,
			wantWhy: "upstream fs now serves fs__write from another endpoint (its URL or command changed)"},
		{name: "another upstream", now: up("files", "https://fs.example/mcp", string(base.InputSchema)),
			wantWhy: "fs__write was served by upstream fs and is now served by upstream files"},
		{name: "now Countersign's own", now: tool("fs__write", string(base.InputSchema)),
			wantWhy: "fs__write was served by upstream fs and is now served by Countersign itself"},
		{name: "gone", wantErr: gateway.ErrUnknownTool},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg, err := gateway.NewRegistry()
			if err != nil {
				t.Fatal(err)
			}
			if tt.now.Name != "" {
				src := tt.now.Upstream
				if src == "" {
					if reg, err = gateway.NewRegistry(tt.now); err != nil {
						t.Fatal(err)
					}
				} else if err := reg.Replace(src, []gateway.Tool{tt.now}); err != nil {
					t.Fatal(err)
				}
			}
			err = reg.CheckPin("fs__write", pin)
			var changed *gateway.ToolChangedError
			switch {
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("CheckPin = %v, want %v", err, tt.wantErr)
				}
			case tt.wantWhy == "":
				if err != nil {
					t.Fatalf("CheckPin = %v, want nil", err)
				}
			case !errors.As(err, &changed) || changed.Reason != tt.wantWhy:
				t.Fatalf("CheckPin = %v, want the reason %q", err, tt.wantWhy)
			}
		})
	}
	if otherDir.Pin().Origin == stdio.Pin().Origin {
		t.Error("two command lines that differ in an argument have one origin")
	}
}
