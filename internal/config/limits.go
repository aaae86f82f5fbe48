package config

import (
	"time"

	"go.yaml.in/yaml/v3"
)

// Limits is the limits section: the approval and request limits of the
// README's "Configuration" and "Request limits" tables. Each key is the flag
// of the same name (rate_per_minute is --rate-per-minute); 0 means the file
// does not say.
//
//	limits:
//	  rate_per_minute: 30        # approval requests per principal per minute
//	  rate_burst: 10
//	  max_pending: 100           # pending tasks per principal
//	  poll_interval: 5s          # pollIntervalMs suggested to clients
//	  result_retention: 168h
//	  requests_per_second: 50    # MCP requests per principal
//	  request_burst: 100
//	  max_in_flight: 16
//	  body_read_timeout: 10s
//	  max_slow_bodies: 128
//	  max_connections: 4096
type Limits struct {
	RatePerMinute     int
	RateBurst         int
	MaxPending        int
	PollInterval      time.Duration
	ResultRetention   time.Duration
	RequestsPerSecond float64
	RequestBurst      int
	MaxInFlight       int
	BodyReadTimeout   time.Duration
	MaxSlowBodies     int
	MaxConnections    int
}

// Bounds of the limits: generous, they only catch typos (an extra digit,
// a unit left out).
const (
	maxCount     = 1_000_000
	maxRetention = 365 * 24 * time.Hour
)

var limitsFields = []string{"rate_per_minute", "rate_burst", "max_pending", "poll_interval", "result_retention",
	"requests_per_second", "request_burst", "max_in_flight", "body_read_timeout", "max_slow_bodies", "max_connections"}

func (d *decoder) limits(f *File, v *yaml.Node) {
	l := &f.Limits
	d.section(v, "limits", limitsFields, func(key, sub string, _, v *yaml.Node) {
		switch key {
		case "rate_per_minute":
			l.RatePerMinute = d.positiveInt(v, sub, maxCount)
		case "rate_burst":
			l.RateBurst = d.positiveInt(v, sub, maxCount)
		case "max_pending":
			l.MaxPending = d.positiveInt(v, sub, maxCount)
		case "poll_interval":
			l.PollInterval = d.duration(v, sub, 100*time.Millisecond, time.Hour)
		case "result_retention":
			l.ResultRetention = d.duration(v, sub, time.Minute, maxRetention)
		case "requests_per_second":
			l.RequestsPerSecond = d.positiveNumber(v, sub, maxCount)
		case "request_burst":
			l.RequestBurst = d.positiveInt(v, sub, maxCount)
		case "max_in_flight":
			l.MaxInFlight = d.positiveInt(v, sub, maxCount)
		case "body_read_timeout":
			l.BodyReadTimeout = d.duration(v, sub, 100*time.Millisecond, time.Hour)
		case "max_slow_bodies":
			l.MaxSlowBodies = d.positiveInt(v, sub, maxCount)
		case "max_connections":
			l.MaxConnections = d.positiveInt(v, sub, maxCount)
		}
	})
}

type limitsView struct {
	RatePerMinute     int     `yaml:"rate_per_minute,omitempty"`
	RateBurst         int     `yaml:"rate_burst,omitempty"`
	MaxPending        int     `yaml:"max_pending,omitempty"`
	PollInterval      string  `yaml:"poll_interval,omitempty"`
	ResultRetention   string  `yaml:"result_retention,omitempty"`
	RequestsPerSecond float64 `yaml:"requests_per_second,omitempty"`
	RequestBurst      int     `yaml:"request_burst,omitempty"`
	MaxInFlight       int     `yaml:"max_in_flight,omitempty"`
	BodyReadTimeout   string  `yaml:"body_read_timeout,omitempty"`
	MaxSlowBodies     int     `yaml:"max_slow_bodies,omitempty"`
	MaxConnections    int     `yaml:"max_connections,omitempty"`
}

// view is the printed form of the section; nil when it is empty.
func (l Limits) view() *limitsView {
	if l == (Limits{}) {
		return nil
	}
	return &limitsView{RatePerMinute: l.RatePerMinute, RateBurst: l.RateBurst, MaxPending: l.MaxPending,
		PollInterval: durationString(l.PollInterval), ResultRetention: durationString(l.ResultRetention),
		RequestsPerSecond: l.RequestsPerSecond, RequestBurst: l.RequestBurst, MaxInFlight: l.MaxInFlight,
		BodyReadTimeout: durationString(l.BodyReadTimeout), MaxSlowBodies: l.MaxSlowBodies, MaxConnections: l.MaxConnections}
}

// durationString is d in the file's syntax, "" for 0 (not given).
func durationString(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}
