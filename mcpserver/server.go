package mcpserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/gateway/conformance"
	"github.com/countersign/countersign/internal/ratelimit"
	"github.com/countersign/countersign/internal/telemetry"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/txtoken"
)

// Defaults for the zero values of [Options]. The task limits (creation
// rate, pending cap, poll interval, result retention) are the approval
// service's: approvals.Default*.
const (
	DefaultMaxBodyBytes = 1 << 20 // 1 MiB
	// The per-principal request budget: far above what an agent polling a
	// few tasks needs (one tasks/get every poll interval each), far below
	// what it takes to slow the endpoint for everyone else.
	DefaultRequestsPerSecond       = 50
	DefaultRequestBurst            = 100
	DefaultMaxInFlightPerPrincipal = 16
	// A principal's open notification streams (2026-07-28
	// subscriptions/listen, 2025-11-25 GET): each client instance holds
	// one (the TypeScript and Go SDKs open the GET stream by themselves),
	// and one agent token is often shared by several (IDE windows, CI
	// jobs). A refused stream costs the client only its notifications.
	DefaultMaxStreamsPerPrincipal = 16
	// DefaultKeepAlive is how often an SSE comment goes down a quiet
	// notification stream, so that proxies and clients do not close it.
	DefaultKeepAlive = 15 * time.Second
)

// AnonymousPrincipal is the principal of every caller when [Options.NoAuth]
// is set.
const AnonymousPrincipal = "anonymous"

// Implementation name and version reported in server/discover and
// initialize.
const (
	ImplementationName    = "countersign"
	ImplementationVersion = "0.1.0"
)

// Options configures a [Server]. Zero values take the documented defaults;
// ServerID, Approvals, PDP and Tools are required, and so is Authenticate
// unless NoAuth is set.
type Options struct {
	// ServerID binds action hashes to this server (SEP-2672 §4.6); it must
	// be stable across restarts and replicas and differ between servers.
	ServerID string
	// PublicURL is the externally visible base URL (for example
	// https://countersign.example.com) of the approver site: an
	// [approval-pending] result names the approver's page under it
	// (approveUrl). Empty leaves approveUrl out.
	PublicURL string
	// InlineWait is how long a tools/call from a client without tasks
	// waits for the approval decision before it answers [approval-pending]
	// (0, the default: it answers at once; at most MaxInlineWait). Decided
	// within the window, the call returns the final result itself.
	InlineWait time.Duration

	// Approvals opens the tasks that calls become and serves their owners
	// (*approvals.Service); the task limits are configured there.
	Approvals Approvals
	// Passkeys enables SEP-2672 in-band verified approval (the
	// verifiedApproval capability, approval/* methods, the tool annotation
	// and evidence on tools/call; see verified.go). Nil: none of it, and a
	// call policy decides "verify" is denied.
	Passkeys Passkeys
	PDP      *pdp.Engine
	Tools    *gateway.Registry
	// Fixtures are the conformance fixtures among Tools (`countersign dev
	// --conformance`): asynchronous tools, tools that require a task, and
	// tools that ask their client for input. Nil in production: every tool
	// is then synchronous.
	Fixtures *conformance.Set

	// Authenticate maps a bearer token to the principal that owns the tasks
	// it creates. An error wrapping authn.ErrUnavailable (the token store
	// did not answer) or ErrAuthUnavailable is answered 503 with
	// Retry-After; any other error (or an empty principal) 401. The error
	// itself is logged, never sent; one wrapping authn.ErrDisabled (the
	// valid token of a disabled agent) is told the agent is disabled, any
	// other only that the token is invalid.
	Authenticate func(ctx context.Context, bearer string) (principal string, err error)
	// OAuth, when set, also accepts OAuth 2.1 access tokens of one
	// issuer, and answers a missing or rejected token with its challenge.
	OAuth OAuth
	// NoAuth serves every caller as principal "anonymous". For conformance
	// runs and tests only; New logs a warning.
	NoAuth bool

	// MaxBodyBytes caps a request body (default 1 MiB). A larger body is
	// answered with HTTP 413 and a JSON-RPC error, and nothing runs.
	MaxBodyBytes int64
	// RequestsPerSecond and RequestBurst budget every request of one
	// principal, whatever its method (default 50 a second, burst 100), and
	// MaxInFlightPerPrincipal caps its concurrent requests (default 16;
	// 2025-11-25 tasks/result, which waits for the task by design, spends a
	// token but holds no slot). Over budget the request is answered HTTP 429
	// with Retry-After and JSON-RPC error -31029, and nothing runs.
	RequestsPerSecond       float64
	RequestBurst            int
	MaxInFlightPerPrincipal int
	// MaxStreamsPerPrincipal caps one principal's open notification
	// streams (default 16): 2026-07-28 subscriptions/listen and 2025-11-25
	// GET. Opening one spends a request token but holds no in-flight slot;
	// over the cap the answer is HTTP 429 and -31029.
	MaxStreamsPerPrincipal int
	// KeepAlive is the interval of the SSE comments on a quiet
	// notification stream (default DefaultKeepAlive).
	KeepAlive time.Duration
	// Rates is where ChallengesPerMinute is counted: one count for every
	// replica sharing its NATS. Nil counts in this process alone (tests).
	Rates *ratelimit.Store
	// ChallengesPerMinute and ChallengeBurst bound the in-band challenges
	// (approval/challenge/create) one principal creates (default 30 a minute, burst 10: approvals.DefaultRatePerMinute and
	// DefaultBurst; the server sets them to --rate-per-minute and
	// --rate-burst). Each stays stored until well after its lifetime
	// even if never answered (passkey's challengeKeyTTL). Over the bound
	// the answer is CodeTooManyRequests (-31029), and nothing is created.
	ChallengesPerMinute int
	ChallengeBurst      int

	// Tokens issues and redeems single-use transaction tokens for calls
	// policy puts in the "token" mode (countersign/transactionToken, and
	// tools/call with the token in _meta). Nil: the method is not served
	// and a token-mode call is denied.
	Tokens *txtoken.Service

	// Logger receives operational logs; nil discards them.
	Logger *slog.Logger
	// Telemetry counts tools/call decisions and failed verifications, and
	// traces each tools/call; nil records nothing.
	Telemetry *telemetry.Telemetry
}

