#!/usr/bin/env bash
# The whole test suite, as CI runs it: format check, clippy with warnings denied, and
# every test of both workspace members, tokenmint and the bench tool (unit and HTTP tests
# against a real mongod, which the harness starts from .tools/mongodb/bin/mongod; this
# script installs it first if missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/install-mongod.sh
# A failing test's own message (a race's violations, say) is what to read; a backtrace
# of its assertion names only the test and pushes that message out of a log's tail.
export RUST_BACKTRACE="${RUST_BACKTRACE_IN_TESTS:-0}"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --all-targets --locked "$@"
