package devstack

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

const portsFile = "ports.json"

// ports are the gRPC ports of the four services. They are chosen on first
// start and kept in DataDir/ports.json.
type ports struct {
	Frontend int `json:"frontend"`
	History  int `json:"history"`
	Matching int `json:"matching"`
	Worker   int `json:"worker"`
}

// handedOut remembers every port this process picked or reused, so that two
// servers starting at once in one process never get the same port. The
// kernel may hand a just-closed ephemeral port out again.
var handedOut = struct {
	sync.Mutex
	m map[int]bool
}{m: map[int]bool{}}

// loadPorts reads DataDir/ports.json; a missing file is not an error.
func loadPorts(dir string) (ports, bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, portsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return ports{}, false, nil
	}
	if err != nil {
		return ports{}, false, fmt.Errorf("devstack: read %s: %w", portsFile, err)
	}
	var p ports
	if err := json.Unmarshal(b, &p); err != nil {
		return ports{}, false, fmt.Errorf("devstack: parse %s: %w", portsFile, err)
	}
	return p, true, nil
}

// savePorts writes DataDir/ports.json atomically.
func savePorts(dir string, p ports) error {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, portsFile+".*")
	if err != nil {
		return fmt.Errorf("devstack: write %s: %w", portsFile, err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("devstack: write %s: %w", portsFile, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("devstack: write %s: %w", portsFile, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("devstack: write %s: %w", portsFile, err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, portsFile)); err != nil {
		return fmt.Errorf("devstack: write %s: %w", portsFile, err)
	}
	return nil
}

// resolvePorts decides the four ports: an explicit frontend port wins, then
// ports.json, then free loopback ports. It reports whether ports.json needs
// writing.
func resolvePorts(dir string, frontend int) (ports, bool, error) {
	p, found, err := loadPorts(dir)
	if err != nil {
		return ports{}, false, err
	}
	want := p
	if frontend != 0 {
		want.Frontend = frontend
	}

	handedOut.Lock()
	defer handedOut.Unlock()
	for _, port := range []*int{&want.Frontend, &want.History, &want.Matching, &want.Worker} {
		if *port != 0 {
			handedOut.m[*port] = true
			continue
		}
		free, err := freePort()
		if err != nil {
			return ports{}, false, err
		}
		*port = free
	}
	if dup := duplicatePort(want); dup != 0 {
		return ports{}, false, fmt.Errorf("devstack: port %d is assigned to two services (%s)", dup, portsFile)
	}
	return want, !found || want != p, nil
}

// freePort asks the kernel for a free loopback port that this process has
// not handed out before. The caller holds handedOut.
func freePort() (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("devstack: pick a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !handedOut.m[port] {
			handedOut.m[port] = true
			return port, nil
		}
	}
	return 0, errors.New("devstack: pick a free port: no new port after 100 tries")
}

func duplicatePort(p ports) int {
	seen := map[int]bool{}
	for _, port := range []int{p.Frontend, p.History, p.Matching, p.Worker} {
		if seen[port] {
			return port
		}
		seen[port] = true
	}
	return 0
}

// checkBindable fails early, with a clear error, when a port is taken.
// Temporal itself treats a failed listen as fatal.
func checkBindable(host string, port int, service string) error {
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("%w: %s port %d on %s: %w", ErrPortInUse, service, port, host, err)
	}
	return l.Close()
}
