//! Heartbeats: `fleet,function=heartbeat event="{\"instanceId\":\"<id>\"}" <time>`, one line
//! per instance, many lines per NATS message.

use std::borrow::Cow;

use serde::Deserialize;

use super::lp::write_event_line;
use super::{HEARTBEAT_FUNCTION, HEARTBEAT_MEASUREMENT, MAX_MESSAGE_SIZE, WireError};
use crate::lineproto::{Decoder, DecoderOptions, FieldValue, Line, Token};

/// The longest heartbeat line the decoders accept; a real one is about 100 bytes.
pub const HEARTBEAT_MAX_LINE_LEN: usize = 64 << 10;

const OPTIONS: DecoderOptions = DecoderOptions {
    precision: crate::lineproto::Precision::Nanosecond,
    default_time: None,
    max_line_len: HEARTBEAT_MAX_LINE_LEN,
};

/// The canonical start of a heartbeat line, up to the id.
const CANONICAL_PREFIX: &[u8] = br#"fleet,function=heartbeat event="{\"instanceId\":\""#;
/// The canonical bytes between the id and the timestamp.
const CANONICAL_SUFFIX: &[u8] = br#"\"}" "#;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Payload<'a> {
    #[serde(rename = "instanceId", default, borrow)]
    instance_id: Cow<'a, str>,
}

/// Encodes one heartbeat line per id, stamped `time_ns`.
pub fn encode_heartbeat(time_ns: i64, instance_ids: &[&str]) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(instance_ids.len() * 112);
    encode_heartbeat_into(&mut out, time_ns, instance_ids)?;
    Ok(out)
}

/// Appends one heartbeat line per id to `out` (for senders that batch many instances into
/// one NATS message). Nothing is appended on error.
pub fn encode_heartbeat_into(
    out: &mut Vec<u8>,
    time_ns: i64,
    instance_ids: &[&str],
) -> Result<(), WireError> {
    if instance_ids.is_empty() {
        return Err(WireError::NoInstanceId);
    }
    if instance_ids.iter().any(|id| id.is_empty()) {
        return Err(WireError::EmptyInstanceId);
    }
    let tags = [("function", HEARTBEAT_FUNCTION)];
    let mut payload = Vec::with_capacity(64);
    let mut stamp = itoa::Buffer::new();
    let stamp = stamp.format(time_ns).as_bytes();
    for id in instance_ids {
        if id.bytes().all(is_plain_id_byte) {
            // The common case (hex ids): JSON and line protocol need no escapes, so the
            // canonical bytes are written directly.
            out.reserve(CANONICAL_PREFIX.len() + id.len() + CANONICAL_SUFFIX.len() + 21);
            out.extend_from_slice(CANONICAL_PREFIX);
            out.extend_from_slice(id.as_bytes());
            out.extend_from_slice(CANONICAL_SUFFIX);
            out.extend_from_slice(stamp);
            out.push(b'\n');
            continue;
        }
        payload.clear();
        payload.extend_from_slice(br#"{"instanceId":"#);
        super::gojson::to_writer(&mut payload, id).map_err(|e| WireError::Json(e.to_string()))?;
        payload.push(b'}');
        write_event_line(out, HEARTBEAT_MEASUREMENT, &tags, &payload, time_ns);
    }
    Ok(())
}

/// Bytes that Go's JSON encoder and the line-protocol writer both copy verbatim.
#[inline]
fn is_plain_id_byte(b: u8) -> bool {
    b.is_ascii_graphic() && !matches!(b, b'"' | b'\\' | b'<' | b'>' | b'&')
}

/// How a line that is not an accepted heartbeat was classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IgnoreReason {
    /// The line has no string `event` field (a metric or log line on the same subject).
    NotAnEvent,
    /// An event of another measurement.
    OtherMeasurement,
}

