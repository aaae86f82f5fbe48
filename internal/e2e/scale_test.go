package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/descope/virtualwebauthn"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/devstack"
	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/workflows"
)

// scaleInfraEnv makes TestScaleInfraProcess run the external services of
// TestSplitRolesAtScale in the directory it names.
const scaleInfraEnv = "COUNTERSIGN_SCALE_INFRA"

// Files the infrastructure process writes to its directory.
const (
	scaleInfraReady  = "infra.json" // scaleInfra, written last
	scaleNATSSeed    = "nats.nk"    // the NATS user's nkey seed
	scaleTemporalCA  = "temporal-ca.pem"
	scaleTemporalCrt = "temporal-client.pem"
	scaleTemporalKey = "temporal-client.key"
)

// scaleInfra is where the external services listen.
type scaleInfra struct {
	NATSURL         string `json:"natsUrl"`
	TemporalAddress string `json:"temporalAddress"`
}

// TestScaleInfraProcess is not a test: TestSplitRolesAtScale runs this test
// binary again with scaleInfraEnv set, and this function then runs what a
// production deployment has outside Countersign, until its stdin closes:
//
//   - one NATS server with JetStream on a loopback port that admits one
//     user, by nkey (the seed is written to the directory, as an operator
//     hands a seed file to the deployment: --nats-nkey);
//   - one Temporal: the embedded server of internal/devstack (SQLite), which
//     serves only mutual TLS; its CA, and a client certificate and key, are
//     written to the directory, as an operator's PKI hands them out
//     (--temporal-tls-ca, --temporal-tls-cert, --temporal-tls-key).
func TestScaleInfraProcess(t *testing.T) {
	dir := os.Getenv(scaleInfraEnv)
	if dir == "" {
		t.Skip("helper process of TestSplitRolesAtScale")
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := user.Seed()
	pub, _ := user.PublicKey()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: filepath.Join(dir, "nats"), NoLog: true, NoSigs: true, MaxPayload: 8 << 20,
		Nkeys: []*server.NkeyUser{{Nkey: pub}}})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(30 * time.Second) {
		t.Fatal("NATS not ready")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	ts, err := devstack.Start(ctx, devstack.Options{DataDir: filepath.Join(dir, "temporal"), Synchronous: "NORMAL"})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer ts.Stop()
	ca, cert, key, err := ts.ClientPEM()
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{scaleNATSSeed: seed, scaleTemporalCA: ca, scaleTemporalCrt: cert, scaleTemporalKey: key} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := json.Marshal(scaleInfra{NATSURL: ns.ClientURL(), TemporalAddress: ts.FrontendHostPort()})
	if err := os.WriteFile(filepath.Join(dir, scaleInfraReady+".tmp"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, scaleInfraReady+".tmp"), filepath.Join(dir, scaleInfraReady)); err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, os.Stdin) // until the parent hangs up
}

// countersignBinary builds cmd/countersign once for the test (or returns
// COUNTERSIGN_BIN).
func countersignBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("COUNTERSIGN_BIN"); bin != "" {
		return bin
	}
	out := filepath.Join(t.TempDir(), "countersign")
	began := time.Now()
	cmd := exec.Command("go", "build", "-o", out, "github.com/countersign/countersign/cmd/countersign")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build cmd/countersign: %v\n%s", err, b)
	}
	t.Logf("built countersign in %v", time.Since(began).Round(time.Millisecond))
	return out
}

// scaleProc is a child process of the scale test.
type scaleProc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	log   string
}

