//go:build !unix

package upstream

import (
	"os"
	"os/exec"
	"syscall"
)

// Without process groups, the child alone is signalled: what it starts is
// not reached.

func setGroup(*exec.Cmd) {}

func signalGroup(p *os.Process, sig syscall.Signal) error {
	if sig == syscall.SIGKILL {
		return p.Kill()
	}
	return p.Signal(sig)
}

func groupAlive(*os.Process) bool { return false }

func reapGroup(*os.Process) {}
