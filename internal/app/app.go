package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"golang.org/x/net/netutil"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/gateway/conformance"
	"github.com/countersign/countersign/internal/authn"
	"github.com/countersign/countersign/internal/devstack"
	"github.com/countersign/countersign/internal/httplimit"
	"github.com/countersign/countersign/internal/natsrv"
	"github.com/countersign/countersign/internal/oauth"
	"github.com/countersign/countersign/internal/ratelimit"
	"github.com/countersign/countersign/internal/telemetry"
	"github.com/countersign/countersign/mcpserver"
	"github.com/countersign/countersign/notify"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/txtoken"
	"github.com/countersign/countersign/web"
	"github.com/countersign/countersign/workflows"
)

// Mode selects what a process runs.
type Mode int

const (
	ModeDev    Mode = iota // everything, embedded services by default
	ModeServer             // HTTP only, external services
	ModeWorker             // worker only, external services
)

// Files written to the data directory.
const (
	AgentTokenFile = "agent-token"
	AdminTokenFile = "admin-token"
	ServerIDFile   = "server-id"
	URLFile        = "url"
	// NATSURLFile holds the embedded NATS's URL for other processes, with
	// the password of their user (dev only; new at every start).
	NATSURLFile = "nats-url"
)

// DevAgentName is the principal of the agent token `countersign dev` creates.
const DevAgentName = "dev-agent"

// App is a running Countersign process.
type App struct {
	cfg    Config
	mode   Mode
	log    *slog.Logger
	out    io.Writer
	closed atomic.Bool
	// stopping is set when Run's context ends: /readyz answers 503 from
	// then on, through Config.ShutdownDelay and the shutdown.
	stopping atomic.Bool
	// stopBG ends the background loops (the reconciler, the retention
	// sweep, the audit key watch), and bg waits for them.
	stopBG context.CancelFunc
	bg     sync.WaitGroup
	// stopWatch ends the watch that ends a disabled agent's streams.
	stopWatch context.CancelFunc

	nats     *natsrv.Server
	temporal *devstack.Server
	nc       *nats.Conn
	tc       client.Client
	worker   worker.Worker
	httpSrv  *http.Server
	listener net.Listener
	oauth    *oauth.Verifier // nil without --oauth-issuer
	// ln is the listen address taken at the start of New, until
	// startHTTP wraps it into listener.
	ln net.Listener
	// opsSrv serves /metrics, /healthz and /readyz on Config.MetricsAddr.
	opsSrv      *http.Server
	opsListener net.Listener
	tel         *telemetry.Telemetry
	js          jetstream.JetStream
	slack       *notify.Slack
	events      *notify.Events
	decide      *notify.DecisionService
	// upstreams are the configured upstream MCP servers (upstreams.go).
	upstreams []namedUpstream
	// crash is the worker's activities.Activities.Crash: set only in a
	// crash-trial build (crashpoints.go).
	crash func(activities.CrashPoint, string)
	// auditKeys signs the audit records; nil on a server without a key
	// directory. startAuditKeyWatch follows its rotations.
	auditKeys *audit.Keyring

	Store        *tasks.Store
	Orchestrator *tasks.Orchestrator
	// Rates counts the rate limits of every replica sharing this NATS.
	Rates *ratelimit.Store
	// Approvals is the one place that changes a task; every door (MCP,
	// approver API, NATS decisions, Slack, admin) is an adapter over it.
	Approvals *approvals.Service
	Tokens    *authn.Tokens
	Passkeys  *passkey.Service
	// InBandPasskeys is Passkeys for the MCP endpoint's in-band verified
	// approval: the same state, plus Config.VerifiedOrigins.
	InBandPasskeys *passkey.Service
	PDP            *pdp.Engine
	Audit          *audit.Log
	Ledger         *gateway.Ledger
	// Transactions issues and redeems single-use transaction tokens; nil
	// in a worker, and in a server without audit signing keys.
	Transactions *txtoken.Service
	Tools        *gateway.Registry
	// Fixtures are the conformance fixtures among Tools; nil unless
	// Config.Conformance.
	Fixtures *conformance.Set
}

