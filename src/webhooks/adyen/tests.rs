//! Known-answer tests (Adyen's published HMAC vector) and the batch rules.

use serde_json::json;

use super::*;
use crate::webhooks::signing::verify_with;

/// The key and item of the HMAC test in Adyen's own PHP library.
const LIBRARY_KEY: &str = "DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00";

fn library_item(signature: Option<&str>) -> Value {
    let mut item = json!({
        "pspReference": "7914073381342284",
        "merchantAccountCode": "TestMerchant",
        "merchantReference": "TestPayment-1407325143704",
        "amount": { "value": 1130, "currency": "EUR" },
        "eventCode": "AUTHORISATION",
        "success": "true",
        "eventDate": "2026-11-30T10:00:00+01:00",
    });
    if let Some(signature) = signature {
        item["additionalData"] = json!({ "hmacSignature": signature });
    }
    item
}

/// The library's item as an authorisation of tokenmint's: its metadata asks for three
/// `standard` tokens for one owner (unsigned: parsing comes after verification).
fn authorisation_for_three() -> Value {
    let mut item = library_item(None);
    item["additionalData"] = json!({
        "metadata.tokenmint_owner": "65f1a0c2b3d4e5f601234567",
        "metadata.tokenmint_token_type": "standard",
        "metadata.tokenmint_quantity": "3",
    });
    item
}

fn batch_of(items: &[Value]) -> Vec<u8> {
    let items: Vec<Value> = items
        .iter()
        .map(|i| json!({ "NotificationRequestItem": i }))
        .collect();
    json!({ "live": "false", "notificationItems": items })
        .to_string()
        .into_bytes()
}

/// Adyen signs no timestamp: only the keys count.
fn verify(body: &[u8], keys: &[&str]) -> Result<(), SignatureError> {
    verify_with(keys, 0, 0, |check| verify_adyen(body, check.secrets))
}

const KNOWN: &str = "Ny9gS2veKo5E4w8/OL6xz1/wvT/hYkAXy1xNc/QvO4I=";

#[test]
fn known_answer_from_adyens_library() {
    let item = library_item(None);
    assert_eq!(
        signed_text(item.as_object().unwrap()).as_deref(),
        Some(
            "7914073381342284::TestMerchant:TestPayment-1407325143704:1130:EUR:AUTHORISATION:true"
        )
    );
    let key = hex::decode(LIBRARY_KEY).unwrap();
    assert_eq!(
        item_signature(&key, item.as_object().unwrap()).as_deref(),
        Some(KNOWN)
    );
    assert_eq!(
        verify(&batch_of(&[library_item(Some(KNOWN))]), &[LIBRARY_KEY]),
        Ok(())
    );
    let signed = sign_adyen(LIBRARY_KEY, &batch_of(&[item])).unwrap();
    assert_eq!(verify(&signed, &[LIBRARY_KEY]), Ok(()));
}

#[test]
fn one_bad_item_refuses_the_batch() {
    let other = "00".repeat(32);
    let good = library_item(Some(KNOWN));
    let mut tampered = good.clone();
    tampered["amount"]["value"] = json!(1);
    assert_eq!(
        verify(&batch_of(&[good.clone(), tampered]), &[LIBRARY_KEY]),
        Err(SignatureError::Invalid)
    );
    assert_eq!(
        verify(
            &batch_of(&[good.clone(), library_item(None)]),
            &[LIBRARY_KEY]
        ),
        Err(SignatureError::Missing)
    );
    assert_eq!(
        verify(&batch_of(std::slice::from_ref(&good)), &[&other]),
        Err(SignatureError::Invalid)
    );
    assert_eq!(
        verify(&batch_of(&[good]), &[&other, LIBRARY_KEY]),
        Ok(()),
        "rotation"
    );
    assert_eq!(
        verify(&batch_of(&[]), &[LIBRARY_KEY]),
        Err(SignatureError::Missing)
    );
    assert_eq!(
        verify(b"[accepted]", &[LIBRARY_KEY]),
        Err(SignatureError::Invalid)
    );
}