// Approvals is what the endpoint needs of the approval service
// (*approvals.Service), the one place that changes a task: this package maps
// the protocol to these calls and their answers and errors back to the wire.
type Approvals interface {
	// Open turns a call into a task (or joins an identical pending one);
	// *approvals.Refused when a limit turns it away.
	Open(ctx context.Context, c approvals.Call) (approvals.Opened, error)
	// Charge spends one task creation of the principal's rate for a
	// 2025-11-25 call decided at once (*approvals.Refused when spent), and
	// Completed then stores its result as a completed task.
	Charge(ctx context.Context, principal string, at time.Time) error
	Completed(ctx context.Context, c approvals.Call, result tasks.CallToolResult) (tasks.Record, error)
	// The owner's side: approvals.ErrNotFound (also for another
	// principal's task), approvals.ErrExpired, approvals.ErrUnknownCursor.
	Get(ctx context.Context, owner, taskID string) (tasks.Record, error)
	List(ctx context.Context, owner, cursor string, limit int) ([]tasks.Record, string, error)
	Recent(ctx context.Context, owner string, since time.Time, visit func(tasks.Record) bool) error
	Await(ctx context.Context, owner, taskID string) (tasks.Record, error)
	Cancel(ctx context.Context, owner, taskID string) (tasks.Record, bool, error)
	ProvideInput(ctx context.Context, owner, taskID string, responses map[string]json.RawMessage) error
}

var _ Approvals = (*approvals.Service)(nil)

