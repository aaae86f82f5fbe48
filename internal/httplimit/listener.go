package httplimit

import (
	"net"
	"sync"
)

// DefaultMaxConns is the connection cap of the servers this repository
// runs when none is configured.
const DefaultMaxConns = 4096

// LimitListener returns a listener that accepts at most n connections open
// at once (golang.org/x/net/netutil.LimitListener's behaviour): at the cap,
// Accept waits until a connection closes, and new clients wait in the
// kernel's backlog instead of holding a descriptor of this process.
func LimitListener(l net.Listener, n int) net.Listener {
	return &limitListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{})}
}

type limitListener struct {
	net.Listener
	sem       chan struct{}
	closeOnce sync.Once
	done      chan struct{}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

// Open is the number of accepted connections not yet closed.
func (l *limitListener) Open() int { return len(l.sem) }

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
