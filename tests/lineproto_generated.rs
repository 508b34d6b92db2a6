//! Generated line protocol against the codec's own spec: lines built from a model (with
//! every escape, number syntax, spacing and line ending the grammar allows) decode to that
//! model, and the same lines with a few bytes changed decode without panicking, in line
//! order.
//!
//! The generator also writes the input of a differential run against another decoder
//! (`LP_DIFF_DIR=dir cargo test --test lineproto_generated -- --ignored`): `input.bin`
//! holds chunks, each `<length>\n<bytes>`, every chunk decoded on its own (an unclosed string
//! would otherwise swallow everything after it); `ccfleet.out` holds ccfleet's answer, per
//! chunk a `C <index>` line and then one line per point or error:
//! `P <name> T<key>=<value>... F<key>=<type><value>... @<time>` or `E <line>:<column>`, with
//! names, keys and string values as lowercase hex of their unescaped bytes, floats as `f`
//! and the hex of their bits, `i`/`u`/`b`/`s` for the other types, and a default time of 42.

use ccfleet::lineproto::{Decoder, DecoderOptions, FieldValue, Precision};

/// xorshift64*: deterministic and dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    Float(f64),
    Int(i64),
    Uint(u64),
    Bool(bool),
    Str(String),
}

#[derive(Debug, Clone, PartialEq)]
struct Model {
    measurement: String,
    tags: Vec<(String, String)>,
    fields: Vec<(String, Value)>,
    time: Option<i64>,
}

/// Characters names and keys are made of: the delimiters, a backslash, `#`, quotes and
/// multi-byte UTF-8, next to plain letters.
const NAME_CHARS: &[&str] = &[
    "a", "b", "z", "0", "_", "-", ".", " ", ",", "=", "\\", "\"", "#", "é", "€", "😀", "x",
];

fn name(rng: &mut Rng) -> String {
    let len = 1 + rng.below(6);
    let mut s = String::new();
    for _ in 0..len {
        let piece: &&str = rng.pick(NAME_CHARS);
        s.push_str(piece);
    }
    // A trailing backslash cannot be written (it would escape the delimiter after it).
    while s.ends_with('\\') {
        s.pop();
        s.push('q');
    }
    s
}

/// Escapes as the Go encoder does: a backslash before each byte of `specials`.
fn escape(s: &str, specials: &[u8], out: &mut Vec<u8>) {
    for &b in s.as_bytes() {
        if specials.contains(&b) {
            out.push(b'\\');
        }
        out.push(b);
    }
}

/// A float and one of the ways Go's syntax can spell it.
fn float(rng: &mut Rng) -> (f64, String) {
    let v = match rng.below(5) {
        0 => rng.below(1000) as f64,
        1 => (rng.next() as i64 as f64) / (1u64 << rng.below(60)) as f64,
        2 => f64::from_bits(rng.next() & !(0x7ff << 52) | ((rng.below(2046) as u64 + 1) << 52)),
        3 => *rng.pick(&[0.25, -3.0, 1e10, 0.1, 5e-324, f64::MAX, f64::MIN_POSITIVE]),
        _ => -(rng.below(100_000) as f64) / 1000.0,
    };
    let text = match rng.below(6) {
        0 => format!("{v:e}"),
        1 => format!("{v:E}"),
        2 if v.fract() == 0.0 && v.abs() < 1e15 => {
            // Digit separators, as Go allows.
            let digits = format!("{}", v.abs() as u64);
            let mut s = String::from(if v < 0.0 { "-" } else { "" });
            for (i, c) in digits.chars().enumerate() {
                if i > 0 && (digits.len() - i) % 3 == 0 {
                    s.push('_');
                }
                s.push(c);
            }
            s
        }
        3 if v != 0.0 && v.is_normal() => {
            // Hexadecimal mantissa and binary exponent.
            let bits = v.to_bits();
            let exponent = ((bits >> 52) & 0x7ff) as i64 - 1023;
            let sign = if v < 0.0 { "-" } else { "" };
            format!("{sign}0x1.{:013x}p{exponent}", bits & ((1 << 52) - 1))
        }
        _ => format!("{v}"),
    };
    (v, text)
}

