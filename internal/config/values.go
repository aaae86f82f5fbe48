package config

import (
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// The decoders of single values that the sections share. Each reports what
// is wrong with the value at its line and returns the zero value then.

// section walks the mapping v of the section (or subsection) field: every
// key must be one of known.
func (d *decoder) section(v *yaml.Node, field string, known []string, fn func(key, sub string, k, v *yaml.Node)) {
	if v.Kind != yaml.MappingNode {
		d.addf(v.Line, field, "must be a mapping (%s), not %s", keyList(known), describe(v))
		return
	}
	d.mapping(v, field, known, func(key string, k, val *yaml.Node) {
		fn(key, join(field, key), k, val)
	})
}

// nonEmpty is a string that must not be empty.
func (d *decoder) nonEmpty(v *yaml.Node, field string) string {
	s, ok := d.str(v, field)
	if ok && strings.TrimSpace(s) == "" {
		d.addf(v.Line, field, "must not be empty or blank")
		return ""
	}
	return s
}

// hostPort is a host:port address.
func (d *decoder) hostPort(v *yaml.Node, field, example string) string {
	s, ok := d.str(v, field)
	if !ok {
		return ""
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		d.addf(v.Line, field, "%q must be host:port, e.g. %s", s, example)
		return ""
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		d.addf(v.Line, field, "%q: the port must be a number from 0 to 65535", s)
		return ""
	}
	_ = host // an empty host listens on every interface
	return s
}

// filePath is a file or directory path, made absolute against the configuration file's
// directory. Whether the file exists and holds what it should is checked
// where it is used, on the merged settings (a flag or environment variable
// may replace it).
func (d *decoder) filePath(v *yaml.Node, field string) string {
	s := d.nonEmpty(v, field)
	if s != "" && !filepath.IsAbs(s) {
		s = filepath.Join(d.dir, s)
	}
	return s
}

// secret is a string whose ${NAME} and ${file:…} references are resolved;
// its value never appears in a problem.
func (d *decoder) secret(v *yaml.Node, field string) string {
	raw, ok := d.str(v, field)
	if !ok {
		return ""
	}
	d.checkInline(v.Line, field, field[strings.LastIndexByte(field, '.')+1:], raw)
	s, ok := d.expand(v.Line, field, raw)
	if !ok {
		return ""
	}
	if s == "" {
		d.addf(v.Line, field, "is empty (after expansion)")
		return ""
	}
	if strings.ContainsAny(s, "\x00\r\n") {
		d.addf(v.Line, field, "the value (after expansion) holds a line break or NUL byte")
		return ""
	}
	return s
}

// positiveInt is an integer from 1 to max.
func (d *decoder) positiveInt(v *yaml.Node, field string, max int) int {
	if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!int" {
		n, err := strconv.Atoi(v.Value)
		if err == nil && n >= 1 && n <= max {
			return n
		}
		d.addf(v.Line, field, "must be a whole number from 1 to %d, not %s", max, v.Value)
		return 0
	}
	d.addf(v.Line, field, "must be a whole number from 1 to %d, not %s", max, describe(v))
	return 0
}

// positiveNumber is a number greater than 0 and at most max.
func (d *decoder) positiveNumber(v *yaml.Node, field string, max float64) float64 {
	if v.Kind == yaml.ScalarNode && (v.ShortTag() == "!!int" || v.ShortTag() == "!!float") {
		var x float64
		if err := v.Decode(&x); err == nil && x > 0 && x <= max {
			return x
		}
		d.addf(v.Line, field, "must be a number greater than 0 and at most %g, not %s", max, v.Value)
		return 0
	}
	d.addf(v.Line, field, "must be a number greater than 0 and at most %g, not %s", max, describe(v))
	return 0
}

// duration is a Go duration from min to max.
func (d *decoder) duration(v *yaml.Node, field string, min, max time.Duration) time.Duration {
	s, ok := d.str(v, field)
	if !ok {
		return 0
	}
	t, err := time.ParseDuration(s)
	switch {
	case err != nil:
		d.addf(v.Line, field, "%q is not a duration such as 30s or 2m", s)
	case t < min || t > max:
		d.addf(v.Line, field, "must be from %v to %v, not %v", min, max, t)
	default:
		return t
	}
	return 0
}

// stringList is a string or a list of strings.
func (d *decoder) stringList(v *yaml.Node, field string) []string {
	if v.Kind != yaml.SequenceNode {
		if s, ok := d.str(v, field); ok {
			return []string{s}
		}
		return nil
	}
	if len(v.Content) == 0 {
		d.addf(v.Line, field, "must not be an empty list")
		return nil
	}
	var out []string
	for i, e := range v.Content {
		if s, ok := d.str(deref(e), field+"["+strconv.Itoa(i)+"]"); ok {
			out = append(out, s)
		}
	}
	return out
}
