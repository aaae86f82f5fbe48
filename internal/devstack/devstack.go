package devstack

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/server/common/authorization"
	"go.temporal.io/server/common/cluster"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/dynamicconfig"
	"go.temporal.io/server/common/membership/static"
	sqliteplugin "go.temporal.io/server/common/persistence/sql/sqlplugin/sqlite"
	"go.temporal.io/server/common/primitives"
	"go.temporal.io/server/temporal"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

const (
	dbFile           = "temporal.db"
	clusterName      = "active"
	defaultNamespace = "default"
	defaultHost      = "127.0.0.1"
	loopback         = "127.0.0.1"
	// defaultStartTimeout bounds Start when ctx has no deadline.
	defaultStartTimeout = 2 * time.Minute
)

// Synchronous settings for the SQLite file. See the package doc.
const (
	SynchronousFull   = "FULL"
	SynchronousNormal = "NORMAL"
)

var (
	// ErrInvalidOptions wraps every Options validation failure.
	ErrInvalidOptions = errors.New("devstack: invalid options")
	// ErrPortInUse means a port the server must listen on is taken; for the
	// frontend port this usually means another server runs on the same
	// DataDir.
	ErrPortInUse = errors.New("devstack: port in use")
	// ErrDataDirInUse means another server holds the DataDir.
	ErrDataDirInUse = errors.New("devstack: data dir in use by another server")
)

// Options configures the embedded server. Only DataDir is required.
type Options struct {
	// DataDir holds temporal.db and ports.json. It is created with mode 0700
	// if missing.
	DataDir string
	// Namespace is registered on first start with 7 days of retention.
	// Default "default".
	Namespace string
	// Host is the frontend's listen address. Default 127.0.0.1. History,
	// matching and worker always listen on 127.0.0.1.
	Host string
	// FrontendPort is the frontend's gRPC port. 0 reuses the port from
	// DataDir/ports.json, or picks a free one on first start. All four ports
	// are kept in ports.json and reused on restart.
	FrontendPort int
	// Synchronous is SQLite's synchronous pragma: "FULL" (default, durable
	// against power loss) or "NORMAL" (durable against a process crash only).
	// journal_mode is always WAL.
	Synchronous string
	// Logger receives Temporal's warnings and errors. Nil discards them.
	Logger *slog.Logger
}

// Server is a running embedded Temporal server.
type Server struct {
	srv       temporal.Server
	hostPort  string
	pki       *devPKI
	namespace string
	quiet     *atomic.Bool // see serverLogger
	unlock    func()       // releases the DataDir lock

	stopOnce sync.Once
	stopErr  error
}

// Start starts the server and returns once the frontend answers, the
// namespace exists and history serves requests.
func Start(ctx context.Context, opts Options) (*Server, error) {
	// The ports of a first start are picked free and bound a moment later:
	// another process can take one in between. Such a start is retried with
	// fresh ports; a data dir that already had its ports keeps them.
	fresh := false
	if opts.DataDir != "" && opts.FrontendPort == 0 {
		_, err := os.Stat(filepath.Join(opts.DataDir, portsFile))
		fresh = errors.Is(err, fs.ErrNotExist)
	}
	for attempt := 1; ; attempt++ {
		s, err := start(ctx, opts)
		if err == nil || !fresh || attempt == 3 || !strings.Contains(err.Error(), "Failed to start gRPC listener") {
			return s, err
		}
		if opts.Logger != nil {
			opts.Logger.Warn("devstack: a port was taken while starting; retrying with fresh ports", "attempt", attempt, "err", err)
		}
		if rerr := os.Remove(filepath.Join(opts.DataDir, portsFile)); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			return nil, err
		}
	}
}

// portsChosen, when set (tests), runs between choosing the ports and binding
// them: where another process can take one.
var portsChosen func(ports)

