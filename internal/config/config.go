package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"golang.org/x/net/http/httpguts"
)

// ToolSeparator joins an upstream's prefix and a tool's own name into the
// name agents see.
const ToolSeparator = "__"

// ToolName is the name agents see for the upstream tool tool behind prefix:
// prefix + "__" + tool.
func ToolName(prefix, tool string) string { return prefix + ToolSeparator + tool }

// Timeout bounds for an upstream call. MaxTimeout is the limit on an
// approved call's execution (workflows.ExecuteTimeout, the ExecuteTool
// activity's start-to-close timeout, which also covers the execution
// claim): a longer timeout would be cut short there.
const (
	DefaultTimeout = 60 * time.Second
	MaxTimeout     = 5 * time.Minute
)

// Approval says when a call to an upstream's tools needs a human approval.
type Approval string

// The approval modes.
const (
	ApprovalPolicy Approval = "policy" // the policy decides (the default)
	ApprovalAlways Approval = "always" // every call needs an approval
	ApprovalNever  Approval = "never"  // calls pass without approval
)

// File is a loaded configuration file. Later sections become further fields.
type File struct {
	// Path is the file the configuration came from ("" when it did not come
	// from a file).
	Path string
	// Warnings are what loads but looks like a mistake (a credential
	// written inline, a "$NAME" that is literal), for the caller to show.
	Warnings []Problem
	// Upstreams are the MCP servers whose tools Countersign fronts, in file
	// order.
	Upstreams []Upstream
	// DemoTools is nil when the file does not say; see DemoToolsOr.
	DemoTools *bool
	// InlineWait is how long a tools/call from a client without MCP tasks
	// is held for the approval decision (inline_wait); nil when the file
	// does not say.
	InlineWait *time.Duration

	// The process settings (settings.go): "" when the file does not say.
	Addr, DataDir, AuditKeyDir, PublicURL, ServerID, LogLevel, Policy string

	// Temporal is the temporal section (temporal.go).
	Temporal Temporal
	// NATS is the nats section (nats.go).
	NATS NATS
	// Slack is the slack section (slack.go).
	Slack Slack
	// Limits is the limits section (limits.go).
	Limits Limits
	// OAuth is the oauth section (oauth.go).
	OAuth OAuth
}

// MaxInlineWait bounds inline_wait.
const MaxInlineWait = 10 * time.Minute

// DemoToolsOr is the demo_tools setting, or def when the file has none.
func (f *File) DemoToolsOr(def bool) bool {
	if f == nil || f.DemoTools == nil {
		return def
	}
	return *f.DemoTools
}

// Upstream is one entry of upstreams. Exactly one of Command (stdio) and URL
// (Streamable HTTP) is set. Env and Headers hold resolved values, secrets
// included: print an Upstream only through its own methods (String,
// GoString, MarshalJSON, LogValue), which redact them.
type Upstream struct {
	Name    string
	Prefix  string            // never empty after Load: defaults to Name
	Command []string          // stdio upstream: program and arguments
	Env     map[string]string // stdio only; resolved values
	URL     string            // Streamable HTTP upstream
	Headers map[string]string // HTTP only; resolved values
	Timeout time.Duration     // per call; never 0 after Load
	// Approval is never empty after Load: defaults to ApprovalPolicy.
	Approval Approval
	// Required makes the upstream's being down fail readiness (/readyz
	// 503); by default an upstream's state does not gate it.
	Required bool
	// Line is the line of the entry in the file, for diagnostics.
	Line int
}

// Stdio reports whether the upstream is a child process (Command) rather
// than an HTTP server (URL).
func (u Upstream) Stdio() bool { return len(u.Command) > 0 }

// Problem is one thing wrong with a configuration file.
type Problem struct {
	Path  string // the file
	Line  int    // 0 when the problem has no line
	Field string // the field path, e.g. "upstreams[1].headers.Authorization"; "" for the file as a whole
	Msg   string
}

func (p Problem) String() string {
	var b strings.Builder
	b.WriteString(p.Path)
	if p.Line > 0 {
		b.WriteString(":" + strconv.Itoa(p.Line))
	}
	b.WriteString(": ")
	if p.Field != "" {
		b.WriteString(p.Field + ": ")
	}
	b.WriteString(p.Msg)
	return b.String()
}