/// What [`scan_heartbeats`] made of one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeartbeatLine<'a> {
    /// A valid heartbeat of this instance id.
    Accepted(&'a str),
    /// Not a fleet heartbeat at all; cc-backend skips these silently.
    Ignored(IgnoreReason),
    /// A fleet event that is not a valid heartbeat; cc-backend counts these as rejected.
    Rejected(WireError),
}

/// Classifies every line of a NATS message as cc-backend's heartbeat consumer does, calling
/// `f` once per point. Canonical heartbeat lines take a fast route that only compares bytes;
/// anything else goes through the full decoder and a JSON parse that rejects unknown fields.
///
/// A line that is not valid line protocol (or has no timestamp) stops the scan with an
/// error: cc-backend drops the rest of such a message too.
pub fn scan_heartbeats(data: &[u8], mut f: impl FnMut(HeartbeatLine<'_>)) -> Result<(), WireError> {
    for_each_heartbeat_line(data, |item| {
        match item {
            Item::Canonical(id) => f(HeartbeatLine::Accepted(id)),
            Item::Other(line) => classify(line, &mut f),
        }
        Ok(())
    })
}

/// Decodes every heartbeat of a message (cc-lib's `DecodeHeartbeats`): the first line that
/// is not a valid heartbeat fails the whole message.
pub fn decode_heartbeats(data: &[u8]) -> Result<Vec<String>, WireError> {
    let mut ids = Vec::new();
    for_each_heartbeat_line(data, |item| {
        ids.push(match item {
            Item::Canonical(id) => id.to_owned(),
            Item::Other(line) => parse_heartbeat(line)?.into_owned(),
        });
        Ok(())
    })?;
    Ok(ids)
}

/// One point of a heartbeat message, as [`for_each_heartbeat_line`] hands it on.
enum Item<'l, 'a> {
    /// A heartbeat in the canonical shape, recognised without decoding: its id.
    Canonical(&'l str),
    /// Any other point, already checked to be a valid ClusterCockpit message.
    Other(&'l Line<'a>),
}

/// Walks the points of a message, skipping blank lines and comments; the first syntax
/// error, or the first error `f` returns, ends the walk.
fn for_each_heartbeat_line(
    data: &[u8],
    mut f: impl FnMut(Item<'_, '_>) -> Result<(), WireError>,
) -> Result<(), WireError> {
    check_size(data)?;
    let mut pos = 0;
    let mut line_no = 1;
    while pos < data.len() {
        if let Some((id, used)) = canonical_heartbeat(&data[pos..]) {
            f(Item::Canonical(id))?;
            pos += used;
            line_no += 1;
            continue;
        }
        let mut decoder = Decoder::resume_at(data, pos, line_no, OPTIONS);
        match decoder.next() {
            None => break,
            Some(Err(e)) => return Err(WireError::Decode(e)),
            Some(Ok(line)) => {
                check_message(&line)?;
                f(Item::Other(&line))?;
            }
        }
        pos = decoder.position();
        line_no = decoder.line_number();
    }
    Ok(())
}

/// Reads the instance id of one decoded heartbeat line (cc-lib's `ParseHeartbeat`).
pub fn parse_heartbeat<'a>(line: &Line<'a>) -> Result<Cow<'a, str>, WireError> {
    let measurement = line.measurement();
    if !measurement.eq_unescaped(HEARTBEAT_MEASUREMENT) {
        return Err(WireError::UnexpectedMeasurement(
            measurement.unescape().into_owned(),
        ));
    }
    check_function(line)?;
    let event = last_string_field(line, "event").ok_or(WireError::HeartbeatMissingEvent)?;
    instance_id(event)
}

/// The id of a heartbeat payload, borrowed when the payload needed no unescaping.
fn instance_id(event: Token<'_>) -> Result<Cow<'_, str>, WireError> {
    let id = match event.unescape() {
        Cow::Borrowed(text) => parse_payload(text)?,
        Cow::Owned(text) => Cow::Owned(parse_payload(&text)?.into_owned()),
    };
    if id.is_empty() {
        return Err(WireError::EmptyInstanceId);
    }
    Ok(id)
}

fn parse_payload(text: &str) -> Result<Cow<'_, str>, WireError> {
    serde_json::from_str::<Payload<'_>>(text)
        .map(|p| p.instance_id)
        .map_err(|e| WireError::HeartbeatPayload(e.to_string()))
}

