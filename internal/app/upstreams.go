package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/gateway/conformance"
	"github.com/countersign/countersign/gateway/upstream"
	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/internal/config"
	"github.com/countersign/countersign/pdp"
)

// LoadConfigFile reads the configuration file at path; none ("") is an
// empty configuration.
func LoadConfigFile(path string) (*config.File, error) {
	if path == "" {
		return &config.File{}, nil
	}
	f, err := config.Load(path, nil)
	if err != nil {
		return nil, fmt.Errorf("configuration file: %w", err)
	}
	return f, nil
}

// ownTools are the tools Countersign serves itself in mode under cfg: the
// demo tools (demo_tools; on by default in dev) and, with --conformance,
// the conformance fixtures (fixtures, nil without). ledger backs the demo
// tools; with nil they only name them, for checks (config check).
func ownTools(cfg *Config, mode Mode, ledger *gateway.Ledger) (tools []gateway.Tool, fixtures *conformance.Set) {
	if cfg.File.DemoToolsOr(mode == ModeDev) {
		tools = gateway.DemoTools(ledger)
	}
	if cfg.Conformance {
		fixtures = conformance.New()
		tools = append(tools, fixtures.Tools()...)
	}
	return tools, fixtures
}

// checkNamespaces refuses, at startup (and in config check, Config.Check), a configuration under which an
// upstream's tool could take the name of one of Countersign's own tools
// (the demo tools, the conformance fixtures). Served names cannot collide
// otherwise: an upstream tool is <prefix>__<tool>, a prefix is a-z, 0-9 and
// - (internal/config), so a name's first "__" ends its prefix, and
// internal/config refuses two upstreams with one prefix. What is left is
// an own tool named <prefix>__…, which this refuses. (The registry still
// leaves out, and logs, any tool whose name is taken; a name an upstream
// lists twice is left out, every time, by gateway/upstream.)
func checkNamespaces(file string, own []gateway.Tool, ups []config.Upstream) error {
	var errs []error
	for i, u := range ups {
		for _, t := range own {
			if strings.HasPrefix(t.Name, u.Prefix+config.ToolSeparator) {
				errs = append(errs, fmt.Errorf("%s:%d: upstreams[%d].prefix: %q would put upstream %s's tools beside Countersign's own tool %q (all %s%s* names are the upstream's); choose another prefix",
					file, u.Line, i, u.Prefix, u.Name, t.Name, u.Prefix, config.ToolSeparator))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("configuration file: %w", errors.Join(errs...))
	}
	return nil
}

// startUpstreams connects every configured upstream MCP server and serves
// its tools through the registry as they come and go. An upstream that is
// down does not stop Countersign: its tools are missing until it is up, and
// /readyz names it (and answers 503 only for a required one).
func (a *App) startUpstreams(ctx context.Context, ups []config.Upstream) {
	for _, cu := range ups {
		name := cu.Name
		log := a.log.With("upstream", name)
		opts := upstreamOptions(cu, a.log) // the upstream adds upstream=<name>
		opts.Telemetry = a.tel
		opts.OnChange = func(tools []upstream.Tool) {
			out := served(tools, cu.Approval)
			if err := a.Tools.Replace(name, out); err != nil {
				log.Error("app: upstream tools left out", "err", err)
			}
			log.Info("app: upstream tools", "tools", len(out))
		}
		u := upstream.Start(context.WithoutCancel(ctx), opts)
		a.upstreams = append(a.upstreams, namedUpstream{name: name, required: cu.Required, u: u})
	}
	started := a.upstreams
	if err := a.tel.M().WatchUpstreams(func() map[string]bool {
		out := make(map[string]bool, len(started))
		for _, n := range started {
			out[n.name] = n.u.State().Up
		}
		return out
	}); err != nil {
		a.log.Error("app: upstream state metric", "err", err)
	}
}

// awaitUpstreams waits, up to limit, until every upstream has connected or
// failed once. A worker that started before its upstreams' tools are known
// would deny a pending approval's call as an unknown tool (policy fails
// closed); a short wait at startup spares that after a restart.
func (a *App) awaitUpstreams(ctx context.Context, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		served := map[string]int{}
		for _, t := range a.Tools.List() {
			if t.Upstream != "" {
				served[t.Upstream]++
			}
		}
		settled := true
		for name, st := range a.UpstreamStates() {
			// Up is set a moment before the tools reach the registry.
			if (!st.Up && st.Err == "") || (st.Up && st.Tools > 0 && served[name] == 0) {
				settled = false
			}
		}
		if settled {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	a.log.Warn("app: starting before every upstream answered", "waited", limit)
}

// upstreamOptions are the connection settings of a configured upstream.
func upstreamOptions(cu config.Upstream, log *slog.Logger) upstream.Options {
	return upstream.Options{Name: cu.Name, Prefix: cu.Prefix, Command: cu.Command, Env: cu.Env,
		URL: cu.URL, Headers: cu.Headers, Timeout: cu.Timeout, Logger: log}
}

// served is an upstream's tools as Countersign serves them: with the
// upstream's configured approval override for policy ("" lets policy decide).
func served(tools []upstream.Tool, approval config.Approval) []gateway.Tool {
	override := string(approval)
	if approval == config.ApprovalPolicy {
		override = ""
	}
	out := make([]gateway.Tool, 0, len(tools))
	for _, t := range tools {
		gt := t.Tool
		gt.Approval = override
		out = append(out, gt)
	}
	return out
}

type namedUpstream struct {
	name     string
	required bool // its being down fails readiness (config.Upstream.Required)
	u        *upstream.Upstream
}

// closeUpstreams stops every upstream (and its process).
func (a *App) closeUpstreams() {
	for _, n := range a.upstreams {
		if err := n.u.Close(); err != nil {
			a.log.Warn("app: close upstream", "upstream", n.name, "err", err)
		}
	}
	a.upstreams = nil
}

// UpstreamStates reports each upstream's state, by name.
func (a *App) UpstreamStates() map[string]upstream.State {
	out := make(map[string]upstream.State, len(a.upstreams))
	for _, n := range a.upstreams {
		out[n.name] = n.u.State()
	}
	return out
}

// readyz answers 200 when NATS is connected, the Temporal frontend answers
// and every required upstream is up, else 503; and 503 ("shutting down")
// from the moment the process begins to stop (Run). Its body has a line for each
// thing that is down, an upstream that is not required included: one
// flaky upstream must not take every replica out of the Service, and with
// them every other tool and the approver site.
func (a *App) readyz(w http.ResponseWriter, r *http.Request) {
	var down []string
	if a.stopping.Load() {
		down = append(down, "shutting down")
	}
	if !a.natsConnected() {
		down = append(down, "nats: not connected")
	}
	if why := a.temporalDown(r.Context()); why != "" {
		down = append(down, why)
	}
	ups := make([]upstreamReadiness, 0, len(a.upstreams))
	for _, n := range a.upstreams {
		ups = append(ups, upstreamReadiness{name: n.name, required: n.required, state: n.u.State()})
	}
	ready, lines := readiness(down, ups)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	if len(lines) == 0 {
		lines = []string{"ok"}
	}
	fmt.Fprintln(w, strings.Join(lines, "\n"))
}

// upstreamReadiness is an upstream's part in readiness.
type upstreamReadiness struct {
	name     string
	required bool
	state    upstream.State
}

// readiness decides /readyz from what is down among the process's own
// dependencies (down, each failing readiness) and the upstreams' states:
// ready unless something in down or a required upstream is down. lines
// names everything that is down, upstreams by name.
func readiness(down []string, ups []upstreamReadiness) (ready bool, lines []string) {
	ready = len(down) == 0
	lines = slices.Clone(down)
	ups = slices.Clone(ups)
	slices.SortFunc(ups, func(x, y upstreamReadiness) int { return strings.Compare(x.name, y.name) })
	for _, u := range ups {
		if u.state.Up {
			continue
		}
		lines = append(lines, fmt.Sprintf("upstream %s: down (%s)", u.name, oneLine(u.state.Err, maxReadyzErr)))
		if u.required {
			ready = false
		}
	}
	return ready, lines
}

// The longest error, in characters, that a line of /readyz's body and
// upstreams list show. The list's is long enough for an error's advice,
// which comes last (a refused redirect's "configure the URL it points to").
const (
	maxReadyzErr = 200
	maxListErr   = 1000
)

// oneLine is the error s on one line, cut after n characters.
func oneLine(s string, n int) string {
	if s == "" {
		return "not connected yet"
	}
	return cutText(strings.Join(strings.Fields(s), " "), n)
}

// printable is s with its control characters (a terminal's escape
// sequences among them) made spaces.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}

// cutText cuts s after n characters, marking the cut with "…".
func cutText(s string, n int) string {
	i, count := 0, 0
	for i = range s {
		if count == n {
			return s[:i] + "…"
		}
		count++
	}
	return s
}

// ListUpstreams is `countersign upstreams list`: it connects to every
// upstream of cfg's configuration file at once (waiting up to wait for
// them), and writes, in the file's order, each one's state and tools, with
// the decision the policy gives each tool for empty arguments. The policy
// is the one New would load: cfg.PolicyDir, with cfg.File applied (the
// caller's, or ConfigFile loaded here as Resolve does), else the embedded
// default. When an upstream is down, it returns an error saying how many
// are, after writing everything.
func ListUpstreams(ctx context.Context, cfg Config, wait time.Duration, w io.Writer) error {
	if err := cfg.loadFile(); err != nil {
		return err
	}
	ups := cfg.File.Upstreams
	if len(ups) == 0 {
		fmt.Fprintln(w, "No upstreams configured.")
		return nil
	}
	engine, err := pdp.New(ctx, pdp.Options{Dir: cfg.PolicyDir})
	if err != nil {
		return fmt.Errorf("policy: %w", err)
	}
	checks := make([]upstreamCheck, len(ups))
	var wg sync.WaitGroup
	for i, cu := range ups {
		wg.Go(func() { checks[i] = checkUpstream(ctx, cu, wait) })
	}
	wg.Wait()
	down := 0
	for i, cu := range ups {
		c := checks[i]
		where := cu.URL
		if cu.Stdio() {
			where = strings.Join(cu.Command, " ")
		}
		state := "up"
		if c.down() {
			state = "down: " + oneLine(c.state.Err, maxListErr)
			down++
		}
		fmt.Fprintf(w, "%s  (%s)  approval: %s  %s\n", cu.Name, where, cu.Approval, state)
		if c.down() {
			for _, line := range c.stderr {
				fmt.Fprintf(w, "  stderr: %s\n", line)
			}
		}
		for _, gt := range served(c.tools, cu.Approval) {
			fmt.Fprintf(w, "  %-40s %s\n", gt.Name, decisionFor(ctx, engine, gt))
		}
		for _, r := range c.refused {
			fmt.Fprintf(w, "  refused: %s\n", r)
		}
	}
	if down > 0 {
		return fmt.Errorf("upstreams list: %d of %d upstreams down", down, len(ups))
	}
	return nil
}

// upstreamCheck is what upstreams list found of an upstream.
type upstreamCheck struct {
	state  upstream.State
	tools  []upstream.Tool
	stderr []string // the last lines its process wrote to stderr (stderrTail)
	// refused are the tools it lists that are not served, each with why
	// (stderrTail).
	refused []string
}

func (c upstreamCheck) down() bool { return !c.state.Up && len(c.tools) == 0 }

// checkUpstream connects to cu and waits up to wait for its tools.
func checkUpstream(ctx context.Context, cu config.Upstream, wait time.Duration) upstreamCheck {
	got := make(chan []upstream.Tool, 1)
	tail := &stderrTail{}
	opts := upstreamOptions(cu, slog.New(tail))
	opts.OnChange = func(tools []upstream.Tool) {
		if len(tools) == 0 {
			return
		}
		select {
		case got <- tools:
		default:
		}
	}
	u := upstream.Start(ctx, opts)
	var c upstreamCheck
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case c.tools = <-got:
	case <-t.C:
	case <-ctx.Done():
	}
	c.state = u.State()
	_ = u.Close() // after which the process's stderr is all logged
	c.stderr = tail.lines()
	c.refused = tail.refusals()
	return c
}

// Bounds of the stderr lines upstreams list shows under a stdio upstream
// that is down.
const (
	maxStderrTail     = 5   // lines
	maxStderrTailLine = 300 // characters of a line
)

// stderrTail is a log handler for one upstream that keeps the last lines
// its process wrote to stderr, which gateway/upstream logs one record
// "upstream stderr" each, the line in "line". An upstream retries a failed
// connection with a new process, so the lines kept are those of the last
// attempt that wrote any (each attempt ends in a record "upstream
// unavailable" or "upstream session ended", once its stderr is logged):
// a process that fails the same way every time is shown once. It also
// keeps the tools refused (a record "upstream tool refused" each), by name.
type stderrTail struct {
	mu        sync.Mutex
	cur, last []string // of the attempt under way, of the last one that wrote any
	refused   map[string]string
}

func (t *stderrTail) Enabled(context.Context, slog.Level) bool { return true }
func (t *stderrTail) WithAttrs([]slog.Attr) slog.Handler       { return t }
func (t *stderrTail) WithGroup(string) slog.Handler            { return t }

func (t *stderrTail) Handle(_ context.Context, r slog.Record) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch r.Message {
	case "upstream stderr":
		r.Attrs(func(a slog.Attr) bool {
			if a.Key != "line" {
				return true
			}
			t.cur = append(t.cur, cutText(printable(a.Value.String()), maxStderrTailLine))
			if len(t.cur) > maxStderrTail {
				t.cur = t.cur[len(t.cur)-maxStderrTail:]
			}
			return false
		})
	case "upstream tool refused":
		var tool, why string
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "tool":
				tool = a.Value.String()
			case "error":
				why = a.Value.String()
			}
			return true
		})
		if t.refused == nil {
			t.refused = map[string]string{}
		}
		t.refused[tool] = cutText(printable(fmt.Sprintf("%q: %s", tool, why)), maxStderrTailLine)
	case "upstream unavailable", "upstream session ended":
		if len(t.cur) > 0 {
			t.last, t.cur = t.cur, nil
		}
	}
	return nil
}

