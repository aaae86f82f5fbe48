package upstream

import "syscall"

// undumpable makes this process non-dumpable (prctl PR_SET_DUMPABLE 0):
// its /proc/PID files (environ, mem, maps…) then belong to root, and a
// process of the same user cannot read them or attach to it. A stdio
// upstream runs as Countersign's user; without this it read Countersign's
// whole environment (Slack and Temporal secrets, those meant for other
// upstreams) from /proc/PPID/environ, whatever childEnv left out, and its
// memory from /proc/PPID/mem.
func undumpable() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0); errno != 0 {
		return errno
	}
	return nil
}
