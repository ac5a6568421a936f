#!/usr/bin/env bash
# Where the service's CPU goes per issuance: runs the release tokenmint under
# `valgrind --tool=callgrind` while tokenmint-bench drives it, then prints the
# instructions per issuance by component (scripts/callgrind_summary.py).
#
# Instruction counts, not seconds: callgrind counts are repeatable whatever else the
# machine is doing, where CPU time on a shared 2-core VM is not. The service runs ~50×
# slower under valgrind, so the load is light (concurrency 8) and the counts per
# issuance, not the throughput, are the result.
#
#   scripts/profile.sh                       # upsert mode, quantity 4, new payments
#   scripts/profile.sh --mode atomic
#   scripts/profile.sh --mode upsert --replays 0.5 --duration 30
#
# Options go to `tokenmint-bench run` (the defaults below come first, so yours win;
# --warmup is always 0, see below).
# Needs valgrind (Debian: apt-get install valgrind). Output: target/profile/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

command -v valgrind >/dev/null || { echo "profile.sh: valgrind is not installed" >&2; exit 1; }
scripts/install-mongod.sh >&2
cargo build --release -p tokenmint -p tokenmint-bench --bins >&2

out="$PWD/target/profile"
rm -rf "$out" && mkdir -p "$out"
# The bench starts the service binary it is given; this one runs the real binary under
# callgrind (exec keeps the PID, so the bench still reads its CPU and memory).
cat >"$out/tokenmint-callgrind" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind --callgrind-out-file=$out/callgrind.out.%p $PWD/target/release/tokenmint "\$@"
EOF
chmod +x "$out/tokenmint-callgrind"

# No warm-up: every answered request is then in the report's status counts, which is
# what the instructions are divided by.
target/release/tokenmint-bench run --target service -c 8 -q 4 --duration 20 \
  --work-dir "$out/bench" --service-bin "$out/tokenmint-callgrind" "$@" --warmup 0 |
  tee "$out/bench.md"

# The statuses column of the first result row, e.g. "200×812 201×790" -> 1602.
answered=$(grep -m1 '| tokenmint |' "$out/bench.md" | grep -o '×[0-9]*' | tr -d '×' | awk '{ n += $1 } END { print n }')
python3 scripts/callgrind_summary.py "$out"/callgrind.out.* "$answered" | tee "$out/summary.md"