/// A colon in `merchantReference` is the merchant's own text and verifies; the same
/// signature over fields shifted along the colons (which sign the very same text) does
/// not, nor does an amount whose `value` is a string or whose currency is no ISO code.
#[test]
fn a_signature_verifies_only_fields_that_sign_unambiguously() {
    let mut genuine = library_item(None);
    genuine["merchantReference"] = json!("cap:99999");
    genuine["amount"] = json!({ "value": 400, "currency": "EUR" });
    let signed = sign_adyen(LIBRARY_KEY, &batch_of(&[genuine])).unwrap();
    assert_eq!(verify(&signed, &[LIBRARY_KEY]), Ok(()));

    let batch: Value = serde_json::from_slice(&signed).unwrap();
    let item = &batch["notificationItems"][0]["NotificationRequestItem"];
    let altered = |change: &dyn Fn(&mut Value)| {
        let mut item = item.clone();
        change(&mut item);
        batch_of(&[item])
    };
    let shifted = altered(&|item| {
        item["merchantReference"] = json!("cap");
        item["amount"] = json!({ "value": 99999, "currency": "400:EUR" });
    });
    // What the signature covers, joined without the shape rule: the same text.
    let joined = |body: &[u8]| {
        let batch: Value = serde_json::from_slice(body).unwrap();
        let item = batch["notificationItems"][0]["NotificationRequestItem"].clone();
        SIGNED_FIELDS
            .map(|name| field(item.as_object().unwrap(), name))
            .join(":")
    };
    assert_eq!(
        joined(&shifted),
        joined(&signed),
        "the forgery signs the same text"
    );
    assert_eq!(
        verify(&shifted, &[LIBRARY_KEY]),
        Err(SignatureError::Invalid)
    );
    let value_as_text = altered(&|item| item["amount"]["value"] = json!("400"));
    assert_eq!(
        verify(&value_as_text, &[LIBRARY_KEY]),
        Err(SignatureError::Invalid)
    );
    let moved_into_the_account = altered(&|item| {
        item["merchantAccountCode"] = json!("TestMerchant:cap");
        item["merchantReference"] = json!("99999");
    });
    assert_eq!(
        verify(&moved_into_the_account, &[LIBRARY_KEY]),
        Err(SignatureError::Invalid)
    );

    // A currency that is no ISO code, signed over its fields joined as they are.
    let mut lower = library_item(None);
    lower["amount"]["currency"] = json!("eur");
    assert!(sign_adyen(LIBRARY_KEY, &batch_of(std::slice::from_ref(&lower))).is_err());
    let text = SIGNED_FIELDS
        .map(|name| field(lower.as_object().unwrap(), name))
        .join(":");
    let key = hex::decode(LIBRARY_KEY).unwrap();
    let signature = BASE64.encode(mac(&key, &[text.as_bytes()]).finalize().into_bytes());
    lower["additionalData"] = json!({ "hmacSignature": signature });
    assert_eq!(
        verify(&batch_of(&[lower]), &[LIBRARY_KEY]),
        Err(SignatureError::Invalid)
    );
    // A null or empty amount field signs as a missing one, and verifies as one.
    for amount in [
        json!({ "value": 0, "currency": null }),
        json!({ "value": null, "currency": "" }),
        json!({}),
    ] {
        let mut report = library_item(None);
        report["eventCode"] = json!("REPORT_AVAILABLE");
        report["amount"] = amount.clone();
        let signed = sign_adyen(LIBRARY_KEY, &batch_of(&[report])).unwrap();
        assert_eq!(verify(&signed, &[LIBRARY_KEY]), Ok(()), "{amount}");
    }
}

#[test]
fn keys_are_hex_of_32_to_128_bytes() {
    assert_eq!(check_secret(LIBRARY_KEY), Ok(()));
    assert_eq!(check_secret(&"ab".repeat(128)), Ok(()));
    for secret in [
        "ab".repeat(31),
        "ab".repeat(129),
        format!("{LIBRARY_KEY}0"),
        "zz".repeat(32),
    ] {
        let problem = check_secret(&secret).unwrap_err();
        assert!(!problem.contains(&secret), "{secret}");
    }
}

#[test]
fn items_become_events() {
    let provider = Provider::parse("adyen").unwrap();
    let authorised = authorisation_for_three();
    let refund = json!({ "eventCode": "REFUND", "success": "true", "pspReference": "R1",
        "originalReference": "7914073381342284", "merchantAccountCode": "TestMerchant",
        "amount": { "value": 500, "currency": "EUR" }, "eventDate": "2026-11-30T09:00:00Z" });
    let report = json!({ "eventCode": "REPORT_AVAILABLE", "success": "true", "pspReference": "X" });
    let events = parse_adyen(
        &provider,
        &batch_of(&[authorised, refund, report]),
        100,
        Capture::Auto,
    )
    .unwrap();
    let ParsedEvent::Payment(first) = &events[0] else {
        panic!("{events:?}")
    };
    assert_eq!(first.event_id, "AUTHORISATION:7914073381342284:true");
    assert_eq!(first.key.account_id.as_str(), "TestMerchant");
    assert_eq!(
        (first.amount, first.status),
        (Some(1130), PaymentStatus::Succeeded)
    );
    assert_eq!(
        first.token_params.clone().unwrap().unwrap().quantity.get(),
        3
    );
    let ParsedEvent::Payment(second) = &events[1] else {
        panic!("{events:?}")
    };
    assert_eq!(second.key.payment_intent_id.as_str(), "7914073381342284");
    assert_eq!(second.amount, None);
    assert_eq!(second.refund.as_ref().unwrap().id, "refund:R1");
    assert!(second.version > first.version);
    assert!(matches!(events[2], ParsedEvent::Ignored { .. }));
}