// Error is every problem found in a configuration file, in line order. Its
// message has one "path:line: field: problem" line per problem.
type Error struct {
	Problems []Problem
}

func (e *Error) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// Load reads and checks the configuration file at path. lookupEnv resolves
// ${NAME} references (nil means os.LookupEnv). A file that cannot be read is
// an ordinary error; anything wrong inside it is an *Error listing every
// problem.
func Load(path string, lookupEnv func(string) (string, bool)) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(path, data, lookupEnv)
}

// Parse checks the configuration in data; path names it in messages and
// anchors relative ${file:…} references (at its directory). lookupEnv
// resolves ${NAME} references (nil means os.LookupEnv).
func Parse(path string, data []byte, lookupEnv func(string) (string, bool)) (*File, error) {
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	dir := filepath.Dir(path)
	if abs, err := filepath.Abs(dir); err == nil {
		// Paths made from it stay right whatever directory they are used
		// in, and "./server" stays a path rather than a name for PATH.
		dir = abs
	}
	d := &decoder{path: path, dir: dir, lookupEnv: lookupEnv}
	f := &File{Path: path}
	d.file(f, data)
	if len(d.problems) > 0 {
		slices.SortStableFunc(d.problems, func(a, b Problem) int { return a.Line - b.Line })
		return nil, &Error{Problems: d.problems}
	}
	f.Warnings = d.warnings
	return f, nil
}

// A section decodes one top-level key into f.
type section struct {
	key    string
	decode func(d *decoder, f *File, v *yaml.Node)
}

// sections are the top-level keys, in the order of the documentation. A new
// section is a new entry here and a new field of File.
var sections = []section{
	{"upstreams", (*decoder).upstreams},
	{"demo_tools", func(d *decoder, f *File, v *yaml.Node) {
		if b, ok := d.boolean(v, "demo_tools"); ok {
			f.DemoTools = &b
		}
	}},
	{"inline_wait", func(d *decoder, f *File, v *yaml.Node) {
		s, ok := d.str(v, "inline_wait")
		if !ok {
			return
		}
		t, err := time.ParseDuration(s)
		switch {
		case err != nil:
			d.addf(v.Line, "inline_wait", "%q is not a duration such as 20s or 1m", s)
		case t < 0 || t > MaxInlineWait:
			d.addf(v.Line, "inline_wait", "must be from 0s to 10m, not %v", t)
		default:
			f.InlineWait = &t
		}
	}},
	{"addr", (*decoder).addr},
	{"data_dir", (*decoder).dataDir},
	{"audit_key_dir", (*decoder).auditKeyDir},
	{"public_url", (*decoder).publicURL},
	{"server_id", (*decoder).serverID},
	{"log_level", (*decoder).logLevel},
	{"policy", (*decoder).policy},
	{"temporal", (*decoder).temporal},
	{"nats", (*decoder).nats},
	{"slack", (*decoder).slack},
	{"limits", (*decoder).limits},
	{"oauth", (*decoder).oauth},
}

var upstreamFields = []string{"name", "command", "url", "env", "headers", "prefix", "timeout", "approval", "required"}

var (
	namePattern = regexp.MustCompile(`^[a-z0-9-]{1,32}$`)
	varPattern  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	linePattern = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)
)

// transportHeaders are set by the Streamable HTTP transport itself.
var transportHeaders = []string{"Host", "Content-Length", "Content-Type", "Mcp-Session-Id", "Mcp-Protocol-Version"}

// maxSecretFile bounds a ${file:…} secret.
const maxSecretFile = 64 << 10

type decoder struct {
	path      string
	dir       string
	lookupEnv func(string) (string, bool)
	problems  []Problem
	warnings  []Problem
}

