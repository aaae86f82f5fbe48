package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/tasks"
)

// doubling is a schema whose property a is checked against 2^n subschemas:
// a0 is allOf [a1, a1], a1 is allOf [a2, a2], …
func doubling(n int) string {
	var defs []string
	for i := 0; i < n; i++ {
		defs = append(defs, fmt.Sprintf(`"a%d":{"allOf":[{"$ref":"#/$defs/a%d"},{"$ref":"#/$defs/a%d"}]}`, i, i+1, i+1))
	}
	defs = append(defs, fmt.Sprintf(`"a%d":{"type":"integer"}`, n))
	return `{"type":"object","$defs":{` + strings.Join(defs, ",") + `},"properties":{"a":{"$ref":"#/$defs/a0"}}}`
}

// An input schema (an upstream's, whatever it lists) whose validation would
// not end is refused when the tool is registered. Validating {"a":1}
// against the first overflowed the Go stack, a fatal error that ended the
// whole server on one tools/call; against the doubling one, it ran for
// days.
func TestRegistryRefusesEndlessSchemas(t *testing.T) {
	run := func(context.Context, Call) (tasks.CallToolResult, error) { return tasks.CallToolResult{}, nil }
	for name, schema := range map[string]string{
		"ref cycle":       `{"type":"object","$defs":{"x":{"$ref":"#/$defs/x"}},"properties":{"a":{"$ref":"#/$defs/x"}}}`,
		"two-ref cycle":   `{"type":"object","$defs":{"x":{"$ref":"#/$defs/y"},"y":{"$ref":"#/$defs/x"}},"properties":{"a":{"$ref":"#/$defs/x"}}}`,
		"root in allOf":   `{"type":"object","allOf":[{"$ref":"#"}]}`,
		"cycle via anyOf": `{"type":"object","$defs":{"x":{"anyOf":[{"type":"integer"},{"$ref":"#/$defs/x"}]}},"properties":{"a":{"$ref":"#/$defs/x"}}}`,
		"cycle via not":   `{"type":"object","$defs":{"x":{"not":{"not":{"$ref":"#/$defs/x"}}}},"properties":{"a":{"$ref":"#/$defs/x"}}}`,
		"escaped pointer": `{"type":"object","$defs":{"a/b":{"$ref":"#/$defs/a~1b"}},"properties":{"a":{"$ref":"#/%24defs/a~1b"}}}`,
		"doubling":        doubling(40),
		"dynamic ref":     `{"type":"object","$dynamicAnchor":"x","properties":{"a":{"$dynamicRef":"#x"}}}`,
		"nested $id":      `{"type":"object","properties":{"a":{"$id":"https://example.com/a","$defs":{"x":{}},"$ref":"#/$defs/x"}}}`,
		"anchor":          `{"type":"object","$defs":{"x":{"$anchor":"x","$ref":"#x"}},"properties":{"a":{"$ref":"#x"}}}`,
		"non-pointer ref": `{"type":"object","properties":{"a":{"$ref":"other.json"}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := NewRegistry(Tool{Name: "t", Run: run, InputSchema: json.RawMessage(schema)}); err == nil {
				t.Fatal("accepted")
			}
			r, err := NewRegistry()
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Replace("up", []Tool{{Name: "up__t", Run: run, InputSchema: json.RawMessage(schema)}}); err == nil {
				t.Fatal("Replace accepted it")
			}
			if _, ok := r.Lookup("up__t"); ok {
				t.Fatal("Replace serves it")
			}
		})
	}
}

// Recursive schemas whose recursion moves into the value (a tree), $defs
// shared by many properties, and pointers to a boolean schema are served,
// and checked at once.
func TestRegistryKeepsFiniteSchemas(t *testing.T) {
	run := func(context.Context, Call) (tasks.CallToolResult, error) { return tasks.CallToolResult{}, nil }
	for name, tc := range map[string]struct{ schema, args string }{
		"tree": {`{"type":"object","$defs":{"node":{"type":"object","properties":{"children":{"type":"array","items":{"$ref":"#/$defs/node"}}}}},"properties":{"root":{"$ref":"#/$defs/node"}}}`,
			`{"root":{"children":[{"children":[]},{"children":[{"children":[]}]}]}}`},
		"root recursion": {`{"type":"object","properties":{"next":{"$ref":"#"}}}`, `{"next":{"next":{}}}`},
		"pydantic": {`{"type":"object","$defs":{"Addr":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}},"properties":{"from":{"$ref":"#/$defs/Addr"},"to":{"anyOf":[{"$ref":"#/$defs/Addr"},{"type":"null"}]}}}`,
			`{"from":{"city":"a"},"to":null}`},
		"draft-07 definitions": {`{"type":"object","definitions":{"n":{"type":"number"}},"properties":{"a":{"allOf":[{"$ref":"#/definitions/n"},{"minimum":0}]}}}`, `{"a":1}`},
		"boolean target":       {`{"type":"object","$defs":{"any":true},"properties":{"a":{"$ref":"#/$defs/any"}}}`, `{"a":[1]}`},
		"property named $ref":  {`{"type":"object","properties":{"$ref":{"type":"string"},"allOf":{"type":"string"}}}`, `{"$ref":"x","allOf":"y"}`},
		"doubling, small":      {doubling(7), `{"a":1}`},
		"anchor": {`{"type":"object","$defs":{"addr":{"$anchor":"addressDef","type":"object","properties":{"city":{"type":"string"}}}},"properties":{"a":{"$ref":"#addressDef"},"b":{"$ref":"#/$defs/addr"}}}`,
			`{"a":{"city":"x"},"b":{}}`},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := NewRegistry(Tool{Name: "t", Run: run, InputSchema: json.RawMessage(tc.schema)})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if err := r.Validate("t", json.RawMessage(tc.args)); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("validation took %v", d)
			}
		})
	}
}
