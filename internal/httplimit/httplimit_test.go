package httplimit

import (
	"bufio"
	"fmt"
	"golang.org/x/net/netutil"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// server is an http.Server on loopback shaped like the app's: the guard in
// front of a handler that reads its body as ours do, ReadHeaderTimeout set,
// no WriteTimeout. It counts the server side's open connections.
type server struct {
	URL   string
	Addr  string
	open  atomic.Int64
	srv   *http.Server
	ln    net.Listener
	guard *Bodies
}

func startServer(t *testing.T, opts Options, maxConns int, h http.Handler) *server {
	t.Helper()
	g, err := NewBodies(opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if maxConns > 0 {
		ln = netutil.LimitListener(ln, maxConns)
	}
	s := &server{Addr: ln.Addr().String(), ln: ln, guard: g}
	s.URL = "http://" + s.Addr
	s.srv = &http.Server{
		Handler:           g.Handler(h),
		ReadHeaderTimeout: 2 * time.Second,
		IdleTimeout:       5 * time.Second,
		ConnState: func(_ net.Conn, cs http.ConnState) {
			switch cs {
			case http.StateNew:
				s.open.Add(1)
			case http.StateClosed, http.StateHijacked:
				s.open.Add(-1)
			}
		},
	}
	go s.srv.Serve(ln)
	t.Cleanup(func() { s.srv.Close() })
	return s
}

// readsBody answers like the app's handlers: 400 when the body could not be
// read, else 200 with the body's length.
var readsBody = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "could not read the request body", http.StatusBadRequest)
		return
	}
	fmt.Fprintf(w, "read %d bytes", len(b))
})

// slowClient sends the headers of a POST with a 1000-byte body, one byte of
// it, and stalls; it returns the connection.
func slowClient(t testing.TB, addr, path string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", path)
	return c
}

// response reads the status line and headers the server sent on c before
// it closed the connection, waiting at most d.
func response(c net.Conn, d time.Duration) (*http.Response, error) {
	c.SetReadDeadline(time.Now().Add(d))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// The server must close the connection after answering.
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		return resp, fmt.Errorf("connection still open after the answer: %v", err)
	}
	return resp, nil
}

func openFDs(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd: cannot count file descriptors")
	}
	return len(ents)
}