// New starts every component the mode needs and returns once they are
// ready; the HTTP listener is bound but not yet serving (see Run). On error,
// whatever was started is stopped again.
func New(ctx context.Context, cfg Config, mode Mode, log *slog.Logger, out io.Writer) (_ *App, err error) {
	crash, err := armCrashPoints(&cfg) // a crash-trial build only; see crashpoints.go
	if err != nil {
		return nil, err
	}
	if err := cfg.Resolve(mode); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Every line logged with a context names its trace and its task.
	log = slog.New(telemetry.NewLogHandler(log.Handler()))
	if out == nil {
		out = io.Discard
	}
	a := &App{cfg: cfg, mode: mode, log: log, out: out, crash: crash}
	if crash != nil {
		log.Warn("crash-trial build (-tags crashpoints): crash points are logged, and the armed ones kill the process")
	}
	file := cfg.File
	defer func() {
		if err != nil {
			a.Shutdown(context.Background())
		}
	}()
	if mode != ModeWorker {
		// Take the listen address before anything starts or is written,
		// so a taken port fails at once and leaves no half-made data dir.
		if a.ln, err = net.Listen("tcp", cfg.Addr); err != nil {
			return nil, fmt.Errorf("listen on %s: %w (is another countersign running? choose another with --addr)", cfg.Addr, err)
		}
	}
	if mode == ModeDev {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("data dir: %w", err)
		}
	}
	// The policy before NATS and Temporal: one that does not load stops
	// startup with nothing started or written.
	policyDir := cfg.PolicyDir
	if cfg.Conformance && policyDir == "" {
		// The default policy plus the conformance fixtures (see
		// gateway/conformance), written out so the version hash and
		// the files are inspectable.
		policyDir = filepath.Join(cfg.DataDir, "conformance-policy")
		if err := pdp.WriteConformancePolicy(policyDir); err != nil {
			return nil, err
		}
	}
	if a.PDP, err = pdp.New(ctx, pdp.Options{Dir: policyDir, Logger: log, EvalTimeout: cfg.PolicyTimeout}); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	if err := a.startTelemetry(ctx); err != nil {
		return nil, err
	}
	if err := a.startNATS(ctx); err != nil {
		return nil, err
	}
	if err := a.startTemporal(ctx); err != nil {
		return nil, err
	}
	js, err := jetstream.New(a.nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if a.Store, err = tasks.NewStore(ctx, js, tasks.StoreOptions{Replicas: cfg.NATSReplicas, Logger: log}); err != nil {
		return nil, err
	}
	if a.Rates, err = ratelimit.Open(ctx, js, ratelimit.StoreOptions{Replicas: cfg.NATSReplicas}); err != nil {
		return nil, err
	}
	if err := a.tel.M().WatchPending(a.Store.PendingTotal); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if a.Tokens, err = authn.Open(ctx, js, authn.Options{Replicas: cfg.NATSReplicas}); err != nil {
		return nil, err
	}
	if a.Passkeys, err = passkey.New(ctx, js, passkey.Options{
		RPID: cfg.RPID(), RPOrigins: []string{cfg.Origin()}, RPDisplayName: "Countersign",
		Replicas: cfg.NATSReplicas, Logger: log, InBandChallengeTTL: cfg.VerifiedChallengeTTL,
		ChallengeMaxBytes: cfg.ChallengeMaxBytes, Record: a.recordPasskeyEvent,
		InBandEnrollment: cfg.InBandEnrollmentFor(mode),
	}); err != nil {
		return nil, fmt.Errorf("passkeys: %w", err)
	}
	// In-band verified approval (SEP-2672) runs its ceremony on the MCP
	// client's page: the same buckets, and the client pages' origins too.
	inBandOrigins := append([]string{cfg.Origin()}, cfg.VerifiedOrigins...)
	if mode == ModeDev && len(cfg.VerifiedOrigins) == 0 && cfg.RPID() == "localhost" {
		inBandOrigins = append(inBandOrigins, DevVerifiedOrigin)
	}
	if a.InBandPasskeys, err = passkey.New(ctx, js, passkey.Options{
		RPID: cfg.RPID(), RPOrigins: inBandOrigins, RPDisplayName: "Countersign",
		Replicas: cfg.NATSReplicas, Logger: log, InBandChallengeTTL: cfg.VerifiedChallengeTTL,
		ChallengeMaxBytes:           cfg.ChallengeMaxBytes,
		IgnoreUnsolicitedExtensions: true,
		Record:                      a.recordPasskeyEvent,
		InBandEnrollment:            cfg.InBandEnrollmentFor(mode),
	}); err != nil {
		return nil, fmt.Errorf("passkeys (--verified-origins): %w", err)
	}
	if err := a.startAudit(ctx, js); err != nil {
		return nil, err
	}
	if mode != ModeWorker && cfg.AdminTokenFile != "" {
		if err := a.registerAdminFile(ctx); err != nil {
			return nil, err
		}
	}
	if a.Ledger, err = gateway.NewLedger(ctx, js, gateway.LedgerOptions{Replicas: cfg.NATSReplicas}); err != nil {
		return nil, err
	}
	var tools []gateway.Tool
	tools, a.Fixtures = ownTools(&cfg, mode, a.Ledger)
	if err := checkNamespaces(cfg.ConfigFile, tools, file.Upstreams); err != nil {
		return nil, err
	}
	if a.Tools, err = gateway.NewRegistry(tools...); err != nil {
		return nil, err
	}
	if a.Fixtures != nil {
		a.Fixtures.Bind(a.Tools)
	}
	a.startUpstreams(ctx, file.Upstreams)
	a.awaitUpstreams(ctx, 15*time.Second)
	if err := a.startNotify(ctx, js); err != nil {
		return nil, err
	}
	if a.Approvals, err = approvals.New(approvals.Options{
		Store:                  a.Store,
		Engine:                 a.Orchestrator,
		Passkeys:               a.Passkeys,
		Audit:                  a.Audit,
		Rates:                  a.Rates,
		RatePerMinute:          cfg.RatePerMinute,
		Burst:                  cfg.RateBurst,
		MaxPendingPerPrincipal: cfg.MaxPendingPerPrincipal,
		PollInterval:           cfg.PollInterval,
		ResultRetention:        cfg.ResultRetention,
		Logger:                 log,
		Telemetry:              a.tel,
	}); err != nil {
		return nil, err
	}
	if mode != ModeServer {
		if err := a.startWorker(); err != nil {
			return nil, err
		}
	}
	if mode != ModeWorker {
		if err := a.startHTTP(ctx); err != nil {
			return nil, err
		}
	}
	if err := a.startOps(); err != nil {
		return nil, err
	}
	if mode == ModeDev {
		if err := a.bootstrapDev(ctx); err != nil {
			return nil, err
		}
	}
	bg, cancel := context.WithCancel(context.Background())
	a.stopBG = cancel
	a.startAuditKeyWatch(bg)
	if mode != ModeWorker {
		a.startReconciler(bg)
		a.startRetention(bg)
		if a.Transactions != nil {
			a.startKeyPurge(bg)
		}
	}
	return a, nil
}