func start(ctx context.Context, opts Options) (_ *Server, err error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	unlock := func() {}
	defer func() {
		// serverLogger panics on Temporal's Fatal; one raised on this
		// goroutine (say, a bad config found while building the server)
		// becomes an error.
		if r := recover(); r != nil {
			err = fmt.Errorf("devstack: start server: %v", r)
		}
		if err != nil {
			unlock()
		}
	}()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultStartTimeout)
		defer cancel()
	}
	logger := o.Logger

	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("devstack: create data dir: %w", err)
	}
	release, err := lockDataDir(o.DataDir)
	if err != nil {
		return nil, err
	}
	unlock = release
	p, err := choosePorts(o)
	if err != nil {
		return nil, err
	}
	if portsChosen != nil {
		portsChosen(p)
	}

	dbPath := filepath.Join(o.DataDir, dbFile)
	created, err := ensureSchema(ctx, dbPath, o.Synchronous)
	if err != nil {
		return nil, err
	}
	if created {
		logger.Info("created temporal schema", "path", dbPath)
	}
	sqlCfg := sqlConfig(dbPath, o.Synchronous)
	if err := registerNamespace(sqlCfg, clusterName, o.Namespace); err != nil {
		return nil, err
	}

	dialHost := o.Host
	if ip := net.ParseIP(o.Host); ip != nil && ip.IsUnspecified() {
		dialHost = loopback
	}
	hostPort := net.JoinHostPort(dialHost, strconv.Itoa(p.Frontend))
	pki, err := newDevPKI(certIPs(o.Host))
	if err != nil {
		return nil, err
	}
	cfg := serverConfig(o.Host, hostPort, p, sqlCfg)
	quiet := new(atomic.Bool)
	quiet.Store(true)
	tl := newServerLogger(logger, quiet)
	authorizer, err := authorization.GetAuthorizerFromConfig(&cfg.Global.Authorization)
	if err != nil {
		return nil, fmt.Errorf("devstack: authorizer: %w", err)
	}
	claimMapper, err := authorization.GetClaimMapperFromConfig(&cfg.Global.Authorization, tl)
	if err != nil {
		return nil, fmt.Errorf("devstack: claim mapper: %w", err)
	}

	srv, err := temporal.NewServer(
		temporal.WithConfig(cfg),
		temporal.ForServices(temporal.DefaultServices),
		temporal.WithStaticHosts(map[primitives.ServiceName]static.Hosts{
			primitives.FrontendService: static.SingleLocalHost(hostPort),
			primitives.HistoryService:  static.SingleLocalHost(net.JoinHostPort(loopback, strconv.Itoa(p.History))),
			primitives.MatchingService: static.SingleLocalHost(net.JoinHostPort(loopback, strconv.Itoa(p.Matching))),
			primitives.WorkerService:   static.SingleLocalHost(net.JoinHostPort(loopback, strconv.Itoa(p.Worker))),
		}),
		temporal.WithLogger(tl),
		temporal.WithTLSConfigFactory(pki.provider(dialHost)),
		temporal.WithAuthorizer(authorizer),
		temporal.WithClaimMapper(func(*config.Config) authorization.ClaimMapper { return claimMapper }),
		temporal.WithDynamicConfigClient(dynamicConfig()),
	)
	if err != nil {
		return nil, fmt.Errorf("devstack: create server: %w", err)
	}
	s := &Server{srv: srv, hostPort: hostPort, pki: pki, namespace: o.Namespace, quiet: quiet, unlock: func() {}}
	if err := srv.Start(); err != nil {
		_ = s.Stop()
		return nil, fmt.Errorf("devstack: start server: %w", err)
	}
	if err := waitReady(ctx, hostPort, o.Namespace, pki.clientConfig()); err != nil {
		_ = s.Stop()
		return nil, err
	}
	s.unlock = unlock
	quiet.Store(false)
	return s, nil
}

// FrontendHostPort is the address clients dial, e.g. "127.0.0.1:7233".
func (s *Server) FrontendHostPort() string { return s.hostPort }

// ClientTLS is the TLS configuration clients of this server must use: every
// port requires its client certificate, which exists only in this process's
// memory (a new CA at every Start). Each call returns a new *tls.Config.
func (s *Server) ClientTLS() *tls.Config { return s.pki.clientConfig() }

// ClientPEM is what ClientTLS holds, as PEM for a client configured by
// files (the Temporal CLI, a Countersign process with --temporal-tls-*):
// the CA to trust, and a client certificate (valid 24 hours) and its key.
// The name to verify is TLSServerName. Keep the key private: it opens the
// server.
func (s *Server) ClientPEM() (ca, cert, key []byte, err error) { return s.pki.clientPEM() }

