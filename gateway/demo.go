package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/tasks"
)

// LedgerBucket is the NATS KV bucket of the demo ledger.
const LedgerBucket = "countersign_ledger"

// Entry is one effect recorded by a demo tool.
type Entry struct {
	Key        string          `json:"key"` // the idempotency key that caused it
	Kind       string          `json:"kind"`
	Principal  string          `json:"principal"`
	Arguments  json.RawMessage `json:"arguments"`
	ExecutedAt time.Time       `json:"executedAt"`
}

// Transfer is a transfer as list_transfers reports it.
type Transfer struct {
	ID         string    `json:"id"`
	To         string    `json:"to"`
	Amount     float64   `json:"amount"`
	Currency   string    `json:"currency"`
	Memo       string    `json:"memo"`
	ExecutedAt time.Time `json:"executedAt"`
}

// Ledger is the demo tools' durable record of effects. An effect is written
// with create-if-absent under its idempotency key, so a repeated execution
// of the same call has one effect.
type Ledger struct {
	kv  jetstream.KeyValue
	now func() time.Time
}

// LedgerOptions configures [NewLedger].
type LedgerOptions struct {
	// Replicas of the bucket in a clustered NATS; 0 means 1.
	Replicas int
}

// NewLedger opens (creating if needed) the ledger bucket.
func NewLedger(ctx context.Context, js jetstream.JetStream, opts LedgerOptions) (*Ledger, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      LedgerBucket,
		Description: "Countersign demo tools ledger",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(opts.Replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: open ledger: %w", err)
	}
	return &Ledger{kv: kv, now: time.Now}, nil
}

// record stores an effect once. It returns the stored entry and whether this
// call created it.
func (l *Ledger) record(ctx context.Context, kind string, call Call) (Entry, bool, error) {
	if !tasks.ValidID(call.IdempotencyKey) {
		return Entry{}, false, fmt.Errorf("gateway: idempotency key %q is not a valid id", call.IdempotencyKey)
	}
	e := Entry{Key: call.IdempotencyKey, Kind: kind, Principal: call.Principal, Arguments: call.Arguments, ExecutedAt: l.now().UTC()}
	b, err := json.Marshal(e)
	if err != nil {
		return Entry{}, false, err
	}
	key := kind + "." + call.IdempotencyKey
	if _, err := l.kv.Create(ctx, key, b); err == nil {
		return e, true, nil
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return Entry{}, false, fmt.Errorf("gateway: ledger write: %w", err)
	}
	got, err := l.kv.Get(ctx, key)
	if err != nil {
		return Entry{}, false, fmt.Errorf("gateway: ledger read: %w", err)
	}
	var prev Entry
	if err := json.Unmarshal(got.Value(), &prev); err != nil {
		return Entry{}, false, fmt.Errorf("gateway: ledger decode: %w", err)
	}
	return prev, false, nil
}

// Entries returns every effect of one kind ("" for all), oldest first.
func (l *Ledger) Entries(ctx context.Context, kind string) ([]Entry, error) {
	filter := ">"
	if kind != "" {
		filter = kind + ".>"
	}
	lister, err := l.kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil, nil
		}
		return nil, fmt.Errorf("gateway: ledger list: %w", err)
	}
	var out []Entry
	for k := range lister.Keys() {
		v, err := l.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("gateway: ledger read: %w", err)
		}
		var e Entry
		if err := json.Unmarshal(v.Value(), &e); err != nil {
			return nil, fmt.Errorf("gateway: ledger decode: %w", err)
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ExecutedAt.Before(out[j].ExecutedAt) })
	return out, nil
}

// Transfers returns the executed transfers, oldest first.
func (l *Ledger) Transfers(ctx context.Context) ([]Transfer, error) {
	entries, err := l.Entries(ctx, kindTransfer)
	if err != nil {
		return nil, err
	}
	out := make([]Transfer, 0, len(entries))
	for _, e := range entries {
		var a transferArgs
		if err := json.Unmarshal(e.Arguments, &a); err != nil {
			return nil, fmt.Errorf("gateway: ledger decode: %w", err)
		}
		out = append(out, Transfer{ID: e.Key, To: a.To, Amount: a.Amount, Currency: a.Currency, Memo: a.Memo, ExecutedAt: e.ExecutedAt})
	}
	return out, nil
}

