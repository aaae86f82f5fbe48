package devstack

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/countersign/countersign/internal/proccpu"
)

const (
	taskQueue  = "devstack-test"
	updateName = "decide"
)

// awaitDecision waits for one "decide" Update (or a day) and returns the
// decision it carried.
func awaitDecision(ctx workflow.Context) (string, error) {
	var decision string
	if err := workflow.SetUpdateHandler(ctx, updateName, func(ctx workflow.Context, d string) (string, error) {
		decision = d
		return "ok:" + d, nil
	}); err != nil {
		return "", err
	}
	if ok, err := workflow.AwaitWithTimeout(ctx, 24*time.Hour, func() bool { return decision != "" }); err != nil {
		return "", err
	} else if !ok {
		return "timeout", nil
	}
	return decision, nil
}

// countUpdates accepts "decide" Updates until it sees "stop".
func countUpdates(ctx workflow.Context) (int, error) {
	n, done := 0, false
	if err := workflow.SetUpdateHandler(ctx, updateName, func(ctx workflow.Context, d string) (int, error) {
		n++
		done = d == "stop"
		return n, nil
	}); err != nil {
		return 0, err
	}
	if err := workflow.Await(ctx, func() bool { return done }); err != nil {
		return 0, err
	}
	return n, workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) })
}

// noop completes at once; it measures the cost of a start.
func noop(workflow.Context) error { return nil }

func TestMain(m *testing.M) {
	worker.SetStickyWorkflowCacheSize(1000)
	if dir := os.Getenv("DEVSTACK_HELPER_DIR"); dir != "" {
		os.Exit(helperProcess(dir))
	}
	os.Exit(m.Run())
}

func quietSDKLogger() sdklog.Logger {
	return sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func startServer(t testing.TB, opts Options) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	return s
}

// dial connects a Temporal client with the server's client certificate, as
// the process that started the server does.
func dial(s *Server) (client.Client, error) {
	return client.Dial(client.Options{
		HostPort: s.FrontendHostPort(), Namespace: s.Namespace(), Logger: quietSDKLogger(),
		ConnectionOptions: client.ConnectionOptions{TLS: s.ClientTLS()},
	})
}

// connect dials the server and runs a worker for the test workflows. The
// returned stop function stops the worker and closes the client.
func connect(t testing.TB, s *Server) (client.Client, func()) {
	t.Helper()
	c, err := dial(s)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	w := worker.New(c, taskQueue, worker.Options{})
	w.RegisterWorkflow(awaitDecision)
	w.RegisterWorkflow(countUpdates)
	w.RegisterWorkflow(noop)
	if err := w.Start(); err != nil {
		c.Close()
		t.Fatalf("worker Start: %v", err)
	}
	var once sync.Once
	stop := func() { once.Do(func() { w.Stop(); c.Close() }) }
	t.Cleanup(stop)
	return c, stop
}

func startOptions(id string) client.StartWorkflowOptions {
	return client.StartWorkflowOptions{ID: id, TaskQueue: taskQueue, EnableEagerStart: true}
}

func update(ctx context.Context, c client.Client, workflowID, decision string, result any) error {
	h, err := c.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
		WorkflowID:   workflowID,
		UpdateName:   updateName,
		Args:         []any{decision},
		WaitForStage: client.WorkflowUpdateStageCompleted,
	})
	if err != nil {
		return err
	}
	return h.Get(ctx, result)
}

