//! The properties the fuzz targets check on any input: no panic, and answers that agree with
//! each other. `tests/lineproto_fuzz.rs` includes this file to replay the seed corpus and
//! every input that once failed, so the checks also run in the ordinary test suite.

use ccfleet::lineproto::{
    BatchError, BatchLimits, Decoder, DecoderOptions, Encoder, FieldValue, OwnedValue, Point,
    Precision, TokenKind, check_batch, unescape_implementations,
};
use ccfleet::wire::{self, HeartbeatLine, Provider, ProviderType, ServiceType};

/// Any bytes through the decoder, with options picked by the first byte; every token of
/// every line is read, and what the strict encoder accepts of a decoded point must decode
/// back to the same point.
pub fn decoder(data: &[u8]) {
    let (options, input) = match data.split_first() {
        Some((&pick, rest)) => (
            DecoderOptions {
                precision: [
                    Precision::Nanosecond,
                    Precision::Microsecond,
                    Precision::Millisecond,
                    Precision::Second,
                ][usize::from(pick & 3)],
                default_time: (pick & 4 != 0).then_some(1_700_000_000_123_456_789),
                max_line_len: if pick & 8 != 0 { 64 } else { 1 << 20 },
            },
            rest,
        ),
        None => (DecoderOptions::default(), data),
    };
    let mut last_line = 0;
    let mut scratch = String::new();
    for item in Decoder::with_options(input, options) {
        match item {
            Ok(line) => {
                assert!(line.line_number() > last_line, "line numbers go forward");
                last_line = line.line_number();
                assert!(line.raw().len() <= options.max_line_len);
                let point = Point::from_line(&line);
                assert!(!point.fields.is_empty(), "a point has a field");
                assert_eq!(
                    line.measurement().unescape_with(&mut scratch),
                    point.measurement
                );
                assert!(line.measurement().eq_unescaped(&point.measurement));
                assert_eq!(line.tags().count(), point.tags.len());
                for ((k, v), (pk, pv)) in line.tags().zip(&point.tags) {
                    assert!(k.eq_unescaped(pk) && v.eq_unescaped(pv));
                    assert!(line.tag(pk).is_some());
                }
                for ((k, v), (pk, pv)) in line.fields().zip(&point.fields) {
                    assert!(k.eq_unescaped(pk));
                    if let (FieldValue::String(t), OwnedValue::String(s)) = (v, pv) {
                        assert!(t.eq_unescaped(s));
                        assert_eq!(t.unescape_with(&mut scratch), s);
                    }
                }
                assert_eq!(line.time_or_default(), point.time);
                let _ = point.to_json();
                reencodes_to_itself(&point);
            }
            Err(error) => {
                assert!(error.line >= 1 && error.column >= 1);
                assert!(error.line >= last_line, "errors come in line order");
                last_line = error.line;
                let _ = error.to_string();
            }
        }
    }
}

/// A point the strict encoder accepts decodes back to itself.
fn reencodes_to_itself(point: &Point) {
    let mut encoder = Encoder::new();
    if encoder.encode_point(point, true).is_err() {
        return;
    }
    let mut sorted = point.clone();
    if sorted.normalize_tags().is_err() {
        return;
    }
    let bytes = encoder.take();
    let mut decoder = Decoder::new(&bytes);
    let line = match decoder.next() {
        Some(Ok(line)) => line,
        other => panic!(
            "{:?} re-encoded as {:?}: {other:?}",
            point,
            bytes.escape_ascii().to_string()
        ),
    };
    assert_eq!(Point::from_line(&line), sorted, "{}", bytes.escape_ascii());
    assert!(decoder.next().is_none(), "one point is one line");
}

