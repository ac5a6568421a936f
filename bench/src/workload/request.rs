//! One request against each kind of target — over HTTP to the service, `Issuer::issue`
//! in-process, or a floor's database operations — and the same new payment sent twice at
//! once (a duplicate race), each timed from send to answer. Apart from the closed loop
//! because this is what differs by target; the loop is the same for all.

use std::future::Future;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokenmint::domain::{
    AccountId, Actor, IssuanceMode, IssuanceParams, NewIssuance, Owner, PaymentIntentId,
    PaymentKey, Provider, Quantity, TokenType,
};
use tokenmint::issuing::{Caller, IssueError, IssueOutcome, Issuer};

use super::{ACCOUNT_ID, Client, Outcome, Payment, TOKEN_TYPE, Target};
use crate::http::Conn;
use crate::op_times::OpTimes;

/// One request: on the client's first connection (service), or in-process (store, floors).
pub(super) async fn issue(
    client: &mut Client,
    target: &Target,
    payment: &Payment,
    mode: IssuanceMode,
) -> (Outcome, Duration) {
    match target {
        Target::Service { .. } => timed(post(&mut client.conns[0], payment, mode)).await,
        Target::Store(store) => timed(store_issue(store, payment, mode)).await,
        Target::Floor(floor) => timed(floor.issue(payment, mode, &mut client.times)).await,
    }
}

/// One redemption of `quantity` of the client's tokens, named by its number `seq`: over
/// HTTP on the client's first connection. The store and the floors implement issuance
/// only, and the command line measures redemptions against the service alone.
pub(super) async fn redeem(
    client: &mut Client,
    target: &Target,
    seq: u64,
    quantity: u32,
) -> (Outcome, Duration) {
    let body = redemption_json(client, seq, quantity);
    match target {
        Target::Service { .. } => {
            timed(post_redemption(&mut client.conns[0], body, quantity)).await
        }
        Target::Store(_) | Target::Floor(_) => (
            Outcome::error(
                501,
                "redemptions are measured against the service only".into(),
            ),
            Duration::ZERO,
        ),
    }
}

/// The same new payment twice at once.
pub(super) async fn race_twice(
    client: &mut Client,
    target: &Target,
    payment: &Payment,
    mode: IssuanceMode,
) -> ((Outcome, Duration), (Outcome, Duration)) {
    match target {
        Target::Service { .. } => {
            let [first, second] = client
                .conns
                .get_disjoint_mut([0, 1])
                .expect("two connections for races");
            tokio::join!(
                timed(post(first, payment, mode)),
                timed(post(second, payment, mode))
            )
        }
        Target::Store(store) => tokio::join!(
            timed(store_issue(store, payment, mode)),
            timed(store_issue(store, payment, mode))
        ),
        Target::Floor(floor) => {
            let mut other_times = OpTimes::default();
            let result = tokio::join!(
                timed(floor.issue(payment, mode, &mut client.times)),
                timed(floor.issue(payment, mode, &mut other_times))
            );
            client.times.add(&other_times);
            result
        }
    }
}

/// `request`'s outcome and how long it took, from its first poll to its answer.
async fn timed(request: impl Future<Output = Outcome>) -> (Outcome, Duration) {
    let started = Instant::now();
    (request.await, started.elapsed())
}

/// `Issuer::issue` with the request the HTTP handler would have validated.
async fn store_issue(store: &Issuer, payment: &Payment, mode: IssuanceMode) -> Outcome {
    let request = match new_issuance(payment, mode) {
        Ok(request) => request,
        Err(message) => return Outcome::error(422, message),
    };
    match store.issue(Caller::Trusted, &request).await {
        Ok(IssueOutcome::Created(issued)) => Outcome::ok(201, issued.created),
        Ok(IssueOutcome::Replayed(issued)) => Outcome::ok(200, issued.created),
        Ok(IssueOutcome::Pending(issued)) => Outcome::ok(202, issued.created),
        Err(IssueError::Conflict(_)) => Outcome::ok(409, 0),
        Err(err) => Outcome::error(500, err.to_string()),
    }
}

