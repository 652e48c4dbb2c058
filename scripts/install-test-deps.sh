#!/usr/bin/env bash
# Installs and starts what the tests need, skipping whatever is already there:
# a Rust toolchain (must exist), Redis on 127.0.0.1:6379, and the Python
# clients of tests/requirements.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*"; }

if ! command -v cargo >/dev/null; then
  echo "cargo is required (https://rustup.rs)" >&2
  exit 1
fi

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

apt_updated=
apt_install() {
  if [ -z "$apt_updated" ]; then
    as_root apt-get update -qq
    apt_updated=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# Redis: the control plane's shared store, and redis-benchmark for bench/.
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  log "installing Redis"
  apt_install redis-server redis-tools
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  log "starting Redis on 127.0.0.1:6379"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /tmp --logfile /tmp/sless-test-redis.log
  for _ in $(seq 50); do
    redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null
fi
# Python clients for the end-to-end tests: boto3, awscli v1, moto (reference SQS).
if ! python3 -m pip --version >/dev/null 2>&1; then
  log "installing pip"
  apt_install python3-pip
fi
log "installing Python test requirements"
python3 -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt
# New console scripts (aws, terraform) need shims under pyenv.
if command -v pyenv >/dev/null; then pyenv rehash; fi

log "test dependencies ready"