// Reconcile intervals: a task record older than reconcileGrace without a
// workflow is an orphan of a crash during creation.
const (
	reconcileGrace    = time.Minute
	reconcileInterval = 5 * time.Minute
	// reconcileAgain is when a second round runs after the startup round,
	// if that one left records too young to judge (the orphans of a crash
	// moments before this start: a task answered, its workflow not yet
	// started, resumed once 2 s old) or failed.
	reconcileAgain = 5 * time.Second
)

// startReconciler resumes or fails orphaned task records at startup, again
// shortly after when the first round left some to a later one, and then
// periodically, until Shutdown. Each round reads every pending record, so
// the second runs only when needed.
func (a *App) startReconciler(ctx context.Context) {
	a.bg.Go(func() {
		for first := true; ; first = false {
			round, err := a.Approvals.ReconcileRound(ctx, reconcileGrace)
			if err != nil && ctx.Err() == nil {
				a.log.Warn("reconcile orphaned tasks", "err", err)
			}
			wait := reconcileInterval
			if first && (err != nil || round.Young > 0) {
				wait = reconcileAgain
			}
			if !sleep(ctx, wait) {
				return
			}
		}
	})
}

// sleep waits d, and reports false, at once, when ctx ends first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Retention sweep (tasks.Store.Sweep): a pass every retentionInterval, in
// rounds of at most retentionBatch records, retentionPause apart, so that
// a pass over a large backlog costs the store at most retentionBatch
// records' reads and deletes a second. Every replica that serves sweeps;
// their deletes are idempotent compare-and-deletes.
const (
	retentionInterval = 10 * time.Minute
	retentionBatch    = 200
	retentionPause    = time.Second
)

// startRetention deletes finished tasks past their retention and its grace
// (tasks.RetentionGrace) until Shutdown. The first pass starts a minute
// after the start, not to add to its work.
func (a *App) startRetention(ctx context.Context) {
	a.bg.Go(func() {
		wait, from := time.Minute, uint64(0)
		for sleep(ctx, wait) {
			round, err := a.Store.Sweep(ctx, from, retentionBatch)
			if err != nil && ctx.Err() == nil {
				a.log.Warn("retention sweep", "err", err)
			}
			if round.Deleted > 0 {
				a.log.Info("retention sweep deleted finished tasks", "deleted", round.Deleted)
			}
			from, wait = round.Next, retentionPause
			if from == 0 {
				wait = retentionInterval
			}
		}
	})
}

// keyPurgeInterval is how often a server purges the private halves of
// retired transaction-token keys (txtoken.Service.PurgeRetired): a
// retired key's private half outlives txtoken.PurgeAfter by at most this.
const keyPurgeInterval = time.Minute

// startKeyPurge purges retired transaction-token keys' private halves
// until Shutdown. Every replica that serves purges; a purge is idempotent.
func (a *App) startKeyPurge(ctx context.Context) {
	a.bg.Go(func() {
		for sleep(ctx, keyPurgeInterval) {
			if _, err := a.Transactions.PurgeRetired(ctx); err != nil && ctx.Err() == nil {
				a.log.Warn("transaction-token key purge", "err", err)
			}
		}
	})
}

// devNATSClientUser is the embedded NATS's user for other processes (the
// events and the decision service); see devNATSClients.
const devNATSClientUser = "countersign-client"

// devNATSClients is what processes outside `countersign dev` may do on its
// embedded NATS: read the approval events (a copy of the events stream in an
// account of their own) and use the decision service. Countersign itself
// connects in process; its account (tasks, tokens, passkeys, ledger, audit)
// is out of their reach. replicas is the configured replica count (always 1:
// the embedded NATS is a single node).
func devNATSClients() *natsrv.Clients {
	// The embedded NATS is one node: one replica (Config.Validate).
	events := notify.EventsStreamConfig(notify.EventsOptions{})
	events.Description = "Countersign approval events (JSON, v1), copied for NATS clients of countersign dev"
	return &natsrv.Clients{
		User:     devNATSClientUser,
		Services: []string{"countersign.approver.v1.>"},
		Streams:  []jetstream.StreamConfig{events},
	}
}

