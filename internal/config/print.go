package config

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// RedactedValue replaces secrets (env and header values, temporal.api_key,
// slack.token and slack.signing_secret) in every printed form.
const RedactedValue = "<redacted>"

// Redacted is a copy of f with every secret replaced by "<redacted>", for
// display.
func (f *File) Redacted() *File {
	if f == nil {
		return nil
	}
	out := *f
	out.Upstreams = make([]Upstream, len(f.Upstreams))
	for i, u := range f.Upstreams {
		out.Upstreams[i] = u.redacted()
	}
	out.NATS.URLs = slices.Clone(f.NATS.URLs)
	out.OAuth.Audiences = slices.Clone(f.OAuth.Audiences)
	out.OAuth.RequiredScopes = slices.Clone(f.OAuth.RequiredScopes)
	out.OAuth.Claims = slices.Clone(f.OAuth.Claims)
	redact(&out.Temporal.APIKey)
	redact(&out.Slack.Token)
	redact(&out.Slack.SigningSecret)
	return &out
}

// redact replaces a secret that is set.
func redact(s *string) {
	if *s != "" {
		*s = RedactedValue
	}
}

func (u Upstream) redacted() Upstream {
	u.Command = slices.Clone(u.Command)
	u.Env = redactMap(u.Env)
	u.Headers = redactMap(u.Headers)
	return u
}

func redactMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k := range m {
		out[k] = RedactedValue
	}
	return out
}

// fileView and upstreamView are the printed shapes: the file's own syntax,
// values redacted.
type fileView struct {
	Upstreams   []upstreamView `yaml:"upstreams,omitempty"`
	DemoTools   *bool          `yaml:"demo_tools,omitempty"`
	InlineWait  string         `yaml:"inline_wait,omitempty"`
	Addr        string         `yaml:"addr,omitempty"`
	DataDir     string         `yaml:"data_dir,omitempty"`
	AuditKeyDir string         `yaml:"audit_key_dir,omitempty"`
	PublicURL   string         `yaml:"public_url,omitempty"`
	ServerID    string         `yaml:"server_id,omitempty"`
	LogLevel    string         `yaml:"log_level,omitempty"`
	Policy      string         `yaml:"policy,omitempty"`
	Temporal    *temporalView  `yaml:"temporal,omitempty"`
	NATS        *natsView      `yaml:"nats,omitempty"`
	Slack       *slackView     `yaml:"slack,omitempty"`
	Limits      *limitsView    `yaml:"limits,omitempty"`
	OAuth       *oauthView     `yaml:"oauth,omitempty"`
}

type upstreamView struct {
	Name     string            `yaml:"name" json:"name"`
	Command  []string          `yaml:"command,omitempty,flow" json:"command,omitempty"`
	Env      map[string]string `yaml:"env,omitempty,flow" json:"env,omitempty"`
	URL      string            `yaml:"url,omitempty" json:"url,omitempty"`
	Headers  map[string]string `yaml:"headers,omitempty,flow" json:"headers,omitempty"`
	Prefix   string            `yaml:"prefix" json:"prefix"`
	Timeout  string            `yaml:"timeout" json:"timeout"`
	Approval Approval          `yaml:"approval" json:"approval"`
	Required bool              `yaml:"required,omitempty" json:"required,omitempty"`
}

func (u Upstream) view() upstreamView {
	r := u.redacted()
	return upstreamView{
		Name: r.Name, Command: r.Command, Env: r.Env, URL: r.URL, Headers: r.Headers,
		Prefix: r.Prefix, Timeout: r.Timeout.String(), Approval: r.Approval, Required: r.Required,
	}
}

// String is the configuration as YAML in the file's syntax, defaults filled
// in and secrets redacted.
func (f File) String() string {
	r := f.Redacted()
	v := fileView{DemoTools: r.DemoTools, Addr: r.Addr, DataDir: r.DataDir, AuditKeyDir: r.AuditKeyDir, PublicURL: r.PublicURL,
		ServerID: r.ServerID, LogLevel: r.LogLevel, Policy: r.Policy,
		Temporal: r.Temporal.view(), NATS: r.NATS.view(), Slack: r.Slack.view(), Limits: r.Limits.view(),
		OAuth: r.OAuth.view()}
	if r.InlineWait != nil {
		v.InlineWait = r.InlineWait.String()
	}
	for _, u := range r.Upstreams {
		v.Upstreams = append(v.Upstreams, u.view())
	}
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return fmt.Sprintf("<config: %v>", err)
	}
	_ = enc.Close()
	if s := b.String(); s != "{}\n" {
		return s
	}
	return ""
}