// Server is Countersign's MCP endpoint: the policy enforcement point for
// tools/call and the owner of the tasks/* methods in both protocol eras.
// Create it with [New] and mount [Server.Handler] at /mcp.
type Server struct {
	opts   Options
	log    *slog.Logger
	now    func() time.Time
	budget *ratelimit.Budget
	// challengeRate bounds each principal's in-band challenges.
	challengeRate ratelimit.Limiter
	recent        recentPrincipals
	// working holds a slot for each request doing its store work (see
	// enter).
	working  chan struct{}
	sharesMu sync.Mutex
	shares   map[string]int // working slots held, by principal
	// pageSize is the tasks/list page size (tests shrink it).
	pageSize int
	// sdkTaskGet sends every tasks/get through the SDK (tests compare the
	// lean path's answers with the SDK's; see serveTaskGet).
	sdkTaskGet bool
	// leanGets counts the tasks/gets serveTaskGet answered.
	leanGets atomic.Int64
	mcp      *mcp.Server
	impl     *mcp.Implementation // the SDK server's, as results name it
	handler  http.Handler
	// stateKey signs SEP-2322 requestStates (see inputState).
	stateKey []byte
	// toolsMu guards listed (each tool registered on mcp, as tools/list
	// shows it) and toolsChanged, which is closed and replaced whenever
	// that list changes (the 2025-11-25 GET streams wait on it).
	toolsMu      sync.Mutex
	listed       map[string][]byte
	toolsChanged chan struct{}
	streams      streams
	// waitsEnded ends every wait for a task's decision (EndWaits).
	waitsEnded context.Context
	endWaits   context.CancelFunc
}