fn classify(line: &Line<'_>, f: &mut impl FnMut(HeartbeatLine<'_>)) {
    let Some(event) = last_string_field(line, "event") else {
        return f(HeartbeatLine::Ignored(IgnoreReason::NotAnEvent));
    };
    if !line.measurement().eq_unescaped(HEARTBEAT_MEASUREMENT) {
        return f(HeartbeatLine::Ignored(IgnoreReason::OtherMeasurement));
    }
    if let Err(e) = check_function(line) {
        return f(HeartbeatLine::Rejected(e));
    }
    match instance_id(event) {
        Ok(id) => f(HeartbeatLine::Accepted(&id)),
        Err(e) => f(HeartbeatLine::Rejected(e)),
    }
}

fn check_function(line: &Line<'_>) -> Result<(), WireError> {
    // ClusterCockpit keeps tags in a map, so a repeated key means its last value.
    let function = line
        .tags()
        .filter(|(k, _)| k.eq_unescaped("function"))
        .last();
    match function {
        Some((_, value)) if value.eq_unescaped(HEARTBEAT_FUNCTION) => Ok(()),
        Some((_, value)) => Err(WireError::UnexpectedFunction(value.unescape().into_owned())),
        None => Err(WireError::UnexpectedFunction(String::new())),
    }
}

/// The last field of this key if it is a string (a map keeps the last value of a key).
pub(crate) fn last_string_field<'a>(line: &Line<'a>, key: &str) -> Option<Token<'a>> {
    line.fields()
        .filter(|(k, _)| k.eq_unescaped(key))
        .last()
        .and_then(|(_, v)| match v {
            FieldValue::String(t) => Some(t),
            _ => None,
        })
}

/// Checks what cc-lib's `NewMessage` requires beyond the syntax: a timestamp and a name that
/// is not blank.
pub(crate) fn check_message(line: &Line<'_>) -> Result<(), WireError> {
    if line.time().is_none() {
        return Err(WireError::MissingTimestamp {
            line: line.line_number(),
        });
    }
    if line.measurement().unescape().trim().is_empty() {
        return Err(WireError::UnexpectedMeasurement(String::new()));
    }
    Ok(())
}

pub(crate) fn check_size(data: &[u8]) -> Result<(), WireError> {
    if data.len() > MAX_MESSAGE_SIZE {
        return Err(WireError::MessageTooLarge {
            size: data.len(),
            limit: MAX_MESSAGE_SIZE,
        });
    }
    Ok(())
}

/// The length of the run of bytes at the start of `bytes` that a canonical id may hold:
/// printable ASCII other than space, `"` and `\`. Sixteen bytes are checked at a time with
/// SSE2, eight with word arithmetic elsewhere.
#[inline]
fn plain_id_len(bytes: &[u8]) -> usize {
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    while i + 16 <= bytes.len() {
        use std::arch::x86_64::*;
        // SAFETY: SSE2 is part of the x86-64 baseline, and `bytes[i..i + 16]` is readable.
        let odd = unsafe {
            let v = _mm_loadu_si128(bytes.as_ptr().add(i).cast());
            let eq = |b: u8| _mm_cmpeq_epi8(v, _mm_set1_epi8(b as i8));
            // Signed: bytes above 0x7f are negative, so one comparison finds them and
            // everything up to the space.
            let below = _mm_cmplt_epi8(v, _mm_set1_epi8(0x21));
            let odd = _mm_or_si128(
                _mm_or_si128(below, eq(0x7f)),
                _mm_or_si128(eq(b'"'), eq(b'\\')),
            );
            _mm_movemask_epi8(odd) as u32
        };
        if odd != 0 {
            return i + odd.trailing_zeros() as usize;
        }
        i += 16;
    }
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // Whether any byte of `w` is below `n` (exact for the question "any?", n <= 0x80).
    let any_below = |w: u64, n: u8| w.wrapping_sub(ONES * u64::from(n)) & !w & HIGH != 0;
    while let Some(chunk) = bytes.get(i..i + 8) {
        let w = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let odd = any_below(w, 0x21)
            || (w.wrapping_add(ONES) | w) & HIGH != 0
            || any_below(w ^ (ONES * u64::from(b'"')), 1)
            || any_below(w ^ (ONES * u64::from(b'\\')), 1);
        if odd {
            break;
        }
        i += 8;
    }
    i + bytes[i..]
        .iter()
        .position(|&b| !b.is_ascii_graphic() || b == b'\\' || b == b'"')
        .unwrap_or(bytes.len() - i)
}