// GoString is String, so that %#v redacts too.
func (f File) GoString() string { return f.String() }

// LogValue is the configuration for log/slog, values redacted: the path,
// demo_tools, and a group per upstream under its name.
func (f File) LogValue() slog.Value {
	attrs := []slog.Attr{slog.String("path", f.Path)}
	if f.DemoTools != nil {
		attrs = append(attrs, slog.Bool("demo_tools", *f.DemoTools))
	}
	ups := make([]slog.Attr, len(f.Upstreams))
	for i, u := range f.Upstreams {
		ups[i] = slog.Any(u.Name, u)
	}
	attrs = append(attrs, slog.Attr{Key: "upstreams", Value: slog.GroupValue(ups...)})
	return slog.GroupValue(attrs...)
}

// String is a one-line summary of the upstream, env and header values
// redacted.
func (u Upstream) String() string {
	var b strings.Builder
	b.WriteString(u.Name)
	if u.Stdio() {
		b.WriteString(" (stdio: ")
		for i, a := range u.Command {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(strconv.Quote(a))
		}
		writeKeys(&b, ", env ", u.Env)
	} else {
		b.WriteString(" (http: " + u.URL)
		writeKeys(&b, ", headers ", u.Headers)
	}
	fmt.Fprintf(&b, ", prefix %s, timeout %v, approval %s", u.Prefix, u.Timeout, u.Approval)
	if u.Required {
		b.WriteString(", required")
	}
	b.WriteByte(')')
	return b.String()
}

func writeKeys(b *strings.Builder, label string, m map[string]string) {
	if len(m) == 0 {
		return
	}
	b.WriteString(label)
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(k + "=" + RedactedValue)
	}
}

// GoString is String, so that %#v redacts too.
func (u Upstream) GoString() string { return u.String() }

// MarshalJSON encodes the upstream with env and header values redacted.
func (u Upstream) MarshalJSON() ([]byte, error) { return json.Marshal(u.view()) }

// LogValue is the upstream for log/slog, env and header values redacted.
func (u Upstream) LogValue() slog.Value {
	attrs := []slog.Attr{}
	if u.Stdio() {
		attrs = append(attrs, slog.Any("command", u.Command))
		if len(u.Env) > 0 {
			attrs = append(attrs, slog.Any("env", slices.Sorted(maps.Keys(u.Env))))
		}
	} else {
		attrs = append(attrs, slog.String("url", u.URL))
		if len(u.Headers) > 0 {
			attrs = append(attrs, slog.Any("headers", slices.Sorted(maps.Keys(u.Headers))))
		}
	}
	attrs = append(attrs,
		slog.String("prefix", u.Prefix),
		slog.String("timeout", u.Timeout.String()),
		slog.String("approval", string(u.Approval)))
	if u.Required {
		attrs = append(attrs, slog.Bool("required", true))
	}
	return slog.GroupValue(attrs...)
}

// MarshalJSON encodes the configuration in the file's syntax (the keys of
// String), secrets redacted.
func (f File) MarshalJSON() ([]byte, error) {
	var v any
	if err := yaml.Unmarshal([]byte(f.String()), &v); err != nil {
		return nil, err
	}
	if v == nil {
		v = map[string]any{}
	}
	return json.Marshal(v)
}

// viewString is the flow-style YAML of a section's printed view.
func viewString(v any) string {
	if v == nil {
		return "{}"
	}
	out, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Sprintf("<config: %v>", err)
	}
	return strings.TrimSpace(string(out))
}

// The sections holding secrets print redacted in every form.

func (t Temporal) String() string {
	t.APIKey = redacted(t.APIKey)
	if v := t.view(); v != nil {
		return viewString(v)
	}
	return "{}"
}

// GoString is String, so that %#v redacts too.
func (t Temporal) GoString() string { return t.String() }

// LogValue is the section for log/slog, the API key redacted.
func (t Temporal) LogValue() slog.Value { return slog.StringValue(t.String()) }

// MarshalJSON encodes the section with the API key redacted.
func (t Temporal) MarshalJSON() ([]byte, error) { return json.Marshal(t.String()) }

func (s Slack) String() string {
	s.Token, s.SigningSecret = redacted(s.Token), redacted(s.SigningSecret)
	if v := s.view(); v != nil {
		return viewString(v)
	}
	return "{}"
}

// GoString is String, so that %#v redacts too.
func (s Slack) GoString() string { return s.String() }

// LogValue is the section for log/slog, secrets redacted.
func (s Slack) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalJSON encodes the section with its secrets redacted.
func (s Slack) MarshalJSON() ([]byte, error) { return json.Marshal(s.String()) }

func redacted(s string) string {
	redact(&s)
	return s
}
