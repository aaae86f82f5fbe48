package config

import (
	"fmt"
	"log/slog"
	"net/url"
	"slices"

	"go.yaml.in/yaml/v3"
)

// The top-level process settings: addr, data_dir, audit_key_dir,
// public_url, server_id, log_level and policy. Each is the file's form of
// the flag of the same name (--addr, --data-dir, --audit-key-dir,
// --public-url, --server-id, --log-level, --policy).

func (d *decoder) addr(f *File, v *yaml.Node) {
	f.Addr = d.hostPort(v, "addr", "0.0.0.0:8080")
}

func (d *decoder) dataDir(f *File, v *yaml.Node) {
	f.DataDir = d.filePath(v, "data_dir")
}

// auditKeyDir: the directory of the audit signing keys, which every server
// and worker of a deployment shares.
func (d *decoder) auditKeyDir(f *File, v *yaml.Node) {
	f.AuditKeyDir = d.filePath(v, "audit_key_dir")
}

func (d *decoder) policy(f *File, v *yaml.Node) {
	f.Policy = d.filePath(v, "policy")
}

func (d *decoder) serverID(f *File, v *yaml.Node) {
	f.ServerID = d.nonEmpty(v, "server_id")
}

func (d *decoder) publicURL(f *File, v *yaml.Node) {
	s, ok := d.str(v, "public_url")
	if !ok {
		return
	}
	u, err := url.Parse(s)
	switch {
	case err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https"):
		d.addf(v.Line, "public_url", "%q must be an absolute http(s) URL", s)
	case u.Scheme == "http" && u.Hostname() != "localhost":
		d.addf(v.Line, "public_url", "%q: passkeys need https, or http://localhost", s)
	case u.Path != "" && u.Path != "/":
		d.addf(v.Line, "public_url", "%q must not have a path", s)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "":
		d.addf(v.Line, "public_url", "%q must be scheme://host[:port] only", s)
	default:
		f.PublicURL = s
	}
}

// LogLevels are the values of log_level (and --log-level).
var LogLevels = []string{"debug", "info", "warn", "error"}

func (d *decoder) logLevel(f *File, v *yaml.Node) {
	s, ok := d.str(v, "log_level")
	if !ok {
		return
	}
	if err := CheckLogLevel(s); err != nil {
		d.addf(v.Line, "log_level", "%q must be one of %s", s, keyList(LogLevels))
		return
	}
	f.LogLevel = s
}

// CheckLogLevel accepts debug, info, warn and error.
func CheckLogLevel(s string) error {
	if !slices.Contains(LogLevels, s) {
		return fmt.Errorf("log level %q must be one of %s", s, keyList(LogLevels))
	}
	return nil
}

// SlogLevel is the log/slog level of a checked log level (info otherwise).
func SlogLevel(s string) slog.Level {
	var l slog.Level
	if l.UnmarshalText([]byte(s)) != nil {
		return slog.LevelInfo
	}
	return l
}