/// Any bytes as a heartbeat message: the scan (cc-backend's classification) and the strict
/// decode agree, and the fast path for canonical lines agrees with the full decoder.
pub fn heartbeats(data: &[u8]) {
    let mut scanned = Vec::new();
    let scan = wire::scan_heartbeats(data, |line| {
        scanned.push(match line {
            HeartbeatLine::Accepted(id) => Some(id.to_owned()),
            _ => None,
        })
    });
    let Ok(ids) = wire::decode_heartbeats(data) else {
        return;
    };
    assert!(scan.is_ok(), "decoded, yet the scan failed: {scan:?}");
    let accepted: Vec<_> = ids.iter().cloned().map(Some).collect();
    assert_eq!(scanned, accepted);
    let options = DecoderOptions {
        max_line_len: wire::HEARTBEAT_MAX_LINE_LEN,
        ..DecoderOptions::default()
    };
    let full: Vec<String> = Decoder::with_options(data, options)
        .map(|line| wire::parse_heartbeat(&line.unwrap()).unwrap().into_owned())
        .collect();
    assert_eq!(full, ids);
}

/// Any bytes as a roster message: a roster that decodes re-encodes to the same providers.
pub fn roster(data: &[u8]) {
    let Ok(providers) = wire::decode_roster(data) else {
        return;
    };
    let again = wire::encode_roster("b", ServiceType::MetricStore, &providers, 1).unwrap();
    assert_eq!(wire::decode_roster(&again).unwrap(), providers);
}

/// Reads the fuzz input as a recipe for values to encode.
struct Recipe<'a>(&'a [u8]);