#[test]
fn only_the_documented_batch_shape_is_read() {
    let key = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
    assert!(sign_adyen(key, br#"{"notificationItems": []}"#).is_ok());
    for body in [
        &b"[[]]"[..],
        b"[]",
        b"{\"notificationItems\": [[]]}",
        b"{\"notificationItems\": [1]}",
    ] {
        assert!(
            sign_adyen(key, body).is_err(),
            "{}",
            String::from_utf8_lossy(body)
        );
        assert!(batch(body).is_err());
    }
}

#[test]
fn chargebacks_and_cancel_or_refund_take_everything_back() {
    let provider = Provider::parse("adyen").unwrap();
    let item = |code: &str, success: &str| {
        json!({ "eventCode": code, "success": success, "pspReference": format!("{code}1"),
            "originalReference": "7914073381342284", "merchantAccountCode": "TestMerchant",
            "amount": { "value": 500, "currency": "EUR" }, "eventDate": "2026-11-30T09:00:00Z" })
    };
    // A chargeback takes the money back whatever its `success` says.
    let items = [
        item("CHARGEBACK", "true"),
        item("CHARGEBACK", "false"),
        item("CANCEL_OR_REFUND", "true"),
    ];
    for event in parse_adyen(&provider, &batch_of(&items), 100, Capture::Auto).unwrap() {
        let ParsedEvent::Payment(event) = event else {
            panic!("{event:?}")
        };
        assert_eq!(event.status, PaymentStatus::Refunded, "{}", event.event_id);
        let refund = event.refund.as_ref().unwrap();
        assert_eq!(refund.full, Some(true), "{}", event.event_id);
    }
}

/// A cancellation made by the merchant's reference (`TECHNICAL_CANCEL`) cancels the
/// payment its `originalReference` names, as a CANCELLATION does, and outranks a success
/// dated after it; an unsuccessful one is ignored.
#[test]
fn both_cancellations_cancel_the_payment_and_outrank_a_success() {
    let provider = Provider::parse("adyen").unwrap();
    let item = |code: &str, success: &str, date: &str| {
        json!({ "eventCode": code, "success": success, "pspReference": format!("{code}1"),
            "originalReference": "7914073381342284", "merchantAccountCode": "TestMerchant",
            "eventDate": date })
    };
    let mut success = library_item(None);
    success["eventDate"] = json!("2026-11-30T11:00:00Z");
    let items = [
        item("CANCELLATION", "true", "2026-11-30T10:00:00Z"),
        item("TECHNICAL_CANCEL", "true", "2026-11-30T10:00:00Z"),
        item("TECHNICAL_CANCEL", "false", "2026-11-30T10:00:00Z"),
        success,
    ];
    let events = parse_adyen(&provider, &batch_of(&items), 100, Capture::Auto).unwrap();
    let payment = |event: &ParsedEvent| match event {
        ParsedEvent::Payment(event) => Some((event.status, event.version)),
        ParsedEvent::Ignored { .. } => None,
    };
    let (success_status, success_version) = payment(&events[3]).unwrap();
    assert_eq!(success_status, PaymentStatus::Succeeded);
    for event in &events[..2] {
        let (status, version) = payment(event).unwrap();
        assert_eq!(status, PaymentStatus::Canceled, "{event:?}");
        assert!(version > success_version, "{event:?}");
        let ParsedEvent::Payment(event) = event else {
            unreachable!()
        };
        assert_eq!(event.key.payment_intent_id.as_str(), "7914073381342284");
    }
    assert!(payment(&events[2]).is_none(), "{:?}", events[2]);
}

#[test]
fn reversals_give_back_the_withdrawal_of_their_psp_reference() {
    let provider = Provider::parse("adyen").unwrap();
    let item = |code: &str, success: &str| {
        json!({ "eventCode": code, "success": success, "pspReference": "8815329842815468",
            "originalReference": "7914073381342284", "merchantAccountCode": "TestMerchant",
            "amount": { "value": 500, "currency": "EUR" }, "eventDate": "2026-11-30T09:00:00Z" })
    };
    let reversal = |code: &str, success: &str| match parse_adyen(
        &provider,
        &batch_of(&[item(code, success)]),
        100,
        Capture::Auto,
    )
    .unwrap()
    .remove(0)
    {
        ParsedEvent::Payment(event) => {
            assert_eq!(event.key.payment_intent_id.as_str(), "7914073381342284");
            assert_eq!((event.amount, event.currency.as_deref()), (None, None));
            assert_eq!(event.refund, None);
            event.reversal
        }
        ParsedEvent::Ignored { .. } => None,
    };
    let of = |kind: &str| {
        Some(Reversal {
            id: format!("{kind}:8815329842815468"),
            amount: 500,
            of: Some(format!("{kind}:8815329842815468")),
            at: None,
            since: None,
        })
    };
    assert_eq!(reversal("CHARGEBACK_REVERSED", "true"), of("chargeback"));
    assert_eq!(reversal("CHARGEBACK_REVERSED", "false"), of("chargeback"));
    assert_eq!(reversal("REFUND_FAILED", "true"), of("refund"));
    assert_eq!(reversal("REFUNDED_REVERSED", "true"), of("refund"));
    assert_eq!(reversal("REFUND_FAILED", "false"), None);
}

#[test]
fn the_capture_setting_decides_which_item_is_the_success() {
    let provider = Provider::parse("adyen").unwrap();
    let authorised = authorisation_for_three();
    let modification = |code: &str, date: &str| {
        json!({ "eventCode": code, "success": "true", "pspReference": "C1",
            "originalReference": "7914073381342284", "merchantAccountCode": "TestMerchant",
            "amount": { "value": 1130, "currency": "EUR" }, "eventDate": date })
    };
    let items = [
        authorised,
        modification("CAPTURE", "2026-11-30T11:00:00Z"),
        modification("CAPTURE_FAILED", "2026-12-02T11:00:00Z"),
    ];
    let parse = |capture| parse_adyen(&provider, &batch_of(&items), 100, capture).unwrap();
    let payment = |event: &ParsedEvent| match event {
        ParsedEvent::Payment(event) => Some(event.clone()),
        ParsedEvent::Ignored { .. } => None,
    };
    let manual = parse(Capture::Manual);
    let (auth, capture, failed) = (
        payment(&manual[0]).unwrap(),
        payment(&manual[1]).unwrap(),
        payment(&manual[2]).unwrap(),
    );
    assert_eq!(auth.status, PaymentStatus::Processing);
    assert_eq!(auth.token_params.unwrap().unwrap().quantity.get(), 3);
    assert!(auth.payment_date.is_some());
    assert_eq!(capture.status, PaymentStatus::Succeeded);
    assert_eq!(capture.key.payment_intent_id.as_str(), "7914073381342284");
    assert!(
        capture.token_params.is_none(),
        "the authorisation's are kept"
    );
    // A capture is a part of the payment, under its own pspReference: the parts make
    // the amount.
    assert_eq!(capture.amount, None);
    assert_eq!(
        capture.capture,
        Some(CapturedPart {
            id: "capture:C1".to_owned(),
            amount: 1130
        })
    );
    assert_eq!(failed.capture, None);
    assert_eq!(failed.status, PaymentStatus::Failed);
    // The money the capture was to take never came: a withdrawal of its own.
    let never_taken = failed
        .uncaptured
        .expect("a failed capture withdraws its amount");
    assert_eq!(
        (
            never_taken.id.as_str(),
            never_taken.amount,
            never_taken.full
        ),
        ("capture_failed:C1", Some(1130), None)
    );
    assert_eq!(capture.uncaptured, None);
    assert_eq!(
        failed.amount, None,
        "the part never taken, not the payment's amount"
    );
    assert!(
        failed.version > capture.version,
        "a later failed capture outranks its capture"
    );
    let auto = parse(Capture::Auto);
    assert_eq!(payment(&auto[0]).unwrap().status, PaymentStatus::Succeeded);
    assert!(
        payment(&auto[1]).is_none(),
        "CAPTURE is no news under automatic capture"
    );
    assert_eq!(payment(&auto[2]).unwrap().status, PaymentStatus::Failed);
}