// New validates opts, registers the tools and task methods on an MCP server
// and returns the endpoint.
func New(opts Options) (*Server, error) {
	switch {
	case opts.ServerID == "":
		return nil, errors.New("mcpserver: ServerID is required")
	case opts.Approvals == nil:
		return nil, errors.New("mcpserver: Approvals is required")
	case opts.PDP == nil:
		return nil, errors.New("mcpserver: PDP is required")
	case opts.Tools == nil:
		return nil, errors.New("mcpserver: Tools is required")
	case opts.Authenticate == nil && !opts.NoAuth:
		return nil, errors.New("mcpserver: Authenticate is required unless NoAuth is set")
	case opts.MaxBodyBytes < 0, opts.RequestsPerSecond < 0, opts.RequestBurst < 0, opts.MaxInFlightPerPrincipal < 0,
		opts.MaxStreamsPerPrincipal < 0, opts.KeepAlive < 0, opts.ChallengesPerMinute < 0, opts.ChallengeBurst < 0:
		return nil, errors.New("mcpserver: limits must not be negative")
	case opts.InlineWait < 0 || opts.InlineWait > MaxInlineWait:
		return nil, fmt.Errorf("mcpserver: InlineWait must be from 0 to %v, not %v", MaxInlineWait, opts.InlineWait)
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.RequestsPerSecond == 0 {
		opts.RequestsPerSecond = DefaultRequestsPerSecond
	}
	if opts.RequestBurst == 0 {
		opts.RequestBurst = DefaultRequestBurst
	}
	if opts.MaxInFlightPerPrincipal == 0 {
		opts.MaxInFlightPerPrincipal = DefaultMaxInFlightPerPrincipal
	}
	if opts.MaxStreamsPerPrincipal == 0 {
		opts.MaxStreamsPerPrincipal = DefaultMaxStreamsPerPrincipal
	}
	if opts.KeepAlive == 0 {
		opts.KeepAlive = DefaultKeepAlive
	}
	if opts.ChallengesPerMinute == 0 {
		opts.ChallengesPerMinute = approvals.DefaultRatePerMinute
	}
	if opts.ChallengeBurst == 0 {
		opts.ChallengeBurst = approvals.DefaultBurst
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.NoAuth {
		log.Warn("mcpserver: authentication is disabled; every caller is principal \"anonymous\" (tests and conformance runs only)")
	}

	s := &Server{
		opts:          opts,
		log:           log,
		now:           time.Now,
		budget:        ratelimit.NewBudget(opts.RequestsPerSecond, opts.RequestBurst, opts.MaxInFlightPerPrincipal),
		challengeRate: opts.Rates.Limiter("inband-challenges", opts.ChallengesPerMinute, opts.ChallengeBurst),
		working:       make(chan struct{}, maxWorking),
		shares:        map[string]int{},
		pageSize:      listPageSize,
		stateKey:      make([]byte, 32),
	}
	if _, err := rand.Read(s.stateKey); err != nil {
		return nil, fmt.Errorf("mcpserver: request state key: %w", err)
	}
	s.streams.init()
	s.waitsEnded, s.endWaits = context.WithCancel(context.Background())
	// The SDK logs every stateless request at info; keep its warnings.
	sdkLog := slog.New(minLevel{Handler: log.Handler(), min: slog.LevelWarn}).With("component", "mcp-sdk")

	// listChanged: upstream tools come and go. 2026-07-28 clients hear of
	// it on subscriptions/listen (the SDK's), 2025-11-25 clients on the GET
	// stream (ours, listen.go).
	caps := &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}}
	caps.AddExtension(tasks.ExtTasks, nil)
	caps.AddExtension(tasks.ExtToolApproval, nil)
	caps.AddExtension(tasks.ExtToolApprovalAuthZEN, map[string]any{"version": "0.1"})
	if opts.Tokens != nil {
		caps.AddExtension(ExtTransactionTokens, map[string]any{"method": MethodTransactionToken, "metaKey": txtoken.MetaKey})
	}
	if opts.Passkeys != nil {
		caps.AddExtension(ExtVerifiedApproval, nil) // SEP-2672 §4.3: {}
	}
	s.impl = &mcp.Implementation{Name: ImplementationName, Version: ImplementationVersion}
	s.mcp = mcp.NewServer(s.impl, &mcp.ServerOptions{
		Logger:       sdkLog,
		Capabilities: caps,
		Instructions: "Tools that policy gates do not run at once: a human must approve the exact call with a passkey first. " +
			"A client that supports MCP tasks gets a task to poll; any other client gets a result starting [approval-pending] with a taskId: " +
			"the call has NOT run, do not repeat it, call countersign_await with that taskId for the final result. " +
			"Every final result states whether the call ran.",
	})
	for _, t := range opts.Tools.List() {
		if err := checkObjectSchema(t.InputSchema); err != nil {
			return nil, fmt.Errorf("mcpserver: tool %q: %w", t.Name, err)
		}
		if isFollowUp(t.Name) {
			return nil, fmt.Errorf("mcpserver: tool %q: the name is Countersign's own follow-up tool's", t.Name)
		}
	}
	s.syncTools()
	// Upstream tools come and go (list_changed, restarts): tools/list
	// follows the registry.
	opts.Tools.OnChange(s.syncTools)
	if err := s.registerTaskMethods(); err != nil {
		return nil, err
	}
	if err := s.registerTokenMethod(); err != nil {
		return nil, err
	}
	if err := s.registerApprovalMethods(); err != nil {
		return nil, err
	}
	s.mcp.AddReceivingMiddleware(s.middleware)

	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp }, &mcp.StreamableHTTPOptions{
		// Stateless serves 2026-07-28 (which has no sessions) and 2025-11-25
		// alike; no per-replica session state, so replicas scale out.
		Stateless:           true,
		JSONResponse:        true,
		Logger:              sdkLog,
		MaxRequestBodyBytes: opts.MaxBodyBytes,
	})
	// The same server, answering with a stream: for the tools/calls that
	// can use one (Server.answersAsStream), so that their progress and log
	// notifications reach the client before the result.
	sse := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp }, &mcp.StreamableHTTPOptions{
		Stateless:           true,
		Logger:              sdkLog,
		MaxRequestBodyBytes: opts.MaxBodyBytes,
	})
	s.handler = s.httpHandler(sdk, sse)
	return s, nil
}

