package pdp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
)

//go:embed policy/*.rego
var embedded embed.FS

// policySet is a parsed, hashed policy directory.
type policySet struct {
	modules   []*ast.Module
	data      map[string]any
	dataFiles int
	version   string
}

// load reads every *.rego (but *_test.rego) and *.json file under dir, or the
// embedded default policy when dir is empty. Files and directories whose
// names start with "." are skipped; this also keeps Kubernetes ConfigMap
// mounts (..data/…) from loading twice. JSON data is mounted at its
// directory's path under data, as `opa eval` does.
func load(dir string) (*policySet, error) {
	var fsys fs.FS
	src, prefix := dir, dir
	if dir == "" {
		fsys, _ = fs.Sub(embedded, "policy")
		src, prefix = "embedded default policy", "pdp/policy"
	} else {
		// Said with the path: a walk of a missing directory names only ".".
		fi, err := os.Stat(dir)
		if err != nil {
			return nil, fmt.Errorf("pdp: load policy: %w", err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("pdp: load policy: %s is not a directory", dir)
		}
		fsys = os.DirFS(dir)
	}
	name := func(rel string) string { return filepath.Join(prefix, filepath.FromSlash(rel)) }

	var files []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case p != "." && strings.HasPrefix(d.Name(), "."):
			if d.IsDir() {
				return fs.SkipDir
			}
		case d.IsDir(), strings.HasSuffix(p, "_test.rego"):
		case strings.HasSuffix(p, ".rego"), strings.HasSuffix(p, ".json"):
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pdp: load policy %s: %w", src, err)
	}
	slices.Sort(files)

	set := &policySet{data: map[string]any{}}
	h := sha256.New()
	for _, rel := range files {
		b, err := fs.ReadFile(fsys, rel)
		if err != nil {
			return nil, fmt.Errorf("pdp: load policy: %w", err)
		}
		h.Write([]byte(rel))
		h.Write([]byte{0})
		h.Write(b)
		h.Write([]byte{0})

		if strings.HasSuffix(rel, ".json") {
			if err := set.addData(rel, b); err != nil {
				return nil, fmt.Errorf("pdp: load policy data %s: %w", name(rel), err)
			}
			continue
		}
		m, err := ast.ParseModuleWithOpts(name(rel), string(b), ast.ParserOptions{RegoVersion: ast.RegoV1})
		if err != nil {
			return nil, fmt.Errorf("pdp: parse policy: %w", err)
		}
		set.modules = append(set.modules, m)
	}
	if len(set.modules) == 0 {
		return nil, fmt.Errorf("%w in %s", ErrNoPolicy, src)
	}
	if !set.defines(ast.MustParseRef(Query)) {
		return nil, fmt.Errorf("pdp: policy in %s defines no %s rule", src, Query)
	}
	set.version = "sha256:" + hex.EncodeToString(h.Sum(nil))
	return set, nil
}

// addData merges the JSON object in file rel into set.data at rel's directory.
func (s *policySet) addData(rel string, b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return fmt.Errorf("want a JSON object: %w", err)
	}
	if dec.More() {
		return fmt.Errorf("trailing data after JSON object")
	}
	s.dataFiles++
	if dir := path.Dir(rel); dir != "." {
		keys := strings.Split(dir, "/")
		for i := len(keys) - 1; i >= 0; i-- {
			doc = map[string]any{keys[i]: doc}
		}
	}
	return merge(s.data, doc)
}

// merge adds src to dst; two files may share objects but not leaf values.
func merge(dst, src map[string]any) error {
	for k, v := range src {
		old, ok := dst[k]
		if !ok {
			dst[k] = v
			continue
		}
		om, ok1 := old.(map[string]any)
		vm, ok2 := v.(map[string]any)
		if !ok1 || !ok2 {
			return fmt.Errorf("data key %q is defined twice", k)
		}
		if err := merge(om, vm); err != nil {
			return err
		}
	}
	return nil
}

// defines reports whether some rule produces the document at ref or below it.
func (s *policySet) defines(ref ast.Ref) bool {
	for _, m := range s.modules {
		for _, r := range m.Rules {
			if r.Ref().HasPrefix(ref) {
				return true
			}
		}
	}
	return false
}

// prepare compiles the set for the one query. Built-in errors are strict:
// by default OPA makes an expression whose built-in fails (to_number("x"),
// a bad regex, an unparsable time) undefined, which silently drops the rule
// it is in, so arguments an agent chose could skip a deny rule and reach a
// default allow. Strict, the evaluation fails and the call is denied.
func (s *policySet) prepare(ctx context.Context) (rego.PreparedEvalQuery, error) {
	opts := []func(*rego.Rego){
		rego.Query(Query),
		rego.Store(inmem.NewFromObject(s.data)),
		rego.StrictBuiltinErrors(true),
	}
	for _, m := range s.modules {
		opts = append(opts, rego.ParsedModule(m))
	}
	q, err := rego.New(opts...).PrepareForEval(ctx)
	if err != nil {
		if strings.Contains(err.Error(), "undefined function data.countersign.approvals.") {
			// A copy of default.rego without the helper it imports.
			return q, fmt.Errorf("pdp: compile policy: %w (copy pdp/policy/approvals.rego into the policy directory too)", err)
		}
		return q, fmt.Errorf("pdp: compile policy: %w", err)
	}
	return q, nil
}