func (d *decoder) warnf(line int, field, format string, args ...any) {
	d.warnings = append(d.warnings, Problem{Path: d.path, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// credentialName reports whether a header, variable or setting named name
// holds a credential by its name.
func credentialName(name string) bool {
	n := strings.ToLower(name)
	switch n {
	case "authorization", "proxy-authorization", "cookie":
		return true
	}
	for _, part := range []string{"token", "secret", "password", "passwd", "apikey", "api-key", "api_key", "credential"} {
		if strings.Contains(n, part) {
			return true
		}
	}
	return false
}

// checkInline warns about a value raw of a setting named name (a header,
// an environment variable, a secret setting) that looks like a mistake:
// a credential written inline rather than referenced, or "$NAME", which
// is literal (a reference is ${NAME}). The value never appears in the
// warning.
func (d *decoder) checkInline(line int, field, name, raw string) {
	for i := 0; i+1 < len(raw); i++ {
		if raw[i] != '$' {
			continue
		}
		if strings.HasPrefix(raw[i:], "$${") {
			i += 2
			continue
		}
		if c := raw[i+1]; c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' {
			d.warnf(line, field, "a \"$\" followed by a name is literal, sent as written: a reference is written ${NAME}")
			break
		}
	}
	if credentialName(name) && !strings.Contains(raw, "${") {
		d.warnf(line, field, "holds a credential written inline: reference it instead, from the environment (${NAME}) or a file (${file:/run/secrets/…})")
	}
}

func (d *decoder) addf(line int, field, format string, args ...any) {
	d.problems = append(d.problems, Problem{Path: d.path, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

func (d *decoder) file(f *File, data []byte) {
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if !errors.Is(err, io.EOF) {
			d.yamlError(err, data)
		}
		return
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		d.addf(extra.Line, "", "the file must hold one YAML document, this is a second one")
	} else if !errors.Is(err, io.EOF) {
		d.yamlError(err, data)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return
		}
		root = root.Content[0]
	}
	root = deref(root)
	if isNull(root) {
		return
	}
	if root.Kind != yaml.MappingNode {
		d.addf(root.Line, "", "the file must be a mapping of sections (%s), not %s", keyList(sectionKeys()), describe(root))
		return
	}
	d.mapping(root, "", sectionKeys(), func(key string, _, v *yaml.Node) {
		for _, s := range sections {
			if s.key == key {
				s.decode(d, f, v)
			}
		}
	})
}

func sectionKeys() []string {
	keys := make([]string, len(sections))
	for i, s := range sections {
		keys[i] = s.key
	}
	return keys
}

// yamlError reports a syntax error from the YAML parser at its line.
func (d *decoder) yamlError(err error, data []byte) {
	msg := err.Error()
	if m := linePattern.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		hint := ""
		if strings.Contains(m[2], "did not find expected ',' or") && bytes.Contains(data, []byte("${")) {
			// YAML reads the { of an unquoted ${…} in {…} or […] as the
			// start of another mapping.
			hint = ` (inside {…} or […], a value holding ${…} must be quoted: {Authorization: "Bearer ${TOKEN}"})`
		}
		d.addf(line, "", "invalid YAML: %s%s", m[2], hint)
		return
	}
	d.addf(0, "", "invalid YAML: %s", strings.TrimPrefix(msg, "yaml: "))
}

// mapping walks the mapping n at field, reporting non-string, duplicate and
// (when known is not nil) unknown keys, and calls fn for every other key
// whose value is not null.
func (d *decoder) mapping(n *yaml.Node, field string, known []string, fn func(key string, k, v *yaml.Node)) {
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!null" {
			d.addf(k.Line, field, "keys must be strings, not %s", describe(k))
			continue
		}
		key := k.Value
		sub := join(field, key)
		if k.ShortTag() == "!!merge" {
			d.addf(k.Line, field, "merge keys (<<) are not supported")
			continue
		}
		if first, dup := seen[key]; dup {
			d.addf(k.Line, sub, "duplicate key (first at line %d)", first)
			continue
		}
		seen[key] = k.Line
		if known != nil && !slices.Contains(known, key) {
			d.addf(k.Line, sub, "unknown field (known: %s)", keyList(known))
			continue
		}
		if isNull(v) {
			continue
		}
		fn(key, k, v)
	}
}