func (a *App) startNATS(ctx context.Context) error {
	url := a.cfg.NATSURL
	opts := []nats.Option{nats.Name("countersign"), nats.MaxReconnects(-1)}
	if url == "" {
		if a.mode != ModeDev {
			return errors.New("--nats-url is required outside dev mode")
		}
		srv, err := natsrv.Start(natsrv.Options{StoreDir: filepath.Join(a.cfg.DataDir, "nats"), Clients: devNATSClients()})
		if err != nil {
			return err
		}
		a.nats = srv
		if err := writeSecretFile(filepath.Join(a.cfg.DataDir, NATSURLFile), srv.ClientURL()+"\n"); err != nil {
			return fmt.Errorf("write %s: %w", NATSURLFile, err)
		}
		nc, err := srv.Connect(opts...)
		if err != nil {
			return err
		}
		a.nc = nc
		return nil
	}
	if a.cfg.NATSCreds != "" {
		opts = append(opts, nats.UserCredentials(a.cfg.NATSCreds))
	}
	if a.cfg.NATSNKey != "" {
		opt, err := nats.NkeyOptionFromSeed(a.cfg.NATSNKey)
		if err != nil {
			return fmt.Errorf("--nats-nkey: %w", err)
		}
		opts = append(opts, opt)
	}
	if a.cfg.NATSTLSCA != "" {
		opts = append(opts, nats.RootCAs(a.cfg.NATSTLSCA))
	}
	if a.cfg.NATSTLSCert != "" {
		opts = append(opts, nats.ClientCert(a.cfg.NATSTLSCert, a.cfg.NATSTLSKey))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return fmt.Errorf("connect to NATS at %s: %w%s", strings.Join(withoutUserInfo(url), ","), err, natsDialHint(err))
	}
	a.nc = nc
	return nil
}

// natsDialHint says which setting to look at when connecting to an external
// NATS fails.
func natsDialHint(err error) string {
	switch {
	case errors.Is(err, nats.ErrAuthorization):
		return " (the server does not admit this user: check --nats-creds / nats.creds or --nats-nkey / nats.nkey, and that the server knows the user's account)"
	case errors.Is(err, nats.ErrNoServers):
		return " (no server answered: check --nats-url / nats.url, and --nats-tls-ca if the servers speak TLS)"
	}
	return ""
}

// stickyCacheSize bounds the process-wide sticky workflow cache of every
// Temporal worker in the process: it holds pending workflows in memory.
const stickyCacheSize = 1000

func (a *App) startTemporal(ctx context.Context) error {
	// The SDK creates its process-wide sticky cache with the first worker,
	// at the size set then, and never resizes it. The embedded server runs
	// workers of its own (its worker service), so the cap must be set before
	// it starts, or it never applies (it stayed at the default 10,000).
	worker.SetStickyWorkflowCacheSize(stickyCacheSize)
	hostPort := a.cfg.TemporalAddress
	conn, creds, err := a.cfg.temporalConnection()
	if err != nil {
		return err
	}
	if hostPort == "" {
		if a.mode != ModeDev {
			return errors.New("--temporal-address is required outside dev mode")
		}
		srv, err := devstack.Start(ctx, devstack.Options{
			DataDir:     filepath.Join(a.cfg.DataDir, "temporal"),
			Namespace:   a.cfg.TemporalNamespace,
			Synchronous: a.cfg.SQLiteSync,
			Logger:      embeddedLogger(ctx, a.log),
		})
		if err != nil {
			return fmt.Errorf("embedded Temporal: %w", err)
		}
		a.temporal = srv
		hostPort = srv.FrontendHostPort()
		// The embedded server requires the client certificate only this
		// process holds.
		conn.TLS = srv.ClientTLS()
	}
	interceptors, err := a.tel.TemporalInterceptors()
	if err != nil {
		return fmt.Errorf("temporal tracing: %w", err)
	}
	tc, err := client.DialContext(ctx, client.Options{
		HostPort:          hostPort,
		Namespace:         a.cfg.TemporalNamespace,
		Logger:            tlog.NewStructuredLogger(a.log.With("component", "temporal-client")),
		ConnectionOptions: conn,
		Credentials:       creds,
		MetricsHandler:    a.tel.M().Temporal(),
		Interceptors:      interceptors,
	})
	if err != nil {
		return fmt.Errorf("connect to Temporal at %s: %w%s", hostPort, err, a.cfg.temporalDialHint(err))
	}
	a.tc = tc
	if a.temporal == nil {
		if err := checkTemporalNamespace(ctx, tc, a.cfg.TemporalNamespace, hostPort); err != nil {
			return err
		}
	}
	a.Orchestrator = tasks.NewOrchestrator(tc)
	return nil
}

// checkTemporalNamespace stops the start of a process whose external
// Temporal has no such namespace. A worker would stop at its start anyway;
// a server would start, answer ready, and fail every workflow start. Any
// other answer (a key not allowed to describe it) is left to those.
func checkTemporalNamespace(ctx context.Context, tc client.Client, namespace, hostPort string) error {
	_, err := tc.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: namespace})
	var nf *serviceerror.NamespaceNotFound
	if errors.As(err, &nf) {
		return fmt.Errorf("namespace %q not found on Temporal at %s: register it (temporal operator namespace create --namespace %s), or set --temporal-namespace (temporal.namespace) to one that exists", namespace, hostPort, namespace)
	}
	return nil
}

