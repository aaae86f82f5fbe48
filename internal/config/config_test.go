package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// env is a lookupEnv over a map.
func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// write puts content in a file of a fresh directory and returns its path.
func write(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "countersign.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// problems loads content and returns the problem lines, failing when the
// configuration loads.
func problems(t *testing.T, content string, lookup map[string]string) []string {
	t.Helper()
	_, err := Parse("c.yaml", []byte(content), env(lookup))
	if err == nil {
		t.Fatalf("loaded without error:\n%s", content)
	}
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("error %T is not *Error: %v", err, err)
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(ce.Problems) {
		t.Fatalf("%d message lines for %d problems:\n%v", len(lines), len(ce.Problems), err)
	}
	return lines
}

const full = `# Countersign
upstreams:
  - name: fs                       # [a-z0-9-]{1,32}, unique
    command: ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/srv/data"]
    env: {LOG_LEVEL: info}
    prefix: files
    approval: always
  - name: everything
    url: http://127.0.0.1:3001/mcp
    headers: {Authorization: "Bearer ${EVERYTHING_TOKEN}"}
    timeout: 30s
    required: true
demo_tools: true
inline_wait: 20s
`

func TestLoadFullExample(t *testing.T) {
	path := write(t, full)
	f, err := Load(path, env(map[string]string{"EVERYTHING_TOKEN": "tok-123"}))
	if err != nil {
		t.Fatal(err)
	}
	yes := true
	want := &File{
		Path: path,
		Upstreams: []Upstream{{
			Name:     "fs",
			Prefix:   "files",
			Command:  []string{"npx", "-y", "@modelcontextprotocol/server-filesystem", "/srv/data"},
			Env:      map[string]string{"LOG_LEVEL": "info"},
			Timeout:  DefaultTimeout,
			Approval: ApprovalAlways,
			Line:     3,
		}, {
			Name:     "everything",
			Prefix:   "everything",
			URL:      "http://127.0.0.1:3001/mcp",
			Headers:  map[string]string{"Authorization": "Bearer tok-123"},
			Timeout:  30 * time.Second,
			Approval: ApprovalPolicy,
			Required: true,
			Line:     8,
		}},
		DemoTools:  &yes,
		InlineWait: new(20 * time.Second),
	}
	if diff := cmp.Diff(want, f); diff != "" {
		t.Errorf("Load (-want +got):\n%s", diff)
	}
	if !f.Upstreams[0].Stdio() || f.Upstreams[1].Stdio() {
		t.Error("Stdio: want fs stdio, everything HTTP")
	}
	if !f.DemoToolsOr(false) {
		t.Error("DemoToolsOr(false) = false, the file says true")
	}
}

func TestEmptyFiles(t *testing.T) {
	for _, content := range []string{"", "\n", "# nothing yet\n", "---\n", "~\n", "upstreams:\n", "upstreams: []\ndemo_tools:\n"} {
		f, err := Parse("c.yaml", []byte(content), env(nil))
		if err != nil {
			t.Errorf("%q: %v", content, err)
			continue
		}
		if len(f.Upstreams) != 0 || f.DemoTools != nil {
			t.Errorf("%q: got %+v, want an empty configuration", content, f.Redacted())
		}
		if !f.DemoToolsOr(true) || f.DemoToolsOr(false) {
			t.Errorf("%q: DemoToolsOr must return the default", content)
		}
	}
	var nilFile *File
	if !nilFile.DemoToolsOr(true) {
		t.Error("nil File: DemoToolsOr(true) = false")
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "absent.yaml"), nil)
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load of a missing file: %v, want ErrNotExist", err)
	}
}

