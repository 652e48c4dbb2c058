#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time (default 30 s each):
#   ./scripts/fuzz.sh [SECONDS] [TARGET ...]
# Installs a nightly toolchain (minimal profile) and cargo-fuzz when missing.
# A crash fails the run; its input lands in fuzz/artifacts/TARGET/: turn it
# into a unit test. The test suite (scripts/test.sh) runs this for 20 s.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${1:-30}
shift || true
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "==> installing a nightly toolchain for cargo-fuzz"
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "==> installing cargo-fuzz"
  cargo install cargo-fuzz --version 0.13.2 --locked
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
for target in "${targets[@]}"; do
  echo "==> $target (${seconds}s)"
  mkdir -p "corpus/$target"
  cargo +nightly fuzz run "$target" "corpus/$target" -- -max_total_time="$seconds" -rss_limit_mb=2048
done
