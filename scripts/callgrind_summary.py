#!/usr/bin/env python3
"""Instructions per request of a callgrind profile of `tokenmint serve`, by component.

Usage: scripts/callgrind_summary.py CALLGRIND_OUT ISSUANCES

ISSUANCES is how many requests the service answered while profiled (scripts/profile.sh
reads it off the bench's report, measured without warm-up so that every answered request
counts).

Every instruction is counted once, where it executes (callgrind's self cost), and
grouped by the source file it comes from: the crate directory in the path says which
library it belongs to. Code the compiler inlined from the Rust standard library is
reported as such, whoever called it. Then the inclusive cost of a few entry points
(the two database writes, the JSON body in and out) says what each step costs whole.
"""

import re
import subprocess
import sys

# (component, pattern on the source file path), first match wins.
COMPONENTS = [
    ("MongoDB driver (mongodb crate)", r"/mongodb-\d"),
    ("BSON encoding and decoding (bson crate)", r"/bson-\d"),
    ("allocator (glibc malloc, free, realloc)", r"^\./malloc/"),
    ("memcpy, memset (glibc)", r"^\./string/"),
    ("other glibc and the kernel interface", r"^\./|libc\.so|ld-linux"),
    ("HTTP/1.1 server (hyper, hyper-util, http, httparse)", r"/(hyper|hyper-util|http|httparse|http-body|http-body-util)-\d"),
    ("axum, tower and tower-http layers", r"/(axum|axum-core|tower|tower-http|tower-layer|tower-service)-\d"),
    ("JSON (serde_json, serde_path_to_error)", r"/(serde_json|serde_path_to_error)-\d"),
    ("serde (generic parts)", r"/(serde|serde_core)-\d"),
    ("tokio runtime and I/O (tokio, mio)", r"/(tokio|mio|tokio-util)-\d"),
    ("tracing", r"/tracing(-core|-subscriber)?-\d"),
    ("metrics (metrics, prometheus exporter)", r"/(metrics|metrics-util|metrics-exporter-prometheus|quanta|sketches-ddsketch)-\d"),
    ("hashing and collections (hashbrown, indexmap, ahash)", r"/(hashbrown|indexmap|ahash|foldhash)-\d"),
    ("API keys and encodings (sha2, hex, base64)", r"/(sha2|hex|base64|hmac|digest)-\d"),
    ("dates (chrono)", r"/chrono-\d"),
    ("regular expressions (regex: identifier validation)", r"/(regex|regex-automata|regex-syntax)-\d"),
    ("tokenmint's own code", r"^(/\S*/)?src/((store|http|domain|webhooks|migrate)/|(main|lib|cli|startup|settings|telemetry|embedded)\.rs)"),
    ("Rust standard library (inlined everywhere)", r"/rustc/|/library/(core|alloc|std)/"),
]

# Inclusive cost of these entry points, per issuance.
ENTRY_POINTS = [
    ("Store::issue (all database work of an issuance)", r"tokenmint::store::issuance::<impl tokenmint::store::Store>::issue::\{\{closure\}\} \["),
    ("  claim_record: findOneAndUpdate of the issuance record", r"claim_record::\{\{closure\}\} \["),
    ("  upsert_tokens: the unordered token bulk", r"upsert_tokens::\{\{closure\}\} \["),
    ("  issue_atomic: the transaction (and a replay's reads)", r"issue_atomic::\{\{closure\}\} \["),
    ("  driver: the operations on checked-out connections", r"execute_operation_on_connection::\{\{closure\}\} \["),
    ("  driver: server selection (clones the topology)", r"Client::select_server::\{\{closure\}\} \["),
    ("  driver: topology worker (cluster-time gossip)", r"TopologyWorker::start::\{\{closure\}\} \["),
    ("JSON request body → IssuanceRequest", r"JsonBody<T> as axum_core::extract::FromRequest<S>>::from_request::\{\{closure\}\} \["),
    ("JSON response body", r"<axum::json::Json<T> as axum_core::response::into_response::IntoResponse>::into_response \["),
]



def annotate(path, *options):
    return subprocess.run(
        ["callgrind_annotate", "--threshold=100", "--auto=no", *options, path],
        check=True, capture_output=True, text=True,
    ).stdout


def rows(text):
    """(instructions, 'file:function [object]') for every function line."""
    for line in text.splitlines():
        match = re.match(r"\s*([\d,]+) \([ \d.]+%\)\s+(\S.*)$", line)
        if match and "PROGRAM TOTALS" not in line:
            yield int(match.group(1).replace(",", "")), match.group(2)


def main(path, issuances):
    flat = annotate(path)
    total = next(
        int(m.group(1).replace(",", ""))
        for m in re.finditer(r"([\d,]+) \([ \d.]+%\)\s+PROGRAM TOTALS", flat)
    )

    by_component = {name: 0 for name, _ in COMPONENTS}
    by_component["other"] = 0
    for cost, where in rows(flat):
        source = where.split(":", 1)[0]
        for name, pattern in COMPONENTS:
            if re.search(pattern, source):
                by_component[name] += cost
                break
        else:
            by_component["other"] += cost

    print(f"callgrind profile: {path}")
    print(f"requests answered: {issuances}")
    print(f"instructions: {total:,} in all, {total / issuances:,.0f} per request "
          "(start-up included)\n")
    print("| component (self cost, by source file) | instructions per request | share |")
    print("|---|--:|--:|")
    for name, cost in sorted(by_component.items(), key=lambda item: -item[1]):
        if cost:
            print(f"| {name} | {cost / issuances:,.0f} | {100 * cost / total:.1f} % |")

    # A function's inclusive cost is the sum of the costs of every call into it, as the
    # call edges ("> callee (Nx)") record them; a recursive level ('2) is not counted again.
    into = {}
    for line in annotate(path, "--inclusive=yes", "--tree=calling").splitlines():
        edge = re.match(r"\s*([\d,]+) \([ \d.]+%\)\s+>\s+(.*) \(\d[\d,]*x\)", line)
        if edge and "'" not in edge.group(2):
            callee = edge.group(2)
            into[callee] = into.get(callee, 0) + int(edge.group(1).replace(",", ""))
    print("\n| entry point (inclusive: everything it calls) | instructions per request |")
    print("|---|--:|")
    for name, pattern in ENTRY_POINTS:
        cost = sum(c for callee, c in into.items() if re.search(pattern, callee + " ["))
        if cost:
            print(f"| {name} | {cost / issuances:,.0f} |")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]))
