#!/usr/bin/env bash
# API fuzzing with Schemathesis: every operation in openapi.yaml is exercised with generated
# valid and invalid requests against a real tokenmint (embedded mongod, fresh data dir,
# an admin key, a Stripe webhook provider) and every response is checked: no 5xx, and the
# status code, content type, headers and body all conform to the OpenAPI document.
#
#   scripts/fuzz-api.sh                 # default budget: a few minutes
#   FUZZ_MAX_EXAMPLES=20 scripts/fuzz-api.sh
#
# Environment:
#   FUZZ_MAX_EXAMPLES  test cases per operation and phase (default 250: about 4 minutes
#                      on 2 cores, plus the build)
#   FUZZ_MAX_TIME      optional overall time budget in seconds (schemathesis --max-time)
#   FUZZ_SEED          seed for a reproducible run (default: random, printed in the output)
#   FUZZ_WORKERS       concurrent schemathesis workers (default 1: with Python 3.11, more
#                      than one can crash Hypothesis in ast.parse, which is not thread-safe)
#   FUZZ_PROFILE       debug (default) or release build of tokenmint
#   FUZZ_REPORT_DIR    where the JUnit report, the service's log and Schemathesis' state
#                      go (default target/fuzz-api)
#   FUZZ_EXTRA_ARGS    more `schemathesis run` arguments, e.g. "--include-path-regex tokens"
#
# Failures print a curl command that reproduces them. For a webhook delivery that curl
# shows the generated body, not the signed event sent in its place: the event is in
# $FUZZ_REPORT_DIR/tokenmint.log when the service logged about it, or rerun with
# FUZZ_EXTRA_ARGS="--report vcr" to record every request as sent.
#
# Exits non-zero on any failure. Needs python3 (venv + pip) and cargo; installs the pinned
# Schemathesis into .tools/venv and the pinned mongod into .tools/mongodb on first use.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"

SCHEMATHESIS_VERSION="4.32.5"
max_examples="${FUZZ_MAX_EXAMPLES:-250}"
workers="${FUZZ_WORKERS:-1}"
profile="${FUZZ_PROFILE:-debug}"
report_dir="${FUZZ_REPORT_DIR:-$root/target/fuzz-api}"

# --- tools -------------------------------------------------------------------------------
venv="$root/.tools/venv"
st="$venv/bin/schemathesis"
if ! [ -x "$st" ] || ! "$st" --version 2>/dev/null | grep -q "version $SCHEMATHESIS_VERSION\$"; then
  echo "installing schemathesis $SCHEMATHESIS_VERSION into $venv ..."
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
fi
scripts/install-mongod.sh

if [ "$profile" = release ]; then
  cargo build --release --locked --bin tokenmint
else
  cargo build --locked --bin tokenmint
fi
binary="$root/target/$profile/tokenmint"

# --- the service -------------------------------------------------------------------------
work="$(mktemp -d)"
service_pid=""
cleanup() {
  if [ -n "$service_pid" ] && kill -0 "$service_pid" 2>/dev/null; then
    kill -TERM "$service_pid" 2>/dev/null || true
    # SIGTERM: tokenmint finishes in-flight requests and stops its embedded mongod.
    for _ in $(seq 1 300); do
      kill -0 "$service_pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$service_pid" 2>/dev/null; then
      echo "tokenmint did not stop within 30 s; killing it" >&2
      kill -KILL "$service_pid" 2>/dev/null || true
    fi
    wait "$service_pid" 2>/dev/null || true
  fi
  # The service's log (JSON lines, warnings and errors only) outlives the temp dir.
  [ -f "$work/tokenmint.log" ] && cp "$work/tokenmint.log" "$report_dir/tokenmint.log"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
base="http://127.0.0.1:$port"
key="tm_fuzz_$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
stripe_secret="whsec_fuzz_test_secret_0123456789"
key_sha256="$(printf '%s' "$key" | sha256sum | cut -d' ' -f1)"

mkdir -p "$report_dir"
report_dir="$(cd "$report_dir" && pwd)"
echo "starting tokenmint on $base (data in $work/mongo, log: $report_dir/tokenmint.log)"
env \
  TOKENMINT__MONGO__URI="" \
  TOKENMINT__MONGO__EMBEDDED__DATA_DIR="$work/mongo" \
  TOKENMINT__SERVER__BIND="127.0.0.1:$port" \
  TOKENMINT__AUTH__KEYS="[{id=\"fuzz\", sha256=\"$key_sha256\", scopes=[\"admin\"]}]" \
  TOKENMINT__RATE_LIMIT__PER_KEY_PER_SECOND=100000 \
  TOKENMINT__RATE_LIMIT__BURST=100000 \
  TOKENMINT__PROVIDERS__STRIPE__SCHEME=stripe \
  TOKENMINT__PROVIDERS__STRIPE__SECRETS="[\"$stripe_secret\"]" \
  TOKENMINT__LOG__FORMAT=json \
  TOKENMINT__LOG__LEVEL=warn \
  "$binary" serve >"$work/tokenmint.log" 2>&1 &
service_pid=$!

ready=""
for _ in $(seq 1 600); do
  if ! kill -0 "$service_pid" 2>/dev/null; then
    echo "tokenmint exited during startup:" >&2
    cat "$work/tokenmint.log" >&2
    exit 1
  fi
  if python3 - "$base/readyz" <<'PY' 2>/dev/null; then
import sys, urllib.request
sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=2).status == 200 else 1)
PY
    ready=1
    break
  fi
  sleep 0.1
