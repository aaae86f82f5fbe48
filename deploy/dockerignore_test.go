package deploy

import (
	"bufio"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// dockerignore is the build context's exclusions, matched as Docker does
// for the patterns this repository uses: each pattern is relative to the
// context's root (a leading "/" is dropped), "*" and "?" match within one
// path element, a "**" element matches any number of them, and a path is
// excluded when it or one of its parent directories matches.
type dockerignore struct {
	patterns []*regexp.Regexp
}

func readDockerignore(t *testing.T) *dockerignore {
	t.Helper()
	f, err := os.Open(filepath.Join("..", ".dockerignore"))
	if err != nil {
		t.Fatalf(".dockerignore: %v", err)
	}
	defer f.Close()
	d := &dockerignore{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "!") || strings.ContainsAny(line, `[\`) {
			// An exception or a character class: this matcher does not
			// implement them, so it could not tell what the file keeps.
			t.Fatalf(".dockerignore:%d: %q: this test handles no exceptions (!), classes ([…]) or escapes", n, line)
		}
		p := path.Clean(strings.TrimPrefix(line, "/"))
		var re strings.Builder
		re.WriteString("^")
		elems := strings.Split(p, "/")
		for i, elem := range elems {
			if i > 0 && elems[i-1] != "**" {
				re.WriteString("/")
			}
			if elem == "**" {
				if i == len(elems)-1 {
					re.WriteString(`.*`)
				} else {
					re.WriteString(`(?:[^/]+/)*`)
				}
				continue
			}
			for _, r := range elem {
				switch r {
				case '*':
					re.WriteString(`[^/]*`)
				case '?':
					re.WriteString(`[^/]`)
				default:
					re.WriteString(regexp.QuoteMeta(string(r)))
				}
			}
		}
		re.WriteString("$")
		d.patterns = append(d.patterns, regexp.MustCompile(re.String()))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return d
}

// excluded reports whether p (slash-separated, relative to the context's
// root) is left out of the build context.
func (d *dockerignore) excluded(p string) bool {
	elems := strings.Split(p, "/")
	for i := range elems {
		prefix := strings.Join(elems[:i+1], "/")
		for _, re := range d.patterns {
			if re.MatchString(prefix) {
				return true
			}
		}
	}
	return false
}

// TestDockerignore: the build context keeps everything `go build
// ./cmd/countersign` in the Dockerfile needs (go.mod, go.sum, every Go
// package's source and the files it embeds) and leaves out secrets, local
// state, caches and test outputs.
func TestDockerignore(t *testing.T) {
	d := readDockerignore(t)
	// The matcher itself, on the patterns' known cases.
	for p, want := range map[string]bool{
		"admin-token": true, "audit-keys/ed25519.pem": true, "countersign-data/tasks.db": true,
		".git/HEAD": true, ".cache/upstreams/node_modules/x.js": true,
		"scripts/interop/node_modules/pkg/index.js": true, "node_modules/x": true,
		"countersign": true, "cmd/countersign/countersign.test": true, "coverage.out": true,
		"nats/countersign.creds": true, ".env": true,
		"cmd/countersign/main.go": false, "internal/app/app.go": false, "README.md": false,
		"Dockerfile": false, "deploy/kubernetes/base/server.yaml": false,
	} {
		if got := d.excluded(p); got != want {
			t.Errorf("%s: excluded %v, want %v", p, got, want)
		}
	}

	need := []string{"go.mod", "go.sum"}
	root := ".."
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if e.IsDir() {
			switch e.Name() {
			case ".git", ".cache", "node_modules", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		need = append(need, rel)
		embeds, err := embedded(p)
		if err != nil {
			return err
		}
		for _, pattern := range embeds {
			matches, err := filepath.Glob(filepath.Join(filepath.Dir(p), filepath.FromSlash(pattern)))
			if err != nil || len(matches) == 0 {
				t.Errorf("%s: //go:embed %s matches no file (%v)", rel, pattern, err)
			}
			for _, m := range matches {
				r, _ := filepath.Rel(root, m)
				need = append(need, filepath.ToSlash(r))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(need) < 50 {
		t.Fatalf("found only %d files the build needs: has the code moved?", len(need))
	}
	for _, p := range need {
		if d.excluded(p) {
			t.Errorf(".dockerignore leaves out %s, which the image's build needs", p)
		}
	}
}

// embedded is the patterns of a Go file's //go:embed directives.
func embedded(file string) ([]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "//go:embed "); ok {
			out = append(out, strings.Fields(rest)...)
		}
	}
	return out, nil
}
