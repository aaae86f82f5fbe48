#!/usr/bin/env python3
"""Split a CPU profile of `countersign dev` by component.

Reads `go tool pprof -traces BINARY PROFILE` on stdin and assigns every
sample to the first component (in the order below) with a frame in its
stack, so the shares add up to 100 %. Used by scripts/bench/sep2672-cpu.sh.
"""
import re
import sys

# (name, frame regex), first match wins.
COMPONENTS = [
    ("Temporal persistence (SQLite)", r"modernc\.org/(sqlite|libc)"),
    ("Temporal server (history, matching, frontend)", r"go\.temporal\.io/server"),
    ("Temporal SDK (worker, client, workflow)", r"go\.temporal\.io/sdk"),
    ("gRPC / protobuf (Temporal transport)", r"google\.golang\.org/(grpc|protobuf)|go\.temporal\.io/api"),
    ("NATS server (JetStream KV, streams)", r"nats-io/nats-server"),
    ("NATS client", r"nats-io/nats(%2e|\.)go"),
    ("passkey (WebAuthn verification, challenges)", r"countersign/countersign/passkey|go-webauthn"),
    ("policy (OPA)", r"open-policy-agent|countersign/countersign/pdp"),
    ("MCP request path (HTTP, go-sdk, mcpserver, auth)", r"modelcontextprotocol/go-sdk|countersign/countersign/(mcpserver|internal/app|gateway)|net/http"),
    ("GC (background mark, sweep)", r"runtime\.(gcBgMarkWorker|bgsweep|bgscavenge)"),
]


def parse(stream):
    samples, cur, val = [], [], None
    unit = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    for line in stream:
        if line.startswith("-----------+"):
            if val is not None:
                samples.append((val, cur))
            cur, val = [], None
            continue
        m = re.match(r"^\s+([\d.]+)(s|ms|us|µs|ns)\s+(\S.*)$", line)
        if m:
            val = float(m.group(1)) * unit[m.group(2)]
            cur = [m.group(3)]
        elif val is not None and line.strip():
            cur.append(line.strip())
    if val is not None:
        samples.append((val, cur))
    return samples


def main():
    samples = parse(sys.stdin)
    total = sum(v for v, _ in samples)
    per = {}
    for v, stack in samples:
        name = "other (scheduler, syscalls, timers, ...)"
        for cname, rx in COMPONENTS:
            if any(re.search(rx, f) for f in stack):
                name = cname
                break
        per[name] = per.get(name, 0.0) + v
    print(f"total sampled CPU {total:.2f}s")
    for name, v in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"{100 * v / total:5.1f} %  {v:7.2f}s  {name}")


if __name__ == "__main__":
    main()
