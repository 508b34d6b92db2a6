//! Discovery rosters: `fleetdiscovery,cluster=<bucket>,type=<consumer> event="[...]" <time>`,
//! the full list of providers one kind of consumer in one bucket depends on.

use super::heartbeat::{check_message, check_size, last_string_field};
use super::lp::write_event_line;
use super::{DISCOVERY_MEASUREMENT, MAX_MESSAGE_SIZE, Provider, ServiceType, WireError};
use crate::lineproto::{Decoder, DecoderOptions, Precision};

/// Encodes the roster for `consumer`s in `bucket` as one line.
pub fn encode_roster(
    bucket: &str,
    consumer: ServiceType,
    providers: &[Provider],
    time_ns: i64,
) -> Result<Vec<u8>, WireError> {
    let payload = super::gojson::to_vec(providers).map_err(|e| WireError::Json(e.to_string()))?;
    let mut out = Vec::with_capacity(payload.len() + payload.len() / 4 + 96);
    encode_roster_line(&mut out, bucket, consumer, &payload, time_ns);
    Ok(out)
}

/// Appends the roster line for `consumer`s in `bucket` whose providers are already encoded
/// as Go's JSON (`payload`, as [`encode_roster`] encodes them): the publisher encodes one
/// payload once and sends it to every consumer type and bucket that gets the same list.
pub fn encode_roster_line(
    out: &mut Vec<u8>,
    bucket: &str,
    consumer: ServiceType,
    payload: &[u8],
    time_ns: i64,
) {
    write_event_line(
        out,
        DISCOVERY_MEASUREMENT,
        &[("cluster", bucket), ("type", consumer.code())],
        payload,
        time_ns,
    );
}

/// Decodes a roster message (cc-lib's `DecodeRoster`): exactly one line of measurement
/// `fleetdiscovery` whose `event` is a JSON array of providers. Tags are not checked.
/// Provider types this version does not know are kept (see [`super::ProviderType`]).
pub fn decode_roster(data: &[u8]) -> Result<Vec<Provider>, WireError> {
    decode_roster_timed(data).map(|(_, providers)| providers)
}

/// [`decode_roster`], also returning the roster's timestamp (Unix nanoseconds), which says
/// when the server built it.
pub fn decode_roster_timed(data: &[u8]) -> Result<(i64, Vec<Provider>), WireError> {
    check_size(data)?;
    let options = DecoderOptions {
        precision: Precision::Nanosecond,
        default_time: None,
        max_line_len: MAX_MESSAGE_SIZE,
    };
    let mut lines = Vec::with_capacity(1);
    for line in Decoder::with_options(data, options) {
        let line = line.map_err(WireError::Decode)?;
        check_message(&line)?;
        lines.push(line);
    }
    let [line] = lines.as_slice() else {
        return Err(WireError::RosterLines(lines.len()));
    };
    let measurement = line.measurement();
    if !measurement.eq_unescaped(DISCOVERY_MEASUREMENT) {
        return Err(WireError::UnexpectedMeasurement(
            measurement.unescape().into_owned(),
        ));
    }
    let event = last_string_field(line, "event").ok_or(WireError::RosterMissingEvent)?;
    let time = line.time().unwrap_or_default();
    let payload = event.unescape();
    // Go reads `null` as an empty roster; a roster is never absent, only empty.
    serde_json::from_str::<Option<Vec<Provider>>>(&payload)
        .map(|providers| (time, providers.unwrap_or_default()))
        .map_err(|e| WireError::RosterPayload(e.to_string()))
}

/// NATS header carrying a roster's Ed25519 signature (standard base64 of the 64 signature
/// bytes) over [`roster_signing_input`]. The roster bytes themselves stay exactly what
/// cc-lib's Go client decodes; Go clients ignore the header.
pub const ROSTER_SIGNATURE_HEADER: &str = "Ccfleet-Roster-Signature";

/// Domain separation of roster signatures: a signature made for a roster can never pass as a
/// JWT signature of the same key (whose input is `base64url.base64url`), nor the reverse.
const ROSTER_SIGNING_DOMAIN: &[u8] = b"ccfleet-roster-v1\0";

/// The bytes a roster signature covers: a domain tag, the subject (length-prefixed, so
/// subject and payload cannot be re-split) and the payload. Binding the subject stops a
/// signed roster of one cluster from being replayed on another cluster's subject; the
/// payload's own timestamp bounds replays in time.
pub fn roster_signing_input(subject: &str, payload: &[u8]) -> Vec<u8> {
    let mut input =
        Vec::with_capacity(ROSTER_SIGNING_DOMAIN.len() + 8 + subject.len() + payload.len());
    input.extend_from_slice(ROSTER_SIGNING_DOMAIN);
    input.extend_from_slice(&(subject.len() as u64).to_be_bytes());
    input.extend_from_slice(subject.as_bytes());
    input.extend_from_slice(payload);
    input
}

/// The longest cluster name that can be a roster subject token. NATS closes the connection
/// of a client whose protocol line exceeds its control-line limit (4 KiB by default), which
/// loses every message queued with it, so names are kept far below that.
pub const MAX_SUBJECT_TOKEN_LEN: usize = 255;

