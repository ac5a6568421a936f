//! Batched reads: group commit reads the payments, records and tokens of a whole batch in
//! one query each. The filter groups keys by provider and account; these tests prove it
//! returns exactly the keys asked for, whatever mix of providers and accounts, and never
//! a payment that shares only its id with one asked for.

use mongodb::bson::DateTime;
use serde_json::json;
use tokenmint::domain::{AccountId, PaymentIntentId, PaymentKey, Provider};

use crate::helpers::*;

/// Asked for: two accounts of one provider with the same payment id, and another
/// provider. Not asked for: a payment of the first account, the same payment id under a
/// third account, and one that only a filter mixing the keys' parts would match.
const ASKED: [(&str, &str, &str); 3] = [
    ("stripe", "acct_1", "pi_shared"),
    ("stripe", "acct_2", "pi_shared"),
    ("paddle", "acct_1", "pi_other"),
];
const NOT_ASKED: [(&str, &str, &str); 3] = [
    ("stripe", "acct_1", "pi_decoy"),
    ("stripe", "acct_3", "pi_shared"),
    ("stripe", "acct_1", "pi_other"),
];

fn key((provider, account, payment): (&str, &str, &str)) -> PaymentKey {
    PaymentKey {
        provider: Provider::parse(provider).unwrap(),
        account_id: AccountId::parse(account).unwrap(),
        payment_intent_id: PaymentIntentId::parse(payment).unwrap(),
    }
}

#[tokio::test]
async fn batched_reads_return_exactly_the_keys_asked_for_across_providers_and_accounts() {
    let app = spawn_app().await;
    let now = DateTime::now();
    for (quantity, (provider, account, payment)) in (1..).zip(ASKED.into_iter().chain(NOT_ASKED)) {
        let mut body = issuance_body(payment, quantity);
        body["provider"] = json!(provider);
        body["accountId"] = json!(account);
        assert_eq!(app.issue(WRITER_KEY, &body).await.status().as_u16(), 201);
        app.store_payment(
            (provider, account, payment),
            "succeeded",
            "payment_intent.succeeded",
            now,
        )
        .await;
    }

    let store = app.store().await;
    let asked: Vec<PaymentKey> = ASKED.into_iter().map(key).collect();
    let asked_refs: Vec<&PaymentKey> = asked.iter().collect();
    let payments = store.find_payments(&asked_refs).await.unwrap();
    let records = store.find_records(&asked_refs).await.unwrap();
    let token_sets = store.find_token_sets(&asked_refs).await.unwrap();

    for found in [
        payments.keys().cloned().collect::<Vec<_>>(),
        records.keys().cloned().collect(),
        token_sets.keys().cloned().collect(),
    ] {
        let mut found: Vec<String> = found.iter().map(|k| format!("{k:?}")).collect();
        let mut expected: Vec<String> = asked.iter().map(|k| format!("{k:?}")).collect();
        found.sort();
        expected.sort();
        assert_eq!(found, expected);
    }
    // Each payment's own tokens, in order: quantity 1, 2 and 3 by position in ASKED.
    for (quantity, key) in (1..).zip(&asked) {
        let indexes: Vec<i64> = token_sets[key].iter().map(|t| t.token_index).collect();
        assert_eq!(indexes, (0..quantity).collect::<Vec<i64>>(), "{key:?}");
        assert_eq!(records[key].quantity, quantity, "{key:?}");
    }
}