/// Recognises a heartbeat line in exactly the shape cc-lib writes it, returning the id and
/// the bytes consumed (newline included). Anything unusual (escapes in the id, CRLF, a
/// negative or missing timestamp) returns `None` and takes the full route.
#[inline]
fn canonical_heartbeat(rest: &[u8]) -> Option<(&str, usize)> {
    if !starts_with_canonical_prefix(rest) {
        return None;
    }
    let body = &rest[CANONICAL_PREFIX.len()..];
    let id_len = plain_id_len(body);
    if id_len == 0 {
        return None;
    }
    let after_id = body[id_len..].strip_prefix(CANONICAL_SUFFIX)?;
    // Up to 19 digits, at most i64::MAX; anything else takes the full route. Equally long
    // digit strings compare as their values do, so no number is built.
    let mut digits = 0;
    while let Some(word) = after_id.get(digits..digits + 8)
        && digits < 16
        && all_digits(word)
    {
        digits += 8;
    }
    while digits < 20 && after_id.get(digits).is_some_and(u8::is_ascii_digit) {
        digits += 1;
    }
    if digits == 0 || digits > 19 || (digits == 19 && after_id[..19] > b"9223372036854775807"[..]) {
        return None;
    }
    let newline = match after_id.get(digits) {
        None => 0,
        Some(b'\n') => 1,
        Some(_) => return None,
    };
    let id = &body[..id_len];
    debug_assert!(id.is_ascii());
    // SAFETY: `plain_id_len` counts only printable ASCII bytes, which are valid UTF-8.
    let id = unsafe { std::str::from_utf8_unchecked(id) };
    let used = CANONICAL_PREFIX.len() + id_len + CANONICAL_SUFFIX.len() + digits + newline;
    Some((id, used))
}

/// Whether `rest` starts with [`CANONICAL_PREFIX`], compared as six overlapping words
/// (a `memcmp` call would cost more than the comparison).
#[inline(always)]
fn starts_with_canonical_prefix(rest: &[u8]) -> bool {
    const LEN: usize = CANONICAL_PREFIX.len();
    const _: () = assert!(LEN >= 8);
    let Some(head) = rest.first_chunk::<LEN>() else {
        return false;
    };
    let word = |bytes: &[u8], at: usize| {
        u64::from_le_bytes(bytes[at..at + 8].try_into().expect("eight bytes"))
    };
    let mut diff = 0;
    let mut at = 0;
    loop {
        let at_word = at.min(LEN - 8);
        diff |= word(head, at_word) ^ word(CANONICAL_PREFIX, at_word);
        if at_word == LEN - 8 {
            return diff == 0;
        }
        at += 8;
    }
}