// lines are the lines of the last attempt that ended having written any,
// else those of the attempt under way.
func (t *stderrTail) lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.last) > 0 {
		return slices.Clone(t.last)
	}
	return slices.Clone(t.cur)
}

// refusals are the refused tools with why, in name order.
func (t *stderrTail) refusals() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for _, tool := range slices.Sorted(maps.Keys(t.refused)) {
		out = append(out, t.refused[tool])
	}
	return out
}

// decisionFor is the policy decision on a call of t with empty arguments.
func decisionFor(ctx context.Context, engine *pdp.Engine, t gateway.Tool) string {
	args := json.RawMessage(`{}`)
	hash, err := canon.Hash(t.Name, args, "countersign-upstreams-list")
	if err != nil {
		return "error: " + err.Error()
	}
	d, err := engine.Evaluate(ctx, pdp.Input{
		Subject:  pdp.Entity{Type: "agent", ID: "(any)"},
		Action:   pdp.Action{Name: "tools/call"},
		Resource: t.PolicyResource(),
		Context:  pdp.Context{Arguments: args, ActionHash: hash.String(), Time: time.Now()},
	})
	if err != nil {
		return "error: " + err.Error()
	}
	if d.Effect == pdp.EffectRequestable {
		return fmt.Sprintf("requestable (%s, quorum %d): %s", d.ApproverGroup, d.Quorum, d.Reason)
	}
	return fmt.Sprintf("%s: %s", d.Effect, d.Reason)
}
