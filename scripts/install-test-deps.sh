#!/usr/bin/env bash
# Installs and starts what the tests need, skipping whatever is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*"; }

if ! command -v cargo >/dev/null; then
  echo "cargo is required (https://rustup.rs)" >&2
  exit 1
fi
