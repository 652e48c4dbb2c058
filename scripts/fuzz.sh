#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time (default 30 s each):
#   ./scripts/fuzz.sh [--dev] [SECONDS] [TARGET ...]
# --dev builds the targets without optimizations (still with the address
# sanitizer and debug assertions): 4 min 18 s against 14 min 54 s for the
# release build on 2 cores when measured (9 min 20 s now, cold, with the
# dataflow crate's clients), at about a fifth of the runs per second (about
# 5,000 against 22,000 for sigv4). The test suite uses it.
# Installs a nightly toolchain (minimal profile) and cargo-fuzz when missing.
# A crash fails the run; its input lands in fuzz/artifacts/TARGET/: turn it
# into a unit test. The test suite (scripts/test.sh) runs this for 20 s.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
profile=()
if [ "${1:-}" = "--dev" ]; then
  profile=(--dev)
  shift
fi
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
  cargo +nightly fuzz run "${profile[@]}" "$target" "corpus/$target" -- -max_total_time="$seconds" -rss_limit_mb=2048
done
