//! Tests of the decoder, its views and its caches.

use super::*;
use crate::lineproto::value::FieldValue;

/// The tags and fields of a line read from what the decoder kept, and read by scanning
/// the sections afresh (as lines with more than `KNOWN` of them are read past those).
fn known_and_scanned(line: &Line<'_>) -> [(Vec<String>, Vec<String>); 2] {
    let read = |tags: Tags<'_>, fields: Fields<'_>| {
        let tags = tags
            .map(|(k, v)| {
                format!(
                    "{:?}/{}={:?}/{}",
                    k.raw(),
                    k.has_escapes(),
                    v.raw(),
                    v.has_escapes()
                )
            })
            .collect();
        let fields = fields
            .map(|(k, v)| {
                let v = match v {
                    FieldValue::Float(f) => format!("float {:#x}", f.to_bits()),
                    FieldValue::String(t) => {
                        format!("string {:?}/{}", t.raw(), t.has_escapes())
                    }
                    other => format!("{other:?}"),
                };
                format!("{:?}/{}={v}", k.raw(), k.has_escapes())
            })
            .collect();
        (tags, fields)
    };
    let scanned_tags = Tags {
        known: KnownTags::default(),
        ..line.tags()
    };
    let scanned_fields = Fields {
        known: KnownFields::default(),
        more: 0,
        ..line.fields()
    };
    [
        read(line.tags(), line.fields()),
        read(scanned_tags, scanned_fields),
    ]
}

#[test]
fn tags_and_fields_kept_from_validation_read_as_a_fresh_scan_does() {
    let tags = [
        "a=b",
        "k\\ x=v\\,w",
        "k\\=y=1\\=2",
        "é=ü",
        "t=a\\\\b",
        "a=b",
    ];
    let values = [
        "1",
        "-1.5",
        "0.000001",
        "123456789012345",
        "1234567890123456",
        "12345678901234567",
        "1e3",
        "-0x1p-2",
        "1_000",
        ".5",
        "1.",
        "7i",
        "-9223372036854775808i",
        "12345678i",
        "123456789i",
        "18446744073709551615u",
        "0u",
        "t",
        "TRUE",
        "false",
        "F",
        "\"\"",
        "\"plain\"",
        "\"a \\\"quoted\\\" \\\\ one\"",
        "\"two\nlines\"",
        "\"é\"",
        "9",
    ];
    let keys = ["f", "f\\ g", "k\\=v", "k\\,", "ключ"];
    let mut lines = 0;
    for n_tags in 0..=KNOWN + 2 {
        for n_fields in 1..=KNOWN + 3 {
            for (shift, end) in ["", "\n", "\r\n", " 1700000000000000000\n", " -1\r\n", " 17"]
                .iter()
                .enumerate()
            {
                let mut line = String::from("m\\ x");
                for t in 0..n_tags {
                    line.push(',');
                    line.push_str(tags[(t + shift) % tags.len()]);
                }
                line.push(' ');
                for f in 0..n_fields {
                    if f > 0 {
                        line.push(',');
                    }
                    let at = f * 7 + shift * 3 + n_tags + n_fields;
                    line.push_str(keys[at % keys.len()]);
                    line.push('=');
                    line.push_str(values[at % values.len()]);
                }
                line.push_str(end);
                // Twice: the second time after a line ending, or at the end of the input.
                let input = if end.ends_with('\n') {
                    line.repeat(2)
                } else {
                    format!("{line}\n{line}")
                };
                let decoded: Vec<_> = Decoder::new(input.as_bytes()).collect();
                assert_eq!(decoded.len(), 2, "{line:?}");
                for got in decoded {
                    let got = got.unwrap_or_else(|e| panic!("{line:?}: {e}"));
                    let [known, scanned] = known_and_scanned(&got);
                    assert_eq!(known, scanned, "{line:?}");
                    assert_eq!(known.0.len(), n_tags, "{line:?}");
                    assert_eq!(known.1.len(), n_fields, "{line:?}");
                    assert_eq!(usize::from(got.known_tags.count), n_tags.min(KNOWN));
                    assert_eq!(usize::from(got.known_fields.count), n_fields.min(KNOWN));
                    lines += 1;
                }
            }
        }
    }
    assert!(lines > 400);
}

/// A line of `n` integer fields `f<k>=<k * seed>i`.
fn many_fields_line(n: usize, seed: i64) -> String {
    let fields: Vec<String> = (0..n)
        .map(|k| format!("f{k}={}i", k as i64 * seed))
        .collect();
    format!("m,t=x {}\n", fields.join(","))
}

