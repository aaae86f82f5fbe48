package gateway

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// MaxSchemaSteps bounds the subschemas one value of the arguments can be
// checked against (see [CheckSchemaCost]).
const MaxSchemaSteps = 1000

// CheckSchemaCost says why an input schema could make a validation of the
// arguments run without end, or returns nil. The validator
// (jsonschema-go) follows $ref, allOf, anyOf, oneOf, not, if, then, else
// and dependentSchemas on the same value without a bound: a cycle of them
// ({"$ref":"#/$defs/x"} in x) recursed until the Go stack overflowed,
// which is a fatal error that ends the whole process, and a chain of them
// that doubles at each step (x0: allOf [x1, x1], x1: allOf [x2, x2], …)
// could take days for one call. So a schema is refused when such a cycle exists
// or when one value would be checked against more than MaxSchemaSteps
// subschemas. Keywords that move to a part of the value (properties,
// items…) do not count: the value bounds how far they go.
//
// Only $ref values within the schema, JSON pointers ("#", "#/$defs/x")
// and $anchor names ("#addr"), can be followed here; a schema with another
// $ref, with $dynamicRef, $recursiveRef, $dynamicAnchor or
// $recursiveAnchor, or with $id below its root (which changes what a
// pointer or a name refers to) is refused too.
func CheckSchemaCost(raw json.RawMessage) error {
	var root any
	if err := json.Unmarshal(raw, &root); err != nil {
		return err
	}
	c := &costCheck{nodes: map[string]*schemaNode{}, anchors: map[string]string{}}
	if err := c.index(root, "", true); err != nil {
		return err
	}
	c.steps = make(map[string]int, len(c.nodes))
	c.state = make(map[string]int, len(c.nodes))
	// Every schema object may be where a value starts being checked (a
	// property's schema, an item's…).
	for _, p := range slices.Sorted(maps.Keys(c.nodes)) {
		if _, err := c.count(p); err != nil {
			return err
		}
	}
	return nil
}

// schemaNode is one schema object of a schema: its pointer's edges to the
// subschemas that apply to the same value.
type schemaNode struct {
	same []string // pointers of subschemas applied to the same value
	ref  string   // its $ref, as written
}

type costCheck struct {
	nodes   map[string]*schemaNode
	anchors map[string]string // $anchor name → pointer
	steps   map[string]int    // memoized step counts
	state   map[string]int    // 1: being counted, 2: counted
}

// Keywords whose schemas apply to the same value, and those holding
// schemas for parts of it (or none applied at all, like $defs).
var (
	sameSchema     = []string{"not", "if", "then", "else"}
	sameSchemaList = []string{"allOf", "anyOf", "oneOf"}
	sameSchemaMap  = []string{"dependentSchemas", "dependencies"}
	partSchema     = []string{"additionalProperties", "contains", "propertyNames", "unevaluatedProperties", "unevaluatedItems", "additionalItems", "items"}
	partSchemaList = []string{"prefixItems", "items"}
	partSchemaMap  = []string{"properties", "patternProperties", "$defs", "definitions"}
)