// startScaleProc starts cmd, its output to a log file named after name, and
// waits (3 minutes at most) until ready() holds.
func startScaleProc(t *testing.T, name string, cmd *exec.Cmd, ready func() bool) (*scaleProc, error) {
	lf, err := os.CreateTemp(t.TempDir(), name+"-*.log")
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &scaleProc{name: name, cmd: cmd, stdin: stdin, done: make(chan struct{}), log: lf.Name()}
	go func() { cmd.Wait(); lf.Close(); close(p.done) }()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited while starting (%v):\n%s", name, cmd.ProcessState, p.tail())
		default:
		}
		if ready() {
			return p, nil
		}
		if time.Now().After(deadline) {
			p.kill()
			return nil, fmt.Errorf("%s not ready after 3m:\n%s", name, p.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *scaleProc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// kill is kill -9.
func (p *scaleProc) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop asks the process to end (SIGTERM, and stdin closed for the
// infrastructure process) and kills it after 30 s.
func (p *scaleProc) stop() {
	p.stdin.Close()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.kill()
	}
}

// splitDeployment is NATS and Temporal, and the `countersign server`s and
// `countersign worker`s that share them.
type splitDeployment struct {
	t       *testing.T
	bin     string
	dir     string
	infra   scaleInfra
	env     []string // the settings every role shares, as environment variables
	keyDir  string
	pubKeys string // the audit public keys (PEM)
	admin   string // admin token file
	agent   string
	public  string
	ports   []int // servers' --addr
	mports  []int // workers' --metrics-addr
	hc      *http.Client

	mu      sync.Mutex
	servers []*scaleProc
	workers []*scaleProc

	approver *devtest.Approver
}

// scaleEnv is the environment of the child processes: this process's,
// without any setting of Countersign, NATS, Temporal or OpenTelemetry.
func scaleEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "COUNTERSIGN_") && !strings.HasPrefix(name, "NATS_") &&
			!strings.HasPrefix(name, "TEMPORAL_") && !strings.HasPrefix(name, "OTEL_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// cli runs a countersign command (not a service) and returns its output.
func (d *splitDeployment) cli(env []string, args ...string) (string, error) {
	cmd := exec.Command(d.bin, args...)
	cmd.Env = scaleEnv(env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("countersign %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errOut.String())
	}
	return out.String(), nil
}

// startSplitDeployment starts the infrastructure, prepares what an operator
// prepares (audit signing keys, the first admin token, an agent token, an
// approver with a passkey), and starts nServers servers and nWorkers
// workers, with the commands and flags of the README's Production section.
func startSplitDeployment(t *testing.T, nServers, nWorkers int) *splitDeployment {
	d := &splitDeployment{t: t, bin: countersignBinary(t), dir: t.TempDir(),
		hc: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	infraDir := filepath.Join(d.dir, "infra")
	if err := os.MkdirAll(infraDir, 0o700); err != nil {
		t.Fatal(err)
	}
	infraCmd := exec.Command(os.Args[0], "-test.run=^TestScaleInfraProcess$", "-test.count=1", "-test.timeout=0")
	infraCmd.Env = scaleEnv(scaleInfraEnv + "=" + infraDir)
	p, err := startScaleProc(t, "infra", infraCmd, func() bool {
		_, err := os.Stat(filepath.Join(infraDir, scaleInfraReady))
		return err == nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.stop)
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(infraDir, scaleInfraReady))), &d.infra); err != nil {
		t.Fatal(err)
	}

	// The audit signing key every worker (and server) signs with.
	d.keyDir = filepath.Join(d.dir, "audit-keys")
	out, err := d.cli(nil, "audit", "rotate-key", "--audit-key-dir", d.keyDir)
	if err != nil {
		t.Fatal(err)
	}
	_, pem, ok := strings.Cut(out, ":\n")
	if !ok || !strings.Contains(pem, "PUBLIC KEY") {
		t.Fatalf("audit rotate-key printed no public key: %q", out)
	}
	d.pubKeys = filepath.Join(d.dir, "audit-pub.pem")
	if err := os.WriteFile(d.pubKeys, []byte(pem), 0o644); err != nil {
		t.Fatal(err)
	}
	natsEnv := []string{"NATS_URL=" + d.infra.NATSURL, "NATS_NKEY=" + filepath.Join(infraDir, scaleNATSSeed)}
	// The first admin token, on the deployment's NATS.
	d.admin = filepath.Join(d.dir, "admin-token")
	if _, err := d.cli(natsEnv, "admin", "init", "--audit-key-dir", d.keyDir, "--out", d.admin); err != nil {
		t.Fatal(err)
	}

	// The demo tools (and their ledger in NATS) stand for the gated tools;
	// outside dev they are served only when the configuration file says so.
	// The limits are lifted: one agent makes every call.
	config := filepath.Join(d.dir, "countersign.yaml")
	if err := os.WriteFile(config, []byte(`demo_tools: true
limits:
  rate_per_minute: 1000000
  rate_burst: 1000000
  max_pending: 1000000
  requests_per_second: 1000000
  request_burst: 1000000
  max_in_flight: 1000000
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for range nServers {
		d.ports = append(d.ports, devtest.FreePort(t))
	}
	for range nWorkers {
		d.mports = append(d.mports, devtest.FreePort(t))
	}
	// One public URL for every server, as behind a load balancer: it is the
	// WebAuthn origin and the server ID bound into every action hash.
	d.public = fmt.Sprintf("http://localhost:%d", d.ports[0])
	// What every role shares, as a ConfigMap of environment variables would
	// give it (deploy/kubernetes); each process's own listen address and
	// data directory are flags.
	d.env = append(natsEnv,
		"TEMPORAL_ADDRESS="+d.infra.TemporalAddress,
		"TEMPORAL_TLS_CA_PATH="+filepath.Join(infraDir, scaleTemporalCA),
		"TEMPORAL_TLS_CERT_PATH="+filepath.Join(infraDir, scaleTemporalCrt),
		"TEMPORAL_TLS_KEY_PATH="+filepath.Join(infraDir, scaleTemporalKey),
		"COUNTERSIGN_PUBLIC_URL="+d.public,
		"COUNTERSIGN_CONFIG="+config,
		"COUNTERSIGN_AUDIT_KEY_DIR="+d.keyDir,
		"COUNTERSIGN_LOG_LEVEL=warn",
	)
	d.servers = make([]*scaleProc, nServers)
	d.workers = make([]*scaleProc, nWorkers)
	var wg sync.WaitGroup
	errs := make(chan error, nServers+nWorkers)
	for i := range nWorkers {
		wg.Go(func() { errs <- d.startRole("worker", i) })
	}
	for i := range nServers {
		wg.Go(func() { errs <- d.startRole("server", i) })
	}
	wg.Wait()
	close(errs)
	t.Cleanup(func() {
		for _, p := range append(slices.Clone(d.servers), d.workers...) {
			if p != nil {
				p.stop()
			}
		}
	})
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}

	// An agent token, made by the admin CLI through a server.
	out, err = d.cli([]string{"COUNTERSIGN_ADMIN_TOKEN_FILE=" + d.admin}, "agents", "add", "scale-agent", "--server", d.base(0))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	d.agent = strings.TrimSpace(lines[len(lines)-1])
	// An approver with a passkey, enrolled through the other server.
	s := &devtest.Stack{T: t, Base: d.public, AdminToken: strings.TrimSpace(readFile(t, d.admin))}
	d.approver = s.Enroll("alice", "approvers")
	return d
}

// startRole starts server or worker i (again), and waits until its /readyz
// answers 200 (a worker's on its operations listener).
func (d *splitDeployment) startRole(mode string, i int) error {
	args := []string{mode, "--data-dir", filepath.Join(d.dir, fmt.Sprintf("%s-%d", mode, i))}
	var probe string
	if mode == "server" {
		args = append(args, "--addr", fmt.Sprintf("127.0.0.1:%d", d.ports[i]))
		probe = d.base(i) + "/readyz"
	} else {
		args = append(args, "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", d.mports[i]))
		probe = fmt.Sprintf("http://127.0.0.1:%d/readyz", d.mports[i])
	}
	cmd := exec.Command(d.bin, args...)
	cmd.Env = scaleEnv(d.env...)
	hc := &http.Client{Timeout: 2 * time.Second}
	p, err := startScaleProc(d.t, fmt.Sprintf("%s-%d", mode, i), cmd, func() bool {
		resp, err := hc.Get(probe)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if mode == "server" {
		d.servers[i] = p
	} else {
		d.workers[i] = p
	}
	return nil
}

// base is server i's URL.
func (d *splitDeployment) base(i int) string {
	return fmt.Sprintf("http://127.0.0.1:%d", d.ports[i%len(d.ports)])
}

// scaleCall is one gated call of the run.
type scaleCall struct {
	i      int
	args   map[string]any
	taskID string
	ref    string
	body   []byte // the signed decision, posted again as it is when its answer is lost

	callServer  int // the server that answered the tools/call
	otherServer int // where the approval goes: the other one
	decider     int // the server that answered the decision accepted
	accepted    bool
	settled     bool
	failovers   int // requests sent to the other server than planned, after one failed

	callRTT, decideRTT time.Duration
	created, requested time.Time // the tools/call answered; the approval page first showed the request
	answers, problems  []string
}

// TestSplitRolesAtScale runs the production split as separate OS
// processes of the countersign binary (built by the test): one NATS and one
// Temporal (TestScaleInfraProcess; NATS authenticates by nkey, Temporal by
// mutual TLS), two `countersign server`s and two `countersign worker`s,
// configured with the flags, environment variables and configuration file
// of the README, and prepared with the operator's commands (`audit
// rotate-key`, `admin init`, `agents add`). It makes 300 gated calls
// (COUNTERSIGN_SCALE_CALLS; COUNTERSIGN_SCALE_CONCURRENCY at once, default
// 16) through both servers in parallel, each approved with a passkey posted
// to the server that did not take the call. It kill -9s one worker once a
// third of the approvals are accepted and one server at half, and starts
// each again at once. A client or approver whose server does not answer
// sends the same request to the other server. Then:
//
//   - every task reached exactly one terminal state, and tasks/get through
//     either server, tasks/list (the read model) and the verified audit
//     chain (exported and verified with the CLI) agree on it;
//   - the ledger holds exactly one effect per approved-executed task, and
//     none of a task that did not execute;
//   - no approval is lost: every call ends approved-executed, except an
//     honest outcome-unknown for a task the killed worker had claimed
//     before it died (the tool may or may not have run; the ledger holds at
//     most one effect). An approval answered accepted is in the chain.
//   - a task created by a tools/call whose answer died with its server (the
//     client then called again) is found by tasks/list and cancelled by the
//     agent, and is checked as the others;
//   - a task its server recorded but died before starting its workflow is
//     joined by the client's retry (SEP-2848 dedup), which starts it
//     (approvals resume): it is approved and runs like any other.
//
// How long the test waits for the tasks to end is what the code guarantees
// after a worker dies mid-activity: the activity's timeout (ExecuteTool's
// heartbeat timeout, workflows.DefaultExecuteHeartbeatTimeout; 30 s for
// the others), then a retry.
func TestSplitRolesAtScale(t *testing.T) {
	if os.Getenv(scaleInfraEnv) != "" {
		t.Skip("inside the helper process")
	}
	n := envIntDefault(t, "COUNTERSIGN_SCALE_CALLS", 300)
	conc := max(1, envIntDefault(t, "COUNTERSIGN_SCALE_CONCURRENCY", 16))
	began := time.Now()
	d := startSplitDeployment(t, 2, 2)
	t.Logf("deployment up in %v: NATS %s, Temporal %s, servers on %v, workers' operations on %v",
		time.Since(began).Round(time.Millisecond), d.infra.NATSURL, d.infra.TemporalAddress, d.ports, d.mports)

	nonce := fmt.Sprintf("%x", time.Now().UnixNano()%1e9)
	calls := make([]*scaleCall, n)
	for i := range calls {
		// Over 1,000: the default policy asks one approver.
		calls[i] = &scaleCall{i: i, args: map[string]any{"to": fmt.Sprintf("acct-scale-%s-%d", nonce, i), "amount": 1001 + i, "currency": "USD"}}
	}
	var accepted atomic.Int64
	var k scaleKills
	killer := make(chan error, 1)
	stopKiller := make(chan struct{})
	go func() { killer <- d.killAndRestart(&k, &accepted, int64(n), stopKiller) }()

	start := time.Now()
	work := make(chan *scaleCall)
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for c := range work {
				d.run(c, time.Now().Add(2*time.Minute))
				if c.accepted {
					accepted.Add(1)
				}
			}
		})
	}
	for _, c := range calls {
		work <- c
	}
	close(work)
	wg.Wait()
	driven := time.Since(start)
	close(stopKiller)
	if err := <-killer; err != nil {
		t.Fatalf("restarting a killed process: %v", err)
	}
	if k.workerKill.IsZero() || k.serverKill.IsZero() {
		t.Errorf("the run ended before both kills (worker killed: %v, server killed: %v)", !k.workerKill.IsZero(), !k.serverKill.IsZero())
	}
	// Calls that did not settle in their 2 minutes (a server down, a
	// worker's tasks waiting for their timeouts) go on.
	for _, c := range calls {
		if !c.settled {
			d.run(c, time.Now().Add(2*time.Minute))
		}
	}
	orphans := d.cancelOrphans(calls)
	// The longest a task can take to end after the worker kill: its
	// ExecuteTool attempt's heartbeat timeout (the binary's default), then
	// an activity the dead worker held timing out and retried (30 s
	// attempts), and the time this machine needs.
	bound := time.Now().Add(2 * time.Minute)
	if !k.workerKill.IsZero() {
		bound = later(bound, k.workerKill.Add(workflows.DefaultExecuteHeartbeatTimeout+2*time.Minute))
	}
	ended := d.waitEnded(calls, orphans, bound)
	res := d.judgeScale(calls, orphans, k.workerKill)
	d.report(calls, res, start, driven, ended, k)
}

// scaleKills is when the kills and restarts happened.
type scaleKills struct {
	workerKill, workerBack, serverKill, serverBack time.Time
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// killAndRestart kill -9s worker 0 once a third of the n approvals are
// accepted and server 1 at half, and starts each again at once.
func (d *splitDeployment) killAndRestart(k *scaleKills, accepted *atomic.Int64, n int64, stop chan struct{}) error {
	wait := func(until int64) bool {
		for accepted.Load() < until {
			select {
			case <-stop:
				return false
			case <-time.After(10 * time.Millisecond):
			}
		}
		return true
	}
	if !wait(n / 3) {
		return nil
	}
	k.workerKill = time.Now()
	d.workers[0].kill()
	if err := d.startRole("worker", 0); err != nil {
		return err
	}
	k.workerBack = time.Now()
	if !wait(n / 2) {
		return nil
	}
	k.serverKill = time.Now()
	d.servers[1].kill()
	if err := d.startRole("server", 1); err != nil {
		return err
	}
	k.serverBack = time.Now()
	return nil
}

// run takes a call as far as it goes until deadline: the call through
// server i%2, the approval through the other; a request that gets no answer
// (the server is down) goes to the other server.
func (d *splitDeployment) run(c *scaleCall, deadline time.Time) {
	for !c.settled && time.Now().Before(deadline) {
		if err := d.step(c); err != nil {
			c.failovers++
			c.answers = append(c.answers, err.Error())
			time.Sleep(time.Duration(50+rand.IntN(100)) * time.Millisecond)
		}
	}
}

// server is the server for a request planned for planned: the other one
// after a failover.
func (c *scaleCall) server(planned int) int { return (planned + c.failovers) % 2 }

// step takes the call one step: the tools/call, then the approval page
// until it shows the request, the challenge, and the decision. An error is a
// server that did not answer (transport error or 5xx).
func (d *splitDeployment) step(c *scaleCall) error {
	if c.taskID == "" {
		srv := c.server(c.i % 2)
		t0 := time.Now()
		a := send(d.hc, plainToolCall(d.base(srv), d.agent, "transfer_funds", c.args))
		if a.err != nil || a.code >= 500 {
			return fmt.Errorf("tools/call via server %d: %s", srv, describe(a))
		}
		rpc, err := decodeRPC(a)
		var res struct {
			StructuredContent struct {
				TaskID     string `json:"taskId"`
				ApproveURL string `json:"approveUrl"`
			} `json:"structuredContent"`
		}
		if err != nil || rpc.Error != nil || json.Unmarshal(rpc.Result, &res) != nil || res.StructuredContent.TaskID == "" || res.StructuredContent.ApproveURL == "" {
			c.problems = append(c.problems, "tools/call answered "+describe(a))
			c.settled = true
			return nil
		}
		c.callRTT, c.created = time.Since(t0), time.Now()
		c.taskID = res.StructuredContent.TaskID
		c.ref = res.StructuredContent.ApproveURL[strings.LastIndexByte(res.StructuredContent.ApproveURL, '/')+1:]
		c.callServer, c.otherServer = srv, 1-srv
		c.failovers = 0
		return nil
	}
	srv := c.server(c.otherServer)
	base := d.base(srv)
	if c.body == nil {
		var view struct {
			Status   string `json:"status"`
			Timeline []struct {
				Kind string `json:"kind"`
			} `json:"timeline"`
		}
		a := send(d.hc, jsonRequest("GET", base+"/approver/v1/approvals/"+c.ref, "", nil))
		if a.err != nil || a.code >= 500 {
			return fmt.Errorf("approval page via server %d: %s", srv, describe(a))
		}
		if a.code != 200 || json.Unmarshal(a.body, &view) != nil {
			c.problems = append(c.problems, "approval page answered "+describe(a))
			c.settled = true
			return nil
		}
		if view.Status != string(tasks.ApprovalPending) {
			// Only a decision this test posted, whose answer was lost, ends
			// the approval; the judge checks it was this one.
			c.answers = append(c.answers, "page: "+view.Status)
			c.settled = true
			return nil
		}
		if !slices.ContainsFunc(view.Timeline, func(e struct {
			Kind string `json:"kind"`
		}) bool {
			return e.Kind == "requested"
		}) {
			time.Sleep(20 * time.Millisecond) // the workflow's first task has not run yet
			return nil
		}
		if c.requested.IsZero() {
			c.requested = time.Now()
		}
		a = send(d.hc, jsonRequest("POST", base+"/approver/v1/approvals/"+c.ref+"/challenge", "", map[string]any{"decision": "approve"}))
		if a.err != nil || a.code >= 500 {
			return fmt.Errorf("challenge via server %d: %s", srv, describe(a))
		}
		var ch devtest.Challenge
		if (a.code != 200 && a.code != 201) || json.Unmarshal(a.body, &ch) != nil || ch.ChallengeID == "" {
			c.problems = append(c.problems, "challenge answered "+describe(a))
			c.settled = true
			return nil
		}
		opts, err := virtualwebauthn.ParseAssertionOptions(string(ch.RequestOptions))
		if err != nil {
			c.problems = append(c.problems, "request options: "+err.Error())
			c.settled = true
			return nil
		}
		// A passkey without a signature counter (0), as many are: one
		// approver's decisions on many tasks arrive in any order.
		ap := d.approver
		c.body = decisionBody(ch.ChallengeID, "approve", json.RawMessage(virtualwebauthn.CreateAssertionResponse(ap.RP, ap.Auth, ap.Cred, *opts)))
		return nil
	}
	t0 := time.Now()
	a := send(d.hc, jsonRequest("POST", base+"/approver/v1/approvals/"+c.ref+"/decision", "", json.RawMessage(c.body)))
	if a.err != nil || a.code >= 500 {
		return fmt.Errorf("decision via server %d: %s", srv, describe(a))
	}
	var r decisionResult
	json.Unmarshal(a.body, &r)
	c.answers = append(c.answers, fmt.Sprintf("decision via server %d: %s", srv, describe(a)))
	switch {
	case r.Accepted:
		c.accepted, c.settled, c.decideRTT, c.decider = true, true, time.Since(t0), srv
	case r.Reason == "task_not_pending" || r.Reason == "challenge_consumed":
		// The same decision, posted before to a server that died before
		// answering, was counted (or not: the judge reads the chain).
		c.settled = true
	case r.Reason == "challenge_expired" || r.Reason == "challenge_unknown":
		c.body = nil
	default:
		c.problems = append(c.problems, "decision answered "+describe(a))
		c.settled = true
	}
	return nil
}

func jsonRequest(method, url, token string, body any) *http.Request {
	var b []byte
	switch v := body.(type) {
	case nil:
	case json.RawMessage:
		b = v
	default:
		b, _ = json.Marshal(v)
	}
	req, _ := http.NewRequest(method, url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return req
}

// plainToolCall is a 2026-07-28 tools/call from an MCP client that does not
// declare the tasks extension: the answer names the task and its approval
// page at once (--inline-wait 0).
func plainToolCall(base, token, tool string, args map[string]any) *http.Request {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{
		"name": tool, "arguments": args,
		"_meta": map[string]any{
			"io.modelcontextprotocol/protocolVersion":    string(tasks.Era2026),
			"io.modelcontextprotocol/clientCapabilities": map[string]any{},
			"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "e2e-scale", "version": "1"},
		}}})
	req, _ := http.NewRequest("POST", base+"/mcp", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", string(tasks.Era2026))
	req.Header.Set("Mcp-Method", "tools/call")
	req.Header.Set("Mcp-Name", tool)
	req.Header.Set("Authorization", "Bearer "+token)
	return req
}

// getTask is tasks/get through server i.
func (d *splitDeployment) getTask(i int, id string) (devtest.DetailedTask, error) {
	var dt devtest.DetailedTask
	rpc, err := decodeRPC(send(d.hc, mcpRequest(d.base(i), d.agent, tasks.Era2026, "tasks/get", id, map[string]any{"taskId": id})))
	if err != nil {
		return dt, err
	}
	if rpc.Error != nil {
		return dt, fmt.Errorf("tasks/get %s: %d %s", id, rpc.Error.Code, rpc.Error.Message)
	}
	return dt, json.Unmarshal(rpc.Result, &dt)
}

// listTasks is the agent's every task as the read model has them
// (2025-11-25 tasks/list through server i, every page): ID to status.
func (d *splitDeployment) listTasks(i int) (map[string]tasks.Status, error) {
	out := map[string]tasks.Status{}
	cursor := ""
	for {
		params := map[string]any{}
		if cursor != "" {
			params["cursor"] = cursor
		}
		a := send(d.hc, mcpRequest(d.base(i), d.agent, tasks.Era2025, "tasks/list", "", params))
		rpc, err := decodeRPC(a)
		if err != nil {
			return nil, err
		}
		if rpc.Error != nil {
			return nil, fmt.Errorf("tasks/list: %d %s", rpc.Error.Code, rpc.Error.Message)
		}
		var page struct {
			Tasks []struct {
				TaskID string       `json:"taskId"`
				Status tasks.Status `json:"status"`
			} `json:"tasks"`
			NextCursor string `json:"nextCursor"`
		}
		if err := json.Unmarshal(rpc.Result, &page); err != nil {
			return nil, fmt.Errorf("tasks/list: %v in %s", err, rpc.Result)
		}
		for _, tk := range page.Tasks {
			out[tk.TaskID] = tk.Status
		}
		if page.NextCursor == "" {
			return out, nil
		}
		cursor = page.NextCursor
	}
}

// cancelOrphans finds the agent's tasks that no call knows, made by a
// tools/call whose answer was lost with its server, and cancels them as
// their agent (tasks/cancel), as a client that lists its tasks would.
func (d *splitDeployment) cancelOrphans(calls []*scaleCall) []string {
	known := map[string]bool{}
	for _, c := range calls {
		known[c.taskID] = true
	}
	all, err := d.listTasks(0)
	if err != nil {
		d.t.Fatal(err)
	}
	var orphans []string
	for id, st := range all {
		if known[id] {
			continue
		}
		orphans = append(orphans, id)
		if st.Terminal() {
			continue
		}
		rpc, err := decodeRPC(send(d.hc, mcpRequest(d.base(0), d.agent, tasks.Era2026, "tasks/cancel", id, map[string]any{"taskId": id})))
		if err != nil || rpc.Error != nil {
			d.t.Errorf("tasks/cancel %s (a task whose tools/call answer was lost): %v %+v", id, err, rpc.Error)
		}
	}
	slices.Sort(orphans)
	return orphans
}

// waitEnded polls until every task is terminal, or deadline, and returns
// when they were.
func (d *splitDeployment) waitEnded(calls []*scaleCall, orphans []string, deadline time.Time) time.Time {
	open := slices.Clone(orphans)
	for _, c := range calls {
		if c.taskID != "" {
			open = append(open, c.taskID)
		}
	}
	for {
		var still []string
		for _, id := range open {
			dt, err := d.getTask(0, id)
			if err != nil || !dt.Status.Terminal() {
				still = append(still, id)
			}
		}
		open = still
		if len(open) == 0 {
			return time.Now()
		}
		if time.Now().After(deadline) {
			d.t.Errorf("%d tasks not ended by %v (what the timeouts guarantee): %v", len(open), deadline.Format(time.TimeOnly), open[:min(len(open), 10)])
			return time.Now()
		}
		time.Sleep(time.Second)
	}
}

// scaleResult is what the judge found.
type scaleResult struct {
	dispositions map[string]int
	effects      int
	chains       map[string][][]byte
	crossed      int // approvals accepted by the other server than the call's
}

// judgeScale checks the invariants of TestSplitRolesAtScale's doc comment.
func (d *splitDeployment) judgeScale(calls []*scaleCall, orphans []string, workerKill time.Time) scaleResult {
	t := d.t
	// The ledger, through the ungated list_transfers tool.
	a := send(d.hc, mcpRequest(d.base(1), d.agent, tasks.Era2026, "tools/call", "list_transfers", map[string]any{"name": "list_transfers", "arguments": map[string]any{}}))
	rpc, err := decodeRPC(a)
	var ledger struct {
		StructuredContent struct {
			Transfers []struct {
				ID string `json:"id"`
			} `json:"transfers"`
		} `json:"structuredContent"`
	}
	if err != nil || rpc.Error != nil || json.Unmarshal(rpc.Result, &ledger) != nil {
		t.Fatalf("list_transfers: %v %s", err, describe(a))
	}
	effects := map[string]int{}
	for _, tr := range ledger.StructuredContent.Transfers {
		effects[tr.ID]++
	}
	// The audit log, exported through a server and verified, with the CLI.
	adminEnv := []string{"COUNTERSIGN_ADMIN_TOKEN_FILE=" + d.admin}
	export, err := d.cli(adminEnv, "audit", "export", "--server", d.base(1))
	if err != nil {
		t.Fatal(err)
	}
	exportFile := filepath.Join(d.dir, "audit.jsonl")
	if err := os.WriteFile(exportFile, []byte(export), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := d.cli(nil, "audit", "verify", exportFile, "--key", d.pubKeys); err != nil {
		t.Errorf("countersign audit verify: %v", err)
	} else {
		t.Logf("countersign audit verify: %s", lastLine(out))
	}
	keys, err := audit.ParsePublicKeys([]byte(readFile(t, d.pubKeys)))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := audit.VerifyReader(strings.NewReader(export), keys, audit.VerifyOptions{})
	if err != nil {
		t.Fatalf("audit export: %v", err)
	}
	if !rep.OK {
		t.Errorf("the audit export does not verify: %s", verifyProblems(rep))
	}
	chains := map[string][][]byte{}
	for _, l := range bytes.Split(bytes.TrimSpace([]byte(export)), []byte("\n")) {
		var rec audit.Record
		if json.Unmarshal(l, &rec) == nil && !strings.HasPrefix(rec.TaskID, "admin-") {
			chains[rec.TaskID] = append(chains[rec.TaskID], l)
		}
	}
	verdicts := map[string]audit.TaskVerdict{}
	for _, tv := range rep.Tasks {
		verdicts[tv.TaskID] = tv
	}
	readModel, err := d.listTasks(1)
	if err != nil {
		t.Fatal(err)
	}

	res := scaleResult{dispositions: map[string]int{}, effects: len(ledger.StructuredContent.Transfers), chains: chains}
	known := map[string]bool{}
	// check judges one task and returns its end.
	check := func(id string) (string, []string) {
		known[id] = true
		var problems []string
		fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
		views, statuses := map[string]bool{}, map[tasks.Status]bool{}
		for srv := range 2 {
			dt, err := d.getTask(srv, id)
			if err != nil {
				fail("server %d: %v", srv, err)
				continue
			}
			if !dt.Status.Terminal() {
				fail("server %d: tasks/get says %s", srv, dt.Status)
			}
			views[viewOf(dt.Status, disposition(dt))] = true
			statuses[dt.Status] = true
		}
		view := "unknown"
		if len(views) == 1 {
			for v := range views {
				view = v
			}
		} else {
			fail("the servers' tasks/get disagree: %v", views)
		}
		cf := readChain(chains[id])
		tv, ok := verdicts[id]
		switch {
		case !ok || !cf.sealed:
			fail("no sealed audit chain")
		case !tv.OK:
			fail("the chain does not verify: %v", tv.Problems)
		case viewOf(tasks.Status(tv.Status), tasks.Disposition(tv.Disposition)) != view:
			fail("tasks/get says %s, the audit outcome %s/%s", view, tv.Status, tv.Disposition)
		case cf.terminalView() != view:
			fail("tasks/get says %s, the chain's terminal record %s", view, cf.terminalView())
		}
		if st := readModel[id]; !statuses[st] || len(statuses) != 1 {
			fail("tasks/list says %s, tasks/get %v", st, slices.Collect(maps.Keys(statuses)))
		}
		terminals, outcomes := 0, 0
		for _, l := range chains[id] {
			var rec audit.Record
			json.Unmarshal(l, &rec)
			if audit.IsTerminalKind(rec.Kind) {
				terminals++
			}
			if rec.Kind == audit.KindOutcome {
				outcomes++
			}
		}
		if terminals != 1 || outcomes != 1 {
			fail("%d terminal records and %d outcomes in the chain", terminals, outcomes)
		}
		n := effects[id]
		switch view {
		case string(tasks.ApprovedExecuted):
			if n != 1 {
				fail("approved-executed with %d ledger effects", n)
			}
		case string(tasks.OutcomeUnknown):
			// Only the worker kill may leave an outcome unknown: the task
			// was claimed (its tool about to run, or running) before it.
			claimed := scaleClaimTime(chains[id])
			if workerKill.IsZero() || claimed.IsZero() || claimed.After(workerKill) {
				fail("outcome-unknown, claimed at %v, the worker killed at %v", claimed, workerKill)
			}
			if n > 1 {
				fail("outcome-unknown with %d ledger effects", n)
			}
		default:
			if n != 0 {
				fail("%s with %d ledger effects", view, n)
			}
		}
		return view, problems
	}
	for _, c := range calls {
		if c.taskID == "" {
			t.Errorf("call %d never got a task: %v %v", c.i, c.problems, c.answers)
			continue
		}
		view, problems := check(c.taskID)
		cf := readChain(chains[c.taskID])
		switch {
		case view == string(tasks.ApprovedExecuted), view == string(tasks.OutcomeUnknown):
		default:
			problems = append(problems, "every call was approved: a lost approval")
		}
		res.dispositions[view]++
		if c.accepted && cf.acceptedApprovals() != 1 {
			problems = append(problems, fmt.Sprintf("the API answered the approval accepted; the chain holds %d", cf.acceptedApprovals()))
		}
		if c.accepted && c.decider != c.callServer {
			res.crossed++
		}
		problems = append(problems, c.problems...)
		if len(problems) > 0 {
			t.Errorf("call %d (task %s, via server %d): %s\n  answers: %v\n  chain: %s\n  - %s", c.i, c.taskID, c.callServer, view, c.answers, cf.summary(), strings.Join(problems, "\n  - "))
		}
	}
	for _, id := range orphans {
		view, problems := check(id)
		res.dispositions["orphan "+view]++
		if view != string(tasks.StatusCancelled) {
			problems = append(problems, "cancelled by its agent, it ended "+view)
		}
		if len(problems) > 0 {
			t.Errorf("task %s (its tools/call's answer was lost): %s\n  chain: %s\n  - %s", id, view, readChain(chains[id]).summary(), strings.Join(problems, "\n  - "))
		}
	}
	for id := range chains {
		if !known[id] {
			t.Errorf("the audit log holds task %s, which neither a call nor tasks/list knows", id)
		}
	}
	for id := range readModel {
		if !known[id] {
			t.Errorf("tasks/list holds task %s, which appeared after the orphans were cancelled", id)
		}
	}
	for id, n := range effects {
		if !known[id] {
			t.Errorf("the ledger holds %d effects of %s, which no call made", n, id)
		}
	}
	return res
}

// scaleClaimTime is when the chain's claim was recorded (zero if never).
func scaleClaimTime(lines [][]byte) time.Time {
	for _, l := range lines {
		var rec audit.Record
		if json.Unmarshal(l, &rec) == nil && rec.Kind == audit.KindClaimed {
			return rec.At
		}
	}
	return time.Time{}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// report logs the run's figures: throughput, latencies on the clients' side
// and from the audit chains, the restarts.
func (d *splitDeployment) report(calls []*scaleCall, res scaleResult, start time.Time, driven time.Duration, ended time.Time, k scaleKills) {
	var callRTT, decideRTT, toEnd, total, toPage []time.Duration
	failovers := 0
	var heldByKill time.Duration // the longest a task open at the worker kill took to end after it
	openAtKill := 0
	for _, c := range calls {
		failovers += c.failovers
		if c.callRTT > 0 {
			callRTT = append(callRTT, c.callRTT)
		}
		if c.decideRTT > 0 {
			decideRTT = append(decideRTT, c.decideRTT)
		}
		if !c.requested.IsZero() {
			toPage = append(toPage, c.requested.Sub(c.created))
		}
		var first, decided, end time.Time
		for _, l := range res.chains[c.taskID] {
			var rec audit.Record
			if json.Unmarshal(l, &rec) != nil {
				continue
			}
			if first.IsZero() {
				first = rec.At
			}
			if rec.Kind == audit.KindDecision && decided.IsZero() {
				decided = rec.At
			}
			if rec.Kind == audit.KindOutcome {
				end = rec.At
			}
		}
		if !decided.IsZero() && !end.IsZero() {
			toEnd = append(toEnd, end.Sub(decided))
			total = append(total, end.Sub(first))
			if !k.workerKill.IsZero() && first.Before(k.workerKill) && end.After(k.workerKill) {
				openAtKill++
				heldByKill = max(heldByKill, end.Sub(k.workerKill))
			}
		}
	}
	ms := func(v time.Duration) string { return v.Round(time.Millisecond).String() }
	pct := func(d []time.Duration) string {
		return fmt.Sprintf("p50 %s p95 %s p99 %s max %s", ms(percentile(d, 0.5)), ms(percentile(d, 0.95)), ms(percentile(d, 0.99)), ms(percentile(d, 1)))
	}
	d.t.Logf("TestSplitRolesAtScale: %d calls+approvals through 2 servers and 2 workers driven in %v (%.1f/s), all ended %v after the start",
		len(calls), ms(driven), float64(len(calls))/driven.Seconds(), ms(ended.Sub(start)))
	d.t.Logf("  tools/call: %s", pct(callRTT))
	d.t.Logf("  tools/call answered to the request on the approval page: %s", pct(toPage))
	d.t.Logf("  decision POST: %s", pct(decideRTT))
	d.t.Logf("  decision to outcome (audit): %s", pct(toEnd))
	d.t.Logf("  request to outcome (audit): %s", pct(total))
	if !k.workerKill.IsZero() {
		d.t.Logf("  worker-0 kill -9 at +%v, ready again %v later; %d tasks open at the kill ended at most %v after it",
			ms(k.workerKill.Sub(start)), ms(k.workerBack.Sub(k.workerKill)), openAtKill, ms(heldByKill))
	}
	if !k.serverKill.IsZero() {
		d.t.Logf("  server-1 kill -9 at +%v, ready again %v later", ms(k.serverKill.Sub(start)), ms(k.serverBack.Sub(k.serverKill)))
	}
	d.t.Logf("  %d requests failed over to the other server; %d approvals accepted by the other server than the call's", failovers, res.crossed)
	d.t.Logf("  ends %v; %d ledger effects", res.dispositions, res.effects)
}
