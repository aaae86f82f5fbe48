//go:build unix

package upstream

import (
	"bytes"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// setGroup makes cmd's process the leader of a new process group, whose ID
// is its PID.
func setGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

// signalGroup sends sig to every process in the group p leads (or led). It
// fails with ESRCH when none is left.
func signalGroup(p *os.Process, sig syscall.Signal) error {
	return syscall.Kill(-p.Pid, sig)
}

// groupAlive reports whether a process that has not exited is left in the
// group p led. On Linux, a member that has exited but is not reaped yet (a
// zombie: one whose parent is Countersign is reaped by reapGroup once the
// group is ended) does not count; elsewhere, and when /proc cannot be read, it
// does, and such a group is waited for until SIGKILL.
func groupAlive(p *os.Process) bool {
	if syscall.Kill(-p.Pid, 0) == syscall.ESRCH {
		return false
	}
	if runtime.GOOS != "linux" {
		return true
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, e := range procs {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // it exited meanwhile
		}
		// "pid (comm) state ppid pgrp ...": comm may hold spaces and
		// parentheses, so the fields start after the last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) >= 3 && f[0] != "Z" && f[2] == strconv.Itoa(p.Pid) {
			return true
		}
	}
	return false
}

// reapGroup collects the exit status of every member of the group p led
// that has exited and whose parent is now this process: a wrapper's
// children are handed to it when the wrapper dies and Countersign is PID 1
// (in a container with no init) or a child subreaper. Left unreaped they
// would stay zombies, one more with every restart of the upstream. It
// waits only on that group (p, the leader, is reaped already by
// exec.Cmd.Wait), so it never takes the status of another child. It
// returns when no member has exited unreaped: ECHILD (none of the group is
// Countersign's child), or a member still running.
func reapGroup(p *os.Process) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-p.Pid, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
	}
}
