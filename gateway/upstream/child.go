package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// groupPoll is how often endGroup looks whether a process group is gone.
const groupPoll = 20 * time.Millisecond

// stdioTransport runs a stdio upstream: cmd in a process group of its own
// (see [child]), spoken to over its stdin and stdout, its stderr copied to
// stderr (a lineLogger, which takes it as fast as it comes). Its connection
// records writes (see writeRecorder).
type stdioTransport struct {
	cmd    *exec.Cmd // Stdin, Stdout and Stderr unset
	stderr io.Writer
	// grace is how long the child gets to exit after its stdin is closed,
	// and again after SIGTERM, before it is killed.
	grace time.Duration
}

func (t stdioTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := startChild(t.cmd, t.stderr, t.grace)
	if err != nil {
		return nil, err
	}
	// The connection is closed by closing the child's stdin (child.Close),
	// not its stdout: a child writing its last words must not get SIGPIPE.
	conn, err := (&mcp.IOTransport{Reader: io.NopCloser(c.stdout), Writer: c}).Connect(ctx)
	if err != nil {
		c.Close()
		return nil, err
	}
	return writeRecorder{conn}, nil
}

// child is a stdio upstream's process and the process group it leads. A
// stdio upstream is often a wrapper (npx, uv run, sh -c) that starts the
// server as its own child; the group holds them all, and whatever they
// start, unless a process leaves it (setsid, a daemon).
//
// The group is ended when the child exits, for whatever reason: what is
// left of it gets SIGTERM, then, if anything is still there after grace,
// SIGKILL. Close asks the child to exit first, as MCP's stdio shutdown
// says: it closes the child's stdin and waits up to grace, then sends the
// group SIGTERM and waits up to grace again, then sends the group SIGKILL.
//
// The child's stdin, stdout and stderr are pipes Countersign made, not
// exec.Cmd's: the child's exit is seen at once, even while a process it
// left behind holds them open, and no output is lost to a pipe closed
// under it.
type child struct {
	cmd    *exec.Cmd
	stdin  *os.File // Countersign's ends
	stdout *os.File
	grace  time.Duration

	exited  chan struct{} // closed once the child has exited
	ended   chan struct{} // closed once its group is gone and its stderr drained
	waitErr error         // cmd.Wait's; set before exited is closed
}

// startChild starts cmd with pipes for stdin, stdout and stderr (copied to
// stderr, which must not block: the child would wait on a full pipe) as the
// leader of a new process group.
func startChild(cmd *exec.Cmd, stderr io.Writer, grace time.Duration) (_ *child, err error) {
	var files []*os.File // all ends, closed on failure
	defer func() {
		if err != nil {
			for _, f := range files {
				f.Close()
			}
		}
	}()
	var ends [3][2]*os.File // stdin, stdout, stderr: {read, write}
	for i := range ends {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		ends[i] = [2]*os.File{r, w}
		files = append(files, r, w)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = ends[0][0], ends[1][1], ends[2][1]
	setGroup(cmd)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// The child has its own copies of its ends.
	ends[0][0].Close()
	ends[1][1].Close()
	ends[2][1].Close()
	c := &child{
		cmd:    cmd,
		stdin:  ends[0][1],
		stdout: ends[1][0],
		grace:  grace,
		exited: make(chan struct{}),
		ended:  make(chan struct{}),
	}
	errR := ends[2][0]
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		_, _ = io.Copy(stderr, errR)
	}()
	go c.reap(errR, drained)
	return c, nil
}

// reap waits for the child to exit, ends its group, then waits up to grace
// for the rest of its stderr (a process that left the group may hold it).
func (c *child) reap(errR *os.File, drained <-chan struct{}) {
	c.waitErr = c.cmd.Wait()
	close(c.exited)
	endGroup(c.cmd.Process, c.grace)
	t := time.NewTimer(c.grace)
	select {
	case <-drained:
	case <-t.C:
	}
	t.Stop()
	errR.Close()
	<-drained
	close(c.ended)
}

// endGroup sends the group p led SIGTERM, and SIGKILL if any process is still
// in it after grace, then reaps the members handed to Countersign
// (reapGroup). p has exited.
func endGroup(p *os.Process, grace time.Duration) {
	defer reapGroup(p)
	if signalGroup(p, syscall.SIGTERM) != nil {
		return // no process left, or signals are not supported here
	}
	deadline := time.Now().Add(grace)
	killed := false
	for groupAlive(p) {
		if time.Now().After(deadline) {
			if killed {
				return
			}
			_ = signalGroup(p, syscall.SIGKILL)
			killed, deadline = true, time.Now().Add(grace)
		}
		time.Sleep(groupPoll)
	}
}

func (c *child) Write(p []byte) (int, error) { return c.stdin.Write(p) }

// Close ends the child and its group (see [child]) and waits for both. It
// returns the child's exit error, as exec.Cmd.Wait gives it.
func (c *child) Close() error {
	err := c.stdin.Close()
	defer c.stdout.Close()
	if !c.exitsWithin(c.grace) {
		// If SIGTERM cannot be sent, go on to SIGKILL at once.
		if signalGroup(c.cmd.Process, syscall.SIGTERM) != nil || !c.exitsWithin(c.grace) {
			_ = signalGroup(c.cmd.Process, syscall.SIGKILL)
			if !c.exitsWithin(c.grace) {
				return fmt.Errorf("process %d did not exit after SIGKILL", c.cmd.Process.Pid)
			}
		}
	}
	<-c.ended
	if errors.Is(err, os.ErrClosed) {
		err = nil
	}
	return errors.Join(err, c.waitErr)
}

func (c *child) exitsWithin(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.exited:
		return true
	case <-t.C:
		return false
	}
}