func TestRestartKeepsWorkflow(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t0 := time.Now()
	s1 := startServer(t, Options{DataDir: dir, Logger: testLogger(t)})
	t.Logf("cold start (new data dir) %v", time.Since(t0))
	addr := s1.FrontendHostPort()
	persisted, found, err := loadPorts(dir)
	if err != nil || !found {
		t.Fatalf("ports.json after first start: found=%v err=%v", found, err)
	}
	t.Logf("ports %+v", persisted)
	if want := fmt.Sprintf("127.0.0.1:%d", persisted.Frontend); addr != want {
		t.Fatalf("FrontendHostPort = %q, ports.json says %q", addr, want)
	}
	if s1.Namespace() != "default" {
		t.Fatalf("Namespace = %q, want default", s1.Namespace())
	}
	// A second server on the same data dir must not start.
	if _, err := Start(ctx, Options{DataDir: dir, FrontendPort: persisted.Frontend + 1}); !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("second Start on a busy data dir: err = %v, want ErrDataDirInUse", err)
	}
	if _, err := Start(ctx, Options{DataDir: t.TempDir(), FrontendPort: persisted.Frontend}); !errors.Is(err, ErrPortInUse) {
		t.Fatalf("Start on a taken frontend port: err = %v, want ErrPortInUse", err)
	}

	c, stop := connect(t, s1)
	run, err := c.ExecuteWorkflow(ctx, startOptions("restart-1"), awaitDecision)
	if err != nil {
		t.Fatalf("ExecuteWorkflow: %v", err)
	}
	// One Update before the restart, on another workflow, proves the worker
	// is wired up; the pending one waits through the restart.
	if _, err := c.ExecuteWorkflow(ctx, startOptions("restart-warmup"), awaitDecision); err != nil {
		t.Fatalf("ExecuteWorkflow: %v", err)
	}
	var got string
	if err := update(ctx, c, "restart-warmup", "warm", &got); err != nil || got != "ok:warm" {
		t.Fatalf("update before restart: %q, %v", got, err)
	}
	stop()
	if err := s1.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := s1.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}

	t0 = time.Now()
	s2 := startServer(t, Options{DataDir: dir, Logger: testLogger(t)})
	t.Logf("warm start (existing data dir) %v", time.Since(t0))
	if s2.FrontendHostPort() != addr {
		t.Fatalf("restart moved the frontend: %q, was %q", s2.FrontendHostPort(), addr)
	}
	if p, _, _ := loadPorts(dir); p != persisted {
		t.Fatalf("ports.json changed across restart: %+v, was %+v", p, persisted)
	}
	c2, _ := connect(t, s2)

	t0 = time.Now()
	if err := update(ctx, c2, "restart-1", "approve", &got); err != nil {
		t.Fatalf("update after restart: %v", err)
	}
	rtt := time.Since(t0)
	t.Logf("first update round trip after restart %v", rtt)
	if got != "ok:approve" {
		t.Fatalf("update result %q, want ok:approve", got)
	}
	if rtt > 5*time.Second {
		t.Fatalf("update after restart took %v; static hosts should make it well under a second", rtt)
	}
	var result string
	if err := c2.GetWorkflow(ctx, "restart-1", run.GetRunID()).Get(ctx, &result); err != nil || result != "approve" {
		t.Fatalf("workflow result %q, %v; want approve", result, err)
	}
	assertWAL(t, filepath.Join(dir, dbFile))
}

// assertWAL checks that journal_mode=WAL reached SQLite: a misspelled
// connect attribute is silently ignored. journal_mode=WAL is stored in the
// file, so a separate connection sees it.
func assertWAL(t *testing.T, path string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var mode string
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if !strings.EqualFold(mode, "wal") {
		t.Fatalf("journal_mode = %q, want wal", mode)
	}
}

func TestConcurrentServers(t *testing.T) {
	root := t.TempDir()
	dirs := []string{filepath.Join(root, "a", "data"), filepath.Join(root, "b", "data")}
	servers := make([]*Server, len(dirs))
	errs := make([]error, len(dirs))
	var wg sync.WaitGroup
	for i, dir := range dirs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			servers[i], errs[i] = Start(ctx, Options{DataDir: dir, Namespace: fmt.Sprintf("ns-%d", i)})
		})
	}
	wg.Wait()
	for i, s := range servers {
		if s != nil {
			t.Cleanup(func() { _ = s.Stop() })
		}
		if errs[i] != nil {
			t.Fatalf("Start %d: %v", i, errs[i])
		}
	}

	var all []int
	for _, dir := range dirs {
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm != 0o700 {
			t.Errorf("%s has mode %v, want 0700", dir, perm)
		}
		p, _, err := loadPorts(dir)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, p.Frontend, p.History, p.Matching, p.Worker)
	}
	slices.Sort(all)
	if len(slices.Compact(all)) != 8 {
		t.Fatalf("ports collide: %v", all)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, s := range servers {
		c, _ := connect(t, s)
		run, err := c.ExecuteWorkflow(ctx, startOptions(fmt.Sprintf("concurrent-%d", i)), noop)
		if err != nil {
			t.Fatalf("server %d: ExecuteWorkflow: %v", i, err)
		}
		if err := run.Get(ctx, nil); err != nil {
			t.Fatalf("server %d: workflow: %v", i, err)
		}
	}
}