func (a *App) startWorker() error {
	wo := a.cfg.workflowOptions()
	w := worker.New(a.tc, tasks.TaskQueue, worker.Options{
		// Finish in-flight activities and workflow tasks on a clean stop,
		// so a restart does not wait out their timeouts.
		WorkerStopTimeout: 15 * time.Second,
		// ExecuteTool heartbeats while the tool runs; send one at least
		// every third of its heartbeat timeout (the SDK's own throttle,
		// 80 % of it, leaves a loaded machine little margin).
		MaxHeartbeatThrottleInterval: cmp.Or(wo.ExecuteHeartbeatTimeout, workflows.DefaultExecuteHeartbeatTimeout) / 3,
	})
	w.RegisterWorkflowWithOptions(wo.Approval, workflow.RegisterOptions{Name: tasks.WorkflowName})
	w.RegisterActivity(&activities.Activities{
		Tasks:     a.Store,
		PDP:       a.PDP,
		Passkeys:  a.Passkeys,
		Tools:     a.Tools,
		Notifier:  a.notifier(),
		Audit:     a.Audit,
		PublicURL: a.cfg.PublicURL,
		Logger:    a.log,
		Telemetry: a.tel,

		ResultRetention: a.cfg.ResultRetention,
		Crash:           a.crash,
	})
	if err := w.Start(); err != nil {
		return fmt.Errorf("start worker: %w", err)
	}
	a.worker = w
	return nil
}

func (a *App) serverID() (string, error) {
	if a.cfg.ServerID != "" {
		return a.cfg.ServerID, nil
	}
	if a.mode != ModeDev {
		return a.cfg.PublicURL, nil
	}
	p := filepath.Join(a.cfg.DataDir, ServerIDFile)
	if b, err := os.ReadFile(p); err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	id := "countersign-dev:" + tasks.NewID("srv_")
	if err := os.WriteFile(p, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write server id: %w", err)
	}
	return id, nil
}

