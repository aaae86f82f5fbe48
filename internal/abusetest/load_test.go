//go:build !race

// Load tests, built without -race: the race detector allows at most 8,128
// live goroutines (10,000 pollers with their connections need several
// times that), and its instrumentation of the clients' own bulk writes
// starves the server it measures. scripts/test.sh runs them in a second,
// plain `go test` of this package.

package abusetest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/httplimit"
	"github.com/countersign/countersign/mcpserver"
)

// TestTenThousandPollers: thousands of tasks/get pollers at once (3,000 in
// the test command; COUNTERSIGN_POLLERS=10000 for the figure),
// from 100 agents, over the production connection cap
// (httplimit.DefaultMaxConns) and the default per-agent budget (50
// requests/s, burst 100, 16 in flight). Each poller wants three answers a
// second apart and, refused, waits the Retry-After it is given, as a
// task-aware agent does. Every poller gets its answers; every refusal is a
// 429 or 503 with Retry-After (nothing else, no transport error); the
// server never holds more connections than the cap; the heap stays under
// 1 GiB; descriptors and goroutines come back. The figures are logged
// (docs/benchmarks.md "Load and abuse").
// COUNTERSIGN_POLLERS_UNBUDGETED=1 lifts the budget (every request reaches
// tasks/get), for measuring.
func TestTenThousandPollers(t *testing.T) {
	const (
		pollers  = 3_000
		agents   = 100
		answers  = 3
		maxHeap  = 1 << 30
		deadline = 4 * time.Minute
	)
	n := pollers
	if v, err := strconv.Atoi(os.Getenv("COUNTERSIGN_POLLERS")); err == nil && v > 0 {
		n = v
	}
	l := limits{maxConns: httplimit.DefaultMaxConns}
	if os.Getenv("COUNTERSIGN_POLLERS_UNBUDGETED") != "" {
		l.mcp = mcpserver.Options{RequestsPerSecond: 1e9, RequestBurst: 1e9, MaxInFlightPerPrincipal: 1e9}
	}
	st := startStack(t, l)
	type agent struct{ token, task string }
	as := make([]agent, agents)
	for i := range as {
		as[i].token, as[i].task = st.agent(t, fmt.Sprintf("poller-agent-%d", i))
	}
	fds0, gor0 := openFDs(t), runtime.NumGoroutine()

	// Many clients' worth of connections: no cap per host, and an idle
	// connection is let go after a second, as a poller that is done would.
	tr := &http.Transport{
		MaxIdleConns: n, MaxIdleConnsPerHost: n, IdleConnTimeout: time.Second,
		DialContext: (&net.Dialer{Timeout: 2 * time.Minute}).DialContext,
	}
	c := &http.Client{Transport: tr, Timeout: 2 * time.Minute}
	defer tr.CloseIdleConnections()

	var peakConns, peakFDs atomic.Int64
	var peakHeap, peakRSS uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		var ms runtime.MemStats
		for {
			if v := st.open.Load(); v > peakConns.Load() {
				peakConns.Store(v)
			}
			if v := int64(openFDs(t)); v > peakFDs.Load() {
				peakFDs.Store(v)
			}
			runtime.ReadMemStats(&ms)
			peakHeap = max(peakHeap, ms.HeapInuse)
			peakRSS = max(peakRSS, rssBytes())
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()

	start := time.Now()
	end := start.Add(deadline)
	var mu sync.Mutex
	statuses := map[string]int{}
	var first []time.Duration
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			a := as[g%agents]
			local := map[string]int{}
			var firstAnswer time.Duration
			got := 0
			for i := 0; got < answers && time.Now().Before(end); i++ {
				code, h, resp, err := tasksGet(c, st.base, a.token, a.task, g*1000+i)
				wait := time.Second
				refused := code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable
				switch {
				case err != nil && !refused:
					local["error: "+errClass(err)]++
				case code == http.StatusOK && resp.Result.TaskID == a.task:
					local["200"]++
					got++
					if got == 1 {
						firstAnswer = time.Since(start)
					}
				case refused:
					ra, err := strconv.Atoi(h.Get("Retry-After"))
					if err != nil || ra < 0 {
						local[fmt.Sprintf("%d without Retry-After", code)]++
						break
					}
					local[strconv.Itoa(code)]++
					wait = time.Duration(ra)*time.Second + time.Duration(g%1000)*time.Millisecond
				default:
					msg := resp.Result.Status
					if resp.Error != nil {
						msg = fmt.Sprintf("error %d %s", resp.Error.Code, resp.Error.Message)
					}
					local[fmt.Sprintf("status %d (%s)", code, msg)]++
				}
				if got < answers {
					time.Sleep(wait)
				}
			}
			mu.Lock()
			for k, v := range local {
				statuses[k] += v
			}
			if got > 0 {
				first = append(first, firstAnswer)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stop)
	<-sampled

	slices.Sort(first)
	q := func(p float64) time.Duration {
		if len(first) == 0 {
			return 0
		}
		return first[int(float64(len(first)-1)*p)].Round(time.Millisecond)
	}
	t.Logf("%d pollers wanting %d answers each, done in %v: %v; first answer after p50 %v, p99 %v; "+
		"peak: server connections %d (cap %d), fds %d (client and server sides, from %d), heap in use %d MiB, RSS %d MiB (both sides)",
		n, answers, elapsed.Round(time.Millisecond), statuses, q(0.5), q(0.99),
		peakConns.Load(), httplimit.DefaultMaxConns, peakFDs.Load(), fds0, peakHeap>>20, peakRSS>>20)
	for k, v := range statuses {
		if k != "200" && k != "429" && k != "503" {
			t.Errorf("%d requests: %s", v, k)
		}
	}
	if statuses["200"] != n*answers {
		t.Errorf("%d of %d answers within %v", statuses["200"], n*answers, deadline)
	}
	if peakConns.Load() > int64(httplimit.DefaultMaxConns) {
		t.Errorf("the server held %d connections, over its cap of %d", peakConns.Load(), httplimit.DefaultMaxConns)
	}
	if peakHeap > maxHeap {
		t.Errorf("heap in use peaked at %d MiB, over %d MiB", peakHeap>>20, maxHeap>>20)
	}
	tr.CloseIdleConnections()
	waitFor(t, 10*time.Second, func() bool {
		return st.open.Load() == 0 && openFDs(t) <= fds0+2 && runtime.NumGoroutine() <= gor0+5
	})
}

// TestOversizeBodiesInBulk: 100 clients at once each send a 4 MiB tools/call
// to /mcp with an agent's token, as fast as loopback allows. Each is
// answered 413 with a JSON-RPC error before its body is read (the declared
// length is over the 1 MiB cap), nothing is created, and the heap stays
// within the bodies' caps plus slack.
func TestOversizeBodiesInBulk(t *testing.T) {
	const (
		clients = 100
		size    = 4 << 20
	)
	st := startStack(t, limits{maxConns: httplimit.DefaultMaxConns,
		mcp: mcpserver.Options{RequestsPerSecond: 1e9, RequestBurst: 1e9, MaxInFlightPerPrincipal: 1e9}})
	tok, _ := st.agent(t, "agent-big")
	pending0, err := st.store.CountPending(context.Background(), "agent-big")
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heap0 := ms.HeapInuse
	var peak atomic.Uint64
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	prefix := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"transfer_funds","arguments":{"amount":1,"currency":"USD","to":"acct-1","memo":"`
	c := newClient(clients)
	defer c.CloseIdleConnections()
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[string]int{}
	for range clients {
		wg.Go(func() {
			body := &repeatReader{prefix: prefix, n: size}
			req, _ := http.NewRequest(http.MethodPost, st.base+"/mcp", body)
			req.ContentLength = int64(len(prefix) + size)
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
			key := ""
			resp, err := c.Do(req)
			if err != nil {
				key = "error: " + errClass(err)
			} else {
				var r rpcResponse
				b := make([]byte, 4096)
				k, _ := resp.Body.Read(b)
				resp.Body.Close()
				key = fmt.Sprint(resp.StatusCode)
				if resp.StatusCode == http.StatusRequestEntityTooLarge {
					if err := json.Unmarshal(b[:k], &r); err != nil || r.Error == nil {
						key += " without a JSON-RPC error"
					}
				}
			}
			mu.Lock()
			statuses[key]++
			mu.Unlock()
		})
	}
	wg.Wait()
	close(done)
	<-sampled
	t.Logf("%d × %d MiB bodies: %v; heap in use %d MiB before, %d MiB at peak",
		clients, size>>20, statuses, heap0>>20, peak.Load()>>20)
	for k, v := range statuses {
		// A client still writing when the server answers and closes may
		// see its write fail: the answer was sent, the body refused.
		if k != "413" && !strings.HasPrefix(k, "error: ") {
			t.Errorf("%d requests: %s", v, k)
		}
	}
	if statuses["413"] == 0 {
		t.Errorf("no request was answered 413: %v", statuses)
	}
	if grew := peak.Load() - min(peak.Load(), heap0); grew > clients<<20+256<<20 {
		t.Errorf("heap grew by %d MiB for %d refused bodies", grew>>20, clients)
	}
	if n, err := st.store.CountPending(context.Background(), "agent-big"); err != nil || n != pending0 {
		t.Errorf("pending tasks after refused bodies: %d (before: %d) %v", n, pending0, err)
	}
}

// repeatReader yields prefix then n bytes of 'x'.
type repeatReader struct {
	prefix string
	n      int
	off    int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.off >= len(r.prefix)+r.n {
		return 0, io.EOF
	}
	k := 0
	for k < len(p) && r.off < len(r.prefix)+r.n {
		if r.off < len(r.prefix) {
			p[k] = r.prefix[r.off]
		} else {
			p[k] = 'x'
		}
		k++
		r.off++
	}
	return k, nil
}

// rssBytes is the process's resident set size, from /proc.
func rssBytes() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseUint(f[1], 10, 64)
	return pages * uint64(os.Getpagesize())
}