impl Recipe<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |acc, _| acc << 8 | u64::from(self.byte()))
    }

    /// A string of up to 31 bytes, drawn mostly from the bytes that matter to the syntax.
    fn text(&mut self) -> String {
        const ALPHABET: &[u8] = b"a\\ ,=\"\t\r\n#x\x01\x7f";
        let len = self.byte() % 32;
        let mut bytes = Vec::new();
        for _ in 0..len {
            let b = self.byte();
            if b < 0xc0 {
                bytes.push(ALPHABET[usize::from(b) % ALPHABET.len()]);
            } else if b < 0xe0 {
                bytes.extend_from_slice("é".as_bytes());
            } else {
                bytes.push(self.byte());
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Values built from the fuzz input go through each encoder and decode back to themselves.
pub fn round_trip(data: &[u8]) {
    let mut recipe = Recipe(data);

    // The line-protocol encoder: a point it accepts decodes to the same point.
    let mut point = Point {
        measurement: recipe.text(),
        ..Point::default()
    };
    for _ in 0..recipe.byte() % 4 {
        point.tags.push((recipe.text(), recipe.text()));
    }
    for _ in 0..1 + recipe.byte() % 4 {
        let value = match recipe.byte() % 5 {
            0 => OwnedValue::Float(f64::from_bits(recipe.u64())),
            1 => OwnedValue::Int(recipe.u64() as i64),
            2 => OwnedValue::Uint(recipe.u64()),
            3 => OwnedValue::Bool(recipe.byte() & 1 == 1),
            _ => OwnedValue::String(recipe.text()),
        };
        point.fields.push((recipe.text(), value));
    }
    point.time = (recipe.byte() & 1 == 1).then(|| recipe.u64() as i64);
    reencodes_to_itself(&point);

    // Heartbeats: any non-empty ids come back, through the scan and the strict decode.
    let ids: Vec<String> = (0..1 + recipe.byte() % 3)
        .map(|_| recipe.text())
        .filter(|id| !id.is_empty())
        .collect();
    if !ids.is_empty() {
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let time = recipe.u64() as i64;
        let bytes = wire::encode_heartbeat(time, &refs).unwrap();
        assert_eq!(wire::decode_heartbeats(&bytes).unwrap(), ids);
        let mut scanned = Vec::new();
        wire::scan_heartbeats(&bytes, |line| {
            scanned.push(match line {
                HeartbeatLine::Accepted(id) => id.to_owned(),
                other => panic!("{other:?}"),
            })
        })
        .unwrap();
        assert_eq!(scanned, ids);
    }

    // Rosters: the providers come back; the bucket tag reads back as Go writes it, with a
    // tab, CR or LF turned into two backslashes and a letter.
    let bucket = recipe.text();
    let consumer = ServiceType::ALL[usize::from(recipe.byte()) % ServiceType::ALL.len()];
    let providers: Vec<Provider> = (0..recipe.byte() % 3)
        .map(|_| Provider {
            // Unknown provider types (any string) are kept as they arrived.
            service_type: match recipe.byte() {
                b if b % 4 == 0 => ProviderType::from(recipe.text().as_str()),
                b => ServiceType::ALL[usize::from(b) % ServiceType::ALL.len()].into(),
            },
            hostname: recipe.text(),
            state: recipe.text(),
            meta: (0..recipe.byte() % 3)
                .map(|_| (recipe.text(), recipe.text()))
                .collect(),
        })
        .collect();
    let bytes = wire::encode_roster(&bucket, consumer, &providers, 1).unwrap();
    let readable = !bucket.is_empty()
        && !bucket.ends_with('\\')
        && bucket
            .bytes()
            .all(|b| !(b < 0x20 || b == 0x7f) || matches!(b, b'\t' | b'\r' | b'\n'));
    if !readable {
        return;
    }
    assert_eq!(wire::decode_roster(&bytes).unwrap(), providers);
    let line = Decoder::new(&bytes).next().unwrap().unwrap();
    let go_bucket = bucket
        .replace('\t', "\\\\t")
        .replace('\r', "\\\\r")
        .replace('\n', "\\\\n");
    assert_eq!(line.tag("cluster").unwrap().unescape(), go_bucket);
    assert_eq!(line.tag("type").unwrap().unescape(), consumer.code());
}

/// Any text unescaped as a token of the kind the first byte picks: every implementation this
/// CPU runs (portable, SSE2, AVX2, NEON) must give what a byte-at-a-time reading of the
/// escape rules gives, and `Token::unescape` the same.
pub fn unescape(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let kind = [
        TokenKind::Measurement,
        TokenKind::Key,
        TokenKind::StringField,
    ][usize::from(pick % 3)];
    let raw = String::from_utf8_lossy(rest);
    let want = unescape_reference(&raw, kind);
    for (name, unescape) in unescape_implementations() {
        let mut out = String::from("prefix");
        unescape(&raw, kind, &mut out);
        assert_eq!(out.strip_prefix("prefix"), Some(want.as_str()), "{name}");
    }
}

/// The escape rules one byte at a time: a backslash followed by a byte of the kind's set
/// stands for that byte (`n`, `r`, `t` for control characters in strings); any other
/// backslash is literal and the byte after it is read afresh.
fn unescape_reference(raw: &str, kind: TokenKind) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let replaced = match (kind, bytes[i], bytes.get(i + 1)) {
            (TokenKind::Measurement, b'\\', Some(&c @ (b' ' | b','))) => Some(c),
            (TokenKind::Key, b'\\', Some(&c @ (b' ' | b',' | b'='))) => Some(c),
            (TokenKind::StringField, b'\\', Some(&c @ (b'\\' | b'"'))) => Some(c),
            (TokenKind::StringField, b'\\', Some(b'n')) => Some(b'\n'),
            (TokenKind::StringField, b'\\', Some(b'r')) => Some(b'\r'),
            (TokenKind::StringField, b'\\', Some(b't')) => Some(b'\t'),
            _ => None,
        };
        match replaced {
            Some(c) => {
                out.push(c);
                i += 2;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).expect("unescaping keeps UTF-8")
}

/// A collector's batch as the guest SDK writes it, for [`emit_check`] to mutate.
const VALID_BATCH: &[u8] =
    b"cpu_user,hostname=n1,type=hwthread,type-id=0,unit=Percent value=1.5 1700000000000000000\n\
cpu_idle,hostname=n1,type=node value=97 1700000000000000000\n\
mem_free,hostname=n\\ 1,unit=kB value=123i\n\
note,hostname=n1 text=\"a \\\"b\\\" c\",ok=true,n=3u 1700000000000000000\n";

/// Any bytes as a plugin's `emit-lines` batch, under limits the first byte picks; with its
/// top bit set, the rest instead edits a valid batch (each pair of bytes writes a byte at a
/// position). Nothing panics; a refused batch leaves nothing in the output and names a line
/// that exists; an accepted batch decodes without error into as many points as the check
/// counted, each within the limits and with a time, each line the input's own (with the time
/// appended where it had none), and checking the output again accepts it unchanged.
pub fn emit_check(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let limits = BatchLimits {
        max_points: [1, 3, 100, 10_000][usize::from(pick & 3)],
        max_bytes: if pick & 4 != 0 { 64 } else { 1 << 20 },
        max_line_len: if pick & 8 != 0 { 48 } else { 64 << 10 },
        max_tags: [0, 2, 64, 64][usize::from((pick >> 4) & 3)],
        max_fields: if pick & 0x40 != 0 { 1 } else { 1024 },
    };
    let mutated;
    let input = if pick & 0x80 != 0 {
        let mut batch = VALID_BATCH.to_vec();
        for edit in rest.chunks_exact(2) {
            let at = usize::from(edit[0]) % batch.len();
            batch[at] = edit[1];
        }
        mutated = batch;
        &mutated[..]
    } else {
        rest
    };
    const NOW: i64 = 1_700_000_000_999_999_999;
    let prefix = b"earlier batch\n";
    let mut out = prefix.to_vec();
    let mut clock_reads = 0;
    let result = check_batch(
        input,
        &limits,
        &mut || {
            clock_reads += 1;
            NOW
        },
        &mut out,
    );
    assert!(clock_reads <= 1, "the clock is read once at most");
    assert!(out.starts_with(prefix), "what came before is kept");
    let lines_in_input = input.iter().filter(|&&b| b == b'\n').count() + 1;
    let points = match result {
        Err(error) => {
            assert_eq!(out, prefix, "a refused batch leaves nothing: {error}");
            if let Some(line) = error.line() {
                assert!(line >= 1 && line <= lines_in_input, "{error}");
            }
            if let BatchError::TooLarge { bytes, limit } = error {
                assert!(bytes > limit && bytes == input.len());
            }
            let _ = error.to_string();
            return;
        }
        Ok(points) => points,
    };
    assert!(input.len() <= limits.max_bytes);
    assert!(points <= limits.max_points);
    let checked = &out[prefix.len()..];
    // The input decodes without an error into the lines the output holds.
    let options = DecoderOptions {
        max_line_len: limits.max_line_len,
        ..DecoderOptions::default()
    };
    let originals: Vec<_> = Decoder::with_options(input, options)
        .map(|line| line.expect("an accepted batch decodes"))
        .collect();
    let relaxed = DecoderOptions {
        max_line_len: usize::MAX,
        ..DecoderOptions::default()
    };
    let sent: Vec<_> = Decoder::with_options(checked, relaxed)
        .map(|line| line.expect("what is sent decodes"))
        .collect();
    assert_eq!(sent.len(), points);
    assert_eq!(originals.len(), points);
    for (line, original) in sent.iter().zip(&originals) {
        assert!(line.tag_count() <= limits.max_tags);
        assert!(line.field_count() <= limits.max_fields && line.field_count() >= 1);
        assert_eq!(line.tag_count(), line.tags().count());
        let keys: Vec<&str> = line.tags().map(|(k, _)| k.raw()).collect();
        let mut unique = keys.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), keys.len(), "a tag key repeated");
        assert_eq!(line.field_count(), line.fields().count());
        match original.time() {
            Some(time) => {
                assert_eq!(line.raw(), original.raw());
                assert_eq!(line.time(), Some(time));
            }
            None => {
                assert_eq!(line.raw(), format!("{} {NOW}", original.raw()));
                assert_eq!(line.time(), Some(NOW));
            }
        }
        assert_eq!(
            Point::from_line(line).fields,
            Point::from_line(original).fields
        );
    }
    // Checked again (every line has its time now), the output passes unchanged.
    let again = BatchLimits {
        max_bytes: usize::MAX,
        max_line_len: usize::MAX,
        ..limits
    };
    let mut twice = Vec::new();
    let recheck = check_batch(checked, &again, &mut || unreachable!(), &mut twice);
    assert_eq!(recheck, Ok(points));
    assert_eq!(twice, checked);
}

/// Any text as a host list (bytes up to the first `\n`) and a name (the rest): parsing never
/// panics; a list that parses and expands to a few names matches each of them, and the names
/// written back by `compress` parse (unless the list is longer than any expression may be),
/// expand to the same set and match each name.
pub fn hostlist(data: &[u8]) {
    use ccfleet::hostlist::{HostList, compress};
    let text = String::from_utf8_lossy(data);
    let (expression, name) = text.split_once('\n').unwrap_or((&text, ""));
    let Ok(list) = HostList::parse(expression) else {
        return;
    };
    let _ = list.matches(name);
    let Ok(mut names) = list.expand(256) else {
        return;
    };
    for n in &names {
        assert!(
            list.matches(n),
            "{expression:?} does not match its own {n:?}"
        );
    }
    let written = compress(names.iter().map(String::as_str));
    let back = match HostList::parse(&written) {
        Ok(back) => back,
        // Names long enough that even their list is longer than an expression may be (a
        // bound on what is parsed, not on what is written) are refused for that alone.
        Err(e) if written.len() > ccfleet::hostlist::MAX_EXPRESSION_LEN => {
            assert!(e.message.starts_with("longer than"), "{e}");
            return;
        }
        Err(e) => panic!("compress writes a host list: {e}: {written:?}"),
    };
    let mut again = back.expand(256).expect("as many names as went in");
    names.sort();
    names.dedup();
    again.sort();
    assert_eq!(again, names, "{expression:?} written as {written:?}");
}

/// Any bytes as a (signed) WebAssembly binary: splitting at the signature section and reading
/// its payload never panic nor take more than the input holds; what reads re-encodes into a
/// section that reads back the same, and a binary assembled from the parts splits into them.
pub fn wasm_signature(data: &[u8]) {
    use ccfleet::wasm_signature::{MAX_HASHES, MAX_SIGNATURES, assemble, encode, parse, split};
    // Both as given and under a component header, so the fuzzer need not find the magic.
    let mut headed = ccfleet::wasm_signature::COMPONENT_HEADER.to_vec();
    headed.extend_from_slice(data);
    for binary in [data, &headed[..]] {
        let Ok(parts) = split(binary) else {
            continue;
        };
        assert!(parts.signed.len() <= binary.len() - 8);
        assert!(
            binary.ends_with(parts.signed),
            "the signed part is the binary's tail"
        );
        let Some(payload) = parts.signature else {
            assert_eq!(
                parts.signed,
                &binary[8..],
                "unsigned: everything is content"
            );
            continue;
        };
        let Ok(sets) = parse(payload) else {
            continue;
        };
        assert!(sets.len() <= MAX_HASHES);
        for set in &sets {
            assert!(set.hashes.len() <= MAX_HASHES);
            assert!(set.signatures.len() <= MAX_SIGNATURES);
            for signature in &set.signatures {
                assert!(signature.key_id.len() + signature.bytes.len() <= payload.len());
            }
        }
        let again = encode(&sets).expect("what was read fits the format");
        assert!(
            again.len() <= payload.len(),
            "the shortest form is no longer"
        );
        assert_eq!(parse(&again).expect("re-encoded reads"), sets);
        let rebuilt = assemble(parts.header, &again, parts.signed).expect("assembles");
        let back = split(&rebuilt).expect("an assembled binary splits");
        assert_eq!(back.signature, Some(&again[..]));
        assert_eq!(back.signed, parts.signed);
    }
}