/// The fields of a line, which must be those of `many_fields_line(n, seed)`.
fn assert_many_fields(line: &Line<'_>, n: usize, seed: i64) {
    let got: Vec<(String, FieldValue<'_>)> = line
        .fields()
        .map(|(k, v)| (k.raw().to_owned(), v))
        .collect();
    let want: Vec<(String, FieldValue<'_>)> = (0..n)
        .map(|k| (format!("f{k}"), FieldValue::Int(k as i64 * seed)))
        .collect();
    assert_eq!(got, want, "{n} fields, seed {seed}");
}

#[test]
fn a_line_read_partway_reads_on_right_whatever_the_thread_decodes_meanwhile() {
    // Another line decoded between two reads of a line's fields replaces the thread's
    // table; the rest of the first line must still read right (by scanning).
    for stop_after in [3, 4, 5, 7, 8, 9, 12, 13] {
        let text = many_fields_line(15, 31);
        let line = Decoder::new(text.as_bytes()).next().unwrap().unwrap();
        let mut fields = line.fields();
        let mut got: Vec<(String, FieldValue<'_>)> = fields
            .by_ref()
            .take(stop_after)
            .map(|(k, v)| (k.raw().to_owned(), v))
            .collect();
        let other = many_fields_line(11, 37);
        let other_line = Decoder::new(other.as_bytes()).next().unwrap().unwrap();
        got.extend(fields.map(|(k, v)| (k.raw().to_owned(), v)));
        let want: Vec<(String, FieldValue<'_>)> = (0..15)
            .map(|k| (format!("f{k}"), FieldValue::Int(k as i64 * 31)))
            .collect();
        assert_eq!(got, want, "stopped after {stop_after}");
        assert_many_fields(&other_line, 11, 37);
    }
}

#[test]
fn fields_past_the_kept_ones_read_right_whichever_line_the_thread_decoded_last() {
    // Shorter lines after longer ones, each by a new decoder: the table's storage is
    // reused and must hold only the line's own fields (it once held an earlier line's
    // too, which made reading them wrong or panic).
    for (n, seed) in [(20, 3), (6, 5), (6, 7), (5, 11), (30, 13), (7, 17), (5, 19)] {
        let text = many_fields_line(n, seed);
        let line = Decoder::new(text.as_bytes()).next().unwrap().unwrap();
        assert_many_fields(&line, n, seed);
    }
    // A line that fails after its fifth field leaves nothing to the next.
    let text = format!(
        "m f0=1,f1=2,f2=3,f3=4,f4=5,f5=6 x\n{}",
        many_fields_line(6, 29)
    );
    let got: Vec<_> = Decoder::new(text.as_bytes()).collect();
    assert!(got[0].is_err(), "{text:?}");
    assert_many_fields(got[1].as_ref().unwrap(), 6, 29);
    // Lines kept while later ones are decoded (the table holds the last one only), and
    // a line read on another thread (whose table holds none of this thread's lines).
    let text: String = (1..=4)
        .map(|i| many_fields_line(4 + 3 * i, i as i64))
        .collect();
    let lines: Vec<Line<'_>> = Decoder::new(text.as_bytes()).map(Result::unwrap).collect();
    for (i, line) in lines.iter().enumerate().rev() {
        assert_many_fields(line, 7 + 3 * i, i as i64 + 1);
    }
    let other = many_fields_line(9, 23);
    let _ = Decoder::new(other.as_bytes()).next();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let _ = Decoder::new(other.as_bytes()).next();
            for (i, line) in lines.iter().enumerate() {
                assert_many_fields(line, 7 + 3 * i, i as i64 + 1);
            }
        });
    });
    assert_many_fields(&lines[3], 16, 4);
}

#[test]
fn timestamps_built_while_scanned_agree_with_the_integer_parser() {
    let mut stamps = vec![
        "0".to_owned(),
        "-0".to_owned(),
        "9223372036854775807".to_owned(),
        "9223372036854775808".to_owned(),
        "-9223372036854775808".to_owned(),
        "-9223372036854775809".to_owned(),
        "9999999999999999999".to_owned(),
        "18446744073709551616".to_owned(),
        "00000000000000000000000001".to_owned(),
        "1-2".to_owned(),
        "--1".to_owned(),
        "12345678-".to_owned(),
        "-".to_owned(),
    ];
    for n in 1..=22 {
        stamps.push("7".repeat(n));
        stamps.push(format!("1{}", "0".repeat(n - 1)));
    }
    for stamp in stamps {
        for end in ["", "\n", " \n", "\r\n", " x"] {
            let input = format!("m f=1 {stamp}{end}");
            let got = Decoder::new(input.as_bytes()).next().unwrap();
            if end == " x" {
                // What follows is judged before the digits are.
                let kind = got.unwrap_err().kind;
                assert_eq!(
                    kind,
                    DecodeErrorKind::UnexpectedCharacter(b'x'),
                    "{input:?}"
                );
                continue;
            }
            match (got, parse_int_reference(&stamp)) {
                (Ok(line), Ok(v)) => assert_eq!(line.time(), Some(v), "{input:?}"),
                (Err(e), Err(kind)) => assert_eq!(e.kind, kind, "{input:?}"),
                (got, want) => panic!("{input:?}: {got:?} {want:?}"),
            }
        }
    }
}

/// What a timestamp's digits mean, by the plain integer parser.
fn parse_int_reference(stamp: &str) -> Result<i64, DecodeErrorKind> {
    value::parse_int(stamp.as_bytes()).map_err(|kind| match kind {
        DecodeErrorKind::OutOfRange => DecodeErrorKind::TimestampOutOfRange,
        _ => DecodeErrorKind::InvalidTimestamp,
    })
}

#[test]
fn an_unterminated_string_near_the_end_of_the_input_is_an_error_not_a_panic() {
    // 25-31 bytes after the quote once made the scanner search past the end.
    for n in 0..=80 {
        let input = format!("m f=\"{}", "a".repeat(n));
        let got: Vec<_> = Decoder::new(input.as_bytes()).collect();
        assert_eq!(got.len(), 1, "{input:?}");
        let error = got[0].as_ref().unwrap_err();
        assert_eq!(error.kind, DecodeErrorKind::UnterminatedString, "{input:?}");
        assert_eq!((error.line, error.column), (1, 5), "{input:?}");
    }
    let heartbeat = b"fleet,function=heartbeat event=\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let error = Decoder::new(heartbeat).next().unwrap().unwrap_err();
    assert_eq!(error.kind, DecodeErrorKind::UnterminatedString);
}