func TestDefaultLookupIsProcessEnvironment(t *testing.T) {
	t.Setenv("COUNTERSIGN_TEST_TOKEN", "from-env")
	f, err := Parse("c.yaml", []byte("upstreams:\n  - name: a\n    url: https://x.example\n    headers: {X-Token: \"${COUNTERSIGN_TEST_TOKEN}\"}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Upstreams[0].Headers["X-Token"]; got != "from-env" {
		t.Errorf("header = %q, want from-env", got)
	}
}

// TestProblems: every rule, broken, is reported at its line and field.
func TestProblems(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    []string // each a prefix of one problem line, in order
	}{{
		name:    "unknown top-level key",
		content: "upstreams: []\ntemporl:\n  x: 1\n",
		want:    []string{"c.yaml:2: temporl: unknown field (known: upstreams, demo_tools, inline_wait, "},
	}, {
		name:    "unknown upstream key",
		content: "upstreams:\n  - name: a\n    url: http://h\n    tiemout: 3s\n",
		want:    []string{"c.yaml:4: upstreams[0].tiemout: unknown field (known: name, command, url, env, headers, prefix, timeout, approval, required)"},
	}, {
		name:    "top level not a mapping",
		content: "- a\n- b\n",
		want:    []string{"c.yaml:1: the file must be a mapping of sections (upstreams, demo_tools, inline_wait, "},
	}, {
		name:    "inline_wait not a duration",
		content: "inline_wait: soon\n",
		want:    []string{`c.yaml:1: inline_wait: "soon" is not a duration such as 20s or 1m`},
	}, {
		name:    "inline_wait too long",
		content: "inline_wait: 11m\n",
		want:    []string{"c.yaml:1: inline_wait: must be from 0s to 10m, not 11m0s"},
	}, {
		name:    "duplicate top-level key",
		content: "demo_tools: true\ndemo_tools: false\n",
		want:    []string{"c.yaml:2: demo_tools: duplicate key (first at line 1)"},
	}, {
		name:    "demo_tools not a boolean",
		content: "demo_tools: yes\n",
		want:    []string{"c.yaml:1: demo_tools: must be true or false, not a string"},
	}, {
		name:    "upstreams not a list",
		content: "upstreams:\n  name: a\n",
		want:    []string{"c.yaml:2: upstreams: must be a list of upstreams, not a mapping"},
	}, {
		name:    "upstream not a mapping",
		content: "upstreams:\n  - fs\n",
		want:    []string{"c.yaml:2: upstreams[0]: must be a mapping"},
	}, {
		name:    "name missing",
		content: "upstreams:\n  - url: http://h\n",
		want:    []string{"c.yaml:2: upstreams[0].name: required"},
	}, {
		name:    "name bad charset",
		content: "upstreams:\n  - url: http://h\n    name: Files_1\n",
		want:    []string{`c.yaml:3: upstreams[0].name: "Files_1" must be 1 to 32 characters of a-z, 0-9 and -`},
	}, {
		name:    "name too long",
		content: "upstreams:\n  - name: " + strings.Repeat("a", 33) + "\n    url: http://h\n",
		want:    []string{"c.yaml:2: upstreams[0].name: \"aaaa"},
	}, {
		name:    "name not a string",
		content: "upstreams:\n  - name: [a]\n    url: http://h\n",
		want:    []string{"c.yaml:2: upstreams[0].name: must be a string, not a list"},
	}, {
		name:    "neither command nor url",
		content: "upstreams:\n  - name: a\n    prefix: b\n",
		want:    []string{"c.yaml:2: upstreams[0]: one of command (a stdio upstream) or url (an HTTP upstream) is required"},
	}, {
		name:    "both command and url",
		content: "upstreams:\n  - name: a\n    command: [x]\n    url: http://h\n",
		want:    []string{"c.yaml:4: upstreams[0]: command (line 3) and url (line 4) exclude each other"},
	}, {
		name:    "command a string",
		content: "upstreams:\n  - name: a\n    command: npx server\n",
		want:    []string{`c.yaml:3: upstreams[0].command: must be a list of strings, e.g. ["npx", "-y", "server"], not a string`},
	}, {
		name:    "command empty",
		content: "upstreams:\n  - name: a\n    command: []\n",
		want:    []string{"c.yaml:3: upstreams[0].command: must not be empty"},
	}, {
		name:    "command element not a string",
		content: "upstreams:\n  - name: a\n    command:\n      - npx\n      - {a: b}\n",
		want:    []string{"c.yaml:5: upstreams[0].command[1]: must be a string, not a mapping"},
	}, {
		name:    "command program empty",
		content: "upstreams:\n  - name: a\n    command: ['', x]\n",
		want:    []string{"c.yaml:3: upstreams[0].command[0]: the program must not be empty"},
	}, {
		name:    "url scheme",
		content: "upstreams:\n  - name: a\n    url: ftp://h/mcp\n",
		want:    []string{"c.yaml:3: upstreams[0].url: must be an http or https URL"},
	}, {
		name:    "url without host",
		content: "upstreams:\n  - name: a\n    url: http:///mcp\n",
		want:    []string{"c.yaml:3: upstreams[0].url: must have a host"},
	}, {
		name:    "url relative",
		content: "upstreams:\n  - name: a\n    url: /mcp\n",
		want:    []string{"c.yaml:3: upstreams[0].url: must be an http or https URL"},
	}, {
		name:    "url unparsable",
		content: "upstreams:\n  - name: a\n    url: \"http://h:port/\"\n",
		want:    []string{"c.yaml:3: upstreams[0].url: not a URL"},
	}, {
		name:    "url with credentials",
		content: "upstreams:\n  - name: a\n    url: https://u:pw@h/mcp\n",
		want:    []string{"c.yaml:3: upstreams[0].url: must not carry user:password; use headers"},
	}, {
		name:    "env with url",
		content: "upstreams:\n  - name: a\n    url: http://h\n    env: {A: b}\n",
		want:    []string{"c.yaml:4: upstreams[0].env: only for command (stdio) upstreams"},
	}, {
		name:    "headers with command",
		content: "upstreams:\n  - name: a\n    command: [x]\n    headers: {A: b}\n",
		want:    []string{"c.yaml:4: upstreams[0].headers: only for url (HTTP) upstreams"},
	}, {
		name:    "env not a mapping",
		content: "upstreams:\n  - name: a\n    command: [x]\n    env: [A=b]\n",
		want:    []string{"c.yaml:4: upstreams[0].env: must be a mapping of names to strings, not a list"},
	}, {
		name:    "env bad name and value",
		content: "upstreams:\n  - name: a\n    command: [x]\n    env:\n      A=B: x\n      C: [1]\n",
		want: []string{
			`c.yaml:5: upstreams[0].env["A=B"]: not a valid environment variable name`,
			"c.yaml:6: upstreams[0].env.C: must be a string, not a list",
		},
	}, {
		name:    "header bad name, transport header, duplicate",
		content: "upstreams:\n  - name: a\n    url: http://h\n    headers:\n      \"Bad Header\": x\n      mcp-session-id: y\n      X-A: 1\n      x-a: 2\n",
		want: []string{
			`c.yaml:5: upstreams[0].headers["Bad Header"]: not a valid HTTP header name`,
			"c.yaml:6: upstreams[0].headers.mcp-session-id: set by the HTTP transport",
			"c.yaml:8: upstreams[0].headers.x-a: duplicate header (header names ignore case; first at line 7)",
		},
	}, {
		name:    "prefix bad charset",
		content: "upstreams:\n  - name: a\n    url: http://h\n    prefix: a__b\n",
		want:    []string{`c.yaml:4: upstreams[0].prefix: "a__b" must be 1 to 32 characters`},
	}, {
		name:    "timeout not a duration",
		content: "upstreams:\n  - name: a\n    url: http://h\n    timeout: 30\n",
		want:    []string{`c.yaml:4: upstreams[0].timeout: "30" is not a duration such as 30s or 2m`},
	}, {
		name:    "timeout zero",
		content: "upstreams:\n  - name: a\n    url: http://h\n    timeout: 0s\n",
		want:    []string{"c.yaml:4: upstreams[0].timeout: must be greater than 0, not 0s"},
	}, {
		name:    "timeout negative",
		content: "upstreams:\n  - name: a\n    url: http://h\n    timeout: -5s\n",
		want:    []string{"c.yaml:4: upstreams[0].timeout: must be greater than 0, not -5s"},
	}, {
		name:    "timeout too long",
		content: "upstreams:\n  - name: a\n    url: http://h\n    timeout: 5m1s\n",
		want:    []string{"c.yaml:4: upstreams[0].timeout: must be at most 5m0s, the limit on an approved call's execution, not 5m1s"},
	}, {
		name:    "approval",
		content: "upstreams:\n  - name: a\n    url: http://h\n    approval: sometimes\n",
		want:    []string{`c.yaml:4: upstreams[0].approval: "sometimes" must be always, never or policy`},
	}, {
		name:    "required not a boolean",
		content: "upstreams:\n  - name: a\n    url: http://h\n    required: yes-please\n",
		want:    []string{`c.yaml:4: upstreams[0].required: must be true or false, not a string`},
	}, {
		name:    "duplicate key in an upstream",
		content: "upstreams:\n  - name: a\n    url: http://h\n    name: b\n",
		want:    []string{"c.yaml:4: upstreams[0].name: duplicate key (first at line 2)"},
	}, {
		name:    "duplicate names",
		content: "upstreams:\n  - name: a\n    url: http://h\n  - name: a\n    command: [x]\n",
		want:    []string{`c.yaml:4: upstreams[1].name: duplicate name "a" (upstreams[0], line 2)`},
	}, {
		name:    "duplicate explicit prefixes",
		content: "upstreams:\n  - name: a\n    url: http://h\n    prefix: p\n  - name: b\n    command: [x]\n    prefix: p\n",
		want:    []string{`c.yaml:7: upstreams[1].prefix: duplicate prefix "p" (upstreams[0], line 4)`},
	}, {
		name:    "prefix collides with a defaulted prefix",
		content: "upstreams:\n  - name: a\n    url: http://h\n  - name: b\n    command: [x]\n    prefix: a\n",
		want:    []string{`c.yaml:6: upstreams[1].prefix: duplicate prefix "a" (upstreams[0], line 2)`},
	}, {
		name:    "merge keys",
		content: "base: &b {url: http://h}\n",
		want:    []string{"c.yaml:1: base: unknown field"},
	}, {
		name:    "two documents",
		content: "demo_tools: true\n---\ndemo_tools: false\n",
		want:    []string{"c.yaml:2: the file must hold one YAML document"},
	}, {
		name: "every problem, in line order",
		content: `upstreams:
  - name: A
    url: http://h
    headers: {X: "${MISSING}"}
  - name: b
    command: x
    timeout: 2h
    bogus: 1
demo_tools: 1
`,
		want: []string{
			`c.yaml:2: upstreams[0].name: "A" must be`,
			"c.yaml:4: upstreams[0].headers.X: environment variable MISSING is not set",
			"c.yaml:6: upstreams[1].command: must be a list of strings",
			"c.yaml:7: upstreams[1].timeout: must be at most 5m0s, the limit on an approved call's execution, not 2h0m0s",
			"c.yaml:8: upstreams[1].bogus: unknown field",
			"c.yaml:9: demo_tools: must be true or false, not a number",
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := problems(t, tt.content, nil)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d problems, want %d:\n%s", len(got), len(tt.want), strings.Join(got, "\n"))
			}
			for i, w := range tt.want {
				if !strings.HasPrefix(got[i], w) {
					t.Errorf("problem %d:\n got %s\nwant %s…", i, got[i], w)
				}
			}
		})
	}
}

