// Package proccpu reads the CPU time this process has used, user and
// system, on every thread. Benchmarks use it where the work they measure
// runs on goroutines of its own: the embedded NATS or Temporal server, an
// HTTP handler.
package proccpu

import (
	"syscall"
	"time"
)

// Used is the CPU time this process has used so far; 0 if it cannot be
// read.
func Used() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// PerOp is the CPU used since start (a value of Used) per op, in
// microseconds: the figure benchmarks report as "cpu-µs/op".
func PerOp(start time.Duration, ops int) float64 {
	if ops <= 0 {
		return 0
	}
	return float64((Used() - start).Nanoseconds()) / 1e3 / float64(ops)
}
