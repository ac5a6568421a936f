"""Schemathesis hooks for scripts/fuzz-api.sh.

1. Let generated webhook deliveries past the signature check, so that the fuzzer reaches
   event parsing and processing instead of hearing 401 for every delivery.
2. Send a whole-number float quantity as an integer literal (see `_integral_quantity`).

The webhook body is documented as a free-form object (each provider has its own event
shape), so generated bodies are almost never events. For positive cases this hook turns
the generated object into a Stripe event whose every field is drawn (deterministically,
from the generated body) from valid, borderline and invalid values: known and unknown
event types, a small pool of payment ids so that events for one payment interact
(succeeded, then refunded, then a late processing…), good and bad token metadata, huge
and negative `created` values. Then it signs the exact bytes it sends with the configured
Stripe secret (FUZZ_STRIPE_SECRET), unless the case already carries a generated
`Stripe-Signature`, which is left alone so that bad signatures are still exercised.

Negative cases (a body that is not an object) are signed but not rewritten: they must be
refused with 400.
"""

import hashlib
import hmac
import json
import os
import random
import re
import time

import schemathesis
from schemathesis.core import NOT_SET

WEBHOOK_PATH = "/v1/webhooks/{provider}"
ISSUANCES_PATH = "/v1/issuances"
PROVIDER = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
SECRET = os.environ.get("FUZZ_STRIPE_SECRET", "").encode()

# Each pool: (mostly) valid values first, then borderline and invalid ones, drawn with
# `_pick` so that most events are well-formed and reach the processing logic.
EVENT_TYPES = (
    [
        "payment_intent.processing",
        "payment_intent.succeeded",
        "payment_intent.payment_failed",
        "payment_intent.canceled",
        "charge.refunded",
    ],
    ["customer.created", "", "payment_intent.unknown"],
)
PAYMENT_IDS = (["pi_fuzz_1", "pi_fuzz_2", "pi_fuzz_3", "pi_123"], ["", "pi $bad", "x" * 129, None])
OWNERS = (["65f1a0c2b3d4e5f601234567", "65f1a0c2b3d4e5f601234568"], ["nope", "", None])
TOKEN_TYPES = (["standard", "gold"], ["Bad Type", "$where", "", None])
QUANTITIES = (["1", "4", "1000"], ["1001", "0", "-1", "4.5", "99999999999999999999", "", None])
# Unix seconds near "now" (so that events for one payment arrive in every order), then
# values that must be refused: negative, past the year 2286, past i64.
CREATED = (
    [1_780_000_000 + offset for offset in range(-3, 4)],
    [0, -1, 2**31, 10**10 - 1, 10**10, 2**53, 2**63 - 1, -(2**63)],
)
ACCOUNTS = ([None, None, None, "acct_1", "acct_2"], ["bad account", "$acct", ""])


def _pick(rng: random.Random, pool, p_bad: float = 0.15):
    good, bad = pool
    return rng.choice(bad if rng.random() < p_bad else good)


def _stripe_event(rng: random.Random, generated: dict) -> dict:
    event_type = _pick(rng, EVENT_TYPES)
    payment_id = _pick(rng, PAYMENT_IDS)
    created = _pick(rng, CREATED, 0.1)
    if event_type == "charge.refunded":
        obj = {
            "id": f"ch_{rng.randrange(10**6)}",
            "payment_intent": payment_id,
            "refunded": rng.choice([True, True, False, None]),
            "amount_refunded": rng.choice([0, 500, -1]),
        }
    else:
        metadata = {}
        for key, pool in (
            ("tokenmint_owner", OWNERS),
            ("tokenmint_token_type", TOKEN_TYPES),
            ("tokenmint_quantity", QUANTITIES),
        ):
            value = _pick(rng, pool, 0.1)
            if value is not None:
                metadata[key] = value
        obj = {
            "id": payment_id,
            "amount": rng.choice([500, 0, -1, 2**63 - 1]),
            "currency": rng.choice(["eur", "usd", ""]),
            "status": (event_type or ".").rsplit(".", 1)[-1],
            "metadata": rng.choice([metadata, metadata, {}, None, "not an object"]),
        }
        if rng.random() < 0.2:
            obj["created"] = _pick(rng, CREATED)
    event = {
        "id": f"evt_{rng.randrange(10**9)}",
        "object": "event",
        "type": event_type,
        "created": created,
        "data": {"object": obj},
        # Whatever else was generated rides along: unknown fields must be ignored.
        "extra": generated,
    }
    account = _pick(rng, ACCOUNTS, 0.1)
    if account is not None:
        event["account"] = account
    if rng.random() < 0.05:
        event["id"] = "evt_replayed"  # the same event id again and again: deduplication
    return event


def _integral_quantity(case) -> None:
    """`quantity: 4.0` as an integer literal `4`.

    JSON Schema counts 4.0 as an integer, so Schemathesis generates it as valid data; but
    tokenmint deliberately refuses a quantity written as a fraction, even a whole one (a
    payment system does not guess what a float meant to buy; the API contract, and the unit
    test `quantity::tests::rejects_everything_else`). No schema keyword can say "integer
    literal", so such values are sent the way a client would write them. Fractional
    values (4.5) and everything else are left as generated.
    """
    body = case.body
    if isinstance(body, dict):
        quantity = body.get("quantity")
        if isinstance(quantity, float) and quantity.is_integer() and abs(quantity) < 2**63:
            body["quantity"] = int(quantity)


def _has_header(headers, name: str) -> bool:
    return any(key.lower() == name.lower() for key in (headers or {}))


@schemathesis.hook
def before_call(context, case, kwargs):
    if case.operation.path == ISSUANCES_PATH:
        _integral_quantity(case)
        return
    if case.operation.path != WEBHOOK_PATH or case.method.upper() != "POST":
        return
    parameters = case.path_parameters or {}
    provider = parameters.get("provider")
    if provider != "stripe" and isinstance(provider, str) and PROVIDER.match(provider):
        # A valid but unknown provider name only ever hears 404: send three in four of
        # these to the configured provider instead (still a schema-valid value).
        if hashlib.sha256(provider.encode()).digest()[0] < 192:
            parameters["provider"] = provider = "stripe"
    if provider != "stripe":
        return
    if _has_header(case.headers, "Stripe-Signature") or "data" in kwargs or "json" in kwargs:
        return
    body = case.body
    if body is NOT_SET:
        payload = b""
    elif isinstance(body, dict):
        # The case id varies the event even where Hypothesis generates the same body twice.
        generated = json.dumps(body, sort_keys=True, default=str) + str(case.id)
        seed = hashlib.sha256(generated.encode()).digest()
        payload = json.dumps(_stripe_event(random.Random(seed), body), default=str).encode()
    elif isinstance(body, (bytes, bytearray)):
        payload = bytes(body)
    else:
        try:
            payload = json.dumps(body, default=str).encode()
        except (TypeError, ValueError):
            return
    timestamp = int(time.time())
    signature = hmac.new(SECRET, f"{timestamp}.".encode() + payload, hashlib.sha256).hexdigest()
    kwargs["data"] = payload
    headers = dict(case.headers or {})
    headers["Stripe-Signature"] = f"t={timestamp},v1={signature}"
    case.headers = headers
