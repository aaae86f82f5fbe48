package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/countersign/countersign/internal/testnats"
	"github.com/countersign/countersign/tasks"
)

func demoRegistry(t *testing.T) (*Registry, *Ledger) {
	t.Helper()
	js, _ := testnats.Start(t)
	l, err := NewLedger(context.Background(), js, LedgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRegistry(DemoTools(l)...)
	if err != nil {
		t.Fatal(err)
	}
	return r, l
}

func TestValidate(t *testing.T) {
	r, _ := demoRegistry(t)
	for _, tc := range []struct {
		name, tool, args string
		wantErr          string
	}{
		{"ok", "transfer_funds", `{"to":"acct-1","amount":10,"currency":"USD"}`, ""},
		{"ok with memo", "transfer_funds", `{"to":"acct-1","amount":10,"currency":"USD","memo":"rent"}`, ""},
		{"missing field", "transfer_funds", `{"to":"acct-1","amount":10}`, "currency"},
		{"negative amount", "transfer_funds", `{"to":"acct-1","amount":-1,"currency":"USD"}`, "amount"},
		{"string amount", "transfer_funds", `{"to":"acct-1","amount":"10","currency":"USD"}`, "amount"},
		{"extra field", "transfer_funds", `{"to":"a","amount":1,"currency":"USD","x":1}`, "x"},
		{"not an object", "transfer_funds", `[1]`, "object"},
		{"not JSON", "transfer_funds", `{`, "JSON"},
		{"empty is {}", "list_transfers", ``, ""},
		{"deploy ok", "deploy_service", `{"service":"api","version":"1.2.3","environment":"production"}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := r.Validate(tc.tool, json.RawMessage(tc.args))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			var ae *ArgumentError
			if !errors.As(err, &ae) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want an ArgumentError mentioning %q", err, tc.wantErr)
			}
		})
	}
	if err := r.Validate("nope", nil); !errors.Is(err, ErrUnknownTool) {
		t.Fatalf("unknown tool: got %v", err)
	}
}

func TestExecuteIsIdempotentPerKey(t *testing.T) {
	r, l := demoRegistry(t)
	ctx := context.Background()
	key := tasks.NewID("tsk_")
	args := json.RawMessage(`{"to":"acct-9","amount":5000,"currency":"EUR","memo":"x"}`)
	for range 3 {
		res, err := r.Execute(ctx, "transfer_funds", Call{IdempotencyKey: key, Principal: "agent", Arguments: args})
		if err != nil || res.IsError {
			t.Fatalf("execute: %v %+v", err, res)
		}
	}
	ts, err := l.Transfers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 1 || ts[0].Amount != 5000 || ts[0].To != "acct-9" || ts[0].ID != key {
		t.Fatalf("want exactly one transfer, got %+v", ts)
	}
	res, err := r.Execute(ctx, "list_transfers", Call{IdempotencyKey: tasks.NewID("call_")})
	if err != nil {
		t.Fatal(err)
	}
	var sc struct {
		Transfers []Transfer `json:"transfers"`
	}
	if err := json.Unmarshal(res.StructuredContent, &sc); err != nil || len(sc.Transfers) != 1 {
		t.Fatalf("list_transfers structuredContent: %s (%v)", res.StructuredContent, err)
	}
	if _, err := r.Execute(ctx, "transfer_funds", Call{Arguments: args}); err == nil {
		t.Fatal("execution without idempotency key accepted")
	}
}

func TestDescribe(t *testing.T) {
	r, _ := demoRegistry(t)
	got := r.Describe("transfer_funds", json.RawMessage(`{"to":"acct-991","amount":50000,"currency":"USD","memo":"Q3"}`))
	if want := `Transfer 50,000.00 USD to acct-991 (memo: "Q3")`; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	for in, want := range map[float64]string{0.5: "0.50", 999: "999.00", 1000: "1,000.00", 1234567.891: "1,234,567.89"} {
		if got := formatAmount(in); got != want {
			t.Errorf("formatAmount(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestNewRegistryRejectsBadTools(t *testing.T) {
	run := func(context.Context, Call) (tasks.CallToolResult, error) { return tasks.CallToolResult{}, nil }
	for _, tc := range []struct {
		name  string
		tools []Tool
	}{
		{"no name", []Tool{{Run: run, InputSchema: json.RawMessage(`{"type":"object"}`)}}},
		{"no run", []Tool{{Name: "a", InputSchema: json.RawMessage(`{"type":"object"}`)}}},
		{"not object", []Tool{{Name: "a", Run: run, InputSchema: json.RawMessage(`{"type":"string"}`)}}},
		{"bad json", []Tool{{Name: "a", Run: run, InputSchema: json.RawMessage(`{`)}}},
		{"duplicate", []Tool{{Name: "a", Run: run, InputSchema: json.RawMessage(`{"type":"object"}`)}, {Name: "a", Run: run, InputSchema: json.RawMessage(`{"type":"object"}`)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewRegistry(tc.tools...); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}