func (d *decoder) upstreams(f *File, v *yaml.Node) {
	if v.Kind != yaml.SequenceNode {
		d.addf(v.Line, "upstreams", "must be a list of upstreams, not %s", describe(v))
		return
	}
	type origin struct {
		index int
		line  int
	}
	names := map[string]origin{}
	prefixes := map[string]origin{}
	for i, item := range v.Content {
		field := "upstreams[" + strconv.Itoa(i) + "]"
		u, lines, ok := d.upstream(deref(item), field)
		if !ok {
			continue
		}
		dupName := false
		if u.Name != "" {
			if o, dup := names[u.Name]; dup {
				d.addf(lines.name, field+".name", "duplicate name %q (upstreams[%d], line %d)", u.Name, o.index, o.line)
				dupName = true
			} else {
				names[u.Name] = origin{i, lines.name}
			}
		}
		if u.Prefix != "" {
			if o, dup := prefixes[u.Prefix]; dup {
				// A defaulted prefix repeats a duplicate name: one problem is enough.
				if !dupName || lines.prefix != 0 {
					line := lines.prefix
					if line == 0 {
						line = lines.name
					}
					d.addf(line, field+".prefix", "duplicate prefix %q (upstreams[%d], line %d); tool names would collide", u.Prefix, o.index, o.line)
				}
			} else {
				line := lines.prefix
				if line == 0 {
					line = lines.name
				}
				prefixes[u.Prefix] = origin{i, line}
			}
		}
		f.Upstreams = append(f.Upstreams, u)
	}
}

// upstreamLines are where an upstream's checked-across-entries fields are.
type upstreamLines struct {
	name, prefix int
}

// upstream decodes one entry; ok is false when it is not a mapping at all.
func (d *decoder) upstream(n *yaml.Node, field string) (u Upstream, lines upstreamLines, ok bool) {
	if n.Kind != yaml.MappingNode {
		d.addf(n.Line, field, "must be a mapping (name, command or url, …), not %s", describe(n))
		return u, lines, false
	}
	u.Line = n.Line
	var envNode, headersNode, commandNode, urlNode *yaml.Node
	d.mapping(n, field, upstreamFields, func(key string, k, v *yaml.Node) {
		sub := join(field, key)
		switch key {
		case "name":
			lines.name = k.Line
			if s, ok := d.str(v, sub); ok {
				if !namePattern.MatchString(s) {
					d.addf(v.Line, sub, "%q must be 1 to 32 characters of a-z, 0-9 and -", s)
				}
				u.Name = s
			}
		case "prefix":
			lines.prefix = k.Line
			if s, ok := d.str(v, sub); ok {
				if !namePattern.MatchString(s) {
					d.addf(v.Line, sub, "%q must be 1 to 32 characters of a-z, 0-9 and -", s)
				}
				u.Prefix = s
			}
		case "command":
			commandNode = k
			u.Command = d.command(v, sub)
		case "url":
			urlNode = k
			if s, ok := d.str(v, sub); ok {
				u.URL = s
				d.checkURL(v, sub, s)
			}
		case "env":
			envNode = k
			u.Env = d.secrets(v, sub, false)
		case "headers":
			headersNode = k
			u.Headers = d.secrets(v, sub, true)
		case "timeout":
			u.Timeout = d.timeout(v, sub)
		case "approval":
			if s, ok := d.str(v, sub); ok {
				switch a := Approval(s); a {
				case ApprovalAlways, ApprovalNever, ApprovalPolicy:
					u.Approval = a
				default:
					d.addf(v.Line, sub, "%q must be always, never or policy", s)
				}
			}
		case "required":
			if b, ok := d.boolean(v, sub); ok {
				u.Required = b
			}
		}
	})
	if lines.name == 0 {
		d.addf(n.Line, field+".name", "required")
	}
	switch {
	case commandNode != nil && urlNode != nil:
		d.addf(urlNode.Line, field, "command (line %d) and url (line %d) exclude each other: an upstream is stdio or HTTP", commandNode.Line, urlNode.Line)
	case commandNode == nil && urlNode == nil:
		d.addf(n.Line, field, "one of command (a stdio upstream) or url (an HTTP upstream) is required")
	case urlNode != nil && envNode != nil:
		d.addf(envNode.Line, field+".env", "only for command (stdio) upstreams; this one has a url")
	case commandNode != nil && headersNode != nil:
		d.addf(headersNode.Line, field+".headers", "only for url (HTTP) upstreams; this one has a command")
	}
	if u.Prefix == "" {
		u.Prefix = u.Name
	}
	if u.Timeout == 0 {
		u.Timeout = DefaultTimeout
	}
	if u.Approval == "" {
		u.Approval = ApprovalPolicy
	}
	return u, lines, true
}

