//! Property tests: arbitrary bytes never panic the decoders, and what the encoder writes
//! decodes back to the same point.

use ccfleet::lineproto::{
    DecodeErrorKind, Decoder, DecoderOptions, Encoder, OwnedValue, Point, Precision,
};
use ccfleet::wire;
use proptest::prelude::*;

fn decode_everything(bytes: &[u8]) {
    for line in Decoder::new(bytes).flatten() {
        let _ = Point::from_line(&line);
    }
    let _ = wire::decode_heartbeats(bytes);
    let _ = wire::scan_heartbeats(bytes, |_| {});
    let _ = wire::decode_roster(bytes);
}

/// Valid fleet and metric lines with bytes changed: close to the grammar, so the mutations
/// reach deep into the decoder.
fn near_valid() -> impl Strategy<Value = Vec<u8>> {
    let seeds = [
        wire::encode_heartbeat(1, &["3f1c9a2b7d4e6f8a0b1c2d3e4f5a6b7c", "a\"b\\c"]).unwrap(),
        b"load_one,cluster=fritz,hostname=f0101 value=0.73,n=5i,u=7u,b=t,s=\"x\\\"y\\n\" 1734000000\r\n# c\n".to_vec(),
        b"fleetdiscovery,cluster=fritz,type=ccmc event=\"[{\\\"type\\\":\\\"ccb\\\",\\\"hostname\\\":\\\"m\\\",\\\"state\\\":\\\"active\\\"}]\" 1\n".to_vec(),
    ];
    (
        0..seeds.len(),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    )
        .prop_map(move |(which, edits)| {
            let mut bytes = seeds[which].clone();
            for (at, byte) in edits {
                let i = at.index(bytes.len());
                bytes[i] = byte;
            }
            bytes
        })
}

fn token() -> impl Strategy<Value = String> {
    // Escape-relevant ASCII, letters and some multi-byte characters; no control characters.
    "[a-zA-Z0-9 ,=\\\\\"#é€😀_.-]{1,40}"
        .prop_filter("no trailing backslash", |s| !s.ends_with('\\'))
}

fn value() -> impl Strategy<Value = OwnedValue> {
    prop_oneof![
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(OwnedValue::Float),
        any::<i64>().prop_map(OwnedValue::Int),
        any::<u64>().prop_map(OwnedValue::Uint),
        any::<bool>().prop_map(OwnedValue::Bool),
        "[ -~\t\né😀]{0,20}".prop_map(OwnedValue::String),
    ]
}

fn point() -> impl Strategy<Value = Point> {
    (
        token().prop_filter("a leading # reads as a comment", |m| !m.starts_with('#')),
        prop::collection::btree_map(token(), token(), 0..4),
        prop::collection::vec((token(), value()), 1..5),
        prop::option::of(any::<i64>()),
    )
        .prop_map(|(measurement, tags, fields, time)| Point {
            measurement,
            tags: tags.into_iter().collect(),
            fields,
            time,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        decode_everything(&bytes);
    }

    #[test]
    fn mutated_lines_never_panic(bytes in near_valid()) {
        decode_everything(&bytes);
    }

    #[test]
    fn encode_then_decode_round_trips(points in prop::collection::vec(point(), 1..4)) {
        let mut encoder = Encoder::new();
        for p in &points {
            encoder.encode_point(p, true).unwrap();
        }
        let bytes = encoder.take();
        let decoded: Vec<Point> = Decoder::new(&bytes)
            .map(|l| Point::from_line(&l.unwrap()))
            .collect();
        prop_assert_eq!(decoded, points);
    }

    #[test]
    fn heartbeats_round_trip(ids in prop::collection::vec("[ -~é]{1,40}", 1..20), t in any::<i64>()) {
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let encoded = wire::encode_heartbeat(t, &refs).unwrap();
        prop_assert_eq!(wire::decode_heartbeats(&encoded).unwrap(), ids);
    }
}

#[test]
fn lines_over_the_limit_are_errors_and_decoding_goes_on() {
    let long = format!("m v=\"{}\" 1\nm v=2 2\n", "x".repeat(100));
    let options = DecoderOptions {
        max_line_len: 64,
        ..DecoderOptions::default()
    };
    let results: Vec<_> = Decoder::with_options(long.as_bytes(), options).collect();
    assert_eq!(results.len(), 2);
    let err = results[0].as_ref().unwrap_err();
    assert_eq!(err.kind, DecodeErrorKind::LineTooLong { limit: 64 });
    assert_eq!(results[1].as_ref().unwrap().time(), Some(2));
}

#[test]
fn messages_over_the_limit_are_errors() {
    let huge = vec![b'\n'; wire::MAX_MESSAGE_SIZE + 1];
    let err = wire::decode_heartbeats(&huge).unwrap_err();
    assert!(err.to_string().contains("exceeds the limit"), "{err}");
    assert!(wire::decode_roster(&huge).is_err());
}

#[test]
fn bad_lines_report_line_and_column_and_the_rest_decodes() {
    let input = b"a v=1 1\nb,t v=1 1\r\n\n# comment\nc v=\"multi\nline\" 3\nd v=tru 4\ne v=5i 5\n";
    let results: Vec<_> = Decoder::new(input).collect();
    let summary: Vec<String> = results
        .iter()
        .map(|r| match r {
            Ok(l) => format!("ok {} line {}", l.measurement().raw(), l.line_number()),
            Err(e) => format!("err {}:{}", e.line, e.column),
        })
        .collect();
    assert_eq!(
        summary,
        [
            "ok a line 1",
            // As the Go decoder: a tag key without `=` is reported where the key starts.
            "err 2:3",
            "ok c line 5",
            "err 7:5",
            "ok e line 8"
        ]
    );
}

#[test]
fn precision_and_default_time() {
    let options = DecoderOptions {
        precision: Precision::Second,
        default_time: Some(1_700_000_000_123_456_789),
        ..DecoderOptions::default()
    };
    let lines: Vec<_> =
        Decoder::with_options(b"m v=1 2\nm v=1\nm v=1 9223372037\n", options).collect();
    assert_eq!(lines[0].as_ref().unwrap().time(), Some(2_000_000_000));
    assert_eq!(
        lines[1].as_ref().unwrap().time_or_default(),
        Some(1_700_000_000_000_000_000)
    );
    assert_eq!(
        lines[2].as_ref().unwrap_err().kind,
        DecodeErrorKind::TimestampOutOfRange
    );
}
