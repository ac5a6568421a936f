#!/usr/bin/env bash
# The whole test suite, as CI runs it: format check, clippy with warnings denied, and
# every test of both workspace members, tokenmint and the bench tool (unit and HTTP tests
# against a real mongod, which the harness starts from .tools/mongodb/bin/mongod; this
# script installs it first if missing). The checkout kit first: its node modules, its
# types generated from openapi.yaml as it is and the type-check against them, and
# Chromium for its browser test (tests/api/browser.rs), which cargo test runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/install-mongod.sh
scripts/install-chromium.sh
# No install scripts: the one dependency that has one (esbuild) works without it, and
# a test run then never executes a package's code at install time.
npm ci --prefix clients/typescript --ignore-scripts
npm run --prefix clients/typescript check
# A failing test's own message (a race's violations, say) is what to read; a backtrace
# of its assertion names only the test and pushes that message out of a log's tail.
export RUST_BACKTRACE="${RUST_BACKTRACE_IN_TESTS:-0}"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --all-targets --locked "$@"
