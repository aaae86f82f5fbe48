package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/bench"
)

const benchUsage = `Usage:
  countersign bench [flags]                   measure a running server (--server, tokens) or one started here (--dev)
  countersign bench compare A.json B.json     B against A: p50, p99 and throughput as ratios and deltas
  countersign bench plot REPORT.json -o FILE.svg   latency distributions and throughput against concurrency

Run "countersign bench -h" for the flags.
`

// benchEnv carries what a test hands the command instead of flags: the
// Temporal client of an in-process stack, for the baseline.
type benchEnv struct {
	temporal client.Client
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runBenchWith(ctx, args, stdout, stderr, benchEnv{})
}

func runBenchWith(ctx context.Context, args []string, stdout, stderr io.Writer, env benchEnv) error {
	if len(args) > 0 {
		switch args[0] {
		case "compare":
			return benchCompare(args[1:], stdout)
		case "plot":
			return benchPlot(args[1:], stderr)
		}
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, benchUsage+"\nFlags:\n"); fs.PrintDefaults() }
	server := fs.String("server", envOr("COUNTERSIGN_SERVER", ""), "server URL (default: the URL saved in --data-dir)")
	dataDir := fs.String("data-dir", envOr("COUNTERSIGN_DATA_DIR", "./countersign-data"), "data directory of a `countersign dev`, for its URL and tokens")
	agentToken := fs.String("agent-token", envOr("COUNTERSIGN_AGENT_TOKEN", ""), "agent bearer token (default: DATA_DIR/agent-token)")
	adminToken := fs.String("admin-token", envOr("COUNTERSIGN_ADMIN_TOKEN", ""), "admin token, to add the bench's approvers and agents (default: DATA_DIR/admin-token)")
	dev := fs.Bool("dev", false, "start a `countersign dev` in this process on a fresh data dir (limits lifted, an echo upstream for the gateway scenario) and measure it; the baseline uses its Temporal")
	devLimits := fs.Bool("dev-limits", false, "with --dev, keep the default rate, pending and request limits (for --scenario flood)")
	scenarios := fs.String("scenario", envOr("COUNTERSIGN_BENCH_SCENARIOS", strings.Join(bench.DefaultScenarios, ",")), "comma-separated scenarios: "+strings.Join(bench.AllScenarios, ", "))
	concurrency := fs.String("concurrency", envOr("COUNTERSIGN_BENCH_CONCURRENCY", "1,8"), "comma-separated concurrency levels, each run in turn")
	duration := fs.Duration("duration", 10*time.Second, "how long each scenario runs at each concurrency (unless --requests)")
	requests := fs.Int("requests", 0, "operations per scenario and concurrency (overrides --duration)")
	warmup := fs.Int("warmup", 10, "operations before each measurement, not counted")
	baseline := fs.Bool("baseline", false, "also measure a raw Temporal StartWorkflow of a trivial waiting workflow against the same Temporal (--dev, or --temporal-address)")
	// The server's Temporal settings, with the server's flag names and
	// variables (README, Configuration), for --baseline.
	var tcfg app.Config
	fs.StringVar(&tcfg.TemporalAddress, "temporal-address", envOr("TEMPORAL_ADDRESS", ""), "the server's Temporal frontend host:port, for --baseline (env TEMPORAL_ADDRESS)")
	fs.StringVar(&tcfg.TemporalNamespace, "temporal-namespace", envOr("TEMPORAL_NAMESPACE", app.DefaultTemporalNamespace), "the server's Temporal namespace (env TEMPORAL_NAMESPACE)")
	fs.BoolVar(&tcfg.TemporalTLS, "temporal-tls", false, "connect to Temporal over TLS (implied by the other --temporal-tls-* flags and --temporal-api-key) (env TEMPORAL_TLS)")
	fs.StringVar(&tcfg.TemporalTLSCA, "temporal-tls-ca", envOr("TEMPORAL_TLS_CA_PATH", ""), "CA bundle (PEM) to verify the Temporal server with (env TEMPORAL_TLS_CA_PATH)")
	fs.StringVar(&tcfg.TemporalTLSCert, "temporal-tls-cert", envOr("TEMPORAL_TLS_CERT_PATH", ""), "client certificate (PEM) for Temporal mutual TLS (env TEMPORAL_TLS_CERT_PATH)")
	fs.StringVar(&tcfg.TemporalTLSKey, "temporal-tls-key", envOr("TEMPORAL_TLS_KEY_PATH", ""), "client key (PEM) for Temporal mutual TLS (env TEMPORAL_TLS_KEY_PATH)")
	fs.StringVar(&tcfg.TemporalTLSServerName, "temporal-tls-server-name", envOr("TEMPORAL_TLS_SERVER_NAME", ""), "name the Temporal server certificate must carry (env TEMPORAL_TLS_SERVER_NAME)")
	fs.StringVar(&tcfg.TemporalAPIKey, "temporal-api-key", envOr("TEMPORAL_API_KEY", ""), "Temporal Cloud API key (implies TLS) (env TEMPORAL_API_KEY)")
	upstreamURL := fs.String("upstream-url", envOr("COUNTERSIGN_BENCH_UPSTREAM_URL", ""), "Streamable HTTP URL of an upstream MCP server the server gates, called directly by the gateway scenario")
	upstreamTool := fs.String("upstream-tool", envOr("COUNTERSIGN_BENCH_UPSTREAM_TOOL", "echo"), "the upstream tool the gateway scenario calls (policy must allow it)")
	gatewayTool := fs.String("gateway-tool", envOr("COUNTERSIGN_BENCH_GATEWAY_TOOL", ""), "the same tool's name through Countersign (UPSTREAM__TOOL)")
	upstreamArgs := fs.String("upstream-args", envOr("COUNTERSIGN_BENCH_UPSTREAM_ARGS", `{"message":"bench"}`), "the gateway call's arguments, a JSON object")
	group := fs.String("approver-group", envOr("COUNTERSIGN_BENCH_APPROVER_GROUP", "approvers"), "the approver group policy names for transfer_funds; the bench's approvers join it")
	origin := fs.String("verified-origin", envOr("COUNTERSIGN_BENCH_VERIFIED_ORIGIN", app.DevVerifiedOrigin), "the client page origin of the SEP-2672 ceremony (one of the server's --verified-origins)")
	floodWorkers := fs.Int("flood-workers", 32, "agent A's concurrent callers in the flood scenario")
	floodInterval := fs.Duration("flood-interval", 20*time.Millisecond, "pause between agent B's calls in the flood scenario")
	jsonOut := fs.String("json", envOr("COUNTERSIGN_BENCH_JSON", ""), "write the report as JSON to this file")
	progress := fs.Bool("progress", false, "draw a progress bar on stderr even when it is not a terminal")
	profileDir := fs.String("profile-dir", envOr("COUNTERSIGN_BENCH_PROFILE_DIR", ""), "write a CPU profile of this process for each scenario and concurrency into this directory (with --dev: the server, its Temporal and NATS, and the bench)")
	note := fs.String("note", envOr("COUNTERSIGN_BENCH_NOTE", ""), "a note copied into the report (the machine's load, the build)")
	if err := fs.Parse(args); err != nil {
		return parseError(err)
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("bench: unexpected argument %q\n\n%s", fs.Arg(0), benchUsage)}
	}
	// The typed flags' variables: a value that does not parse is an error,
	// not the default.
	if _, err := setFromEnv(fs, map[string]string{
		"dev":            "COUNTERSIGN_BENCH_DEV",
		"dev-limits":     "COUNTERSIGN_BENCH_DEV_LIMITS",
		"duration":       "COUNTERSIGN_BENCH_DURATION",
		"requests":       "COUNTERSIGN_BENCH_REQUESTS",
		"warmup":         "COUNTERSIGN_BENCH_WARMUP",
		"baseline":       "COUNTERSIGN_BENCH_BASELINE",
		"temporal-tls":   "TEMPORAL_TLS",
		"flood-workers":  "COUNTERSIGN_BENCH_FLOOD_WORKERS",
		"flood-interval": "COUNTERSIGN_BENCH_FLOOD_INTERVAL",
		"progress":       "COUNTERSIGN_BENCH_PROGRESS",
	}); err != nil {
		return err
	}
	o := bench.Options{
		Scenarios: splitList(*scenarios), Duration: *duration, Requests: *requests, Warmup: *warmup,
		ApproverGroup: *group, VerifiedOrigin: *origin, FloodWorkers: *floodWorkers, FloodInterval: *floodInterval,
		UpstreamTool: *upstreamTool, GatewayTool: *gatewayTool, Upstream: *upstreamURL, Note: *note,
		ProfileDir: *profileDir,
	}
	for _, c := range splitList(*concurrency) {
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 {
			return usageError{fmt.Sprintf("--concurrency: %q is not a positive number", c)}
		}
		o.Concurrency = append(o.Concurrency, n)
	}
	if err := json.Unmarshal([]byte(*upstreamArgs), &o.UpstreamArgs); err != nil {
		return usageError{fmt.Sprintf("--upstream-args must be a JSON object: %v", err)}
	}
	if f, ok := stderr.(*os.File); *progress || ok && isTerminal(f) {
		o.Progress = stderr
	}
	if *dev {
		if *server != "" {
			return usageError{"--dev starts its own server: it takes no --server"}
		}
		d, err := startBenchDev(ctx, *devLimits, stderr)
		if err != nil {
			return err
		}
		defer d.stop()
		o.Server, o.AgentToken, o.AdminToken = d.url, d.agentToken, d.adminToken
		if o.Upstream == "" {
			o.Upstream, o.UpstreamTool, o.GatewayTool = d.echo.URL, "echo", "bench__echo"
		}
		if *baseline {
			o.Temporal = d.app.Temporal()
		}
	} else {
		o.Server, o.AgentToken, o.AdminToken = *server, *agentToken, *adminToken
		if f := os.Getenv("COUNTERSIGN_ADMIN_TOKEN_FILE"); o.AdminToken == "" && f != "" {
			b, err := os.ReadFile(f)
			if err != nil {
				return fmt.Errorf("COUNTERSIGN_ADMIN_TOKEN_FILE: %w", err)
			}
			o.AdminToken = strings.TrimSpace(string(b))
		}
		fillFromDataDir(&o, *dataDir)
		base, err := serverURL(o.Server)
		if err != nil {
			return err
		}
		o.Server = base
		if *baseline && env.temporal != nil {
			o.Temporal = env.temporal
		} else if *baseline {
			if tcfg.TemporalAddress == "" {
				return usageError{"--baseline needs the server's Temporal: --temporal-address (and its TLS flags). The embedded Temporal of a separate `countersign dev` admits only its own process: use `countersign bench --dev --baseline`"}
			}
			tc, err := app.DialTemporal(ctx, &tcfg)
			if err != nil {
				return fmt.Errorf("--baseline: %w", err)
			}
			defer tc.Close()
			o.Temporal = tc
		}
	}
	if o.AgentToken == "" && o.AdminToken == "" {
		return usageError{"no agent token: pass --agent-token (COUNTERSIGN_AGENT_TOKEN), or the admin token (--admin-token, COUNTERSIGN_ADMIN_TOKEN or COUNTERSIGN_ADMIN_TOKEN_FILE) to add an agent for the run, or --data-dir of a `countersign dev`"}
	}
	rep, err := bench.Run(ctx, o)
	if err != nil {
		return err
	}
	if *jsonOut != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return bench.WriteText(stdout, rep)
}

