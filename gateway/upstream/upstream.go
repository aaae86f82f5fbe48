// Package upstream connects Countersign to upstream MCP servers and exposes
// their tools as gateway tools.
//
// An [Upstream] is one connection, over stdio (a child process) or Streamable
// HTTP, kept up by a supervisor goroutine: it connects, lists the tools,
// reports them through [Options.OnChange], re-lists on
// notifications/tools/list_changed (at most once a second, however many
// arrive), and reconnects with exponential backoff when the session ends. [Start] never fails because the upstream is down.
//
// # A stdio upstream's processes
//
// A stdio upstream's command runs as the leader of a process group of its
// own (on Unix), so that a wrapper (npx, uv run, sh -c) and whatever it
// starts end together. When the command exits, for whatever reason, what
// is left of its group gets SIGTERM, then SIGKILL if anything is still
// there 2 seconds later. Closing the session (Close, a restart) first
// closes the command's stdin and waits up to 2 seconds for it to exit, then
// sends the group SIGTERM and waits up to 2 seconds more, then sends the
// group SIGKILL. A process that leaves the group (setsid, a daemon) is not
// reached; on other systems, only the command itself is signalled.
//
// The command's stderr is read as fast as it is written, so that the
// command never waits on it, and logged: a record "upstream stderr" per
// line, with upstream=<Name>, a line longer than 8 KiB cut there and
// marked " … [truncated]". An upstream logs at most 200 lines and 128 KiB
// at once, then 20 lines and 16 KiB a second, across its restarts; the
// lines past that are dropped, and counted in a record "upstream stderr
// dropped" (lines, bytes) 10 seconds after the first of them, or when
// the session ends if sooner.
//
// # What a tool's Run returns
//
//   - The upstream answered: its CallToolResult, converted but not altered
//     (content blocks, structuredContent, isError, _meta), nil error, except
//     that _meta loses the keys with which Countersign states its own
//     decisions (the two disposition keys, related-task,
//     model-immediate-response and every io.countersign/ key, such as the
//     audit receipt), which an upstream must not forge. Two
//     more exceptions, both with IsError set: a result larger than
//     [Options.MaxResultBytes] is replaced by a text block saying so, and a
//     JSON-RPC error answer becomes a text block
//     "upstream error <code>: <message>" (the call reached the upstream, which
//     is an execution error, not a refusal), itself under the same cap.
//   - The call was certainly not sent (the upstream stayed down, or its
//     session gone, until the call's deadline, or its next attempt to
//     reconnect comes after that deadline; the session lists the tool
//     with another input schema, or not at all, now or once it is back): an error
//     wrapping [ErrNotSent] (and, for another input schema, a
//     [*gateway.ToolChangedError] saying so). Nothing happened upstream. Whether the request
//     left is what the transport saw (an HTTP POST that reached the server,
//     a write to the child's stdin begun), never what the error says.
//   - Anything else (timeout, the process died or the connection broke while
//     the call was in flight, an HTTP answer other than 2xx or 404): a plain
//     error. The outcome is unknown. This includes a JSON-RPC error with code
//     -32003, -32004 or -32005, the codes the SDK gives its own errors
//     ("client/server is closing", "rejected by transport"): the code cannot
//     tell a tool's failure from the SDK's, and the SDK reports the first
//     two as the connection closing.
//
// One message from an upstream is read up to 16 MiB: a line of a stdio
// upstream's stdout, an SSE event, an HTTP response body that is not an
// SSE stream (which the SDK would otherwise read whole, however long). A
// larger one ends the session; a call it answered fails with a plain
// error, its outcome unknown. A tool list, all its pages together, is
// read up to 16 MiB too (and 100 pages): past that, the upstream is down.
//
// An HTTP upstream's redirects are not followed: the configured headers
// (credentials) and the calls go to the configured URL only. A redirect
// fails the request with an error naming the upstream and the redirect's
// target; for a call, the outcome is unknown (the upstream answered the
// POST, and a 303 would say it processed it).
//
// A call is never sent twice, yet it rides out an upstream that is
// reconnecting: it waits, before anything of it is sent, while there is no
// session, and after a send that certainly did not reach the upstream
// because the session is gone (an HTTP POST answered 404, the connection
// closed; the supervisor is asked to replace the session) or the upstream
// refused the connection (an HTTP POST that could not connect; tried again
// with backoff, or on a new session). The wait ends with the call's context
// or [Options.Timeout], whichever comes first: they bound the wait and the
// call together. A call that finds no session does not wait at all when the
// supervisor's next attempt to reconnect (after its backoff) starts after
// that deadline: no session can come in time. A session that ends is
// replaced whatever [Options.OnChange] is doing. The call is sent only if
// the session, as it lists its tools last (after a list_changed, or on a
// new session), lists the tool with the pin ([gateway.Tool.Pin]) the
// caller's tool has, so an approved call still runs only against the tool
// that was approved. Once bytes of the call may have
// left, nothing changes: the outcome is the call's, or unknown.
//
// The conversion of results goes through the SDK's typed CallToolResult: JSON
// numbers in structuredContent and _meta are decoded as float64 (integers
// above 2^53 lose precision) and a content block of a type the SDK does not
// know makes the call fail with a plain error.
package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/internal/telemetry"
)