// TestSurvivesProcessKill starts a workflow in a child process, kills the
// child with SIGKILL, and completes the workflow from a fresh server on the
// same data dir.
func TestSurvivesProcessKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a second process")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "DEVSTACK_HELPER_DIR="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper: %v", err)
	}
	var msg struct{ WorkflowID, RunID, Err string }
	if err := json.Unmarshal([]byte(line), &msg); err != nil || msg.Err != "" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper said %q (%v)", line, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := startServer(t, Options{DataDir: dir, Logger: testLogger(t)})
	c, _ := connect(t, s)
	var got string
	t0 := time.Now()
	if err := update(ctx, c, msg.WorkflowID, "after-kill", &got); err != nil {
		t.Fatalf("update after kill: %v", err)
	}
	rtt := time.Since(t0)
	t.Logf("first update round trip after kill -9 and restart %v", rtt)
	if rtt > 5*time.Second {
		t.Fatalf("update after restart took %v", rtt)
	}
	var result string
	if err := c.GetWorkflow(ctx, msg.WorkflowID, msg.RunID).Get(ctx, &result); err != nil || result != "after-kill" {
		t.Fatalf("workflow result %q, %v", result, err)
	}
}

// helperProcess is the child side of TestSurvivesProcessKill: it starts a
// server and a workflow, reports the workflow on stdout and waits to be
// killed.
func helperProcess(dir string) int {
	report := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Println(string(b))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := Start(ctx, Options{DataDir: dir})
	if err != nil {
		report(map[string]string{"Err": err.Error()})
		return 1
	}
	c, err := dial(s)
	if err != nil {
		report(map[string]string{"Err": err.Error()})
		return 1
	}
	w := worker.New(c, taskQueue, worker.Options{})
	w.RegisterWorkflow(awaitDecision)
	if err := w.Start(); err != nil {
		report(map[string]string{"Err": err.Error()})
		return 1
	}
	run, err := c.ExecuteWorkflow(ctx, startOptions("killed-1"), awaitDecision)
	if err != nil {
		report(map[string]string{"Err": err.Error()})
		return 1
	}
	// Wait for the worker to finish the first workflow task. Killed with that
	// task in flight, the workflow would wait out the 10 s workflow task
	// timeout after the restart, which says nothing about the server.
	for {
		if err := ctx.Err(); err != nil {
			report(map[string]string{"Err": err.Error()})
			return 1
		}
		if firstTaskCompleted(ctx, c, run.GetID(), run.GetRunID()) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	report(map[string]string{"WorkflowID": run.GetID(), "RunID": run.GetRunID()})
	select {} // killed by the parent
}

func firstTaskCompleted(ctx context.Context, c client.Client, workflowID, runID string) bool {
	it := c.GetWorkflowHistory(ctx, workflowID, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			return false
		}
		if e.GetEventType() == enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED {
			return true
		}
	}
	return false
}

func TestOptionsValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"no data dir", Options{}},
		{"bad synchronous", Options{DataDir: t.TempDir(), Synchronous: "OFF"}},
		{"host name", Options{DataDir: t.TempDir(), Host: "example.com"}},
		{"port out of range", Options{DataDir: t.TempDir(), FrontendPort: 70000}},
	} {
		if _, err := Start(context.Background(), tc.opts); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("%s: err = %v, want ErrInvalidOptions", tc.name, err)
		}
	}
}

// TestMeasure prints the numbers DESIGN.md's cost model cares about. It
// asserts nothing about speed. Run with DEVSTACK_MEASURE=1.
func TestMeasure(t *testing.T) {
	if os.Getenv("DEVSTACK_MEASURE") == "" {
		t.Skip("set DEVSTACK_MEASURE=1")
	}
	for _, mode := range []string{SynchronousFull, SynchronousNormal} {
		t.Run(mode, func(t *testing.T) { measure(t, mode) })
	}
}