func (a *App) startHTTP(ctx context.Context) error {
	serverID, err := a.serverID()
	if err != nil {
		return err
	}
	maxStreams := 0 // mcpserver's default
	if a.cfg.Conformance {
		// Every caller is principal "anonymous", and each 2025-11-25
		// client of the suites opens a GET stream.
		maxStreams = conformanceRequestBudget
	}
	if a.Audit.CanSign() {
		if a.Transactions, err = txtoken.Open(ctx, a.js, txtoken.Options{
			ServerID: serverID, Audit: a.Audit, Replicas: a.cfg.NATSReplicas, Logger: a.log,
		}); err != nil {
			return err
		}
	}
	var oauthOpt mcpserver.OAuth
	if a.cfg.OAuthIssuer != "" {
		if a.oauth, err = oauth.New(ctx, oauth.Options{
			Issuer:         a.cfg.OAuthIssuer,
			Resource:       strings.TrimRight(a.cfg.PublicURL, "/") + "/mcp",
			Audiences:      a.cfg.OAuthAudiences,
			PrincipalClaim: a.cfg.OAuthPrincipalClaim,
			RequiredScopes: a.cfg.OAuthRequiredScopes,
			JWKSURL:        a.cfg.OAuthJWKSURL,
			Claims:         a.cfg.OAuthClaims,
			ClockSkew:      a.cfg.OAuthClockSkew,
			JWKSMaxAge:     a.cfg.OAuthJWKSMaxAge,
			Logger:         a.log,
		}); err != nil {
			return fmt.Errorf("--oauth-issuer: %w", err)
		}
		oauthOpt = oauthAgents{v: a.oauth, tokens: a.Tokens}
	}
	mcp, err := mcpserver.New(mcpserver.Options{
		OAuth:        oauthOpt,
		ServerID:     serverID,
		PublicURL:    a.cfg.PublicURL,
		Approvals:    a.Approvals,
		Passkeys:     a.InBandPasskeys,
		PDP:          a.PDP,
		Tools:        a.Tools,
		Fixtures:     a.Fixtures,
		Authenticate: a.Tokens.Agent,
		NoAuth:       a.cfg.Conformance,
		InlineWait:   a.cfg.InlineWait,
		Tokens:       a.Transactions,
		Logger:       a.log,
		Telemetry:    a.tel,

		RequestsPerSecond:       a.cfg.RequestsPerSecond,
		RequestBurst:            a.cfg.RequestBurst,
		MaxInFlightPerPrincipal: a.cfg.MaxInFlightPerPrincipal,
		MaxStreamsPerPrincipal:  maxStreams,
		// An in-band challenge is the first half of a verified call: it
		// gets the task creation rate, counted apart.
		Rates:               a.Rates,
		ChallengesPerMinute: a.cfg.RatePerMinute,
		ChallengeBurst:      a.cfg.RateBurst,
	})
	if err != nil {
		return fmt.Errorf("mcp endpoint: %w", err)
	}
	siteOpts := web.Options{
		PublicURL: a.cfg.PublicURL,
		Approvals: a.Approvals,
		Passkeys:  a.Passkeys,
		Tokens:    a.Tokens,
		Audit:     a.Audit,
		Rates:     a.Rates,
		Logger:    a.log,
	}
	if a.Transactions != nil {
		siteOpts.Transactions = tokenIssuer{tools: a.Tools, svc: a.Transactions}
	}
	site, err := web.New(siteOpts)
	if err != nil {
		return fmt.Errorf("approver site: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", a.tel.ExtractHTTP(mcp.Handler()))
	if a.oauth != nil {
		for _, path := range a.oauth.MetadataPaths() {
			mux.Handle("GET "+path, a.oauth.MetadataHandler())
		}
	}
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.HandleFunc("GET /healthz", a.healthz)
	if err := a.mountNotify(ctx, mux); err != nil {
		return err
	}
	mux.Handle("/", site)
	bodies, err := httplimit.NewBodies(httplimit.Options{
		BodyTimeout:   a.cfg.BodyReadTimeout,
		MaxSlowBodies: a.cfg.MaxSlowBodies,
		Reject:        rejectRequest,
	})
	if err != nil {
		return err
	}
	ln := a.ln
	a.ln = nil // a.listener owns it now
	a.listener = netutil.LimitListener(ln, a.cfg.MaxConnections)
	bodyTimeout := a.cfg.BodyReadTimeout
	a.httpSrv = &http.Server{
		Handler:           bodies.Handler(mux),
		ReadHeaderTimeout: readHeaderTimeout,
		// A backstop for the guard's per-request body deadline. Read
		// deadlines do not cut responses: net/http clears the deadline once
		// the body has been read, before it watches for the client hanging
		// up (internal/httplimit's tests check a response streaming past it).
		ReadTimeout: readHeaderTimeout + bodyTimeout,
		IdleTimeout: idleTimeout,
		// No WriteTimeout: it would cut Streamable HTTP SSE streams.
	}
	// Notification streams last until the client leaves, and a wait for
	// a decision (--inline-wait, 2025-11-25 tasks/result) until the
	// task's approvers act; Shutdown waits for handlers to return, so it
	// ends them first.
	a.httpSrv.RegisterOnShutdown(mcp.CloseStreams)
	a.httpSrv.RegisterOnShutdown(mcp.EndWaits)
	if !a.cfg.Conformance {
		// Requests authenticate anew; a notification stream opened with
		// a token that is then disabled or revoked is ended here.
		wctx, cancel := context.WithCancel(context.Background())
		a.stopWatch = cancel
		if err := a.Tokens.WatchInactive(wctx, func(p authn.Principal) {
			if p.Kind == authn.KindAgent || p.Kind == authn.KindOAuth {
				mcp.EndStreams(p.Name)
			}
		}); err != nil {
			return err
		}
	}
	return nil
}

// HTTP server timeouts: a client has this long to send its request headers,
// and an idle keep-alive connection is closed after idleTimeout.
const (
	readHeaderTimeout = 5 * time.Second
	idleTimeout       = 30 * time.Second
)

// rejectRequest answers a request the body guard refused, in the shape of
// the endpoint it was for: JSON-RPC on /mcp, the API's {"error", "message"}
// elsewhere.
func rejectRequest(w http.ResponseWriter, r *http.Request, status int, message string) {
	if r.URL.Path == "/mcp" {
		mcpserver.WriteHTTPError(w, status, message)
		return
	}
	httplimit.WriteJSONError(w, r, status, message)
}

// Addr is the bound HTTP address (useful with port 0).
func (a *App) Addr() string {
	if a.listener == nil {
		return ""
	}
	return a.listener.Addr().String()
}

// Run serves until ctx ends, then shuts down cleanly: /readyz answers 503
// ("shutting down") at once, HTTP keeps serving for Config.ShutdownDelay,
// then Shutdown has ShutdownTimeout to finish.
func (a *App) Run(ctx context.Context) error {
	errc := make(chan error, 2)
	if a.httpSrv != nil {
		go func() { errc <- a.httpSrv.Serve(a.listener) }()
	}
	if a.opsSrv != nil {
		go func() { errc <- a.opsSrv.Serve(a.opsListener) }()
	}
	served := func(err error) error {
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		a.Shutdown(context.Background())
		return fmt.Errorf("http: %w", err)
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		if err := served(err); err != nil {
			return err
		}
	}
	// Not ready from now on, but still serving for the delay: the
	// requests a load balancer routes here until it sees that are
	// answered, not refused.
	a.stopping.Store(true)
	if d := a.cfg.ShutdownDelay; d > 0 && !a.closed.Load() {
		a.log.Info("app: stopping: /readyz answers 503, serving on until the delay ends", "delay", d)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case err := <-errc:
			t.Stop()
			if err := served(err); err != nil {
				return err
			}
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	return a.Shutdown(sctx)
}

// Shutdown stops everything in reverse order of start. It is idempotent.
func (a *App) Shutdown(ctx context.Context) error {
	if !a.closed.CompareAndSwap(false, true) {
		return nil
	}
	var errs []error
	if a.stopWatch != nil {
		a.stopWatch()
	}
	if a.stopBG != nil {
		a.stopBG()
		a.bg.Wait()
	}
	if a.httpSrv != nil {
		if err := a.httpSrv.Shutdown(ctx); err != nil {
			errs = append(errs, err)
		}
	} else if a.listener != nil {
		a.listener.Close()
	}
	if a.ln != nil {
		a.ln.Close()
	}
	if a.opsSrv != nil {
		if err := a.opsSrv.Shutdown(ctx); err != nil {
			errs = append(errs, err)
		}
	} else if a.opsListener != nil {
		a.opsListener.Close()
	}
	if a.decide != nil {
		a.decide.Close()
	}
	if a.Approvals != nil {
		// The doors are closed: the workflow starts they left in flight
		// finish before the Temporal client goes.
		if err := a.Approvals.Drain(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if a.worker != nil {
		a.worker.Stop()
	}
	// After the worker: a call in flight finishes or ends with its upstream.
	a.closeUpstreams()
	if a.tc != nil {
		a.tc.Close()
	}
	if a.temporal != nil {
		if err := a.temporal.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if a.nc != nil {
		if err := a.nc.Drain(); err != nil {
			a.nc.Close()
		}
	}
	if a.nats != nil {
		a.nats.Shutdown()
	}
	if a.tel != nil {
		if err := a.tel.Tracing.Shutdown(ctx); err != nil {
			a.log.Warn("app: trace export at shutdown", "err", err)
		}
	}
	return errors.Join(errs...)
}

// embeddedLogger is the logger of the embedded Temporal server: its warnings
// and errors are about its own internals (ports, membership, shards) and
// would bury Countersign's console, so they show only at --log-level debug.
// Countersign's own errors about Temporal (the client's) always show.
func embeddedLogger(ctx context.Context, log *slog.Logger) *slog.Logger {
	if log.Enabled(ctx, slog.LevelDebug) {
		return log.With("component", "embedded-temporal")
	}
	return nil
}

// bootstrapDev creates the dev agent and admin tokens on first start, saves
// them in the data dir, and prints how to use them.
func (a *App) bootstrapDev(ctx context.Context) error {
	agent, err := a.ensureToken(ctx, AgentTokenFile, DevAgentName, authn.KindAgent)
	if err != nil {
		return err
	}
	admin, err := a.ensureToken(ctx, AdminTokenFile, "admin", authn.KindAdmin)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(a.cfg.DataDir, URLFile), []byte(a.cfg.PublicURL+"\n"), 0o600); err != nil {
		return err
	}
	fmt.Fprintf(a.out, `Countersign dev is ready.
  MCP endpoint   %[1]s/mcp   (Authorization: Bearer <agent token>)
  Approver site  %[1]s/
  Agent token    %[2]s   (saved in %[4]s)
  Admin token    %[3]s   (saved in %[5]s)
  Data           %[6]s
Add an approver:  countersign approvers add alice --group approvers --data-dir %[6]s
`, a.cfg.PublicURL, agent, admin,
		filepath.Join(a.cfg.DataDir, AgentTokenFile), filepath.Join(a.cfg.DataDir, AdminTokenFile), a.cfg.DataDir)
	if a.nats != nil {
		fmt.Fprintf(a.out, "NATS events and decisions:  %s   (user and password in %s)\n",
			a.nats.Addr(), filepath.Join(a.cfg.DataDir, NATSURLFile))
	}
	return nil
}

func (a *App) ensureToken(ctx context.Context, file, name, kind string) (string, error) {
	p := filepath.Join(a.cfg.DataDir, file)
	if b, err := os.ReadFile(p); err == nil {
		tok := strings.TrimSpace(string(b))
		if _, err := a.Tokens.Lookup(ctx, tok); err == nil {
			return tok, nil
		}
		// The file outlived the store (data wiped by hand): register it again.
		if err := a.Tokens.Register(ctx, tok, name, kind); err != nil && !errors.Is(err, authn.ErrNameTaken) {
			return "", err
		}
		return tok, nil
	}
	tok := authn.NewToken(kind)
	if err := os.WriteFile(p, []byte(tok+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", p, err)
	}
	if kind == authn.KindAgent {
		// Every agent's creation is recorded before its token is
		// stored, as the admin API does (web.addAgent).
		if _, _, err := web.RecordAgentCreated(ctx, a.Audit, name, "server:dev"); err != nil {
			return "", err
		}
	}
	if err := a.Tokens.Register(ctx, tok, name, kind); err != nil {
		return "", err
	}
	return tok, nil
}

// Config returns the effective configuration.
func (a *App) Config() *Config { return &a.cfg }

// Temporal is the process's Temporal client (benchmarks start baseline
// workflows on it; tests read workflow histories through it: in dev mode
// the embedded server talks only to this process).
func (a *App) Temporal() client.Client { return a.tc }

// startNotify opens the outbound channels: NATS events always (on the
// embedded or external NATS), Slack when a token is configured.
func (a *App) startNotify(ctx context.Context, js jetstream.JetStream) error {
	a.js = js
	var err error
	if a.events, err = notify.NewEvents(ctx, js, notify.EventsOptions{Replicas: a.cfg.NATSReplicas}); err != nil {
		return err
	}
	if a.cfg.SlackToken == "" {
		return nil
	}
	a.slack, err = notify.NewSlack(ctx, js, notify.SlackOptions{
		Token:          a.cfg.SlackToken,
		DefaultChannel: a.cfg.SlackChannel,
		DenyButton:     a.cfg.SlackSigningSecret != "",
		APIURL:         a.cfg.SlackAPIURL,
		Replicas:       a.cfg.NATSReplicas,
		Logger:         a.log,
	})
	if err != nil {
		return fmt.Errorf("slack: %w", err)
	}
	return nil
}

// notifier composes the console (the approval link of every new task), the
// NATS events and, when configured, Slack. A failing channel does not keep
// the others from being told.
func (a *App) notifier() activities.Notifier {
	f := &activities.Fanout{
		Notifiers: []activities.Notifier{activities.ConsoleNotifier{W: a.out}, a.events},
		Names:     []string{"console", "nats"},
		Logger:    a.log,
	}
	if a.slack != nil {
		f.Notifiers = append(f.Notifiers, a.slack)
		f.Names = append(f.Names, "slack")
	}
	return f
}

// mountNotify starts the NATS decision service over the approvals service and,
// with Slack on, mounts the Slack interactivity endpoint and the admin
// endpoint that links a Slack user to an approver.
func (a *App) mountNotify(ctx context.Context, mux *http.ServeMux) error {
	var err error
	if a.decide, err = notify.NewDecisionService(a.nc, notify.DecisionOptions{Approvals: a.Approvals, Logger: a.log}); err != nil {
		return err
	}
	if a.slack == nil {
		return nil
	}
	users, err := notify.NewSlackUsers(ctx, a.js, notify.SlackUsersOptions{Passkeys: a.Passkeys, Audit: a.Audit, Replicas: a.cfg.NATSReplicas, Logger: a.log})
	if err != nil {
		return err
	}
	mux.Handle("POST /admin/v1/approvers/{id}/slack", users.LinkHandler(a.Tokens.Admin))
	mux.Handle("DELETE /admin/v1/approvers/{id}/slack/{slackUserId}", users.UnlinkHandler(a.Tokens.Admin))
	if a.cfg.SlackSigningSecret == "" {
		return nil
	}
	in, err := notify.NewInteractions(ctx, a.js, notify.InteractionsOptions{
		SigningSecret: a.cfg.SlackSigningSecret,
		Slack:         a.slack,
		Users:         users,
		Approvals:     a.Approvals,
		Replicas:      a.cfg.NATSReplicas,
		Logger:        a.log,
	})
	if err != nil {
		return err
	}
	mux.Handle("/slack/interactivity", in)
	return nil
}

func (a *App) natsConnected() bool { return a.nc != nil && a.nc.Status() == nats.CONNECTED }

// NATSURL is the URL clients of the events and the decision service use:
// with embedded NATS, the URL with the client user's credentials (also in
// DataDir/nats-url); otherwise the URL the process is connected to.
func (a *App) NATSURL() string {
	if a.nats != nil {
		return a.nats.ClientURL()
	}
	return a.nc.ConnectedUrl()
}

// writeSecretFile writes a file only its owner can read, replacing any
// earlier one (whose mode might have been wider) atomically.
func writeSecretFile(path, content string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.WriteString(content); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// oauthAgents adapts the OAuth verifier to mcpserver.OAuth: the principal
// is "oauth:" and the token's principal claim (oauth.Identity), which no
// static agent name can be; the subject properties are what policy sees of
// the token (oauth.Verifier.Properties). A principal an admin disabled or
// revoked here (authn.Tokens.SetOAuthStatus) is refused whatever its token.
type oauthAgents struct {
	v      *oauth.Verifier
	tokens *authn.Tokens
}

func (o oauthAgents) Claims(token string) bool { return o.v.Claims(token) }

// Challenge is the OAuth challenge; a disabled agent's static token
// (authn.ErrDisabled) is told, as a disabled OAuth principal is, why.
func (o oauthAgents) Challenge(err error) (int, string) {
	if errors.Is(err, authn.ErrDisabled) {
		err = &oauth.Error{Code: oauth.CodeInvalidToken, Description: "this agent is disabled at Countersign"}
	}
	return o.v.Challenge(err)
}

func (o oauthAgents) Authenticate(ctx context.Context, token string) (string, map[string]any, error) {
	id, err := o.v.Verify(ctx, token, time.Now())
	if errors.Is(err, oauth.ErrUnavailable) {
		return "", nil, fmt.Errorf("%w: %w", mcpserver.ErrAuthUnavailable, err)
	}
	if err != nil {
		return "", nil, err
	}
	switch err := o.tokens.OAuthActive(ctx, id.Principal); {
	case errors.Is(err, authn.ErrPrincipalInactive):
		return "", nil, &oauth.Error{Code: oauth.CodeInvalidToken, Description: "this principal is disabled at Countersign"}
	case err != nil:
		return "", nil, fmt.Errorf("%w: %w", mcpserver.ErrAuthUnavailable, err)
	}
	return id.Principal, o.v.Properties(id), nil
}