/// The validated request for `payment`: what the in-process store is asked to issue, and
/// what the floors build their documents from with the store's own builders.
pub fn new_issuance(payment: &Payment, mode: IssuanceMode) -> Result<NewIssuance, String> {
    Ok(NewIssuance {
        key: PaymentKey {
            provider: Provider::parse(payment.provider)?,
            account_id: AccountId::parse(payment.account_id)?,
            payment_intent_id: PaymentIntentId::parse(&payment.payment_intent_id)?,
        },
        params: IssuanceParams {
            owner: Owner::from_object_id(payment.owner),
            token_type: TokenType::parse(payment.token_type)?,
            quantity: Quantity::from_i64(i64::from(payment.quantity), u32::MAX)?,
        },
        payment_date: tokenmint::store::chrono_time(payment.date),
        mode,
        requested_by: Actor::api_key("bench"),
    })
}

async fn post(conn: &mut Conn, payment: &Payment, mode: IssuanceMode) -> Outcome {
    match conn.post_json("/v1/issuances", json(payment, mode)).await {
        Ok(reply) => Outcome {
            status: reply.status,
            created: created_field(&reply.body).unwrap_or(0),
            error: (reply.status >= 400).then(|| String::from_utf8_lossy(&reply.body).into_owned()),
        },
        Err(err) => Outcome::error(599, format!("transport: {err:#}")),
    }
}

/// The body of `POST /v1/issuances` for `payment`.
fn json(payment: &Payment, mode: IssuanceMode) -> Bytes {
    Bytes::from(format!(
        r#"{{"provider":"{}","accountId":"{}","paymentIntentId":"{}","owner":"{}","tokenType":"{}","quantity":{},"mode":"{}"}}"#,
        payment.provider,
        payment.account_id,
        payment.payment_intent_id,
        payment.owner.to_hex(),
        payment.token_type,
        payment.quantity,
        mode.as_str()
    ))
}

/// `POST /v1/redemptions`: a 201 redeemed `quantity` tokens, a 200 (a retry) none.
async fn post_redemption(conn: &mut Conn, body: Bytes, quantity: u32) -> Outcome {
    match conn.post_json("/v1/redemptions", body).await {
        Ok(reply) => Outcome {
            status: reply.status,
            created: if reply.status == 201 { quantity } else { 0 },
            error: (reply.status >= 400).then(|| String::from_utf8_lossy(&reply.body).into_owned()),
        },
        Err(err) => Outcome::error(599, format!("transport: {err:#}")),
    }
}

/// The body of `POST /v1/redemptions` for the client's redemption number `seq`: its own
/// owner, the type and account every payment of the bench carries.
fn redemption_json(client: &Client, seq: u64, quantity: u32) -> Bytes {
    Bytes::from(format!(
        r#"{{"owner":"{}","tokenType":"{TOKEN_TYPE}","quantity":{quantity},"reference":"{}","accountId":"{ACCOUNT_ID}"}}"#,
        client.owner.to_hex(),
        client.reference(seq),
    ))
}

/// The `created` count of an issuance answer: its last field, found from the end
/// without parsing the whole JSON.
fn created_field(body: &[u8]) -> Option<u32> {
    const KEY: &[u8] = b"\"created\":";
    let at = body.windows(KEY.len()).rposition(|w| w == KEY)? + KEY.len();
    let digits = body[at..].iter().take_while(|b| b.is_ascii_digit());
    Some(digits.fold(0u32, |n, d| n * 10 + u32::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redemption_names_the_clients_owner_and_a_reference_per_number() {
        let target = Target::Service {
            addr: "127.0.0.1:1".parse().unwrap(),
            api_key: "tm_test".into(),
        };
        let client = Client::new(3, 1, "ab12_0", &target, false).unwrap();
        let body = redemption_json(&client, 7, 10);
        let expected = format!(
            r#"{{"owner":"{}","tokenType":"standard","quantity":10,"reference":"rd_ab12_0_3_7","accountId":"acct_bench"}}"#,
            client.owner.to_hex()
        );
        assert_eq!(body, expected.as_bytes());
        // The same number is the same reference: that is what makes a retry a retry.
        assert_eq!(redemption_json(&client, 7, 10), body);
        assert_ne!(redemption_json(&client, 8, 10), body);
    }

    #[test]
    fn reads_created_from_the_end() {
        assert_eq!(created_field(br#"{"tokens":[],"created":4}"#), Some(4));
        assert_eq!(created_field(br#"{"created":12}"#), Some(12));
        assert_eq!(created_field(br#"{"tokens":[]}"#), None);
    }
}
