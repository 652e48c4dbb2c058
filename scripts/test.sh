#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: installs and starts what the
# tests need, then runs every test. Usage: ./scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-test-deps.sh

# Unformatted code or a clippy warning fails the suite like a failing test.
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo build --workspace --all-targets --locked
cargo test --workspace --locked
# A build without the connectors whose clients are heavy (cargo features):
# it compiles, and refuses those types by name.
cargo check -p sless --no-default-features --locked
cargo test -p sless-dataflow --no-default-features --locked --lib types_left_out_of_the_build
# End-to-end: the real sless binary with boto3, awscli and moto.
python3 -m pytest tests/ -q
# Every fuzz target for a bounded time: a crash fails the suite.
./scripts/fuzz.sh --dev 20