// ErrNotSent is wrapped by errors of calls that certainly did not reach the
// upstream: the task can fail cleanly, nothing ran. It is [gateway.ErrNotSent].
var ErrNotSent = gateway.ErrNotSent

// Defaults for [Options].
const (
	DefaultTimeout        = 60 * time.Second
	DefaultListTimeout    = 10 * time.Second
	DefaultMaxResultBytes = 1 << 20
	// ProtocolVersion is the MCP version requested in initialize. It is the
	// latest stable, session-based version; the upstream may negotiate an
	// older one.
	ProtocolVersion = "2025-11-25"
)

// Reconnect backoff; variables so tests can shorten them.
var (
	backoffMin = 250 * time.Millisecond
	backoffMax = 30 * time.Second
	// A session that stayed up this long resets the backoff: its end is
	// followed by an immediate reconnect.
	stableAfter = 10 * time.Second
	// maxConnectWait bounds the longer waits of connections after one
	// timed out (see Options.ListTimeout).
	maxConnectWait = 2 * time.Minute
	// relistEvery is the least time between two listings of a session's
	// tools: a notifications/tools/list_changed that comes sooner is
	// answered then, once, however many came meanwhile.
	relistEvery = time.Second
	// maxListBytes bounds the tools of one listing, all pages together,
	// as encoded: each page is bounded by maxMessageBytes, but a hundred
	// of them would be held at once.
	maxListBytes = maxMessageBytes
	// terminateWait is how long a child gets to exit after its stdin is
	// closed, and again after SIGTERM, before its process group is killed;
	// and how long what is left of the group gets after SIGTERM once the
	// child has exited.
	terminateWait = 2 * time.Second
	// onChangeWait is how long Close waits for a call of Options.OnChange
	// under way before it returns without it.
	onChangeWait = 2 * time.Second
	// stderrReportEvery is how often the lines a stdio upstream's stderr
	// had over its budget are summarized (see stderrLimit).
	stderrReportEvery = 10 * time.Second
)

// inheritedEnv are the variables a stdio upstream takes from Countersign's
// environment: what a program needs to find other programs and run in the
// user's locale.
var inheritedEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SHELL", "TERM"}

// hideOnce makes the process non-dumpable (undumpable) before its first
// stdio upstream starts: the child runs as the same user, and the
// environment childEnv keeps from it would otherwise still be readable in
// /proc/PPID/environ.
var hideOnce sync.Once

