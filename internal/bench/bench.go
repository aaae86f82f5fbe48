package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.temporal.io/sdk/client"
)

// Schema names the report's JSON format; it changes when a field changes
// meaning.
const Schema = "countersign-bench/1"

// Scenario names.
const (
	ScenarioBaseline          = "baseline"
	ScenarioGatedCall         = "gated-call"
	ScenarioTasksGetPending   = "tasks-get-pending"
	ScenarioTasksGetCompleted = "tasks-get-completed"
	ScenarioApproval          = "approval"
	ScenarioAwait             = "await"
	ScenarioGateway           = "gateway"
	ScenarioSEP2672           = "sep2672"
	ScenarioFlood             = "flood"
)

// DefaultScenarios run when Options.Scenarios is empty, in this order (the
// baseline first when there is one).
var DefaultScenarios = []string{ScenarioGatedCall, ScenarioTasksGetPending, ScenarioTasksGetCompleted,
	ScenarioApproval, ScenarioAwait, ScenarioGateway, ScenarioSEP2672}

// AllScenarios are every scenario Run knows.
var AllScenarios = append(slices.Clone(DefaultScenarios), ScenarioFlood)

// Options say what to measure and where. Server and AgentToken are
// required; AdminToken for approval, await, tasks-get-completed and flood.
type Options struct {
	// Server is the Countersign base URL (http://host:port).
	Server     string
	AgentToken string
	AdminToken string
	// Scenarios to run (DefaultScenarios when empty).
	Scenarios []string
	// Concurrency levels, each run in turn (1 and 8 when empty).
	Concurrency []int
	// Each phase (scenario × concurrency) runs Requests operations when
	// Requests > 0, else for Duration (10s when both are zero).
	Requests int
	Duration time.Duration
	// Warmup operations before each phase, not counted.
	Warmup int
	// ApproverGroup is the group the policy asks to approve transfer_funds
	// ("approvers" in the default policy).
	ApproverGroup string
	// VerifiedOrigin is the origin of the MCP client page the SEP-2672
	// ceremony claims; the server must accept it (--verified-origins).
	VerifiedOrigin string
	// Upstream is an MCP server (Streamable HTTP) that the server gates:
	// the gateway scenario calls UpstreamTool on it directly, and
	// GatewayTool (its name through Countersign) through the server, with
	// UpstreamArgs. Without an Upstream the gateway scenario is skipped.
	Upstream     string
	UpstreamTool string
	GatewayTool  string
	UpstreamArgs map[string]any
	// Temporal, when set, runs the baseline against it, on TaskQueue
	// (a fresh one per run when empty).
	Temporal  client.Client
	TaskQueue string
	// FloodWorkers are agent A's concurrent callers in the flood scenario
	// (32 when 0); FloodInterval is the pause between agent B's calls
	// (20ms when 0).
	FloodWorkers  int
	FloodInterval time.Duration
	// Progress, when set, receives a progress line rewritten in place.
	Progress io.Writer
	// HTTP is the client for every request (one with enough idle
	// connections per host when nil).
	HTTP *http.Client
	// Note is copied into the report (the machine's load, the build).
	Note string
	// ProfileDir, when set, receives a CPU profile of this process for
	// each measured phase, SCENARIO-cN.pprof (with --dev the process is
	// the server, its embedded Temporal and NATS, and the bench's client).
	ProfileDir string
}

// Report is a run's result, the JSON of --json.
type Report struct {
	Schema     string    `json:"schema"`
	RunID      string    `json:"runId"`
	StartedAt  time.Time `json:"startedAt"`
	FinishedAt time.Time `json:"finishedAt"`
	Machine    Machine   `json:"machine"`
	Server     string    `json:"server"`
	Note       string    `json:"note,omitempty"`
	Settings   Settings  `json:"settings"`
	Results    []Result  `json:"results"`
	Skipped    []Skip    `json:"skipped,omitempty"`
	// Targets are issue 14's targets judged on Results (see Targets).
	Targets []Target `json:"targets,omitempty"`
	// CleanupErrors are the tasks the run could not cancel, and the agents
	// and approvers it added and could not revoke at its end (cancel and
	// revoke them with the admin CLI).
	CleanupErrors []string `json:"cleanupErrors,omitempty"`
}

