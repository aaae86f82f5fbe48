package abusetest

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/httplimit"
)

// TestSlowHeaders: 500 connections send part of a request's headers and
// stall (slowloris). Each is closed by the server within its header
// deadline, unanswered or with 408; a prompt client is served meanwhile;
// descriptors and goroutines come back.
func TestSlowHeaders(t *testing.T) {
	const slow = 500
	st := startStack(t, limits{maxConns: httplimit.DefaultMaxConns})
	tok, taskID := st.agent(t, "agent-prompt")
	c := newClient(1)
	defer c.CloseIdleConnections()
	fds0, gor0 := openFDs(t), runtime.NumGoroutine()

	start := time.Now()
	conns := make([]net.Conn, slow)
	for i := range conns {
		nc, err := net.Dial("tcp", st.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		fmt.Fprintf(nc, "POST /mcp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer %s\r\nX-Slow-%d: ", tok, i)
		conns[i] = nc
	}
	if code, _, resp, err := tasksGet(c, st.base, tok, taskID, 1); err != nil || code != http.StatusOK || resp.Result.TaskID != taskID {
		t.Fatalf("prompt client among the slow ones: %d %+v %v", code, resp, err)
	}
	// The stack's ReadHeaderTimeout is 5 s, as internal/app's.
	const deadline = 5*time.Second + 3*time.Second
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[string]int{}
	for _, nc := range conns {
		wg.Go(func() {
			nc.SetReadDeadline(time.Now().Add(deadline))
			b := make([]byte, 512)
			var got []byte
			var err error
			for {
				var k int
				k, err = nc.Read(b)
				got = append(got, b[:k]...)
				if err != nil {
					break
				}
			}
			key := "closed"
			switch {
			case isTimeout(err):
				key = "still open"
			case len(got) > 0:
				key = strings.SplitN(string(got), "\r\n", 2)[0]
			}
			mu.Lock()
			outcomes[key]++
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	t.Logf("%d slow-header connections ended in %v: %v", slow, elapsed.Round(10*time.Millisecond), outcomes)
	for k := range outcomes {
		if k != "closed" && !strings.HasPrefix(k, "HTTP/1.1 408") && !strings.HasPrefix(k, "HTTP/1.1 400") {
			t.Errorf("%d slow-header connections: %s", outcomes[k], k)
		}
	}
	for _, nc := range conns {
		nc.Close()
	}
	c.CloseIdleConnections()
	waitFor(t, 5*time.Second, func() bool {
		return st.open.Load() == 0 && openFDs(t) <= fds0+2 && runtime.NumGoroutine() <= gor0+5
	})
}

// errClass is a transport error without its addresses, for counting.
func errClass(err error) string {
	switch {
	case isTimeout(err):
		return "timeout"
	case strings.Contains(err.Error(), "connection reset"):
		return "connection reset"
	case strings.Contains(err.Error(), "broken pipe"):
		return "broken pipe"
	case strings.Contains(err.Error(), "EOF"):
		return "EOF"
	}
	return err.Error()
}

func isTimeout(err error) bool {
	var ne net.Error
	return err != nil && errors.As(err, &ne) && ne.Timeout()
}