/// Whether all eight bytes are ASCII digits: each high nibble is 3, and adding 6 leaves it
/// 3 only for a low nibble up to 9.
#[inline(always)]
fn all_digits(eight: &[u8]) -> bool {
    let word = u64::from_le_bytes(eight.try_into().expect("eight bytes"));
    let high = word & 0xf0f0_f0f0_f0f0_f0f0;
    let carried = (word.wrapping_add(0x0606_0606_0606_0606) & 0xf0f0_f0f0_f0f0_f0f0) >> 4;
    high | carried == 0x3333_3333_3333_3333
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f1c9a2b7d4e6f8a0b1c2d3e4f5a6b7c";
    const T: i64 = 1_734_000_000_000_000_000;

    #[test]
    fn encodes_go_bytes() {
        let got = encode_heartbeat(T, &[ID]).unwrap();
        assert_eq!(
            got,
            format!("fleet,function=heartbeat event=\"{{\\\"instanceId\\\":\\\"{ID}\\\"}}\" {T}\n")
                .as_bytes()
        );
        let two = encode_heartbeat(T, &[ID, "b"]).unwrap();
        assert_eq!(two.iter().filter(|&&b| b == b'\n').count(), 2);
        assert_eq!(encode_heartbeat(T, &[]), Err(WireError::NoInstanceId));
        assert_eq!(
            encode_heartbeat(T, &[ID, ""]),
            Err(WireError::EmptyInstanceId)
        );
        assert_eq!(
            WireError::NoInstanceId.to_string(),
            "fleet: heartbeat without instance id"
        );
    }

    #[test]
    fn the_word_at_a_time_id_scan_agrees_with_a_byte_loop() {
        let reference = |bytes: &[u8]| {
            bytes
                .iter()
                .position(|&b| !b.is_ascii_graphic() || b == b'\\' || b == b'"')
                .unwrap_or(bytes.len())
        };
        for len in 0..=70 {
            for at in 0..=len {
                for odd in (0..=255u8).filter(|&b| !b.is_ascii_alphanumeric() || b == b'a') {
                    let mut bytes = vec![b'a'; len];
                    if at < len {
                        bytes[at] = odd;
                    }
                    assert_eq!(plain_id_len(&bytes), reference(&bytes), "{bytes:?}");
                }
            }
        }
    }

    #[test]
    fn the_word_prefix_check_agrees_with_a_plain_comparison() {
        let mut line = CANONICAL_PREFIX.to_vec();
        line.extend_from_slice(b"abc");
        assert!(starts_with_canonical_prefix(&line));
        for at in 0..CANONICAL_PREFIX.len() {
            for byte in [0u8, b'a', b'"', 0xff] {
                let mut odd = line.clone();
                odd[at] = byte;
                assert_eq!(
                    starts_with_canonical_prefix(&odd),
                    odd.starts_with(CANONICAL_PREFIX),
                    "{at} {byte}"
                );
            }
            assert!(!starts_with_canonical_prefix(&line[..at]));
        }
        for byte in 0..=255u8 {
            for lane in 0..8 {
                let mut eight = *b"01234567";
                eight[lane] = byte;
                assert_eq!(all_digits(&eight), eight.iter().all(u8::is_ascii_digit));
            }
        }
    }

    #[test]
    fn the_fast_route_takes_exactly_the_timestamps_the_full_decoder_accepts() {
        for stamp in [
            "0",
            "1",
            "1734000000000000000",
            "0000000000000000001",
            "12345678",
            "1234567812345678",
            "123456781234567x",
            "9223372036854775807",
            "9223372036854775808",
            "9999999999999999999",
            "09223372036854775807",
            "10000000000000000000",
            "-1",
            "",
            "12a",
        ] {
            let line = format!(
                "fleet,function=heartbeat event=\"{{\\\"instanceId\\\":\\\"{ID}\\\"}}\" {stamp}\n"
            );
            let full = Decoder::resume_at(line.as_bytes(), 0, 1, OPTIONS)
                .next()
                .unwrap()
                .ok()
                .and_then(|l| l.time());
            let fast = canonical_heartbeat(line.as_bytes());
            if let Some((id, used)) = fast {
                assert_eq!((id, used), (ID, line.len()), "{stamp}");
                assert_eq!(full, stamp.parse::<i64>().ok(), "{stamp}");
            } else {
                // Anything the fast route leaves is odd: a time the full decoder rejects, or
                // one it reads another way (a sign).
                assert!(
                    full.is_none() || stamp.starts_with('-') || stamp.len() > 19,
                    "{stamp}"
                );
            }
        }
    }

    #[test]
    fn fast_and_full_routes_agree() {
        let canonical = encode_heartbeat(T, &[ID, "x y\"z"]).unwrap();
        assert_eq!(decode_heartbeats(&canonical).unwrap(), [ID, "x y\"z"]);
        let crlf = String::from_utf8(canonical.clone())
            .unwrap()
            .replace('\n', "\r\n");
        assert_eq!(decode_heartbeats(crlf.as_bytes()).unwrap(), [ID, "x y\"z"]);
        let spaced = format!(
            "fleet,function=heartbeat event=\"{{ \\\"instanceId\\\" : \\\"{ID}\\\" }}\" {T}\n"
        );
        assert_eq!(decode_heartbeats(spaced.as_bytes()).unwrap(), [ID]);
        assert_eq!(decode_heartbeats(b"").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn rejects_like_go() {
        let cases = [
            (
                r#"other,function=heartbeat event="{\"instanceId\":\"a\"}" 1"#,
                "unexpected measurement",
            ),
            (
                r#"fleet,function=register event="{\"instanceId\":\"a\"}" 1"#,
                "unexpected function",
            ),
            (
                r#"fleet event="{\"instanceId\":\"a\"}" 1"#,
                "unexpected function",
            ),
            (
                r#"fleet,function=heartbeat event="{\"instanceId\":\"a\",\"x\":1}" 1"#,
                "payload",
            ),
            (
                r#"fleet,function=heartbeat event="{\"instanceId\":\"\"}" 1"#,
                "empty instance id",
            ),
            (r#"fleet,function=heartbeat event="a" 1"#, "payload"),
            (
                r#"fleet,function=heartbeat event="{\"instanceId\":\"a\"}""#,
                "no timestamp",
            ),
            (r#"fleet,function=heartbeat value=1 1"#, "missing the event"),
        ];
        for (line, want) in cases {
            let err = decode_heartbeats(line.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(want), "{line}: {err}");
        }
    }

    #[test]
    fn scan_classifies_like_cc_backend() {
        let msg = format!(
            "fleet,function=heartbeat event=\"{{\\\"instanceId\\\":\\\"{ID}\\\"}}\" {T}\n\
             job,function=start_job event=\"{{}}\" {T}\n\
             fleet,function=heartbeat value=1 {T}\n\
             fleet,function=stop_job event=\"{{\\\"instanceId\\\":\\\"{ID}\\\"}}\" {T}\n\
             fleet,function=heartbeat event=\"{{}}\" {T}\n\
             fleet,function=heartbeat event=\"\" {T}\n\
             fleet,function=heartbeat event=\"{{\\\"instance_id\\\":\\\"{ID}\\\"}}\" {T}\n"
        );
        let mut seen = Vec::new();
        scan_heartbeats(msg.as_bytes(), |l| seen.push(format!("{l:?}"))).unwrap();
        assert_eq!(seen.len(), 7);
        assert!(seen[0].starts_with("Accepted"));
        assert_eq!(seen[1], "Ignored(OtherMeasurement)");
        assert_eq!(seen[2], "Ignored(NotAnEvent)");
        for s in &seen[3..] {
            assert!(s.starts_with("Rejected"), "{s}");
        }
        // A syntax error stops the message, as in cc-backend.
        let mut accepted = 0;
        let bad = format!(
            "fleet,function=heartbeat event=\"x {T}\nfleet,function=heartbeat event=\"{{\\\"instanceId\\\":\\\"{ID}\\\"}}\" {T}\n"
        );
        let _ = scan_heartbeats(bad.as_bytes(), |_| accepted += 1);
        assert!(scan_heartbeats(b"fleet,function=heartbeat event=\"x\n", |_| {}).is_err());
        assert_eq!(accepted, 0);
    }
}