func TestSlowBodiesAreCutAndReleased(t *testing.T) {
	const (
		slow     = 300
		timeout  = 1500 * time.Millisecond
		maxSlow  = 20
		deadline = timeout + 2*time.Second // slack for a loaded machine
	)
	s := startServer(t, Options{BodyTimeout: timeout, SlowAfter: 200 * time.Millisecond, MaxSlowBodies: maxSlow}, 0, readsBody)
	fds0, gor0 := openFDs(t), runtime.NumGoroutine()

	start := time.Now()
	conns := make([]net.Conn, slow)
	for i := range conns {
		conns[i] = slowClient(t, s.Addr, "/approver/v1/enrollments/made-up-token/begin")
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()

	// Meanwhile, a client that sends its body promptly is served.
	time.Sleep(300 * time.Millisecond)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Post(s.URL+"/mcp", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	if err != nil {
		t.Fatalf("normal request during the attack: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("normal request during the attack: %d %s", resp.StatusCode, body)
	}
	peakServer, peakFDs := s.open.Load(), openFDs(t)

	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			resp, err := response(c, deadline)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				statuses[-1]++
				t.Errorf("slow client: %v", err)
				return
			}
			statuses[resp.StatusCode]++
			switch resp.StatusCode {
			case http.StatusServiceUnavailable:
				if resp.Header.Get("Retry-After") == "" {
					t.Error("503 without Retry-After")
				}
			case http.StatusRequestTimeout:
			default:
				t.Errorf("slow client got %d", resp.StatusCode)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type %q, want JSON", ct)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if elapsed > deadline {
		t.Errorf("slow clients held for %v, want under %v", elapsed, deadline)
	}
	if statuses[http.StatusRequestTimeout] > maxSlow {
		t.Errorf("%d bodies read to the deadline, cap %d", statuses[http.StatusRequestTimeout], maxSlow)
	}
	for _, c := range conns {
		c.Close()
	}
	client.CloseIdleConnections()

	// Everything is released: connections, descriptors, goroutines, slots.
	waitFor(t, 5*time.Second, func() bool {
		return s.open.Load() == 0 && openFDs(t) <= fds0+2 && runtime.NumGoroutine() <= gor0+5
	})
	if n := s.guard.Reading(); n != 0 {
		t.Errorf("%d bodies still counted as being read", n)
	}
	if n := s.guard.SlowReaders(); n != 0 {
		t.Errorf("%d slow-reader slots still taken", n)
	}
	t.Logf("%d slow connections: statuses %v in %v; server connections at peak %d; fds %d → peak %d → %d; goroutines %d → %d",
		slow, statuses, elapsed.Round(10*time.Millisecond), peakServer, fds0, peakFDs, openFDs(t), gor0, runtime.NumGoroutine())
}

func waitFor(t *testing.T, d time.Duration, ok func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !ok(); {
		if time.Now().After(end) {
			t.Fatalf("not released after %v", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestLongResponseOutlivesBodyTimeout(t *testing.T) {
	// A handler that has read its body may answer (or stream) for longer
	// than the body timeout: the read deadline must not cancel it.
	const timeout = 300 * time.Millisecond
	s := startServer(t, Options{BodyTimeout: timeout, SlowAfter: 100 * time.Millisecond}, 0,
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := io.ReadAll(r.Body); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			w.WriteHeader(http.StatusOK)
			for i := range 3 {
				select {
				case <-r.Context().Done():
					return
				case <-time.After(timeout):
				}
				fmt.Fprintf(w, "event %d\n", i)
				http.NewResponseController(w).Flush()
			}
		}))
	resp, err := http.Post(s.URL, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || strings.Count(string(b), "event") != 3 {
		t.Fatalf("stream = %q, %v; want three events", b, err)
	}
}

func TestHandlerAnsweringWithoutReadingClosesAtOnce(t *testing.T) {
	// A handler that refuses before reading (401) must not wait for the
	// rest of a slow body.
	s := startServer(t, Options{BodyTimeout: 5 * time.Second}, 0,
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
		}))
	c := slowClient(t, s.Addr, "/mcp")
	defer c.Close()
	start := time.Now()
	resp, err := response(c, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusUnauthorized || time.Since(start) > time.Second {
		t.Fatalf("got %d after %v, want 401 at once", resp.StatusCode, time.Since(start))
	}
}

func TestRejectShape(t *testing.T) {
	var gotStatus atomic.Int64
	s := startServer(t, Options{BodyTimeout: 200 * time.Millisecond, SlowAfter: 100 * time.Millisecond,
		Reject: func(w http.ResponseWriter, r *http.Request, status int, message string) {
			gotStatus.Store(int64(status))
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":%q}}`, message)
		}}, 0, readsBody)
	c := slowClient(t, s.Addr, "/mcp")
	defer c.Close()
	resp, err := response(c, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestTimeout || gotStatus.Load() != http.StatusRequestTimeout {
		t.Fatalf("status %d (Reject saw %d), want 408", resp.StatusCode, gotStatus.Load())
	}
}

func TestLimitListener(t *testing.T) {
	s := startServer(t, Options{}, 2, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	dial := func() net.Conn {
		c, err := net.Dial("tcp", s.Addr) // sends nothing: the server waits for headers
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a := dial()
	dial()
	waitFor(t, time.Second, func() bool { return s.open.Load() == 2 })
	dial() // waits in the backlog
	time.Sleep(100 * time.Millisecond)
	if n := s.open.Load(); n != 2 {
		t.Fatalf("%d connections accepted, cap 2", n)
	}
	a.Close()
	waitFor(t, time.Second, func() bool { return s.open.Load() == 2 })
	s.ln.Close()
	if _, err := s.ln.Accept(); err == nil {
		t.Error("Accept after Close succeeded")
	}
}