func (d *decoder) command(v *yaml.Node, field string) []string {
	if v.Kind != yaml.SequenceNode {
		d.addf(v.Line, field, `must be a list of strings, e.g. ["npx", "-y", "server"], not %s`, describe(v))
		return nil
	}
	if len(v.Content) == 0 {
		d.addf(v.Line, field, "must not be empty")
		return nil
	}
	var out []string
	for i, e := range v.Content {
		s, ok := d.str(deref(e), field+"["+strconv.Itoa(i)+"]")
		if !ok {
			continue
		}
		if i == 0 && s == "" {
			d.addf(e.Line, field+"[0]", "the program must not be empty")
		}
		if i == 0 && strings.ContainsRune(s, '/') && !filepath.IsAbs(s) {
			// A path, like the file's others, is relative to its
			// directory; a bare name is looked up in PATH.
			s = filepath.Join(d.dir, s)
		}
		out = append(out, s)
	}
	return out
}

func (d *decoder) checkURL(v *yaml.Node, field, s string) {
	u, err := url.Parse(s)
	if err != nil {
		d.addf(v.Line, field, "not a URL: %v", errors.Unwrap(err))
		return
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		d.addf(v.Line, field, "must be an http or https URL")
	case u.Hostname() == "":
		d.addf(v.Line, field, "must have a host")
	case u.User != nil:
		d.addf(v.Line, field, "must not carry user:password; use headers")
	}
}

func (d *decoder) timeout(v *yaml.Node, field string) time.Duration {
	s, ok := d.str(v, field)
	if !ok {
		return 0
	}
	t, err := time.ParseDuration(s)
	switch {
	case err != nil:
		d.addf(v.Line, field, "%q is not a duration such as 30s or 2m", s)
	case t <= 0:
		d.addf(v.Line, field, "must be greater than 0, not %v", t)
	case t > MaxTimeout:
		d.addf(v.Line, field, "must be at most %v, the limit on an approved call's execution, not %v", MaxTimeout, t)
	default:
		return t
	}
	return 0
}

// secrets decodes env or headers: a mapping of names to values with
// ${…} references resolved. Values never appear in problems.
func (d *decoder) secrets(v *yaml.Node, field string, headers bool) map[string]string {
	if v.Kind != yaml.MappingNode {
		d.addf(v.Line, field, "must be a mapping of names to strings, not %s", describe(v))
		return nil
	}
	out := map[string]string{}
	canonical := map[string]int{} // header name, case folded → line
	d.mapping(v, field, nil, func(key string, k, val *yaml.Node) {
		sub := join(field, key)
		if headers {
			switch {
			case !httpguts.ValidHeaderFieldName(key):
				d.addf(k.Line, sub, "not a valid HTTP header name")
				return
			case slices.ContainsFunc(transportHeaders, func(h string) bool { return strings.EqualFold(h, key) }):
				d.addf(k.Line, sub, "set by the HTTP transport; it cannot be configured")
				return
			}
			c := strings.ToLower(key)
			if first, dup := canonical[c]; dup {
				d.addf(k.Line, sub, "duplicate header (header names ignore case; first at line %d)", first)
				return
			}
			canonical[c] = k.Line
		} else if key == "" || strings.ContainsAny(key, "=\x00") {
			d.addf(k.Line, sub, "not a valid environment variable name")
			return
		}
		raw, ok := d.str(val, sub)
		if !ok {
			return
		}
		d.checkInline(val.Line, sub, key, raw)
		s, ok := d.expand(val.Line, sub, raw)
		if !ok {
			return
		}
		if headers && !httpguts.ValidHeaderFieldValue(s) {
			d.addf(val.Line, sub, "the value (after expansion) is not a valid HTTP header value: it holds a control character such as a newline")
			return
		}
		if !headers && strings.ContainsRune(s, 0) {
			d.addf(val.Line, sub, "the value (after expansion) holds a NUL byte")
			return
		}
		out[key] = s
	})
	return out
}