// Machine describes where the bench ran (the client side).
type Machine struct {
	Cores     int    `json:"cores"`
	CPU       string `json:"cpu,omitempty"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
	GoVersion string `json:"goVersion"`
	LoadAvg   string `json:"loadAvg,omitempty"`
}

// Settings are the options that shape the numbers.
type Settings struct {
	Scenarios   []string `json:"scenarios"`
	Concurrency []int    `json:"concurrency"`
	Requests    int      `json:"requests,omitempty"`
	Duration    string   `json:"duration,omitempty"`
	Warmup      int      `json:"warmup"`
	Baseline    bool     `json:"baseline"`
}

// Result is one series of one scenario at one concurrency.
type Result struct {
	Scenario    string `json:"scenario"`
	Series      string `json:"series"`
	Concurrency int    `json:"concurrency"`
	// Count is the successful operations measured; Errors the failed ones,
	// by kind (rate-limited, HTTP status, JSON-RPC code, transport).
	Count      int            `json:"count"`
	Errors     int            `json:"errors"`
	ErrorKinds map[string]int `json:"errorKinds,omitempty"`
	Seconds    float64        `json:"seconds"`
	// Throughput is Count / Seconds: operations a second at this
	// concurrency (for a series timed inside a larger operation, the
	// larger operation's rate).
	Throughput float64 `json:"throughput"`
	LatencyMs  Latency `json:"latencyMs"`
	// QuantilesMs are the latencies at 0, 1, …, 100 percent (the plot's
	// distribution); empty when Count is 0.
	QuantilesMs []float64 `json:"quantilesMs,omitempty"`
}

// Latency summarizes a series, in milliseconds.
type Latency struct {
	P50  float64 `json:"p50"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
	Mean float64 `json:"mean"`
	Min  float64 `json:"min"`
	Max  float64 `json:"max"`
}

// Skip is a scenario that did not run, and why.
type Skip struct {
	Scenario string `json:"scenario"`
	Reason   string `json:"reason"`
}

// Run runs the scenarios against the server and returns the report. A
// scenario that cannot run here (no upstream for gateway) is reported in
// Skipped; one that fails to set up ends the run with an error.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	b := &bencher{o: o, runID: newRunID(), c: newClient(o)}
	rep := &Report{
		Schema: Schema, RunID: b.runID, StartedAt: time.Now().UTC(), Machine: machine(), Server: o.Server, Note: o.Note,
		Settings: Settings{Scenarios: o.Scenarios, Concurrency: o.Concurrency, Requests: o.Requests, Warmup: o.Warmup, Baseline: o.Temporal != nil},
	}
	if o.Requests == 0 {
		rep.Settings.Duration = o.Duration.String()
	}
	b.rep = rep
	defer b.cleanup()
	if o.AgentToken == "" {
		// The run's own agent, revoked at the end.
		name := "bench-" + b.runID
		tok, err := b.c.addAgent(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("bench: no agent token, and %w", err)
		}
		b.o.AgentToken, b.c.agent = tok, tok
		b.onCleanup(func() { b.revoke("agents", name) })
	}
	if err := b.c.check(ctx, b.tools()); err != nil {
		return nil, err
	}
	defer b.finish() // before the cleanup: a revoked agent cannot cancel
	if o.Temporal != nil {
		stop, err := b.startBaseline()
		if err != nil {
			return nil, err
		}
		defer stop()
		// Without gated calls to interleave with, the baseline runs first.
		if !slices.Contains(b.o.Scenarios, ScenarioGatedCall) {
			for _, conc := range b.o.Concurrency {
				if err := b.baseline(ctx, conc); err != nil {
					return nil, err
				}
			}
		}
	}
	for _, s := range o.Scenarios {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		run := b.scenario(s)
		if err := run(ctx); err != nil {
			var sk skipError
			if errors.As(err, &sk) {
				rep.Skipped = append(rep.Skipped, Skip{Scenario: s, Reason: sk.reason})
				continue
			}
			return nil, fmt.Errorf("%s: %w", s, err)
		}
	}
	if b.o.Progress != nil {
		fmt.Fprint(b.o.Progress, "\r\033[K")
	}
	rep.FinishedAt = time.Now().UTC()
	rep.Targets = Targets(rep)
	return rep, nil
}

