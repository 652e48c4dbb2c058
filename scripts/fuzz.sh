#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time (default 30 s each):
#   ./scripts/fuzz.sh [SECONDS] [TARGET ...]
# Needs a nightly toolchain (rustup toolchain install nightly) and cargo-fuzz
# (cargo install cargo-fuzz). Crashes land in fuzz/artifacts/TARGET/; turn
# each into a unit test. CI does not run this.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${1:-30}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
for target in "${targets[@]}"; do
  echo "==> $target (${seconds}s)"
  mkdir -p "corpus/$target"
  cargo +nightly fuzz run "$target" "corpus/$target" -- -max_total_time="$seconds" -rss_limit_mb=2048
done