// childEnv is a stdio upstream's environment: inheritedEnv, then env.
func childEnv(env map[string]string) []string {
	var out []string
	for _, k := range inheritedEnv {
		if _, set := env[k]; set {
			continue
		}
		if v, ok := os.LookupEnv(k); ok {
			out = append(out, k+"="+v)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// maxListPages bounds tools/list pagination.
const maxListPages = 100

// Options configures an upstream. Exactly one of Command and URL is set.
type Options struct {
	// Name identifies the upstream in logs, State and Describe texts.
	// Defaults to Prefix.
	Name string
	// Prefix namespaces the tools: an upstream tool "t" is exposed as
	// Prefix + "__" + "t". Defaults to Name.
	Prefix string

	// Command is the stdio server's argv. The child's environment is PATH,
	// HOME, USER, LOGNAME, LANG, LC_ALL, LC_CTYPE, TZ, TMPDIR, SHELL and
	// TERM, those of them set in Countersign's, then Env (which overrides
	// them): nothing else of Countersign's environment, which holds its own
	// secrets and those meant for other upstreams.
	Command []string
	Env     map[string]string

	// URL is the Streamable HTTP endpoint. Headers are set on every request
	// (not overriding the headers the MCP transport itself sets). Redirects
	// are not followed: the headers and the calls go to URL only.
	URL     string
	Headers map[string]string

	// Timeout bounds each tool call, including its wait for an upstream
	// that is reconnecting. Default [DefaultTimeout].
	Timeout time.Duration
	// ListTimeout bounds connecting (initialize) and listing the tools.
	// Default [DefaultListTimeout]. A connection that timed out gives the
	// next one twice as long, up to maxConnectWait, so that a server slower
	// to start (npx downloading it, a JVM) comes up.
	ListTimeout time.Duration
	// MaxResultBytes caps the encoded size of a result's content,
	// structuredContent and _meta. Default [DefaultMaxResultBytes].
	MaxResultBytes int

	Logger *slog.Logger
	// Telemetry times each tool call (by upstream name and result), traces
	// it, and sends its trace context to an HTTP upstream (traceparent);
	// nil records nothing.
	Telemetry *telemetry.Telemetry

	// OnChange receives the upstream's complete current tool list each time
	// it is (re)listed: after connecting, after reconnecting, after
	// notifications/tools/list_changed; and nil when the upstream goes down
	// (a session that ends and is re-established at once is not reported as
	// down). Calls are serialized and in order, from a goroutine that
	// does nothing else: a slow OnChange delays only the delivery of the
	// lists, never the replacement of a session that ended. Lists are not
	// queued behind a slow OnChange: of those that come while it runs, it
	// receives only the latest (each list is complete, so one that a newer
	// list replaced no longer matters), and the last list it receives is
	// the latest one. OnChange must not block for long and must not call
	// Close, which waits for a call under way up to 2 seconds, then
	// returns an error without it. OnChange is not called after Close; a
	// call Close stopped waiting for is the last, whenever it returns.
	OnChange func(tools []Tool)
}

// State is an upstream's connection state, for readiness checks and the CLI.
type State struct {
	Up bool
	// Err is the last connection or listing error, empty when up.
	Err string
	// Tools is how many tools are exposed (refused tools not counted).
	Tools int
	// Since is when Up last changed.
	Since time.Time
}

// Upstream is a supervised connection to one upstream MCP server.
type Upstream struct {
	opts   Options
	log    *slog.Logger
	client *mcp.Client
	hc     *http.Client // nil for stdio

	ctx       context.Context
	cancel    context.CancelFunc
	done      chan struct{} // the supervisor returned
	delivered chan struct{} // the goroutine calling OnChange returned

	stderr *stderrLimit // the budget of a stdio upstream's stderr

	relist chan struct{}           // list_changed received
	kick   chan *mcp.ClientSession // a call found this session gone

	// refusals are the tool refusals last logged, so that re-listing does
	// not log them again. Supervisor goroutine only.
	refusals map[string]bool

	mu      sync.Mutex
	sess    *mcp.ClientSession
	tools   map[string]Tool // sess's, by name upstream
	changed chan struct{}   // closed and replaced on every state change
	state   State
	// retryAt is when the supervisor's current or next attempt to connect
	// starts, when sess is nil: no attempt starts before it. Zero before
	// the first attempt.
	retryAt time.Time

	reported bool      // the list last queued for OnChange is not nil
	next     []Tool    // the list OnChange is to receive next, if queued
	queued   bool      // next holds a list OnChange has not received
	pending  chan bool // holds a value while queued (and a moment after)
}

// Start starts the supervisor and returns at once. The upstream runs until
// Close or until ctx is done. A configuration error (no or both of Command
// and URL) leaves it permanently down with the error in State.
func Start(ctx context.Context, opts Options) *Upstream {
	if opts.Name == "" {
		opts.Name = opts.Prefix
	}
	if opts.Prefix == "" {
		opts.Prefix = opts.Name
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.ListTimeout <= 0 {
		opts.ListTimeout = DefaultListTimeout
	}
	if opts.MaxResultBytes <= 0 {
		opts.MaxResultBytes = DefaultMaxResultBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	u := &Upstream{
		opts:      opts,
		log:       opts.Logger.With("upstream", opts.Name),
		done:      make(chan struct{}),
		delivered: make(chan struct{}),
		relist:    make(chan struct{}, 1),
		kick:      make(chan *mcp.ClientSession, 1),
		changed:   make(chan struct{}),
		pending:   make(chan bool, 1),
		state:     State{Since: time.Now()},
	}
	u.stderr = newStderrLimit(u.log, stderrReportEvery)
	u.ctx, u.cancel = context.WithCancel(ctx)
	u.client = mcp.NewClient(&mcp.Implementation{Name: "countersign", Version: "1"}, &mcp.ClientOptions{
		Logger: u.log,
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case u.relist <- struct{}{}:
			default:
			}
		},
		// Never let the SDK re-send a call on its own.
		MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
	})

	var cfgErr error
	switch {
	case len(opts.Command) > 0 && opts.URL != "":
		cfgErr = errors.New("both a command and a URL are configured")
	case len(opts.Command) == 0 && opts.URL == "":
		cfgErr = errors.New("neither a command nor a URL is configured")
	case opts.URL != "":
		base := http.DefaultTransport.(*http.Transport).Clone()
		u.hc = &http.Client{
			Transport:     &roundTripper{upstream: opts.Name, base: base, headers: opts.Headers, tel: opts.Telemetry},
			CheckRedirect: refuseRedirect(opts.Name),
		}
	}
	if cfgErr != nil {
		u.log.Error("upstream misconfigured", "error", cfgErr)
		u.state.Err = cfgErr.Error()
		close(u.done)
		close(u.delivered)
		return u
	}
	go u.supervise()
	go u.deliver()
	return u
}

// State returns the connection state.
func (u *Upstream) State() State {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.state
}

// Close stops the supervisor, ends the session (terminating a child process)
// and waits for both, and for a call of OnChange under way up to
// onChangeWait: past that, it returns an error saying so, and the call,
// when it returns, is the last. Calls in flight fail with a plain error.
func (u *Upstream) Close() error {
	u.cancel()
	<-u.done
	t := time.NewTimer(onChangeWait)
	defer t.Stop()
	select {
	case <-u.delivered:
		return nil
	case <-t.C:
		return fmt.Errorf("upstream %s: OnChange has not returned after %v; Close does not wait for it longer", u.opts.Name, onChangeWait)
	}
}

// current returns the session and the tools it lists, by upstream name;
// nil when there is none.
func (u *Upstream) current() (*mcp.ClientSession, map[string]Tool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.sess, u.tools
}

// byName maps tools by their name upstream.
func byName(tools []Tool) map[string]Tool {
	m := make(map[string]Tool, len(tools))
	for _, t := range tools {
		m[t.UpstreamTool] = t
	}
	return m
}

// setState updates the state under u.mu and wakes waiters.
func (u *Upstream) setState(f func()) {
	u.mu.Lock()
	defer u.mu.Unlock()
	wasUp := u.state.Up
	f()
	if u.state.Up != wasUp {
		u.state.Since = time.Now()
	}
	close(u.changed)
	u.changed = make(chan struct{})
}

// report queues tools for OnChange, in place of a list it has not received
// yet, and returns at once; tools == nil reports the upstream as down, once.
func (u *Upstream) report(tools []Tool) {
	if u.opts.OnChange == nil {
		return
	}
	u.mu.Lock()
	if tools == nil && !u.reported {
		u.mu.Unlock()
		return
	}
	u.reported = tools != nil
	u.next, u.queued = tools, true
	u.mu.Unlock()
	select {
	case u.pending <- true:
	default:
	}
}

// deliver gives OnChange the queued list, each time there is one, until
// u.ctx is done. It runs apart from the supervisor so that a slow OnChange
// never keeps the supervisor from noticing that its session ended, or from
// replacing it.
func (u *Upstream) deliver() {
	defer close(u.delivered)
	for {
		select {
		case <-u.ctx.Done():
			return
		case <-u.pending:
		}
		u.mu.Lock()
		tools, queued := u.next, u.queued
		u.next, u.queued = nil, false
		u.mu.Unlock()
		// Close may have begun while OnChange ran, and pending and
		// u.ctx.Done() were then both ready.
		if u.ctx.Err() != nil {
			return
		}
		if queued {
			u.opts.OnChange(tools)
		}
	}
}

func backoff(attempt int) time.Duration {
	if attempt <= 0 {
		return 0
	}
	d := backoffMin
	for i := 1; i < attempt && d < backoffMax; i++ {
		d *= 2
	}
	return min(d, backoffMax)
}

// supervise connects, serves and reconnects until u.ctx is done.
func (u *Upstream) supervise() {
	defer close(u.done)
	attempt := 0          // consecutive failures; 0 reconnects at once
	var retryAt time.Time // published as u.retryAt
	connectWait := u.opts.ListTimeout
	for {
		if attempt > 0 {
			u.report(nil)
		}
		if d := time.Until(retryAt); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-u.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		sess, flush, err := u.connect(connectWait)
		if errors.Is(err, context.DeadlineExceeded) {
			// A process killed for starting slowly starts as slowly again.
			connectWait = max(min(2*connectWait, maxConnectWait), u.opts.ListTimeout)
		}
		var tools []Tool
		if err == nil {
			tools, err = u.list(sess)
			if err != nil {
				sess.Close()
				flush()
				err = fmt.Errorf("listing tools: %w", err)
			}
		}
		if u.ctx.Err() != nil {
			if err == nil {
				sess.Close()
				flush()
			}
			return
		}
		if err != nil {
			attempt++
			retryAt = time.Now().Add(backoff(attempt))
			u.log.Warn("upstream unavailable", "error", err, "retry_in", backoff(attempt).String())
			u.setState(func() {
				u.state.Up = false
				u.state.Err = err.Error()
				u.state.Tools = 0
				u.retryAt = retryAt
			})
			u.report(nil)
			continue
		}

		upAt := time.Now()
		u.log.Info("upstream connected", "tools", len(tools))
		u.setState(func() {
			u.sess = sess
			u.tools = byName(tools)
			u.state.Up = true
			u.state.Err = ""
			u.state.Tools = len(tools)
		})
		u.report(tools)
		err = u.serve(sess)
		// A session the server forgot (HTTP 404), or that a call found
		// gone, is re-initialized at once, without reporting the tools as
		// gone.
		if errors.Is(err, errKicked) || errors.Is(err, mcp.ErrSessionMissing) || time.Since(upAt) >= stableAfter {
			attempt = 0
		} else {
			attempt++
		}
		retryAt = time.Now().Add(backoff(attempt))
		u.setState(func() {
			u.sess = nil
			u.tools = nil
			u.state.Up = false
			u.state.Err = err.Error()
			u.state.Tools = 0
			u.retryAt = retryAt
		})
		sess.Close()
		flush()
		if u.ctx.Err() != nil {
			return
		}
		u.log.Warn("upstream session ended", "error", err)
	}
}

var errKicked = errors.New("session lost (a call found it gone), re-initializing")

// serve blocks until the session ends, re-listing on list_changed, at most
// once per relistEvery: an upstream that sends list_changed without pause
// must not keep Countersign converting its tools and telling every agent.
func (u *Upstream) serve(sess *mcp.ClientSession) error {
	ended := make(chan error, 1)
	go func() { ended <- sess.Wait() }()
	listedAt := time.Now() // the supervisor has just listed the tools
	later := time.NewTimer(0)
	later.Stop()
	defer later.Stop()
	waiting := false // later is set for a list_changed that came early
	for {
		select {
		case <-u.ctx.Done():
			return u.ctx.Err()
		case err := <-ended:
			if err == nil {
				err = errors.New("connection closed")
			}
			return fmt.Errorf("session ended: %w", err)
		case s := <-u.kick:
			if s == sess {
				return errKicked
			}
			continue
		case <-u.relist:
			if waiting {
				continue
			}
			if d := time.Until(listedAt.Add(relistEvery)); d > 0 {
				later.Reset(d)
				waiting = true
				continue
			}
		case <-later.C:
			waiting = false
		}
		// A list_changed to answer now.
		tools, err := u.list(sess)
		if err != nil {
			return fmt.Errorf("re-listing tools after list_changed: %w", err)
		}
		listedAt = time.Now()
		u.log.Info("upstream tools changed", "tools", len(tools))
		u.setState(func() {
			u.tools = byName(tools)
			u.state.Tools = len(tools)
		})
		u.report(tools)
	}
}

// connect starts a session (and, for stdio, the process), waiting up to
// wait. flush writes out the child's last partial stderr line once the
// session is closed.
func (u *Upstream) connect(wait time.Duration) (*mcp.ClientSession, func(), error) {
	ctx, cancel := context.WithTimeout(u.ctx, wait)
	defer cancel()
	flush := func() {}
	var t mcp.Transport
	if u.hc != nil {
		t = &mcp.StreamableClientTransport{Endpoint: u.opts.URL, HTTPClient: u.hc}
	} else {
		hideOnce.Do(func() {
			if err := undumpable(); err != nil {
				u.log.Error("could not make the process non-dumpable; a stdio upstream can read its environment and memory", "error", err)
			}
		})
		cmd := exec.Command(u.opts.Command[0], u.opts.Command[1:]...)
		cmd.Env = childEnv(u.opts.Env)
		stderr := &lineLogger{lim: u.stderr}
		flush = stderr.flush
		t = stdioTransport{cmd: cmd, stderr: stderr, grace: terminateWait}
	}
	sess, err := u.client.Connect(ctx, t, &mcp.ClientSessionOptions{ProtocolVersion: ProtocolVersion})
	if err != nil {
		flush()
		return nil, nil, fmt.Errorf("connecting: %w", err)
	}
	return sess, flush, nil
}

// list fetches all tools, bounded by ListTimeout, maxListPages and
// maxListBytes, and converts them, refusing invalid ones.
func (u *Upstream) list(sess *mcp.ClientSession) ([]Tool, error) {
	ctx, cancel := context.WithTimeout(u.ctx, u.opts.ListTimeout)
	defer cancel()
	var all []*mcp.Tool
	size := 0
	params := &mcp.ListToolsParams{}
	for page := 0; ; page++ {
		if page == maxListPages {
			return nil, fmt.Errorf("more than %d pages of tools", maxListPages)
		}
		res, err := sess.ListTools(ctx, params)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(res.Tools)
		if err != nil {
			return nil, fmt.Errorf("page %d of tools: %w", page+1, err)
		}
		if size += len(b); size > maxListBytes {
			return nil, fmt.Errorf("the tools are more than %d bytes (at page %d)", maxListBytes, page+1)
		}
		all = append(all, res.Tools...)
		if res.NextCursor == "" {
			break
		}
		params = &mcp.ListToolsParams{Cursor: res.NextCursor}
	}
	return u.convert(all), nil
}

// kickSession asks the supervisor to replace sess, if it is still the
// current session.
func (u *Upstream) kickSession(sess *mcp.ClientSession) {
	if cur, _ := u.current(); cur != sess {
		return
	}
	// Replace any stale kick (for an earlier session) with this one.
	for {
		select {
		case u.kick <- sess:
			return
		default:
			select {
			case <-u.kick:
			default:
			}
		}
	}
}

// awaitSession waits for a session other than old (nil for none) and
// returns it with the tools it lists; with retry > 0, it returns old after
// retry if old is still the current session. It gives up, with an error
// saying why the upstream is down, when ctx is done, when the upstream is
// closed, and at once when there is no session and the supervisor's next
// attempt to connect starts after ctx's deadline: no session can come in
// time.
func (u *Upstream) awaitSession(ctx context.Context, old *mcp.ClientSession, retry time.Duration) (*mcp.ClientSession, map[string]Tool, error) {
	var again <-chan time.Time
	if retry > 0 {
		t := time.NewTimer(retry)
		defer t.Stop()
		again = t.C
	}
	for {
		u.mu.Lock()
		sess, tools, ch, lastErr, retryAt := u.sess, u.tools, u.changed, u.state.Err, u.retryAt
		u.mu.Unlock()
		if sess != nil && sess != old {
			return sess, tools, nil
		}
		if lastErr == "" {
			lastErr = "not connected yet"
		}
		if deadline, ok := ctx.Deadline(); ok && sess == nil && retryAt.After(deadline) {
			return nil, nil, fmt.Errorf("%s (not waiting: the next attempt to reconnect, in %v, comes after the call's deadline)",
				lastErr, time.Until(retryAt).Round(time.Millisecond))
		}
		select {
		case <-ch:
		case <-again:
			if sess == old {
				return sess, tools, nil
			}
			again = nil
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("%s (waited for it until %w)", lastErr, context.Cause(ctx))
		case <-u.done:
			return nil, nil, errors.New("upstream closed")
		}
	}
}