func (o *Options) defaults() error {
	if o.Server == "" {
		return errors.New("bench: a server URL is required")
	}
	if o.AgentToken == "" && o.AdminToken == "" {
		return errors.New("bench: an agent token is required (or the admin token, to add an agent for the run)")
	}
	o.Server = strings.TrimRight(o.Server, "/")
	if len(o.Scenarios) == 0 {
		o.Scenarios = slices.Clone(DefaultScenarios)
	}
	for _, s := range o.Scenarios {
		if !slices.Contains(AllScenarios, s) {
			return fmt.Errorf("bench: unknown scenario %q (known: %s)", s, strings.Join(AllScenarios, ", "))
		}
		if s != ScenarioGatedCall && s != ScenarioTasksGetPending && s != ScenarioGateway && s != ScenarioSEP2672 && o.AdminToken == "" {
			return fmt.Errorf("bench: scenario %s needs the admin token (it adds approvers or agents)", s)
		}
	}
	if len(o.Concurrency) == 0 {
		o.Concurrency = []int{1, 8}
	}
	for _, c := range o.Concurrency {
		if c < 1 || c > 1024 {
			return fmt.Errorf("bench: concurrency %d out of range 1-1024", c)
		}
	}
	if o.Requests < 0 || o.Duration < 0 || o.Warmup < 0 {
		return errors.New("bench: requests, duration and warmup must not be negative")
	}
	if o.Requests == 0 && o.Duration == 0 {
		o.Duration = 10 * time.Second
	}
	if o.ApproverGroup == "" {
		o.ApproverGroup = "approvers"
	}
	if o.VerifiedOrigin == "" {
		o.VerifiedOrigin = "http://localhost:5173"
	}
	if o.FloodWorkers <= 0 {
		o.FloodWorkers = 32
	}
	if o.FloodInterval <= 0 {
		o.FloodInterval = 20 * time.Millisecond
	}
	if o.UpstreamArgs == nil {
		o.UpstreamArgs = map[string]any{"message": "bench"}
	}
	return nil
}

