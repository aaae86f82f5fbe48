//go:build pprof

// Built only with -tags pprof (benchmarks, never a release): when
// COUNTERSIGN_PPROF_ADDR is set (a loopback host:port), the process serves
// net/http/pprof there, so a CPU profile can be taken of a running
// `countersign dev`, embedded Temporal and NATS included
// (scripts/bench/sep2672-cpu.sh).
package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
)

func init() {
	addr := os.Getenv("COUNTERSIGN_PPROF_ADDR")
	if addr == "" {
		return
	}
	if host, _, err := net.SplitHostPort(addr); err != nil || !net.ParseIP(host).IsLoopback() {
		fmt.Fprintf(os.Stderr, "countersign: COUNTERSIGN_PPROF_ADDR %q: a loopback host:port is required\n", addr)
		os.Exit(2)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	go func() { _ = http.ListenAndServe(addr, mux) }()
}
