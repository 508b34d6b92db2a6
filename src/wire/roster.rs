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
    write_event_line(
        &mut out,
        DISCOVERY_MEASUREMENT,
        &[("cluster", bucket), ("type", consumer.code())],
        &payload,
        time_ns,
    );
    Ok(out)
}

/// Decodes a roster message (cc-lib's `DecodeRoster`): exactly one line of measurement
/// `fleetdiscovery` whose `event` is a JSON array of providers. Tags are not checked.
pub fn decode_roster(data: &[u8]) -> Result<Vec<Provider>, WireError> {
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
    let payload = event.unescape();
    // Go reads `null` as an empty roster; a roster is never absent, only empty.
    serde_json::from_str::<Option<Vec<Provider>>>(&payload)
        .map(Option::unwrap_or_default)
        .map_err(|e| WireError::RosterPayload(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn mgmt() -> Provider {
        Provider {
            service_type: ServiceType::Backend,
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