func newRunID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func machine() Machine {
	m := Machine{Cores: runtime.NumCPU(), OS: runtime.GOOS, Arch: runtime.GOARCH, GoVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for l := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			m.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	return m
}

// bencher is one run.
type bencher struct {
	o     Options
	runID string
	c     *benchClient
	rep   *Report
	// seq numbers the run's calls, so that no two are identical
	// (identical pending calls join one task).
	seq atomic.Int64

	mu       sync.Mutex
	cleanups []func()
	// approvers enrolled for approval and await (one per worker).
	approvers []*approver
	// completed are tasks the run saw approved-executed.
	completed []string
	// leftover are tasks to cancel, waiting the baseline's workflows to
	// terminate, at the end of the run (finish).
	leftover []leftover
	waiting  []string
	// queue is the baseline's task queue.
	queue string
}

type skipError struct{ reason string }

func (e skipError) Error() string { return e.reason }

func (b *bencher) scenario(name string) func(context.Context) error {
	switch name {
	case ScenarioGatedCall:
		return b.gatedCall
	case ScenarioTasksGetPending:
		return b.tasksGetPending
	case ScenarioTasksGetCompleted:
		return b.tasksGetCompleted
	case ScenarioApproval:
		return b.approval
	case ScenarioAwait:
		return b.await
	case ScenarioGateway:
		return b.gateway
	case ScenarioSEP2672:
		return b.sep2672
	case ScenarioFlood:
		return b.flood
	}
	return func(context.Context) error { return fmt.Errorf("unknown scenario %q", name) }
}

// tools are the tools the run's scenarios call.
func (b *bencher) tools() []string {
	var out []string
	add := func(t string) {
		if t != "" && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	for _, s := range b.o.Scenarios {
		switch s {
		case ScenarioSEP2672:
			add("place_trade")
		case ScenarioGateway:
			if b.o.Upstream != "" {
				add(b.o.GatewayTool)
			}
		case ScenarioAwait:
			add("transfer_funds")
			add("countersign_await")
		default:
			add("transfer_funds")
		}
	}
	return out
}

// revoke revokes an agent or approver the run added; a failure is noted in
// the report, not fatal (the run's numbers stand).
func (b *bencher) revoke(kind, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.c.revoke(ctx, kind, name); err != nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.rep.CleanupErrors = append(b.rep.CleanupErrors, fmt.Sprintf("revoke %s %s: %v", kind, name, err))
	}
}

func (b *bencher) onCleanup(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cleanups = append(b.cleanups, f)
}

func (b *bencher) cleanup() {
	b.mu.Lock()
	fs := b.cleanups
	b.cleanups = nil
	b.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// --- the measuring loop --------------------------------------------------

// phase collects one scenario's series at one concurrency.
type phase struct {
	scenario    string
	concurrency int
	mu          sync.Mutex
	samples     map[string][]time.Duration
	errors      map[string]map[string]int
	order       []string
	lastErr     error
}

func newPhase(scenario string, conc int, series ...string) *phase {
	p := &phase{scenario: scenario, concurrency: conc, samples: map[string][]time.Duration{}, errors: map[string]map[string]int{}}
	for _, s := range series {
		p.add(s)
	}
	return p
}

func (p *phase) add(series string) {
	if _, ok := p.samples[series]; !ok {
		p.samples[series] = nil
		p.errors[series] = map[string]int{}
		p.order = append(p.order, series)
	}
}

// observe records one successful operation of series.
func (p *phase) observe(series string, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.add(series)
	p.samples[series] = append(p.samples[series], d)
}

// fail records one failed operation of series.
func (p *phase) fail(series string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.add(series)
	p.errors[series][errorKind(err)]++
	p.lastErr = err
}

func (p *phase) results(elapsed time.Duration) []Result {
	var out []Result
	for _, s := range p.order {
		out = append(out, p.result(s, elapsed))
	}
	return out
}

// result summarizes series over elapsed.
func (p *phase) result(series string, elapsed time.Duration) Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := summarize(p.scenario, series, p.concurrency, p.samples[series], elapsed)
	for k, v := range p.errors[series] {
		if r.ErrorKinds == nil {
			r.ErrorKinds = map[string]int{}
		}
		r.ErrorKinds[k] = v
		r.Errors += v
	}
	return r
}

func summarize(scenario, series string, conc int, d []time.Duration, elapsed time.Duration) Result {
	r := Result{Scenario: scenario, Series: series, Concurrency: conc, Count: len(d), Seconds: round3(elapsed.Seconds())}
	if len(d) == 0 {
		return r
	}
	s := slices.Clone(d)
	slices.Sort(s)
	var sum time.Duration
	for _, v := range s {
		sum += v
	}
	r.Throughput = round3(float64(len(s)) / elapsed.Seconds())
	r.LatencyMs = Latency{
		P50: ms(quantile(s, 0.50)), P95: ms(quantile(s, 0.95)), P99: ms(quantile(s, 0.99)),
		Mean: ms(sum / time.Duration(len(s))), Min: ms(s[0]), Max: ms(s[len(s)-1]),
	}
	r.QuantilesMs = make([]float64, 101)
	for i := range r.QuantilesMs {
		r.QuantilesMs[i] = ms(quantile(s, float64(i)/100))
	}
	return r
}

// quantile is the nearest-rank quantile of sorted s.
func quantile(s []time.Duration, q float64) time.Duration {
	i := int(float64(len(s))*q+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func ms(d time.Duration) float64 { return round3(float64(d) / float64(time.Millisecond)) }

func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

// op is one operation of a worker (0 ≤ worker < concurrency); it records
// its own series on p, and returns an error only when the run must stop.
type op func(ctx context.Context, p *phase, worker int) error

// measure runs op at concurrency conc for the configured requests or
// duration, after the warm-up, and appends the phase's results to the
// report.
func (b *bencher) measure(ctx context.Context, scenario string, conc int, o op, series ...string) error {
	warm := newPhase(scenario, conc)
	for range b.o.Warmup {
		if err := o(ctx, warm, 0); err != nil {
			return err
		}
	}
	p := newPhase(scenario, conc, series...)
	var (
		next    atomic.Int64
		done    atomic.Int64
		stopErr error
		errOnce sync.Once
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var deadline time.Time
	if b.o.Requests == 0 {
		deadline = time.Now().Add(b.o.Duration)
	}
	more := func() bool {
		if ctx.Err() != nil {
			return false
		}
		if b.o.Requests > 0 {
			return next.Add(1) <= int64(b.o.Requests)
		}
		return time.Now().Before(deadline)
	}
	stopProfile, err := b.profile(scenario, conc)
	if err != nil {
		return err
	}
	stopProgress := b.progress(scenario, conc, &done, deadline)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range conc {
		wg.Go(func() {
			for more() {
				if err := o(ctx, p, w); err != nil {
					errOnce.Do(func() { stopErr = err; cancel() })
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	stopProgress()
	stopProfile()
	if stopErr != nil && !errors.Is(stopErr, context.Canceled) {
		return stopErr
	}
	rs := p.results(elapsed)
	b.rep.Results = append(b.rep.Results, rs...)
	ok, failed := 0, map[string]int{}
	for _, r := range rs {
		ok += r.Count
		for k, v := range r.ErrorKinds {
			failed[k] += v
		}
	}
	if ok == 0 && len(failed) > 0 {
		return fmt.Errorf("every operation failed at concurrency %d: %v (last: %v)", conc, failed, p.lastErr)
	}
	return nil
}

// profile starts a CPU profile of the phase, when asked.
func (b *bencher) profile(scenario string, conc int) (stop func(), err error) {
	if b.o.ProfileDir == "" {
		return func() {}, nil
	}
	f, err := os.Create(filepath.Join(b.o.ProfileDir, fmt.Sprintf("%s-c%d.pprof", scenario, conc)))
	if err != nil {
		return nil, fmt.Errorf("bench: CPU profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("bench: CPU profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// progress draws a progress line every 200ms until stopped.
func (b *bencher) progress(scenario string, conc int, done *atomic.Int64, deadline time.Time) func() {
	if b.o.Progress == nil {
		return func() {}
	}
	stop := make(chan struct{})
	finished := make(chan struct{})
	start := time.Now()
	draw := func() {
		var frac float64
		if b.o.Requests > 0 {
			frac = float64(done.Load()) / float64(b.o.Requests)
		} else {
			frac = float64(time.Since(start)) / float64(deadline.Sub(start))
		}
		frac = min(max(frac, 0), 1)
		const width = 30
		n := int(frac * width)
		fmt.Fprintf(b.o.Progress, "\r\033[K%-20s c=%-3d [%s%s] %3.0f%% %6d ops %5.1fs",
			scenario, conc, strings.Repeat("#", n), strings.Repeat("-", width-n), frac*100, done.Load(), time.Since(start).Seconds())
	}
	go func() {
		defer close(finished)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				draw()
				return
			case <-t.C:
				draw()
			}
		}
	}()
	return func() { close(stop); <-finished }
}

// timed runs f, records its duration under series when it succeeds and its
// error otherwise, and returns the error.
func timed(p *phase, series string, f func() error) error {
	t0 := time.Now()
	if err := f(); err != nil {
		p.fail(series, err)
		return err
	}
	p.observe(series, time.Since(t0))
	return nil
}