func TestMergeKeyRejected(t *testing.T) {
	content := "upstreams:\n  - name: a\n    <<: {url: http://h}\n"
	got := problems(t, content, nil)
	if !slices.Contains(got, "c.yaml:3: upstreams[0]: merge keys (<<) are not supported") {
		t.Errorf("got %v", got)
	}
}

// TestYAMLSyntax: syntax errors carry the line the YAML parser gives (for
// some errors, the line of the construct that is left open).
func TestYAMLSyntax(t *testing.T) {
	for content, want := range map[string]string{
		"a: 1\nb: 2\nc 2\nd: 3\n":                "c.yaml:3: invalid YAML: could not find expected ':'",
		"upstreams:\n\t- name: a\n":              "c.yaml:2: invalid YAML: found character that cannot start any token",
		"upstreams:\n  - name: a\n    url: [h\n": "invalid YAML: did not find expected ',' or ']'",
		"upstreams:\n  - name: a\n    url: http://h\n    headers: {Authorization: Bearer ${TOK}}\n": `invalid YAML: did not find expected ',' or '}' (inside {…} or […], a value holding ${…} must be quoted: {Authorization: "Bearer ${TOKEN}"})`,
	} {
		got := problems(t, content, nil)
		if len(got) != 1 || !strings.Contains(got[0], want) || !regexp.MustCompile(`^c\.yaml:\d+: `).MatchString(got[0]) {
			t.Errorf("%q: got %v, want %s", content, got, want)
		}
	}
}

