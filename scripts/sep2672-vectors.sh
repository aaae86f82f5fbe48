#!/usr/bin/env bash
# SEP-2672 interop vectors: recompute the action hash and wire challenge of
# internal/canon/testdata/sep2672-inputs.json with the reference
# implementation's canonicalization (npm canonicalize, pinned) and Node's
# SHA-256 (scripts/interop/sep2672-vectors.mjs), compare them with the
# committed internal/canon/testdata/sep2672-vectors.json, and run the Go test
# that checks Countersign against that file (internal/canon
# TestInteropVectors). Needs node and npm; INTEROP_CACHE as in interop.sh.
#
#   scripts/sep2672-vectors.sh           check (exit 1 on any difference)
#   scripts/sep2672-vectors.sh -update   rewrite the committed vectors
set -euo pipefail
cd "$(dirname "$0")/.."
CANONICALIZE_VERSION=3.0.0
CACHE=${INTEROP_CACHE:-$PWD/.cache/interop}
DIR=${SEP2672_CANON_DIR:-$CACHE/canonicalize}
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
export npm_config_cache=${npm_config_cache:-$CACHE/npm-cache}
export GOTOOLCHAIN=local

spec="canonicalize@$CANONICALIZE_VERSION"
if [ "$(cat "$DIR/.installed" 2>/dev/null)" != "$spec" ]; then
  echo "== npm install $spec"
  rm -rf "$DIR" && mkdir -p "$DIR"
  (cd "$DIR" && echo '{"private":true}' >package.json && npm install --no-save --silent "$spec")
  echo "$spec" >"$DIR/.installed"
fi

inputs=internal/canon/testdata/sep2672-inputs.json
vectors=internal/canon/testdata/sep2672-vectors.json
fresh=$(mktemp)
trap 'rm -f "$fresh"' EXIT
INTEROP_CANON_DIR=$DIR node scripts/interop/sep2672-vectors.mjs "$inputs" >"$fresh"
if [ "${1:-}" = "-update" ]; then
  cp "$fresh" "$vectors"
  echo "== wrote $vectors"
fi
if ! diff -u "$vectors" "$fresh"; then
  echo "sep2672-vectors: the reference's canonicalization disagrees with $vectors" >&2
  exit 1
fi
go test -count=1 -run 'TestInteropVectors' ./internal/canon
echo "$(grep -c '"actionHash"' "$vectors") SEP-2672 vectors agree with $spec"
