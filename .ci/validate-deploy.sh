#!/usr/bin/env bash
# Validate the deployment files without a Docker engine, SQL Server, the
# Service Bus emulator or Azure (none exist on the build machines):
#
#   1. docker-compose.yml parses and resolves (docker-compose `config -q`);
#   2. every binary builds exactly the way the Dockerfile builds it;
#   3. deploy/main.parameters.example.json is JSON, and deploy/main.bicep
#      compiles when a bicep CLI happens to be installed.
#
# The consistency checks between Config.json, docker-compose.yml and the
# routes files are Go tests (./emulator), run by the main test command.
# A missing tool is reported and skipped; a failed check exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf -- '--- %s\n' "$*"; }
skip() { printf -- '--- SKIPPED: %s\n' "$*"; }

# 1. docker-compose.yml
compose=()
if docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
  compose=(docker-compose)
else
  say "installing docker-compose (Debian package) to validate docker-compose.yml"
  if { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose; } >/dev/null 2>&1 \
    && command -v docker-compose >/dev/null 2>&1; then
    compose=(docker-compose)
  fi
fi
if [ ${#compose[@]} -gt 0 ]; then
  say "${compose[*]} -f docker-compose.yml config -q"
  # config only parses and interpolates: no Docker engine is contacted.
  "${compose[@]}" -f docker-compose.yml config -q
else
  skip "docker-compose.yml not validated: neither 'docker compose' nor docker-compose is available and 'apt-get install docker-compose' failed"
fi

# 2. The binaries, with the Dockerfile's exact build command.
build='CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o'
if ! grep -qF -- "$build" Dockerfile; then
  echo "Dockerfile no longer builds with: $build ... ./cmd/... (update .ci/validate-deploy.sh to match)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
say "CGO_ENABLED=0 go build -trimpath -ldflags=\"-s -w\" -o $tmp/ ./cmd/..."
CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$tmp/" ./cmd/...
for bin in processor reconciler demoapi demosender; do
  if [ ! -x "$tmp/$bin" ]; then
    echo "the build produced no $bin binary (the Dockerfile's $bin target copies it)" >&2
    exit 1
  fi
done
ls -l "$tmp"

# 3. Bicep
if [ -f deploy/main.parameters.example.json ]; then
  say "deploy/main.parameters.example.json is JSON"
  if command -v python3 >/dev/null 2>&1; then
    python3 -m json.tool deploy/main.parameters.example.json >/dev/null
  else
    skip "python3 not installed: parameters file not parsed"
  fi
fi
if command -v bicep >/dev/null 2>&1; then
  say "bicep build deploy/main.bicep"
  bicep build deploy/main.bicep --stdout >/dev/null
elif command -v az >/dev/null 2>&1 && az bicep version >/dev/null 2>&1; then
  say "az bicep build deploy/main.bicep"
  az bicep build --file deploy/main.bicep --stdout >/dev/null
else
  skip "deploy/main.bicep not compiled: no bicep CLI (it is not in any package registry this machine reaches)"
fi
say "deployment files OK"