// Namespace is the namespace registered for this server.
func (s *Server) Namespace() string { return s.namespace }

// Stop stops all services. It is safe to call more than once; later calls
// return the first call's result.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		s.quiet.Store(true)
		if err := s.srv.Stop(); err != nil {
			s.stopErr = fmt.Errorf("devstack: stop: %w", err)
		}
		s.unlock()
	})
	return s.stopErr
}

func (o Options) withDefaults() (Options, error) {
	if o.DataDir == "" {
		return o, fmt.Errorf("%w: DataDir is required", ErrInvalidOptions)
	}
	abs, err := filepath.Abs(o.DataDir)
	if err != nil {
		return o, fmt.Errorf("%w: DataDir: %w", ErrInvalidOptions, err)
	}
	o.DataDir = abs
	if o.Namespace == "" {
		o.Namespace = defaultNamespace
	}
	switch {
	case o.Host == "":
		o.Host = defaultHost
	case o.Host == "localhost":
		o.Host = loopback
	case net.ParseIP(o.Host) == nil:
		return o, fmt.Errorf("%w: Host %q is not an IP address", ErrInvalidOptions, o.Host)
	}
	if o.FrontendPort < 0 || o.FrontendPort > 65535 {
		return o, fmt.Errorf("%w: FrontendPort %d", ErrInvalidOptions, o.FrontendPort)
	}
	switch strings.ToUpper(o.Synchronous) {
	case "", SynchronousFull:
		o.Synchronous = SynchronousFull
	case SynchronousNormal:
		o.Synchronous = SynchronousNormal
	default:
		return o, fmt.Errorf("%w: Synchronous %q (want FULL or NORMAL)", ErrInvalidOptions, o.Synchronous)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// choosePorts resolves the four ports, makes sure they can be bound and
// persists them. A taken frontend port is an error (another server probably
// runs on this DataDir); a taken internal port is replaced, since nothing
// outside the process dials it.
func choosePorts(o Options) (ports, error) {
	p, changed, err := resolvePorts(o.DataDir, o.FrontendPort)
	if err != nil {
		return ports{}, err
	}
	if err := checkBindable(o.Host, p.Frontend, "frontend"); err != nil {
		return ports{}, err
	}
	for _, sp := range []struct {
		name string
		port *int
	}{{"history", &p.History}, {"matching", &p.Matching}, {"worker", &p.Worker}} {
		if checkBindable(loopback, *sp.port, sp.name) == nil {
			continue
		}
		handedOut.Lock()
		free, err := freePort()
		handedOut.Unlock()
		if err != nil {
			return ports{}, err
		}
		o.Logger.Warn("temporal port taken, using another", "service", sp.name, "old_port", *sp.port, "port", free)
		*sp.port = free
		changed = true
	}
	if changed {
		if err := savePorts(o.DataDir, p); err != nil {
			return ports{}, err
		}
	}
	return p, nil
}

func serverConfig(frontendIP, hostPort string, p ports, sqlCfg *config.SQL) *config.Config {
	service := func(ip string, port int) config.Service {
		// MembershipPort stays 0: static hosts replace ringpop. HTTPPort 0
		// disables the frontend's HTTP API.
		return config.Service{RPC: config.RPC{GRPCPort: port, BindOnIP: ip}}
	}
	cfg := &config.Config{
		Persistence: config.Persistence{
			DefaultStore:     sqliteplugin.PluginName,
			VisibilityStore:  sqliteplugin.PluginName,
			NumHistoryShards: 1,
			DataStores:       map[string]config.DataStore{sqliteplugin.PluginName: {SQL: sqlCfg}},
		},
		ClusterMetadata: &cluster.Config{
			EnableGlobalNamespace:    false,
			FailoverVersionIncrement: 10,
			MasterClusterName:        clusterName,
			CurrentClusterName:       clusterName,
			ClusterInformation: map[string]cluster.ClusterInformation{
				clusterName: {Enabled: true, InitialFailoverVersion: 1, RPCAddress: hostPort},
			},
		},
		DCRedirectionPolicy: config.DCRedirectionPolicy{Policy: "noop"},
		Services: map[string]config.Service{
			string(primitives.FrontendService): service(frontendIP, p.Frontend),
			string(primitives.HistoryService):  service(loopback, p.History),
			string(primitives.MatchingService): service(loopback, p.Matching),
			string(primitives.WorkerService):   service(loopback, p.Worker),
		},
		// The worker service dials the frontend through this.
		PublicClient: config.PublicClient{HostPort: hostPort},
	}
	// Global.Metrics nil means a no-op metrics handler, and PProf.Port 0 means
	// no pprof listener.
	cfg.Global.Membership = config.Membership{MaxJoinDuration: 30 * time.Second, BroadcastAddress: loopback}
	cfg.Archival.History.State = "disabled"
	cfg.Archival.Visibility.State = "disabled"
	cfg.NamespaceDefaults.Archival.History.State = "disabled"
	cfg.NamespaceDefaults.Archival.Visibility.State = "disabled"
	return cfg
}

// certIPs are the IP addresses in the server certificate: loopback, and the
// frontend's listen address when it is a specific one.
func certIPs(host string) []net.IP {
	ips := []net.IP{net.ParseIP(loopback), net.IPv6loopback}
	if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() && !ip.IsLoopback() {
		ips = append(ips, ip)
	}
	return ips
}

// historyCacheSize bounds the history service's host-level mutable-state
// cache, in workflows. A workflow out of the cache is read from SQLite when
// it is next touched (a decision, its expiry).
const historyCacheSize = 2000

// dynamicConfig is the tuning described in the package doc.
func dynamicConfig() dynamicconfig.StaticClient {
	const pollRPS = 1000
	return dynamicconfig.StaticClient{
		dynamicconfig.TransferProcessorMaxPollRPS.Key():         pollRPS,
		dynamicconfig.TimerProcessorMaxPollRPS.Key():            pollRPS,
		dynamicconfig.VisibilityProcessorMaxPollRPS.Key():       pollRPS,
		dynamicconfig.OutboundProcessorMaxPollRPS.Key():         pollRPS,
		dynamicconfig.MatchingNumTaskqueueReadPartitions.Key():  1,
		dynamicconfig.MatchingNumTaskqueueWritePartitions.Key(): 1,
		dynamicconfig.EnableEagerWorkflowStart.Key():            true,
		// Activities scheduled by a workflow task come back in the answer
		// to its completion, once it has committed: the workflows' outbox
		// (a regular activity) lands without a trip through matching.
		dynamicconfig.EnableActivityEagerExecution.Key():                       true,
		dynamicconfig.FrontendEnableUpdateWorkflowExecution.Key():              true,
		dynamicconfig.FrontendEnableUpdateWorkflowExecutionAsyncAccepted.Key(): true,
		// The history service caches the mutable state of every workflow
		// it touched, up to 128,000 by default: a process holding
		// thousands of pending approvals kept them all in memory.
		dynamicconfig.HistoryCacheHostLevelMaxSize.Key(): historyCacheSize,
	}
}

// waitReady polls until the frontend answers DescribeNamespace and history
// answers for a workflow that does not exist (NotFound means the shard is
// owned and serving).
func waitReady(ctx context.Context, hostPort, namespace string, tlsCfg *tls.Config) error {
	conn, err := grpc.NewClient(hostPort, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		return fmt.Errorf("devstack: dial frontend: %w", err)
	}
	defer conn.Close()
	wf := workflowservice.NewWorkflowServiceClient(conn)

	probe := func() error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if _, err := wf.DescribeNamespace(cctx, &workflowservice.DescribeNamespaceRequest{Namespace: namespace}); err != nil {
			return err
		}
		_, err := wf.DescribeWorkflowExecution(cctx, &workflowservice.DescribeWorkflowExecutionRequest{
			Namespace: namespace,
			Execution: &commonpb.WorkflowExecution{WorkflowId: "devstack-readiness-probe"},
		})
		if err == nil || status.Code(err) == codes.NotFound {
			return nil
		}
		return err
	}

	delay := 10 * time.Millisecond
	for {
		err := probe()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("devstack: server not ready: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 250*time.Millisecond)
	}
}