// expand resolves the ${NAME}, ${file:path} and $${ references in s,
// reporting every one that fails.
func (d *decoder) expand(line int, field, s string) (string, bool) {
	var b strings.Builder
	ok := true
	for {
		i := strings.IndexByte(s, '$')
		if i < 0 {
			b.WriteString(s)
			break
		}
		b.WriteString(s[:i])
		s = s[i:]
		switch {
		case strings.HasPrefix(s, "$${"):
			b.WriteString("${")
			s = s[3:]
			continue
		case !strings.HasPrefix(s, "${"):
			b.WriteByte('$')
			s = s[1:]
			continue
		}
		end := strings.IndexByte(s, '}')
		if end < 0 {
			d.addf(line, field, "unterminated ${ (write $${ for a literal ${)")
			return "", false
		}
		ref := s[2:end]
		s = s[end+1:]
		if p, isFile := strings.CutPrefix(ref, "file:"); isFile {
			v, err := d.readSecret(p)
			if err != nil {
				d.addf(line, field, "${file:%s}: %v", p, err)
				ok = false
				continue
			}
			b.WriteString(v)
			continue
		}
		if !varPattern.MatchString(ref) {
			// The text between the braces is not echoed: it is not a name.
			d.addf(line, field, "a ${…} reference must be ${NAME} (NAME of A-Z, a-z, 0-9 and _, not starting with a digit) or ${file:/path}")
			ok = false
			continue
		}
		v, set := d.lookupEnv(ref)
		if !set {
			d.addf(line, field, "environment variable %s is not set", ref)
			ok = false
			continue
		}
		b.WriteString(v)
	}
	return b.String(), ok
}

func (d *decoder) readSecret(p string) (string, error) {
	if p == "" {
		return "", errors.New("no path")
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(d.dir, p)
	}
	fh, err := os.Open(p)
	if err != nil {
		return "", secretFileError(err)
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, maxSecretFile+1))
	if err != nil {
		return "", secretFileError(err)
	}
	if len(data) > maxSecretFile {
		return "", fmt.Errorf("larger than %d KiB", maxSecretFile>>10)
	}
	return strings.TrimRight(string(data), "\r\n"), nil
}

// secretFileError is err without the path (the message names it already).
func secretFileError(err error) error {
	if pe, ok := errors.AsType[*os.PathError](err); ok {
		return pe.Err
	}
	return err
}

func (d *decoder) str(v *yaml.Node, field string) (string, bool) {
	if v.Kind != yaml.ScalarNode || v.ShortTag() == "!!null" || v.ShortTag() == "!!binary" {
		d.addf(v.Line, field, "must be a string, not %s", describe(v))
		return "", false
	}
	return v.Value, true
}

func (d *decoder) boolean(v *yaml.Node, field string) (bool, bool) {
	if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!bool" {
		var b bool
		if err := v.Decode(&b); err == nil {
			return b, true
		}
	}
	d.addf(v.Line, field, "must be true or false, not %s", describe(v))
	return false, false
}

// deref follows aliases to the node they name.
func deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// describe names a node's kind for a message, without its value.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "null"
		case "!!bool":
			return "a boolean"
		case "!!int", "!!float":
			return "a number"
		case "!!str":
			return "a string"
		}
		return "a " + strings.TrimLeft(n.ShortTag(), "!") + " value"
	}
	return "an unexpected YAML node"
}

var plainKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// join extends a field path by key.
func join(field, key string) string {
	if !plainKey.MatchString(key) {
		return field + "[" + strconv.Quote(key) + "]"
	}
	if field == "" {
		return key
	}
	return field + "." + key
}

func keyList(keys []string) string { return strings.Join(keys, ", ") }
