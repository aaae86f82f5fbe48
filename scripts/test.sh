#!/usr/bin/env bash
# The whole test suite: formatting, vet, staticcheck, unit tests (with the race detector
# where the package does not link the Temporal server), and the end-to-end
# tests against the real embedded Temporal and NATS. Run from the repo root:
#   ./scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

export GOTOOLCHAIN=local
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"

echo "== gofmt"
bad=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.cache/*'))
if [ -n "$bad" ]; then
  echo "gofmt would change:"; echo "$bad"; exit 1
fi

echo "== go vet"
go vet ./...
# The crash-trial build (internal/app/crashpoints.go, which TestCrashTrials
# builds and runs) has code of its own.
go vet -tags crashpoints ./internal/app

echo "== staticcheck"
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

# Workflow code must be deterministic; workflowcheck follows every call the
# workflows make (an ignored line says why it is deterministic).
echo "== workflowcheck"
go run go.temporal.io/sdk/contrib/tools/workflowcheck@v0.6.0 ./workflows/...

# The real upstream MCP servers the gateway tests put Countersign in front
# of (@modelcontextprotocol/server-filesystem and server-everything, pinned).
echo "== upstream MCP servers"
eval "$(./scripts/upstreams.sh)"

# Packages that link the Temporal server are slow and memory-hungry to build
# with -race; they run without it. Everything else runs with -race.
light=()
heavy=()
for pkg in $(go list ./...); do
  # Read the whole list before matching: with `go list | grep -q` under
  # pipefail, grep's early exit can kill go list (SIGPIPE) and misfile a
  # heavy package as light.
  deps=$(go list -deps -test "$pkg")
  if grep -qx 'go.temporal.io/server/temporal' <<<"$deps"; then
    heavy+=("$pkg")
  else
    light+=("$pkg")
  fi
done

echo "== go test -race (${#light[@]} packages)"
go test -race -count=1 "${light[@]}"

# internal/browsertest (the approver site in headless Chromium) is among them;
# it fails with install instructions when Chromium is missing.
# Load tests cannot run under -race (its goroutine limit, and its cost on
# the clients' bulk writes); internal/abusetest builds them only without it.
echo "== load tests (internal/abusetest, without -race)"
go test -count=1 -run 'TestTenThousandPollers|TestOversizeBodiesInBulk' ./internal/abusetest

# internal/e2e holds the crash trials (TestCrashTrials: 30 restarts of
# countersign dev, several minutes on a loaded 2-core machine).
echo "== go test, packages linking the Temporal server (${#heavy[@]} packages)"
go test -count=1 -timeout 45m "${heavy[@]}"

# Short fuzz runs of the parsers of untrusted input (their seed corpora ran
# above with the unit tests); docs/benchmarks.md "Fuzzing" has longer runs.
# One worker each, so the machine stays usable.
# A count, not a duration: with -fuzztime 5s the coordinator's deadline can
# fall while a worker still gathers its baseline, and go test reports
# "context deadline exceeded" as a failure (seen on a clean checkout).
echo "== go test -fuzz (short)"
for target in \
  "FuzzParse ./internal/config" \
  "FuzzDecisionBody ./internal/approverapi" \
  "FuzzBearerToken ./internal/authn" \
  "FuzzParse ./txtoken" \
  "FuzzCanonicalize ./internal/canon" \
  "FuzzNumber ./internal/canon" \
  "FuzzVerify ./audit" \
  "FuzzSealLine ./audit" \
  "FuzzReadCheckpoint ./audit" \
  "FuzzVerifyResponse ./passkey" \
  "FuzzEvidence ./mcpserver" \
  "FuzzVerifiedCall ./mcpserver" \
  "FuzzOpenInputState ./mcpserver" \
  "FuzzJSONRPC ./mcpserver" \
  "FuzzLeanTaskGet ./mcpserver" \
  "FuzzVerify ./internal/oauth" \
  "FuzzDecisionMessage ./notify" \
  "FuzzSlackInteraction ./notify" \
  "FuzzUpstreamResult ./gateway/upstream" \
  "FuzzUpstreamToolList ./gateway/upstream"; do
  set -- $target
  go test -run '^$' -fuzz "^$1\$" -fuzztime "${FUZZTIME:-500x}" -parallel 1 "$2"
done

# MCP suites and clients that no one here wrote (conformance 0.2.0-alpha.12
# and 0.1.16, TypeScript SDK 1.32.2, MCP Inspector 2.12.0) against a real
# `countersign dev`; see the README's "Interoperability" section.
echo "== interop"
./scripts/interop.sh