const (
	kindTransfer = "transfer"
	kindDeploy   = "deploy"
	kindDelete   = "delete"
	kindTrade    = "trade"
)

// tradeArgs are place_trade's arguments, as in the SEP-2672 reference
// implementation's demo server.
type tradeArgs struct {
	Symbol   string  `json:"symbol"`
	Side     string  `json:"side"`
	Quantity float64 `json:"quantity"`
	Limit    float64 `json:"limit"`
}

// jsNumber renders v as JavaScript's String(v) does for the numbers a
// trade carries (shortest round-trip form), so display texts match the
// reference implementation's byte for byte.
func jsNumber(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

type transferArgs struct {
	To       string  `json:"to"`
	Amount   float64 `json:"amount"`
	Currency string  `json:"currency"`
	Memo     string  `json:"memo,omitempty"`
}

type deployArgs struct {
	Service     string `json:"service"`
	Version     string `json:"version"`
	Environment string `json:"environment"`
}

type deleteArgs struct {
	Table  string `json:"table"`
	Filter string `json:"filter"`
}

// formatAmount renders 1234567.5 as "1,234,567.50".
func formatAmount(v float64) string {
	s := strconv.FormatFloat(v, 'f', 2, 64)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	intPart, frac, _ := strings.Cut(s, ".")
	var b strings.Builder
	for i, c := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	out := b.String() + "." + frac
	if neg {
		out = "-" + out
	}
	return out
}

func decodeArgs[T any](raw json.RawMessage) T {
	var v T
	_ = json.Unmarshal(raw, &v) // arguments were validated against the schema first
	return v
}

func textResult(text string) tasks.CallToolResult {
	return tasks.CallToolResult{Content: []json.RawMessage{tasks.TextContent(text)}}
}

// DemoTools returns the tools `countersign dev` serves: transfer_funds,
// list_transfers, deploy_service, delete_records and place_trade, all over
// l. place_trade is the SEP-2672 reference implementation's demo tool (same
// name, schema, display text and result shape); the default policy requires
// in-band verified approval for it.
func DemoTools(l *Ledger) []Tool {
	return []Tool{
		{
			Name:        "transfer_funds",
			Title:       "Transfer funds",
			Description: "Move money to an account. Up to 1,000 runs at once; larger amounts wait for a human approval; above 1,000,000 is refused.",
			InputSchema: json.RawMessage(`{"type":"object","additionalProperties":false,"required":["to","amount","currency"],
				"properties":{"to":{"type":"string","minLength":1,"maxLength":64},
				"amount":{"type":"number","exclusiveMinimum":0},
				"currency":{"type":"string","pattern":"^[A-Z]{3}$"},
				"memo":{"type":"string","maxLength":256}}}`),
			Describe: func(raw json.RawMessage) string {
				a := decodeArgs[transferArgs](raw)
				s := fmt.Sprintf("Transfer %s %s to %s", formatAmount(a.Amount), a.Currency, a.To)
				if a.Memo != "" {
					s += fmt.Sprintf(" (memo: %q)", a.Memo)
				}
				return s
			},
			Run: func(ctx context.Context, call Call) (tasks.CallToolResult, error) {
				e, _, err := l.record(ctx, kindTransfer, call)
				if err != nil {
					return tasks.CallToolResult{}, err
				}
				a := decodeArgs[transferArgs](call.Arguments)
				r := textResult(fmt.Sprintf("Transferred %s %s to %s (transfer %s).", formatAmount(a.Amount), a.Currency, a.To, e.Key))
				r.StructuredContent, _ = json.Marshal(Transfer{ID: e.Key, To: a.To, Amount: a.Amount, Currency: a.Currency, Memo: a.Memo, ExecutedAt: e.ExecutedAt})
				return r, nil
			},
		},
		{
			Name:         "list_transfers",
			Title:        "List transfers",
			Description:  "List the transfers that were executed.",
			ReadOnly:     true,
			InputSchema:  json.RawMessage(`{"type":"object","additionalProperties":false,"properties":{}}`),
			OutputSchema: json.RawMessage(`{"type":"object","required":["transfers"],"properties":{"transfers":{"type":"array","items":{"type":"object"}}}}`),
			Describe:     func(json.RawMessage) string { return "List executed transfers" },
			Run: func(ctx context.Context, _ Call) (tasks.CallToolResult, error) {
				ts, err := l.Transfers(ctx)
				if err != nil {
					return tasks.CallToolResult{}, err
				}
				if ts == nil {
					ts = []Transfer{}
				}
				sc, _ := json.Marshal(map[string]any{"transfers": ts})
				r := textResult(string(sc))
				r.StructuredContent = sc
				return r, nil
			},
		},
		{
			Name:        "deploy_service",
			Title:       "Deploy a service",
			Description: "Deploy a version of a service to an environment. Production deployments wait for a human approval.",
			InputSchema: json.RawMessage(`{"type":"object","additionalProperties":false,"required":["service","version","environment"],
				"properties":{"service":{"type":"string","minLength":1,"maxLength":64},
				"version":{"type":"string","minLength":1,"maxLength":64},
				"environment":{"type":"string","minLength":1,"maxLength":32}}}`),
			Describe: func(raw json.RawMessage) string {
				a := decodeArgs[deployArgs](raw)
				return fmt.Sprintf("Deploy %s version %s to %s", a.Service, a.Version, a.Environment)
			},
			Run: func(ctx context.Context, call Call) (tasks.CallToolResult, error) {
				if _, _, err := l.record(ctx, kindDeploy, call); err != nil {
					return tasks.CallToolResult{}, err
				}
				a := decodeArgs[deployArgs](call.Arguments)
				return textResult(fmt.Sprintf("Deployed %s %s to %s.", a.Service, a.Version, a.Environment)), nil
			},
		},
		{
			Name:        "delete_records",
			Title:       "Delete records",
			Description: "Delete the records of a table that match a filter. Needs two approvers.",
			InputSchema: json.RawMessage(`{"type":"object","additionalProperties":false,"required":["table","filter"],
				"properties":{"table":{"type":"string","minLength":1,"maxLength":64},
				"filter":{"type":"string","minLength":1,"maxLength":512}}}`),
			Describe: func(raw json.RawMessage) string {
				a := decodeArgs[deleteArgs](raw)
				return fmt.Sprintf("Delete every record of table %s matching %q", a.Table, a.Filter)
			},
			Run: func(ctx context.Context, call Call) (tasks.CallToolResult, error) {
				if _, _, err := l.record(ctx, kindDelete, call); err != nil {
					return tasks.CallToolResult{}, err
				}
				a := decodeArgs[deleteArgs](call.Arguments)
				return textResult(fmt.Sprintf("Deleted the records of %s matching %q.", a.Table, a.Filter)), nil
			},
		},
		{
			Name:        "place_trade",
			Title:       "Place trade",
			Description: "Place a limit order. Requires the caller's own passkey for each call (SEP-2672 verified approval): approval/challenge/create, then the assertion in the tools/call _meta.",
			InputSchema: json.RawMessage(`{"type":"object","required":["symbol","side","quantity","limit"],"additionalProperties":false,
				"properties":{"symbol":{"type":"string","minLength":1,"description":"Ticker symbol, e.g. AAPL"},
				"side":{"type":"string","enum":["buy","sell"]},
				"quantity":{"type":"number","exclusiveMinimum":0},
				"limit":{"type":"number","exclusiveMinimum":0,"description":"Limit price"}}}`),
			Describe: func(raw json.RawMessage) string {
				a := decodeArgs[tradeArgs](raw)
				verb := "Sell"
				if a.Side == "buy" {
					verb = "Buy"
				}
				return fmt.Sprintf("%s %s %s at $%s", verb, jsNumber(a.Quantity), a.Symbol, jsNumber(a.Limit))
			},
			Run: func(ctx context.Context, call Call) (tasks.CallToolResult, error) {
				e, _, err := l.record(ctx, kindTrade, call)
				if err != nil {
					return tasks.CallToolResult{}, err
				}
				a := decodeArgs[tradeArgs](call.Arguments)
				executedAt := e.ExecutedAt.Format(time.RFC3339Nano)
				r := textResult(fmt.Sprintf("Placed %s %s %s @ %s (id %s)", a.Side, jsNumber(a.Quantity), a.Symbol, jsNumber(a.Limit), e.Key))
				r.StructuredContent, _ = json.Marshal(map[string]any{"success": true, "tradeId": e.Key, "executedAt": executedAt})
				return r, nil
			},
		},
	}
}