/// Why `token` cannot be one token of a NATS subject (a roster bucket, i.e. a cluster name),
/// or `None` when it can. NATS subjects split on `.`, treat `*` and `>` as wildcards and end
/// at whitespace; control characters are refused as well.
///
/// ```
/// use ccfleet::wire::subject_token_problem;
/// assert_eq!(subject_token_problem("fritz"), None);
/// assert!(subject_token_problem("a.b").is_some());
/// assert!(subject_token_problem("my cluster").is_some());
/// ```
pub fn subject_token_problem(token: &str) -> Option<&'static str> {
    if token.is_empty() {
        Some("is empty")
    } else if token.len() > MAX_SUBJECT_TOKEN_LEN {
        Some("is longer than 255 bytes")
    } else if token.contains('.') {
        Some("contains '.', which separates NATS subject tokens")
    } else if token.contains(['*', '>']) {
        Some("contains a NATS wildcard ('*' or '>')")
    } else if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some("contains whitespace or a control character")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn mgmt() -> Provider {
        Provider {
            service_type: ServiceType::Backend.into(),
            hostname: "mgmt01".into(),
            state: "active".into(),
            meta: BTreeMap::from([("port".into(), "8080".into())]),
        }
    }

    #[test]
    fn encodes_the_reference_example() {
        let got = encode_roster(
            "fritz",
            ServiceType::MetricCollector,
            &[mgmt()],
            1_734_000_000_000_000_000,
        )
        .unwrap();
        let want = r#"fleetdiscovery,cluster=fritz,type=ccmc event="[{\"type\":\"ccb\",\"hostname\":\"mgmt01\",\"state\":\"active\",\"meta\":{\"port\":\"8080\"}}]" 1734000000000000000"#;
        assert_eq!(String::from_utf8(got.clone()).unwrap(), format!("{want}\n"));
        assert_eq!(decode_roster(&got).unwrap(), vec![mgmt()]);
        let empty = encode_roster("infra", ServiceType::MetricStore, &[], 1).unwrap();
        assert_eq!(
            empty,
            b"fleetdiscovery,cluster=infra,type=ccms event=\"[]\" 1\n"
        );
        assert_eq!(decode_roster(&empty).unwrap(), vec![]);
    }

    #[test]
    fn a_roster_with_an_unknown_provider_type_is_kept_whole_and_round_trips() {
        // What a newer cc-backend could send: a type this version has never heard of.
        let line = br#"fleetdiscovery,cluster=fritz,type=ccmc event="[{\"type\":\"ccb\",\"hostname\":\"mgmt01\",\"state\":\"active\"},{\"type\":\"cc-quantum\",\"hostname\":\"q1\",\"state\":\"active\",\"meta\":{\"port\":\"9\"}}]" 1734000000000000000
"#;
        let (time, providers) = decode_roster_timed(line).unwrap();
        assert_eq!(time, 1_734_000_000_000_000_000);
        assert_eq!(providers.len(), 2, "nothing is skipped");
        assert_eq!(providers[0].service_type, ServiceType::Backend);
        assert_eq!(providers[1].service_type.known(), None);
        assert_eq!(providers[1].service_type.code(), "cc-quantum");
        assert_eq!(providers[1].meta["port"], "9");
        let again = encode_roster(
            "fritz",
            ServiceType::MetricCollector,
            &providers,
            1_734_000_000_000_000_000,
        )
        .unwrap();
        assert_eq!(again, line.to_vec(), "byte for byte");
    }

    #[test]
    fn signing_input_binds_subject_and_payload() {
        let a = roster_signing_input("x.fritz.ccmc", b"payload");
        assert_ne!(a, roster_signing_input("x.alex.ccmc", b"payload"));
        assert_ne!(a, roster_signing_input("x.fritz.ccmc", b"payloaD"));
        // Moving bytes between subject and payload changes the input.
        assert_ne!(
            roster_signing_input("ab", b"c"),
            roster_signing_input("a", b"bc")
        );
        assert!(a.starts_with(b"ccfleet-roster-v1\0"));
    }

    #[test]
    fn subject_tokens_that_would_break_nats_are_named() {
        assert_eq!(subject_token_problem("fritz"), None);
        assert_eq!(subject_token_problem("cluster-01_ä"), None);
        assert_eq!(subject_token_problem(&"x".repeat(255)), None);
        for bad in [
            "",
            "a.b",
            "a*",
            "a>",
            "my cluster",
            "a\tb",
            "a\nb",
            "a\u{0}b",
        ] {
            assert!(subject_token_problem(bad).is_some(), "{bad:?}");
        }
        assert!(subject_token_problem(&"x".repeat(256)).is_some());
    }

    #[test]
    fn rejects_like_go() {
        let one = encode_roster("a", ServiceType::MetricStore, &[], 1).unwrap();
        let two = [one.clone(), one].concat();
        assert_eq!(decode_roster(&two), Err(WireError::RosterLines(2)));
        assert_eq!(decode_roster(b""), Err(WireError::RosterLines(0)));
        assert!(matches!(
            decode_roster(b"fleet event=\"[]\" 1"),
            Err(WireError::UnexpectedMeasurement(_))
        ));
        assert_eq!(
            decode_roster(b"fleetdiscovery value=1 1"),
            Err(WireError::RosterMissingEvent)
        );
        assert!(matches!(
            decode_roster(b"fleetdiscovery event=\"{}\" 1"),
            Err(WireError::RosterPayload(_))
        ));
        assert!(matches!(
            decode_roster(b"fleetdiscovery event=\"[]\""),
            Err(WireError::MissingTimestamp { .. })
        ));
        assert!(matches!(
            decode_roster(b"fleetdiscovery event=\"[\n"),
            Err(WireError::Decode(_))
        ));
    }
}