// index records the schema v at pointer ptr and the schemas inside it.
func (c *costCheck) index(v any, ptr string, isRoot bool) error {
	n := &schemaNode{}
	c.nodes[ptr] = n
	obj, ok := v.(map[string]any)
	if !ok {
		return nil // true, false, or not a schema (the resolver judges that)
	}
	for _, k := range []string{"$dynamicRef", "$recursiveRef", "$dynamicAnchor", "$recursiveAnchor"} {
		if _, ok := obj[k]; ok {
			return fmt.Errorf("%s at %q is not supported", k, "#"+ptr)
		}
	}
	if _, ok := obj["$id"]; ok && !isRoot {
		return fmt.Errorf("$id below the root (at %q) is not supported", "#"+ptr)
	}
	if a, ok := obj["$anchor"]; ok {
		name, _ := a.(string)
		if _, dup := c.anchors[name]; dup || name == "" || strings.Contains(name, "/") {
			return fmt.Errorf("$anchor %q at %q is not supported", name, "#"+ptr)
		}
		c.anchors[name] = ptr
	}
	if r, ok := obj["$ref"]; ok {
		s, _ := r.(string)
		if !strings.HasPrefix(s, "#") {
			return fmt.Errorf("$ref %q at %q is not within the schema", s, "#"+ptr)
		}
		n.ref = s
	}
	child := func(k string, v any, same bool) error {
		p := ptr + "/" + escapePointer(k)
		if same {
			n.same = append(n.same, p)
		}
		return c.index(v, p, false)
	}
	for k, v := range obj {
		same := slices.Contains(sameSchema, k) || slices.Contains(sameSchemaList, k) || slices.Contains(sameSchemaMap, k)
		switch {
		case slices.Contains(sameSchema, k) || slices.Contains(partSchema, k) && !isList(v):
			if err := child(k, v, same); err != nil {
				return err
			}
		case slices.Contains(sameSchemaList, k) || slices.Contains(partSchemaList, k):
			list, _ := v.([]any)
			for i, e := range list {
				if err := c.index(e, ptr+"/"+k+"/"+strconv.Itoa(i), false); err != nil {
					return err
				}
				if same {
					n.same = append(n.same, ptr+"/"+k+"/"+strconv.Itoa(i))
				}
			}
		case slices.Contains(sameSchemaMap, k) || slices.Contains(partSchemaMap, k):
			m, _ := v.(map[string]any)
			for name, e := range m {
				p := ptr + "/" + escapePointer(k) + "/" + escapePointer(name)
				if err := c.index(e, p, false); err != nil {
					return err
				}
				if same {
					n.same = append(n.same, p)
				}
			}
		}
	}
	return nil
}

// count returns how many subschemas a value checked against the schema at
// ptr is checked against, itself included.
func (c *costCheck) count(ptr string) (int, error) {
	switch c.state[ptr] {
	case 1:
		return 0, fmt.Errorf("the schema at %q applies to the value itself again (through $ref, allOf, anyOf, oneOf, not, if, then, else or dependentSchemas): checking it would not end", "#"+ptr)
	case 2:
		return c.steps[ptr], nil
	}
	n := c.nodes[ptr]
	c.state[ptr] = 1
	next := n.same
	if n.ref != "" {
		target, err := c.refPointer(n.ref)
		if err != nil {
			return 0, err
		}
		if _, ok := c.nodes[target]; !ok {
			return 0, fmt.Errorf("$ref %q at %q names nothing in the schema", n.ref, "#"+ptr)
		}
		next = append([]string{target}, next...)
	}
	total := 1
	for _, p := range next {
		s, err := c.count(p)
		if err != nil {
			return 0, err
		}
		if total += s; total > MaxSchemaSteps {
			return 0, fmt.Errorf("a value would be checked against more than %d subschemas at %q", MaxSchemaSteps, "#"+ptr)
		}
	}
	c.state[ptr], c.steps[ptr] = 2, total
	return total, nil
}

// refPointer turns a $ref of the form "#", "#/a/b" (URI fragment
// encoding allowed) or "#name" (an $anchor) into the pointer form index
// uses ("", "/a/b").
func (c *costCheck) refPointer(ref string) (string, error) {
	frag, err := url.PathUnescape(strings.TrimPrefix(ref, "#"))
	if err != nil {
		return "", fmt.Errorf("$ref %q: %w", ref, err)
	}
	if frag != "" && !strings.HasPrefix(frag, "/") {
		if p, ok := c.anchors[frag]; ok {
			return p, nil
		}
		return "", fmt.Errorf("$ref %q names no $anchor of the schema", ref)
	}
	parts := strings.Split(frag, "/")
	for i, p := range parts {
		parts[i] = escapePointer(strings.NewReplacer("~1", "/", "~0", "~").Replace(p))
	}
	return strings.Join(parts, "/"), nil
}

// escapePointer escapes one JSON pointer token, so that the pointer index
// builds is the same string for one location however a $ref spells it.
func escapePointer(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}

func isList(v any) bool {
	_, ok := v.([]any)
	return ok
}