fn value(rng: &mut Rng) -> (Value, String) {
    match rng.below(5) {
        0 => {
            let (v, text) = float(rng);
            (Value::Float(v), text)
        }
        1 => {
            let v = match rng.below(3) {
                0 => rng.below(100) as i64,
                1 => rng.next() as i64,
                _ => *rng.pick(&[i64::MIN, i64::MAX, -1, 0]),
            };
            (Value::Int(v), format!("{v}i"))
        }
        2 => {
            let v = if rng.chance(50) {
                rng.next()
            } else {
                rng.below(10) as u64
            };
            (Value::Uint(v), format!("{v}u"))
        }
        3 => {
            let v = rng.chance(50);
            let spellings: &[&str] = if v {
                &["t", "T", "true", "True", "TRUE"]
            } else {
                &["f", "F", "false", "False", "FALSE"]
            };
            (Value::Bool(v), (*rng.pick(spellings)).to_owned())
        }
        _ => {
            let mut s = String::new();
            let mut text = String::from("\"");
            for _ in 0..rng.below(12) {
                let piece = *rng.pick(&[
                    "a",
                    " ",
                    ",",
                    "=",
                    "\\",
                    "\"",
                    "\n",
                    "\r",
                    "\t",
                    "é",
                    "\u{1}",
                    "{\"k\":1}",
                ]);
                s.push_str(piece);
                for c in piece.chars() {
                    match c {
                        '\\' => text.push_str("\\\\"),
                        '"' => text.push_str("\\\""),
                        '\n' if rng.chance(50) => text.push_str("\\n"),
                        '\t' if rng.chance(50) => text.push_str("\\t"),
                        '\r' => text.push_str("\\r"),
                        c => text.push(c),
                    }
                }
            }
            text.push('"');
            (Value::Str(s), text)
        }
    }
}

/// One valid line and the point it stands for; comments and blank lines come before some.
fn line(rng: &mut Rng) -> (Vec<u8>, Model) {
    let mut out = Vec::new();
    if rng.chance(5) {
        out.extend_from_slice(b"# a comment, \xc3\xa9\n");
    }
    if rng.chance(5) {
        out.extend_from_slice(if rng.chance(50) { b"\n" } else { b"  \r\n" });
    }
    out.extend(std::iter::repeat_n(
        b' ',
        rng.below(3) * usize::from(rng.chance(10)),
    ));
    let mut measurement = name(rng);
    if measurement.starts_with('#') {
        measurement.insert(0, 'm');
    }
    escape(&measurement, b", ", &mut out);
    let mut model = Model {
        measurement,
        tags: Vec::new(),
        fields: Vec::new(),
        time: None,
    };
    for _ in 0..rng.below(4) {
        let (k, v) = (name(rng), name(rng));
        out.push(b',');
        escape(&k, b",= ", &mut out);
        out.push(b'=');
        escape(&v, b",= ", &mut out);
        model.tags.push((k, v));
    }
    out.extend(std::iter::repeat_n(b' ', 1 + rng.below(2)));
    for i in 0..1 + rng.below(4) {
        if i > 0 {
            out.push(b',');
        }
        let k = name(rng);
        escape(&k, b",= ", &mut out);
        out.push(b'=');
        let (v, text) = value(rng);
        out.extend_from_slice(text.as_bytes());
        model.fields.push((k, v));
    }
    if rng.chance(70) {
        let t = match rng.below(3) {
            0 => rng.next() as i64,
            1 => -(rng.below(1000) as i64),
            _ => 1_734_000_000_000_000_000 + rng.below(1000) as i64,
        };
        out.extend(std::iter::repeat_n(b' ', 1 + rng.below(2)));
        out.extend_from_slice(t.to_string().as_bytes());
        model.time = Some(t);
    }
    out.extend(std::iter::repeat_n(b' ', usize::from(rng.chance(10))));
    out.extend_from_slice(if rng.chance(20) { b"\r\n" } else { b"\n" });
    (out, model)
}

/// Bytes that matter to the grammar, for mutations.
const MUTATIONS: &[u8] = b"\"\\ ,=\n\r\t#\x00\x7f\xff\x80\xc3-._exXpPiutT0123456789";

fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(3) {
        let at = rng.below(bytes.len() + 1);
        let b = *rng.pick(MUTATIONS);
        match rng.below(3) {
            0 if at < bytes.len() => bytes[at] = b,
            1 if at < bytes.len() => {
                bytes.remove(at);
            }
            _ => bytes.insert(at, b),
        }
    }
}

/// A line whose field value is a random string of number characters: Go's float, int and
/// uint syntax at its edges.
fn number_line(rng: &mut Rng) -> Vec<u8> {
    const CHARS: &[u8] = b"0123456789._-+eEpPxXabcdfiu";
    let mut out = b"m f=".to_vec();
    out.push(*rng.pick(b"-.0123456789"));
    for _ in 0..rng.below(10) {
        out.push(*rng.pick(CHARS));
    }
    out.push(b'\n');
    out
}

/// One chunk of the differential input: a few lines, valid, mutated or numeric.
fn chunk(rng: &mut Rng) -> (Vec<u8>, usize) {
    let mut out = Vec::new();
    let lines = 1 + rng.below(4);
    for _ in 0..lines {
        match rng.below(10) {
            0..=3 => out.extend(line(rng).0),
            4..=5 => out.extend(number_line(rng)),
            _ => {
                let mut bytes = line(rng).0;
                mutate(rng, &mut bytes);
                out.extend(bytes);
            }
        }
    }
    if rng.chance(10) {
        // No line ending at the very end of the input.
        while out.last().is_some_and(|b| matches!(b, b'\n' | b'\r')) {
            out.pop();
        }
    }
    (out, lines)
}