// fillFromDataDir takes what the flags left empty from a dev data dir.
func fillFromDataDir(o *bench.Options, dir string) {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	if o.Server == "" {
		if o.Server = read(app.URLFile); o.Server == "" {
			o.Server = "http://127.0.0.1:8080"
		}
	}
	if o.AgentToken == "" {
		o.AgentToken = read(app.AgentTokenFile)
	}
	if o.AdminToken == "" {
		o.AdminToken = read(app.AdminTokenFile)
	}
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// benchDev is a `countersign dev` started by the bench in its own process.
type benchDev struct {
	app                    *app.App
	echo                   *bench.EchoUpstream
	url                    string
	agentToken, adminToken string
	stop                   func()
}

func startBenchDev(ctx context.Context, keepLimits bool, stderr io.Writer) (*benchDev, error) {
	dir, err := os.MkdirTemp("", "countersign-bench-")
	if err != nil {
		return nil, err
	}
	echo, err := bench.StartEchoUpstream()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	cfgFile := filepath.Join(dir, "bench.yaml")
	if err := os.WriteFile(cfgFile, []byte("upstreams:\n  - name: bench\n    url: "+echo.URL+"\n"), 0o600); err != nil {
		echo.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		echo.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cfg := app.Config{DataDir: filepath.Join(dir, "data"), Addr: fmt.Sprintf("127.0.0.1:%d", port), ConfigFile: cfgFile}
	if !keepLimits {
		cfg.RatePerMinute, cfg.RateBurst, cfg.MaxPendingPerPrincipal = 1_000_000, 1_000_000, 1_000_000
		cfg.RequestsPerSecond, cfg.RequestBurst, cfg.MaxInFlightPerPrincipal = 1_000_000, 1_000_000, 1_000_000
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a, err := app.New(runCtx, cfg, app.ModeDev, newLogger(stderr, "warn"), io.Discard)
	if err != nil {
		cancel()
		echo.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start countersign dev: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	d := &benchDev{app: a, echo: echo, url: fmt.Sprintf("http://127.0.0.1:%d", port)}
	d.stop = func() {
		cancel()
		<-done
		echo.Close()
		os.RemoveAll(dir)
	}
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(cfg.DataDir, name))
		return strings.TrimSpace(string(b)), err
	}
	var e1, e2 error
	d.agentToken, e1 = read(app.AgentTokenFile)
	d.adminToken, e2 = read(app.AdminTokenFile)
	if err := errors.Join(e1, e2); err != nil {
		d.stop()
		return nil, err
	}
	return d, nil
}

func benchCompare(args []string, stdout io.Writer) error {
	if len(args) != 2 {
		return usageError{"usage: countersign bench compare A.json B.json"}
	}
	a, err := bench.ReadReport(args[0])
	if err != nil {
		return err
	}
	b, err := bench.ReadReport(args[1])
	if err != nil {
		return err
	}
	return bench.Compare(stdout, a, b)
}

func benchPlot(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench plot", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "the SVG file to write (required)")
	in, rest := splitPositional(args)
	if err := fs.Parse(rest); err != nil {
		return parseError(err)
	}
	if in == "" && fs.NArg() > 0 {
		in = fs.Arg(0)
	}
	if in == "" || *out == "" {
		return usageError{"usage: countersign bench plot REPORT.json -o FILE.svg"}
	}
	r, err := bench.ReadReport(in)
	if err != nil {
		return err
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	if err := bench.Plot(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