func TestAliases(t *testing.T) {
	content := `upstreams:
  - name: a
    url: http://h
    headers: &auth {Authorization: "Bearer ${T}"}
  - name: b
    url: http://h2
    headers: *auth
`
	f, err := Parse("c.yaml", []byte(content), env(map[string]string{"T": "t"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range f.Upstreams {
		if u.Headers["Authorization"] != "Bearer t" {
			t.Errorf("%s: headers %v", u.Name, u.Headers)
		}
	}
}

func TestDefaults(t *testing.T) {
	f, err := Parse("c.yaml", []byte("upstreams:\n  - name: a\n    url: https://h\n    prefix:\n    timeout: ~\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	u := f.Upstreams[0]
	if u.Prefix != "a" || u.Timeout != DefaultTimeout || u.Approval != ApprovalPolicy || u.Required || u.Env != nil || u.Headers != nil {
		t.Errorf("defaults: %+v", u)
	}
	f, err = Parse("c.yaml", []byte("upstreams:\n  - name: a\n    url: https://h\n    timeout: 5m\n    approval: never\ndemo_tools: false\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if u := f.Upstreams[0]; u.Timeout != 5*time.Minute || u.Approval != ApprovalNever {
		t.Errorf("upper bound and never: %+v", u)
	}
	if f.DemoToolsOr(true) {
		t.Error("demo_tools: false, DemoToolsOr(true) = true")
	}
}

func TestExpansion(t *testing.T) {
	dir := t.TempDir()
	abs := filepath.Join(dir, "token")
	if err := os.WriteFile(abs, []byte("file-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "crlf"), []byte("crlf-secret\r\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{"TOKEN": "tk", "USER": "u1", "EMPTY": ""}
	tests := []struct {
		value, want string
	}{
		{"${TOKEN}", "tk"},
		{"Bearer ${TOKEN}", "Bearer tk"},
		{"${USER}:${TOKEN}!", "u1:tk!"},
		{"x${EMPTY}y", "xy"},
		{"${file:" + abs + "}", "file-secret"},
		{"Bearer ${file:token}", "Bearer file-secret"}, // relative to the file's directory
		{"${file:crlf}", "crlf-secret"},
		{"$${TOKEN} $TOKEN $5 a$", "${TOKEN} $TOKEN $5 a$"},
		{"plain", "plain"},
	}
	for _, tt := range tests {
		content := fmt.Sprintf("upstreams:\n  - name: a\n    url: http://h\n    headers: {X: %q}\n  - name: b\n    command: [x]\n    env: {X: %q}\n", tt.value, tt.value)
		f, err := Parse(filepath.Join(dir, "c.yaml"), []byte(content), env(vars))
		if err != nil {
			t.Errorf("%q: %v", tt.value, err)
			continue
		}
		if got := f.Upstreams[0].Headers["X"]; got != tt.want {
			t.Errorf("header %q = %q, want %q", tt.value, got, tt.want)
		}
		if got := f.Upstreams[1].Env["X"]; got != tt.want {
			t.Errorf("env %q = %q, want %q", tt.value, got, tt.want)
		}
	}
}

func TestExpansionProblems(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "nl"), []byte("a\nb\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "big"), bytes.Repeat([]byte("x"), maxSecretFile+1), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		value string
		want  string
	}{
		{"${UNSET}", "environment variable UNSET is not set"},
		{"Bearer ${UNSET}", "environment variable UNSET is not set"},
		{"${file:" + filepath.Join(dir, "absent") + "}", "${file:" + filepath.Join(dir, "absent") + "}: no such file or directory"},
		{"${file:}", "${file:}: no path"},
		{"${file:big}", "${file:big}: larger than 64 KiB"},
		{"${file:nl}", "the value (after expansion) is not a valid HTTP header value"},
		{"${TOKEN", "unterminated ${"},
		{"${not-a-name}", "a ${…} reference must be ${NAME}"},
	}
	for _, tt := range tests {
		content := fmt.Sprintf("upstreams:\n  - name: a\n    url: http://h\n    headers:\n      X-Key: %q\n", tt.value)
		_, err := Parse(filepath.Join(dir, "c.yaml"), []byte(content), env(nil))
		want := filepath.Join(dir, "c.yaml") + ":5: upstreams[0].headers.X-Key: " + tt.want
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%q: got %v\nwant %s…", tt.value, err, want)
		}
	}
	// Two unset variables in one value: both named.
	got := problems(t, "upstreams:\n  - name: a\n    command: [x]\n    env: {A: \"${ONE}-${TWO}\"}\n", nil)
	if len(got) != 2 || !strings.Contains(got[0], "ONE is not set") || !strings.Contains(got[1], "TWO is not set") {
		t.Errorf("two unset variables: %v", got)
	}
}

// TestSecretsNeverPrinted: resolved values appear in no printed form and in
// no error message.
func TestSecretsNeverPrinted(t *testing.T) {
	const envSecret, headerSecret, fileSecret = "s3cr3t-env-value", "s3cr3t-header-value", "s3cr3t-file-value"
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "key"), []byte(fileSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{"ENV_SECRET": envSecret, "HEADER_SECRET": headerSecret}
	content := `upstreams:
  - name: fs
    command: [server, --verbose]
    env: {API_KEY: "${ENV_SECRET}", OTHER: "${file:key}"}
  - name: web
    url: https://h.example/mcp
    headers: {Authorization: "Bearer ${HEADER_SECRET}"}
demo_tools: false
`
	f, err := Parse(filepath.Join(dir, "c.yaml"), []byte(content), env(vars))
	if err != nil {
		t.Fatal(err)
	}
	if f.Upstreams[0].Env["API_KEY"] != envSecret || f.Upstreams[0].Env["OTHER"] != fileSecret ||
		f.Upstreams[1].Headers["Authorization"] != "Bearer "+headerSecret {
		t.Fatalf("values not resolved: env %d, headers %d", len(f.Upstreams[0].Env), len(f.Upstreams[1].Headers))
	}

	var text, jsonLog bytes.Buffer
	slog.New(slog.NewTextHandler(&text, nil)).Info("config", "config", f)
	slog.New(slog.NewJSONHandler(&jsonLog, nil)).Info("config", "config", *f, "upstream", f.Upstreams[1])
	js, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	forms := map[string]string{
		"String":           f.String(),
		"%v":               fmt.Sprintf("%v", f),
		"%+v":              fmt.Sprintf("%+v", *f),
		"%#v":              fmt.Sprintf("%#v", f),
		"%v upstreams":     fmt.Sprintf("%v", f.Upstreams),
		"%#v upstream":     fmt.Sprintf("%#v", f.Upstreams[0]),
		"Redacted":         fmt.Sprintf("%v", f.Redacted().Upstreams[0].Env) + fmt.Sprint(f.Redacted().Upstreams[1].Headers),
		"json":             string(js),
		"slog text":        text.String(),
		"slog json":        jsonLog.String(),
		"Upstream.String":  f.Upstreams[1].String(),
		"Redacted.String":  f.Redacted().String(),
		"Upstream.LogValu": f.Upstreams[0].LogValue().String(),
	}
	for name, s := range forms {
		for _, secret := range []string{envSecret, headerSecret, fileSecret} {
			if strings.Contains(s, secret) {
				t.Errorf("%s shows a secret:\n%s", name, s)
			}
		}
		if !strings.Contains(s, "API_KEY") && !strings.Contains(s, "Authorization") {
			t.Errorf("%s shows no env or header name:\n%s", name, s)
		}
	}
	// Redacted is a copy: the original keeps its values.
	if f.Upstreams[0].Env["API_KEY"] != envSecret {
		t.Error("Redacted changed the original")
	}

	wantString := `upstreams:
  - name: fs
    command: [server, --verbose]
    env: {API_KEY: <redacted>, OTHER: <redacted>}
    prefix: fs
    timeout: 1m0s
    approval: policy
  - name: web
    url: https://h.example/mcp
    headers: {Authorization: <redacted>}
    prefix: web
    timeout: 1m0s
    approval: policy
demo_tools: false
`
	if diff := cmp.Diff(wantString, f.String()); diff != "" {
		t.Errorf("String (-want +got):\n%s", diff)
	}
	if got, want := f.Upstreams[1].String(), "web (http: https://h.example/mcp, headers Authorization=<redacted>, prefix web, timeout 1m0s, approval policy)"; got != want {
		t.Errorf("Upstream.String:\n got %s\nwant %s", got, want)
	}

	// Errors: a secret that breaks a rule is not echoed.
	multiline := map[string]string{"HEADER_SECRET": headerSecret + "\r\nX-Injected: 1", "NUL": envSecret + "\x00"}
	bad := "upstreams:\n  - name: web\n    url: https://h\n    headers: {Authorization: \"Bearer ${HEADER_SECRET}\"}\n" +
		"  - name: fs\n    command: [x]\n    env: {A: \"${NUL}\"}\n"
	_, err = Parse("c.yaml", []byte(bad), env(multiline))
	if err == nil {
		t.Fatal("a header value with CRLF loaded")
	}
	for _, secret := range []string{envSecret, headerSecret} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("error shows a secret: %v", err)
		}
	}
	if !strings.Contains(err.Error(), "c.yaml:4: upstreams[0].headers.Authorization: the value (after expansion) is not a valid HTTP header value") ||
		!strings.Contains(err.Error(), "c.yaml:7: upstreams[1].env.A: the value (after expansion) holds a NUL byte") {
		t.Errorf("error: %v", err)
	}
}

func TestEmptyFileString(t *testing.T) {
	if s := (&File{}).String(); s != "" {
		t.Errorf("empty File String = %q", s)
	}
}

func TestToolName(t *testing.T) {
	if got := ToolName("files", "read_file"); got != "files__read_file" {
		t.Errorf("ToolName = %q", got)
	}
	if ToolSeparator != "__" {
		t.Errorf("ToolSeparator = %q", ToolSeparator)
	}
}

// TestCommandProgramPath: a program given as a relative path is relative to
// the file's directory, as the file's other paths are; a bare name is left
// for PATH, an absolute path and the arguments as written.
func TestCommandProgramPath(t *testing.T) {
	path := write(t, `upstreams:
  - name: rel
    command: ["./bin/server.sh", "./data"]
  - name: up
    command: ["../tools/server", "x"]
  - name: bare
    command: ["npx", "-y", "server"]
  - name: abs
    command: ["/usr/bin/server"]
`)
	f, err := Load(path, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(path)
	want := [][]string{
		{filepath.Join(dir, "bin", "server.sh"), "./data"},
		{filepath.Join(filepath.Dir(dir), "tools", "server"), "x"},
		{"npx", "-y", "server"},
		{"/usr/bin/server"},
	}
	for i, u := range f.Upstreams {
		if !slices.Equal(u.Command, want[i]) {
			t.Errorf("%s: command %q, want %q", u.Name, u.Command, want[i])
		}
	}

	// A file named by a relative path: the program is still a path.
	t.Chdir(dir)
	f, err = Load("countersign.yaml", env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Upstreams[0].Command[0]; got != want[0][0] {
		t.Errorf("from the file's directory: program %q, want %q", got, want[0][0])
	}
}

// TestWarnings: what loads but looks like a mistake is warned about, with
// its line and field and never its value: a credential written inline, and
// a "$NAME" that is literal. References, escapes and ordinary values are
// not.
func TestWarnings(t *testing.T) {
	f, err := Parse("c.yaml", []byte(`upstreams:
  - name: a
    url: http://h/mcp
    headers:
      Authorization: "Bearer abc123secret"
      X-Api-Key: "k-123"
      X-Trace: "on"
      Cookie: "${COOKIE}"
      X-Note: "cost $$5 or $${HOME}"
  - name: b
    command: [server]
    env:
      GITHUB_TOKEN: "$GH_TOKEN"
      LOG_LEVEL: info
      DB_PASSWORD: "${DB_PASSWORD}"
slack:
  token: xoxb-inline
  signing_secret: "${SLACK_SIGNING_SECRET}"
`), env(map[string]string{"DB_PASSWORD": "p", "SLACK_SIGNING_SECRET": "s", "COOKIE": "c"}))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range f.Warnings {
		got = append(got, w.String())
	}
	inline := "holds a credential written inline: reference it instead, from the environment (${NAME}) or a file (${file:/run/secrets/…})"
	want := []string{
		"c.yaml:5: upstreams[0].headers.Authorization: " + inline,
		"c.yaml:6: upstreams[0].headers.X-Api-Key: " + inline,
		`c.yaml:13: upstreams[1].env.GITHUB_TOKEN: a "$" followed by a name is literal, sent as written: a reference is written ${NAME}`,
		"c.yaml:13: upstreams[1].env.GITHUB_TOKEN: " + inline,
		"c.yaml:17: slack.token: " + inline,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
	for _, secret := range []string{"abc123secret", "k-123", "xoxb-inline", "GH_TOKEN"} {
		if strings.Contains(strings.Join(got, "\n"), secret) {
			t.Errorf("a warning shows the value %q", secret)
		}
	}
}