fn options() -> DecoderOptions {
    DecoderOptions {
        precision: Precision::Nanosecond,
        default_time: Some(42),
        ..DecoderOptions::default()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// ccfleet's answer for one chunk, in the canonical form described at the top.
fn canonical(input: &[u8], out: &mut String) {
    use std::fmt::Write;
    let mut scratch = String::new();
    for item in Decoder::with_options(input, options()) {
        match item {
            Err(e) => writeln!(out, "E {}:{}", e.line, e.column).unwrap(),
            Ok(line) => {
                out.push_str("P ");
                out.push_str(&hex(line.measurement().unescape().as_bytes()));
                for (k, v) in line.tags() {
                    let k = hex(k.unescape().as_bytes());
                    write!(out, " T{k}={}", hex(v.unescape().as_bytes())).unwrap();
                }
                for (k, v) in line.fields() {
                    write!(out, " F{}=", hex(k.unescape().as_bytes())).unwrap();
                    match v {
                        FieldValue::Float(v) => write!(out, "f{:x}", v.to_bits()),
                        FieldValue::Int(v) => write!(out, "i{v}"),
                        FieldValue::Uint(v) => write!(out, "u{v}"),
                        FieldValue::Bool(v) => write!(out, "b{v}"),
                        FieldValue::String(t) => {
                            write!(out, "s{}", hex(t.unescape_with(&mut scratch).as_bytes()))
                        }
                    }
                    .unwrap();
                }
                writeln!(out, " @{}", line.time_or_default().unwrap()).unwrap();
            }
        }
    }
}

#[test]
fn generated_lines_decode_to_the_points_they_were_generated_from() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20_000 {
        let (bytes, model) = line(&mut rng);
        let decoded: Vec<_> = Decoder::with_options(&bytes, options()).collect();
        let text = bytes.escape_ascii().to_string();
        assert_eq!(decoded.len(), 1, "{text}: {decoded:?}");
        let line = decoded[0]
            .as_ref()
            .unwrap_or_else(|e| panic!("{text}: {e}"));
        let got = Model {
            measurement: line.measurement().unescape().into_owned(),
            tags: line
                .tags()
                .map(|(k, v)| (k.unescape().into_owned(), v.unescape().into_owned()))
                .collect(),
            fields: line
                .fields()
                .map(|(k, v)| {
                    let v = match v {
                        FieldValue::Float(v) => Value::Float(v),
                        FieldValue::Int(v) => Value::Int(v),
                        FieldValue::Uint(v) => Value::Uint(v),
                        FieldValue::Bool(v) => Value::Bool(v),
                        FieldValue::String(t) => Value::Str(t.unescape().into_owned()),
                    };
                    (k.unescape().into_owned(), v)
                })
                .collect(),
            time: line.time(),
        };
        assert_eq!(got, model, "{text}");
    }
}

#[test]
fn mutated_lines_decode_without_panic_and_in_line_order() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut out = String::new();
    for _ in 0..20_000 {
        let (bytes, _) = chunk(&mut rng);
        let mut last = 0;
        for item in Decoder::with_options(&bytes, options()) {
            let line = match item {
                Ok(line) => line.line_number(),
                Err(e) => e.line,
            };
            assert!(line >= last, "{}", bytes.escape_ascii());
            last = line;
        }
        out.clear();
        canonical(&bytes, &mut out);
    }
}

#[test]
#[ignore = "writes the input of a differential run; needs LP_DIFF_DIR"]
fn write_a_differential_run() {
    use std::io::Write;
    let dir = std::path::PathBuf::from(std::env::var("LP_DIFF_DIR").expect("LP_DIFF_DIR"));
    let chunks: usize = std::env::var("LP_DIFF_CHUNKS").map_or(400_000, |n| n.parse().unwrap());
    let mut input = std::io::BufWriter::new(std::fs::File::create(dir.join("input.bin")).unwrap());
    let mut answer =
        std::io::BufWriter::new(std::fs::File::create(dir.join("ccfleet.out")).unwrap());
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let (mut lines, mut text) = (0, String::new());
    for index in 0..chunks {
        let (bytes, n) = chunk(&mut rng);
        lines += n;
        writeln!(input, "{}", bytes.len()).unwrap();
        input.write_all(&bytes).unwrap();
        text.clear();
        canonical(&bytes, &mut text);
        write!(answer, "C {index}\n{text}").unwrap();
    }
    println!("{chunks} chunks, {lines} generated lines");
}