func measure(t *testing.T, synchronous string) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	t0 := time.Now()
	s, err := Start(ctx, Options{DataDir: dir, Synchronous: synchronous})
	if err != nil {
		t.Fatal(err)
	}
	cold := time.Since(t0)
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	s = startServer(t, Options{DataDir: dir, Synchronous: synchronous})
	warm := time.Since(t0)
	t.Logf("%s: startup cold %v, warm %v", synchronous, cold.Round(time.Millisecond), warm.Round(time.Millisecond))

	c, _ := connect(t, s)

	// Update round trip on one pending workflow, concurrency 1.
	run, err := c.ExecuteWorkflow(ctx, startOptions("measure-updates"), countUpdates)
	if err != nil {
		t.Fatal(err)
	}
	const updates = 50
	rtts := make([]time.Duration, 0, updates)
	for i := range updates {
		t0 := time.Now()
		var n int
		if err := update(ctx, c, run.GetID(), fmt.Sprint(i), &n); err != nil {
			t.Fatal(err)
		}
		rtts = append(rtts, time.Since(t0))
	}
	if err := update(ctx, c, run.GetID(), "stop", new(int)); err != nil {
		t.Fatal(err)
	}
	slices.Sort(rtts)
	t.Logf("%s: update round trip over %d: p50 %v, p90 %v, max %v", synchronous, updates,
		rtts[updates/2].Round(10*time.Microsecond), rtts[updates*9/10].Round(10*time.Microsecond), rtts[updates-1].Round(10*time.Microsecond))

	// Starts: 200 workflows, each completing at once, 1 or 8 at a time, with
	// and without eager start.
	for _, tc := range []struct {
		conc  int
		eager bool
	}{{1, true}, {8, true}, {8, false}} {
		conc := tc.conc
		const starts = 200
		lat := make([]time.Duration, starts)
		var wg sync.WaitGroup
		var firstErr error
		var mu sync.Mutex
		next := make(chan int)
		cpu0 := proccpu.Used()
		t0 = time.Now()
		for range conc {
			wg.Go(func() {
				for i := range next {
					t1 := time.Now()
					o := startOptions(fmt.Sprintf("measure-start-%d-%v-%d", conc, tc.eager, i))
					o.EnableEagerStart = tc.eager
					run, err := c.ExecuteWorkflow(ctx, o, noop)
					if err == nil {
						lat[i] = time.Since(t1)
						err = run.Get(ctx, nil)
					}
					if err != nil {
						mu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
					}
				}
			})
		}
		for i := range starts {
			next <- i
		}
		close(next)
		wg.Wait()
		if firstErr != nil {
			t.Fatal(firstErr)
		}
		total := time.Since(t0)
		cpu := (proccpu.Used() - cpu0) / starts
		slices.Sort(lat)
		t.Logf("%s: %d starts to completion at concurrency %d, eager %v: %v, %.0f/s, start p50 %v, CPU %v per workflow",
			synchronous, starts, conc, tc.eager, total.Round(time.Millisecond), float64(starts)/total.Seconds(),
			lat[starts/2].Round(10*time.Microsecond), cpu.Round(10*time.Microsecond))
	}
}

func BenchmarkStartWorkflow(b *testing.B) {
	s := startServer(b, Options{DataDir: b.TempDir()})
	c, _ := connect(b, s)
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		run, err := c.ExecuteWorkflow(ctx, startOptions(fmt.Sprintf("bench-%d", i)), noop)
		if err != nil {
			b.Fatal(err)
		}
		if err := run.Get(ctx, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// A first start whose port another process takes between the choice and the
// bind is retried with fresh ports, and works.
func TestStartRetriesAPortTakenMeanwhile(t *testing.T) {
	var stolen []net.Listener
	portsChosen = func(p ports) {
		if len(stolen) > 0 {
			return // only the first attempt loses its port
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(loopback, strconv.Itoa(p.History)))
		if err != nil {
			t.Errorf("steal port %d: %v", p.History, err)
			return
		}
		stolen = append(stolen, ln)
	}
	t.Cleanup(func() {
		portsChosen = nil
		for _, ln := range stolen {
			ln.Close()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := Start(ctx, Options{DataDir: filepath.Join(t.TempDir(), "data")})
	if err != nil {
		t.Fatalf("Start after losing a port: %v", err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	if len(stolen) != 1 {
		t.Fatalf("the port was stolen %d times, want 1", len(stolen))
	}
	c, _ := connect(t, s)
	run, err := c.ExecuteWorkflow(ctx, startOptions("after-retry"), noop)
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Get(ctx, nil); err != nil {
		t.Fatal(err)
	}
}
