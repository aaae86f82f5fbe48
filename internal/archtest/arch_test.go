package archtest

import (
	"bufio"
	"fmt"
	"go/build"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/countersign/countersign"

// testOnly are packages without code of their own (tests only); the
// document names them in prose, not in the table.
var testOnly = []string{"internal/e2e", "internal/browsertest", "internal/abusetest", "internal/archtest", "deploy"}

func TestArchitectureTableMatchesImports(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	table := readTable(t, filepath.Join(root, "docs", "architecture.md"))
	code := modulePackages(t, root)

	for pkg, imports := range code {
		documented, ok := table[pkg]
		if !ok {
			t.Errorf("docs/architecture.md: package %s is missing from the table (it imports %v)", pkg, imports)
			continue
		}
		if !slices.Equal(documented, imports) {
			t.Errorf("docs/architecture.md: %s imports %v, the table says %v", pkg, imports, documented)
		}
	}
	for pkg := range table {
		if _, ok := code[pkg]; !ok {
			t.Errorf("docs/architecture.md: the table lists %s, which is not a package with code", pkg)
		}
	}
}

// TestArchitectureNamesTestOnlyPackages: the packages without code of
// their own are not in the table, so the document's paragraph that begins
// "Test-only packages" names each of them, and a package with only tests
// is one of them.
func TestArchitectureNamesTestOnlyPackages(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, para, ok := strings.Cut(string(doc), "\nTest-only packages")
	if !ok {
		t.Fatal(`docs/architecture.md: no paragraph begins "Test-only packages"`)
	}
	para, _, _ = strings.Cut(para, "\n\n")
	for _, pkg := range testOnly {
		if !strings.Contains(para, "`"+pkg+"`") {
			t.Errorf("docs/architecture.md: the paragraph on test-only packages does not name %s", pkg)
		}
	}
	err = walkPackages(root, func(rel string, p *build.Package) error {
		if len(p.GoFiles) == 0 && !slices.Contains(testOnly, rel) {
			t.Errorf("%s has only tests: add it to testOnly and name it in docs/architecture.md", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// readTable parses the rows "| `pkg` | owns | `a`, `b` |" of the package
// table: package → sorted module imports.
func readTable(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		cells := strings.Split(sc.Text(), "|")
		if len(cells) != 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		pkg := strings.Trim(strings.TrimSpace(cells[1]), "`")
		imports := []string{}
		for _, imp := range strings.Split(cells[3], ",") {
			imp = strings.Trim(strings.TrimSpace(imp), "`")
			if imp != "" && imp != "—" {
				imports = append(imports, imp)
			}
		}
		slices.Sort(imports)
		out[pkg] = imports
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("docs/architecture.md: no package table found")
	}
	return out
}

// walkPackages calls visit with each Go package of the module under root
// (its path relative to root, with slashes), skipping hidden directories,
// testdata and node_modules.
func walkPackages(root string, visit func(rel string, p *build.Package) error) error {
	return filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		name := d.Name()
		if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
			return filepath.SkipDir
		}
		p, err := build.ImportDir(path, 0)
		if err != nil {
			if _, ok := err.(*build.NoGoError); ok {
				return nil
			}
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		return visit(filepath.ToSlash(rel), p)
	})
}

// modulePackages walks the module and returns each package with non-test
// Go files and its sorted imports of other module packages.
func modulePackages(t *testing.T, root string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	err := walkPackages(root, func(rel string, p *build.Package) error {
		if slices.Contains(testOnly, rel) || len(p.GoFiles) == 0 {
			return nil
		}
		imports := []string{}
		for _, imp := range p.Imports {
			if after, ok := strings.CutPrefix(imp, module+"/"); ok {
				imports = append(imports, after)
			}
		}
		slices.Sort(imports)
		out[rel] = imports
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestTestCommandFuzzesEveryTarget: scripts/test.sh runs a short fuzz of
// every fuzz target in the module (the README says so), so a new target
// cannot be left out of it.
func TestTestCommandFuzzesEveryTarget(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(root, "scripts", "test.sh"))
	if err != nil {
		t.Fatal(err)
	}
	fuzzFunc := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(`)
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		for _, m := range fuzzFunc.FindAllSubmatch(src, -1) {
			entry := fmt.Sprintf("%q", string(m[1])+" ./"+filepath.ToSlash(rel))
			if !strings.Contains(string(script), entry) {
				t.Errorf("scripts/test.sh does not fuzz %s (no line %s)", m[1], entry)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
