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

// RedactedValue replaces env and header values in every printed form.
const RedactedValue = "<redacted>"

// Redacted is a copy of f with every env and header value replaced by
// "<redacted>", for display.
func (f *File) Redacted() *File {
	if f == nil {
		return nil
	}
	out := *f
	out.Upstreams = make([]Upstream, len(f.Upstreams))
	for i, u := range f.Upstreams {
		out.Upstreams[i] = u.redacted()
	}
	return &out
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
	Upstreams []upstreamView `yaml:"upstreams,omitempty"`
	DemoTools *bool          `yaml:"demo_tools,omitempty"`
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
}

func (u Upstream) view() upstreamView {
	r := u.redacted()
	return upstreamView{
		Name: r.Name, Command: r.Command, Env: r.Env, URL: r.URL, Headers: r.Headers,
		Prefix: r.Prefix, Timeout: r.Timeout.String(), Approval: r.Approval,
	}
}

// String is the configuration as YAML in the file's syntax, defaults filled
// in and env and header values redacted.
func (f File) String() string {
	v := fileView{DemoTools: f.DemoTools}
	for _, u := range f.Upstreams {
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
	fmt.Fprintf(&b, ", prefix %s, timeout %v, approval %s)", u.Prefix, u.Timeout, u.Approval)
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
	return slog.GroupValue(attrs...)
}