done
if [ -z "$ready" ]; then
  echo "tokenmint did not become ready within 60 s:" >&2
  cat "$work/tokenmint.log" >&2
  exit 1
fi

# --- seed data ---------------------------------------------------------------------------
# One signed Stripe delivery: payment stripe/default/pi_123 succeeded, with token metadata,
# so the payment and its issuance exist for the examples the OpenAPI document names
# (otherwise GET /v1/payments/... can only ever answer 404).
python3 - "$base" "$stripe_secret" <<'PY'
import hashlib, hmac, json, sys, time, urllib.request
base, secret = sys.argv[1], sys.argv[2].encode()
event = {
    "id": "evt_fuzz_seed", "type": "payment_intent.succeeded", "created": int(time.time()),
    "data": {"object": {"id": "pi_123", "amount": 500, "currency": "eur", "status": "succeeded",
        "metadata": {"tokenmint_owner": "65f1a0c2b3d4e5f601234567",
                     "tokenmint_token_type": "standard", "tokenmint_quantity": "4"}}},
}
body = json.dumps(event).encode()
ts = int(time.time())
signature = hmac.new(secret, f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
request = urllib.request.Request(f"{base}/v1/webhooks/stripe", data=body, method="POST", headers={
    "Content-Type": "application/json", "Stripe-Signature": f"t={ts},v1={signature}"})
with urllib.request.urlopen(request, timeout=30) as response:
    outcome = json.load(response)
assert outcome.get("outcome") == "issued", outcome
print("seeded payment stripe/default/pi_123:", outcome)
PY

# --- the fuzz run ------------------------------------------------------------------------
# Every check (`--checks all`) except, for every operation:
#  - unsupported_method: it sends e.g. TRACE or DELETE to each path and wants 405. tokenmint
#    answers 404 problem+json for a method a path does not serve, by design (the route
#    table is not disclosed method by method), so this check cannot hold anywhere.
# Narrower, per-operation exclusions live in scripts/fuzz-api.toml, each with its reason.
# scripts/fuzz_api_hooks.py signs generated webhook deliveries so that they get past the
# signature check (see there).
args=(
  --no-color
  --config-file "$root/scripts/fuzz-api.toml"
  run "$root/openapi.yaml"
  --url "$base"
  --header "Authorization: Bearer $key"
  --checks all
  --exclude-checks unsupported_method
  --max-examples "$max_examples"
  --workers "$workers"
  --request-timeout 30
  --generation-database "$report_dir/examples.db"
  --report junit
  --report-junit-path "$report_dir/junit.xml"
)
[ -n "${FUZZ_MAX_TIME:-}" ] && args+=(--max-time "$FUZZ_MAX_TIME")
[ -n "${FUZZ_SEED:-}" ] && args+=(--seed "$FUZZ_SEED")
# Extra schemathesis arguments, e.g. FUZZ_EXTRA_ARGS="--include-path-regex transfer".
# shellcheck disable=SC2206
[ -n "${FUZZ_EXTRA_ARGS:-}" ] && args+=(${FUZZ_EXTRA_ARGS})

status=0
# Run from the report dir: schemathesis keeps its state (.schemathesis/) in the cwd.
(
  cd "$report_dir"
  SCHEMATHESIS_HOOKS="$root/scripts/fuzz_api_hooks.py" FUZZ_STRIPE_SECRET="$stripe_secret" \
    "$st" "${args[@]}"
) || status=$?

# What the service saw, from its own metrics: responses by status, webhook outcomes.
python3 - "$base/metrics" <<'PY' || true
import collections, re, sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
statuses, webhooks = collections.Counter(), collections.Counter()
for line in text.splitlines():
    if line.startswith("tokenmint_http_requests_total{"):
        labels, value = line.rsplit(" ", 1)
        statuses[re.search(r'status="(\d+)"', labels).group(1)] += int(float(value))
    elif line.startswith("tokenmint_webhook_events_total{"):
        labels, value = line.rsplit(" ", 1)
        webhooks[re.search(r'outcome="([^"]*)"', labels).group(1)] += int(float(value))
print("tokenmint responses by status:", dict(sorted(statuses.items())))
print("tokenmint webhook outcomes:", dict(sorted(webhooks.items())))
PY

if grep -q '"level":"ERROR"' "$work/tokenmint.log"; then
  echo "tokenmint logged errors during the run:" >&2
  grep '"level":"ERROR"' "$work/tokenmint.log" | head -20 >&2
  status=1
fi
if ! kill -0 "$service_pid" 2>/dev/null; then
  echo "tokenmint died during the run:" >&2
  tail -50 "$work/tokenmint.log" >&2
  status=1
fi
exit "$status"