// syncTools makes the SDK server's tool list the registry's. tools/call
// never reaches the tools' handlers: the receiving middleware answers it.
// Registering the tools gives tools/list, the tools capability and the SDK's
// Mcp-Name checks. Only tools that are new, changed or gone touch the SDK
// server, so a registry change that leaves the served list as it was
// notifies no one; one that changes it notifies the 2026-07-28 listeners
// (the SDK, debounced) and the 2025-11-25 GET streams (toolsChanged).
func (s *Server) syncTools() {
	s.toolsMu.Lock()
	defer s.toolsMu.Unlock()
	now := map[string][]byte{}
	changed := false
	// Countersign's own follow-up tools first: always served, never
	// shadowed by a registry tool.
	served := followUpTools()
	for _, t := range s.opts.Tools.List() {
		if err := checkObjectSchema(t.InputSchema); err != nil {
			s.log.Error("mcpserver: tool left out of tools/list", "tool", t.Name, "err", err)
			continue
		}
		if isFollowUp(t.Name) {
			s.log.Error("mcpserver: tool left out of tools/list: the name is Countersign's own", "tool", t.Name)
			continue
		}
		served = append(served, mcpTool(t))
	}
	for _, mt := range served {
		shown, err := json.Marshal(mt)
		if err != nil {
			s.log.Error("mcpserver: tool left out of tools/list", "tool", mt.Name, "err", err)
			continue
		}
		now[mt.Name] = shown
		if old, ok := s.listed[mt.Name]; ok && bytes.Equal(old, shown) {
			continue
		}
		s.mcp.AddTool(mt, unreachableTool)
		changed = true
	}
	var gone []string
	for name := range s.listed {
		if _, ok := now[name]; !ok {
			gone = append(gone, name)
		}
	}
	if len(gone) > 0 {
		s.mcp.RemoveTools(gone...)
		changed = true
	}
	s.listed = now
	if changed || s.toolsChanged == nil {
		if s.toolsChanged != nil {
			close(s.toolsChanged)
		}
		s.toolsChanged = make(chan struct{})
	}
}

// toolsChangedChan returns a channel closed at the next change of the
// served tool list.
func (s *Server) toolsChangedChan() <-chan struct{} {
	s.toolsMu.Lock()
	defer s.toolsMu.Unlock()
	return s.toolsChanged
}

// mcpTool is a tool as tools/list shows it: an upstream's schemas, title,
// description and annotations passed through.
func mcpTool(t gateway.Tool) *mcp.Tool {
	mt := &mcp.Tool{Name: t.Name, Title: t.Title, Description: t.Description, InputSchema: t.InputSchema}
	if len(t.OutputSchema) > 0 {
		mt.OutputSchema = t.OutputSchema
	}
	if len(t.Annotations) > 0 {
		var a mcp.ToolAnnotations
		if json.Unmarshal(t.Annotations, &a) == nil {
			mt.Annotations = &a
		}
	}
	if t.ReadOnly {
		if mt.Annotations == nil {
			mt.Annotations = &mcp.ToolAnnotations{}
		}
		mt.Annotations.ReadOnlyHint = true
	}
	return mt
}

// Handler returns the HTTP handler to mount at /mcp.
func (s *Server) Handler() http.Handler { return s.handler }

func unreachableTool(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	return nil, &rpcError{code: codeInternal, msg: msgInternal, cause: errors.New("mcpserver: tools/call bypassed the enforcement middleware")}
}

// checkObjectSchema reports whether schema is a JSON object with "type":
// "object", which the SDK requires (it would panic otherwise).
func checkObjectSchema(schema json.RawMessage) error {
	// A map, not a struct: encoding/json matches struct fields without
	// regard to case, and "tYpe" is not "type" to a client.
	var m map[string]json.RawMessage
	if err := json.Unmarshal(schema, &m); err != nil || m == nil {
		return fmt.Errorf("input schema is not a JSON object: %v", err)
	}
	var typ string
	if json.Unmarshal(m["type"], &typ) != nil || typ != "object" {
		return errors.New(`input schema must have "type": "object"`)
	}
	return nil
}

// minLevel drops records below min.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

// Handle drops the SDK's warning that a list_changed notification found no
// stream to go on. The SDK tries every session it calls "legacy", and each
// 2025-11-25 request in flight when the tool list changes has a stateless
// session without one (those clients hear of it on their GET stream), so
// the warning would come with every routine change.
func (h minLevel) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "calling notifications/tools/list_changed: rejected by transport") {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{Handler: h.Handler.WithAttrs(attrs), min: h.min}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{Handler: h.Handler.WithGroup(name), min: h.min}
}
