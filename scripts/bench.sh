#!/usr/bin/env bash
# The benchmark, in one command: installs the pinned mongod, builds the release
# tokenmint and tokenmint-bench, then runs the matrix, both modes each — concurrency 32
# quantity 4 with 0% and 50% replays; concurrency 1 (latency) and 256, quantity 4;
# concurrency 32 with quantity 1 and 100 — each scenario against a fresh tokenmint and
# database, with two database floors measured in the same run (the per-request floor:
# tokenmint's design before group commit; the reference floor: one unordered bulk of
# $setOnInsert upserts per issuance). Prints the markdown report (also written to
# target/bench/report.md).
#
#   scripts/bench.sh                      # the full matrix: 5 s warm-up + 15 s per target (~14 min)
#   scripts/bench.sh --quick              # smoke test: 1 s warm-up + 3 s per target
#   scripts/bench.sh --duration 60 --warmup 10
#   BENCH_DURATION=60 BENCH_WARMUP=10 scripts/bench.sh
#   scripts/bench.sh run -c 8 -q 10 --mode atomic --replays 0.2 --races 0.1 --duration 10
#   scripts/bench.sh --workload redeem    # POST /v1/redemptions of 1 and 10 tokens at c=1 and
#                                         # c=32, 30% retries, each beside an issuance (~4 min)
#   scripts/bench.sh run --workload redeem -c 32 -q 10 --retries 0.3 --duration 10
#
# Any other option goes to tokenmint-bench (see `target/release/tokenmint-bench --help`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/install-mongod.sh >&2
cargo build --release -p tokenmint -p tokenmint-bench --bins >&2

mkdir -p target/bench
args=()
if [ "${1:-}" = "run" ]; then
  shift
  args=(run "$@")
else
  args=(matrix)
  [ -n "${BENCH_DURATION:-}" ] && args+=(--duration "$BENCH_DURATION")
  [ -n "${BENCH_WARMUP:-}" ] && args+=(--warmup "$BENCH_WARMUP")
  args+=("$@")
fi
exec target/release/tokenmint-bench "${args[@]}" --markdown target/bench/report.md
