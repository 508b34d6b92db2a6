use super::error::{DecodeError, DecodeErrorKind};
use super::precision::Precision;
use super::simd::{self, StopWindow};
use super::table::{FIELD_VALUE_STOP, KEY_STOP, MEASUREMENT_STOP, is_non_printable};
use super::token::{Token, TokenKind};
use super::value::{self, FieldValue};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

/// The default longest line a [`Decoder`] accepts: 1 MiB, the default NATS `max_payload`.
pub const DEFAULT_MAX_LINE_LEN: usize = 1 << 20;

/// How a [`Decoder`] reads timestamps and how long a line may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderOptions {
    /// The unit of the timestamps in the input.
    pub precision: Precision,
    /// The time (Unix nanoseconds) of lines without a timestamp, truncated to the precision;
    /// `None` leaves such lines without a time.
    pub default_time: Option<i64>,
    /// Lines longer than this many bytes are reported as errors.
    pub max_line_len: usize,
}

impl Default for DecoderOptions {
    fn default() -> Self {
        DecoderOptions {
            precision: Precision::Nanosecond,
            default_time: None,
            max_line_len: DEFAULT_MAX_LINE_LEN,
        }
    }
}

/// Decodes line protocol from a byte buffer, one [`Line`] (or error) per point.
///
/// A bad line yields a [`DecodeError`] with its line and column, and the iterator goes on
/// with the following line (a string field can span lines: after an error the decoder skips
/// to the end of the line it had read to, as the Go decoder does). Blank lines and `#`
/// comments are skipped.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    cursor: Cursor<'a>,
    /// Where the fields past the first [`KNOWN`] of a line are kept while it is validated
    /// (see [`MoreFields`]). Apart from the cursor so that the validating pass can write it
    /// while reading the cursor.
    more_fields: Vec<KnownField>,
}

/// The decoder's input and where it stands in it.
#[derive(Debug, Clone)]
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    line_no: usize,
    precision: Precision,
    default_time: Option<i64>,
    max_line_len: usize,
}

/// One decoded point: views into the input, already validated.
#[derive(Clone, Copy)]
pub struct Line<'a> {
    raw: &'a [u8],
    measurement: Token<'a>,
    tags: &'a [u8],
    fields: &'a [u8],
    time: Option<i64>,
    default_time: Option<i64>,
    number: usize,
    known_tags: KnownTags,
    known_fields: KnownFields,
    /// Which [`MoreFields`] table holds the fields past the first [`KNOWN`]; 0 for none.
    more_fields: u64,
}

/// How many tags, and how many fields, of a line the `Line` keeps what the decoder found
/// while validating them: enough for fleet messages and most metric lines. Tags past these
/// are scanned again when read; fields past these are kept in [`MoreFields`].
const KNOWN: usize = 4;

/// Where the first tags of a line end, found while validating it, so that reading them
/// scans nothing again. Offsets count from the start of the tag section (its first comma).
#[derive(Debug, Clone, Copy, Default)]
struct KnownTags {
    /// How many tags are known (a prefix of the line's tags).
    count: u8,
    /// Bit `2k`: the key of tag `k` holds a backslash; bit `2k + 1`: its value does.
    escaped: u8,
    key_end: [u32; KNOWN],
    value_end: [u32; KNOWN],
}

/// The first fields of a line, found and parsed while validating it, so that reading them
/// neither scans nor parses them again. Offsets count from the start of the field section.
#[derive(Debug, Clone, Copy, Default)]
struct KnownFields {
    /// How many fields are known (a prefix of the line's fields).
    count: u8,
    /// The value's type (`SLOT_*`), and [`KEY_ESCAPED`] when the key holds a backslash.
    kind: [u8; KNOWN],
    key_end: [u32; KNOWN],
    /// Just past the value (past the closing quote of a string).
    value_end: [u32; KNOWN],
    /// The number's bits, or the boolean.
    bits: [u64; KNOWN],
}

/// The fields of the line decoded last on this thread past its first [`KNOWN`], as its
/// validation found and parsed them, so that reading them scans and parses nothing again
/// (half the time of reading a line of 52 fields).
///
/// A cache, not a store: `generation` names the line it holds (a number unique in the
/// process, which the [`Line`] keeps), and a line that does not find its own generation here
/// (another line with many fields was decoded since, or it moved to another thread) reads
/// its fields by scanning the section again. A `Line` stays `Copy` and small: owning the
/// table (an `Arc`) gave it drop glue, and the caller's loop then copied every returned line
/// through `memcpy`, which cost heartbeats a tenth of their time.
struct MoreFields {
    generation: u64,
    fields: Vec<KnownField>,
    /// The storage of the table before, for the next line's fields: a decoder keeps none
    /// between lines, so that a decoder per message allocates nothing in steady state
    /// either.
    spare: Vec<KnownField>,
}

thread_local! {
    static MORE_FIELDS: RefCell<MoreFields> = const {
        RefCell::new(MoreFields {
            generation: 0,
            fields: Vec::new(),
            spare: Vec::new(),
        })
    };
}

/// The last generation handed to a [`MoreFields`] table; 0 is no table.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Makes `fields` (taking them, and leaving the previous table's storage as the spare, so
/// no line allocates in steady state) this thread's [`MoreFields`]; returns their
/// generation, or 0 when the thread's table cannot be used (while the thread ends).
#[inline(never)]
fn publish_more_fields(fields: &mut Vec<KnownField>) -> u64 {
    let generation = GENERATION.fetch_add(1, Ordering::Relaxed) + 1;
    MORE_FIELDS
        .try_with(|table| {
            let Ok(mut table) = table.try_borrow_mut() else {
                return 0;
            };
            let previous = std::mem::replace(&mut table.fields, std::mem::take(fields));
            if previous.capacity() > table.spare.capacity() {
                table.spare = previous;
            }
            table.generation = generation;
            generation
        })
        .unwrap_or(0)
}

/// Storage for the fields of a line past the first [`KNOWN`]: what this thread's table
/// held before the line decoded last.
#[cold]
#[inline(never)]
fn spare_more_fields() -> Vec<KnownField> {
    MORE_FIELDS
        .try_with(|table| {
            table
                .try_borrow_mut()
                .map(|mut table| {
                    // Emptied: it holds the fields of a line decoded earlier.
                    let mut spare = std::mem::take(&mut table.spare);
                    spare.clear();
                    spare
                })
                .unwrap_or_default()
        })
        .unwrap_or_default()
}

/// Field `index` (counting from the first past [`KNOWN`]) of the line of `generation`, if
/// this thread's [`MoreFields`] still holds that line.
#[inline]
fn more_field(generation: u64, index: usize) -> Option<KnownField> {
    MORE_FIELDS
        .try_with(|table| {
            let table = table.try_borrow().ok()?;
            if table.generation != generation {
                return None;
            }
            table.fields.get(index).copied()
        })
        .ok()
        .flatten()
}

/// One field past the first [`KNOWN`]: as [`KnownFields`] keeps its fields, in one record.
#[derive(Debug, Clone, Copy)]
struct KnownField {
    key_end: u32,
    value_end: u32,
    /// The value's type (`SLOT_*`), and [`KEY_ESCAPED`] when the key holds a backslash.
    kind: u8,
    bits: u64,
}

const SLOT_FLOAT: u8 = 0;
const SLOT_INT: u8 = 1;
const SLOT_UINT: u8 = 2;
const SLOT_BOOL: u8 = 3;
const SLOT_STRING: u8 = 4;
const SLOT_ESCAPED_STRING: u8 = 5;
const KEY_ESCAPED: u8 = 0x80;

/// A parsed value as a known field keeps it: type and bits (strings are read from the
/// input).
#[inline(always)]
fn slot(value: FieldValue<'_>) -> (u8, u64) {
    match value {
        FieldValue::Float(v) => (SLOT_FLOAT, v.to_bits()),
        FieldValue::Int(v) => (SLOT_INT, v as u64),
        FieldValue::Uint(v) => (SLOT_UINT, v),
        FieldValue::Bool(v) => (SLOT_BOOL, u64::from(v)),
        FieldValue::String(t) => (
            if t.has_escapes() {
                SLOT_ESCAPED_STRING
            } else {
                SLOT_STRING
            },
            0,
        ),
    }
}

impl KnownFields {
    /// Keeps a validated field whose key ends at `key_end` and value at `value_end`
    /// (offsets in the field section), if there is room.
    #[inline(always)]
    fn record(&mut self, key_end: usize, value_end: usize, kind: u8, bits: u64) {
        let k = usize::from(self.count);
        if k < KNOWN {
            self.kind[k] = kind;
            self.key_end[k] = key_end as u32;
            self.value_end[k] = value_end as u32;
            self.bits[k] = bits;
            self.count += 1;
        }
    }
}

/// Why a line failed, and where decoding picks up again: the Go decoder reports the first
/// error of a line and then skips from wherever its reading had got to (which may be past
/// the error, e.g. after a whole string token) to the end of that line.
#[derive(Debug, Clone)]
struct Failure {
    /// Where the error is reported.
    at: usize,
    kind: DecodeErrorKind,
    /// How far the line had been read.
    resume: usize,
    /// Whether the rest of the line from `resume` is skipped (`false` when the line end
    /// was already read).
    skip_line: bool,
}

impl Failure {
    /// An error at `at`, with the line read up to `resume`.
    #[inline]
    fn new(at: usize, kind: DecodeErrorKind, resume: usize) -> Self {
        Failure {
            at,
            kind,
            resume,
            skip_line: true,
        }
    }

    /// An error reported after the end of its line was read.
    #[inline]
    fn after_line(at: usize, kind: DecodeErrorKind, resume: usize) -> Self {
        Failure {
            at,
            kind,
            resume,
            skip_line: false,
        }
    }
}

/// What a byte that cannot continue a token is called in an error.
#[inline]
fn odd_byte(b: u8, otherwise: DecodeErrorKind) -> DecodeErrorKind {
    match b {
        b'\n' | b'\r' => otherwise,
        b if is_non_printable(b) => DecodeErrorKind::NonPrintable(b),
        _ => otherwise,
    }
}

/// Space, CR and LF: what may follow a field value.
#[inline]
fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\r' | b'\n')
}

impl<'a> Decoder<'a> {
    /// A decoder over `buf` with nanosecond timestamps, no default time and the default
    /// line limit.
    pub fn new(buf: &'a [u8]) -> Self {
        Self::with_options(buf, DecoderOptions::default())
    }

    /// A decoder over `buf` with the given options.
    pub fn with_options(buf: &'a [u8], options: DecoderOptions) -> Self {
        Decoder {
            cursor: Cursor {
                buf,
                pos: 0,
                line_no: 1,
                precision: options.precision,
                default_time: options.default_time.map(|t| options.precision.truncate(t)),
                max_line_len: options.max_line_len,
            },
            more_fields: Vec::new(),
        }
    }

    /// The 1-based number of the line the decoder will read next.
    pub fn line_number(&self) -> usize {
        self.cursor.line_no
    }

    /// The byte offset in the input where the next line starts.
    pub fn position(&self) -> usize {
        self.cursor.pos
    }

    /// Continues decoding `buf` at byte `pos`, which starts line `line_no`: lets a caller
    /// with its own fast path for common lines hand the odd ones to the full decoder.
    pub fn resume_at(buf: &'a [u8], pos: usize, line_no: usize, options: DecoderOptions) -> Self {
        let mut decoder = Self::with_options(buf, options);
        decoder.cursor.pos = pos.min(buf.len());
        decoder.cursor.line_no = line_no;
        decoder
    }
}

impl<'a> Iterator for Decoder<'a> {
    type Item = Result<Line<'a>, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.cursor.next_line(&mut self.more_fields)
    }
}

impl<'a> Cursor<'a> {
    /// Builds the error for a line that starts at `start` (columns count from there) and
    /// moves on to where decoding resumes.
    #[cold]
    fn fail(&mut self, start: usize, failure: Failure) -> DecodeError {
        let buf = self.buf;
        let at = failure.at.min(buf.len());
        // A failure may lie before `start` (inside the line's leading spaces, where the Go
        // decoder reads a line again from): count from the earlier of the two.
        let start = start.min(at);
        let before = &buf[start..at];
        let column_base = memchr::memrchr(b'\n', before).map_or(start, |i| start + i + 1);
        let error = DecodeError {
            line: self.line_no + memchr::memchr_iter(b'\n', before).count(),
            column: at - column_base + 1,
            kind: failure.kind,
        };
        let resume = failure.resume.clamp(at, buf.len());
        let next = if failure.skip_line {
            memchr::memchr(b'\n', &buf[resume..]).map_or(buf.len(), |i| resume + i + 1)
        } else {
            resume
        };
        self.line_no += memchr::memchr_iter(b'\n', &buf[start..next]).count();
        self.pos = next;
        error
    }

    /// Where the line continues if a line ending (or the end of the input) is at `i`.
    #[inline]
    fn line_end(&self, i: usize) -> Option<usize> {
        let buf = self.buf;
        match buf.get(i) {
            None => Some(i),
            Some(b'\n') => Some(i + 1),
            Some(b'\r') => match buf.get(i + 1) {
                // A trailing CR at the very end of the input ends the line too.
                None => Some(i + 1),
                Some(b'\n') => Some(i + 2),
                Some(_) => None,
            },
            Some(_) => None,
        }
    }

    #[inline]
    fn skip_spaces(&self, mut i: usize) -> usize {
        while self.buf.get(i) == Some(&b' ') {
            i += 1;
        }
        i
    }

    /// Scans a comment starting at the `#` at `i`; returns where the next line starts. Only
    /// printable bytes may follow the `#` (a tab may not).
    fn comment(&self, i: usize) -> Result<usize, Failure> {
        let buf = self.buf;
        let mut end = i + 1;
        while end < buf.len() && !is_non_printable(buf[end]) {
            end += 1;
        }
        self.line_end(end)
            .ok_or_else(|| Failure::new(i, DecodeErrorKind::InvalidComment, i))
    }

    /// Validates the UTF-8 of a token that contains a byte above 0x7f.
    #[cold]
    fn check_utf8(&self, start: usize, end: usize) -> Result<(), Failure> {
        std::str::from_utf8(&self.buf[start..end])
            .map(|_| ())
            .map_err(|_| Failure::new(start, DecodeErrorKind::InvalidUtf8, end))
    }

    /// Parses the point starting at `start` (after leading spaces) section by section, in
    /// the order and with the recovery of the Go decoder; returns it, where the next line
    /// starts and how many newlines its string fields held.
    /// Fields past the first [`KNOWN`] are kept in `more_fields` (see [`MoreFields`]).
    #[inline]
    fn point(
        &self,
        line_start: usize,
        start: usize,
        more_fields: &mut Vec<KnownField>,
    ) -> Result<(Line<'a>, usize, usize), Failure> {
        let buf = self.buf;
        let mut i = start;
        let mut window = StopWindow::new();

        // Measurement.
        let (m_end, m_escaped, m_high) = scan_token(&mut window, buf, i, &MEASUREMENT_STOP, b" ,");
        if m_high {
            self.check_utf8(start, m_end)?;
        }
        if m_end == start {
            let kind = match buf.get(start) {
                None => DecodeErrorKind::EmptyMeasurement,
                Some(&b) => odd_byte(b, DecodeErrorKind::UnexpectedCharacter(b)),
            };
            return Err(Failure::new(start, kind, start));
        }
        i = m_end;
        let tags_start = i;
        i = self.tag_comma(i)?;
        // Known tags and fields are kept as u32 offsets.
        let offsets_fit = buf.len() - start <= u32::MAX as usize;
        let mut known_tags = KnownTags::default();

        // Tags, until a space starts the fields.
        loop {
            if buf.get(i) == Some(&b' ') {
                break;
            }
            let k_start = i;
            let (k_end, k_escaped, k_high) = scan_token(&mut window, buf, i, &KEY_STOP, b",= ");
            if k_high {
                self.check_utf8(k_start, k_end)?;
            }
            i = k_end;
            match buf.get(i) {
                Some(b'=') if k_end > k_start => {}
                next => {
                    let kind = match (k_end > k_start, next) {
                        (false, None) => DecodeErrorKind::NoFields,
                        (true, _) => DecodeErrorKind::ExpectedTagEquals,
                        (false, Some(b'=')) => DecodeErrorKind::EmptyTagKey,
                        (false, Some(&b)) => odd_byte(b, DecodeErrorKind::NoFields),
                    };
                    return Err(Failure::new(k_start, kind, i));
                }
            }
            i += 1;
            let v_start = i;
            let (v_end, v_escaped, v_high) = scan_token(&mut window, buf, i, &KEY_STOP, b",= ");
            if v_high {
                self.check_utf8(v_start, v_end)?;
            }
            i = v_end;
            if v_end == v_start {
                return Err(Failure::new(v_start, DecodeErrorKind::EmptyTagValue, i));
            }
            let k = usize::from(known_tags.count);
            if k < KNOWN && offsets_fit {
                known_tags.key_end[k] = (k_end - tags_start) as u32;
                known_tags.value_end[k] = (v_end - tags_start) as u32;
                known_tags.escaped |= (u8::from(k_escaped) | u8::from(v_escaped) << 1) << (2 * k);
                known_tags.count += 1;
            }
            if i >= buf.len() {
                break;
            }
            i = self.tag_comma(i)?;
        }
        let tags_end = i;
        i = self.skip_spaces(i);

        // Fields, then the timestamp or the line end.
        let fields_start = i;
        let mut newlines = 0;
        let mut known_fields = KnownFields::default();
        // Emptied for every line rather than at a fifth field: a flag saying whether it was
        // would be carried through the field loop, which cost short lines a few percent.
        more_fields.clear();
        let mut time_start = None;
        let fields_end;
        let mut next = 0;
        loop {
            let k_start = i;
            let (k_end, k_escaped, k_high) = scan_token(&mut window, buf, i, &KEY_STOP, b",= ");
            if k_high {
                self.check_utf8(k_start, k_end)?;
            }
            i = k_end;
            if k_end == k_start {
                let kind = match buf.get(i) {
                    Some(&b) => odd_byte(b, DecodeErrorKind::EmptyFieldKey),
                    None => DecodeErrorKind::EmptyFieldKey,
                };
                return Err(Failure::new(k_start, kind, i));
            }
            match buf.get(i) {
                Some(b'=') => i += 1,
                Some(&b) => {
                    let kind = odd_byte(b, DecodeErrorKind::ExpectedFieldEquals);
                    return Err(Failure::new(i, kind, i));
                }
                None => return Err(Failure::new(i, DecodeErrorKind::ExpectedFieldEquals, i)),
            }
            let v_start = i;
            let value_ok = match buf.get(i) {
                None => return Err(Failure::new(i, DecodeErrorKind::EmptyFieldValue, i)),
                Some(b'"') => {
                    let body = i + 1;
                    let simd::StringScan {
                        close: end,
                        escaped,
                        newlines: lines,
                        high,
                    } = simd::scan_string(buf, body);
                    if high {
                        self.check_utf8(body, end)?;
                    }
                    if end >= buf.len() {
                        return Err(Failure::new(i, DecodeErrorKind::UnterminatedString, end));
                    }
                    newlines += lines;
                    i = end + 1;
                    let kind = if escaped {
                        SLOT_ESCAPED_STRING
                    } else {
                        SLOT_STRING
                    };
                    Ok((kind, 0))
                }
                Some(b'-' | b'.' | b'0'..=b'9')
                    if let Some((end, value)) = value::parse_plain_number(buf, i) =>
                {
                    i = end;
                    Ok(slot(value))
                }
                Some(b't' | b'T' | b'f' | b'F' | b'-' | b'.' | b'0'..=b'9') => {
                    while i < buf.len() && !FIELD_VALUE_STOP[buf[i] as usize] {
                        i += 1;
                    }
                    value::parse_unquoted_in(buf, v_start, i).map(slot)
                }
                Some(b' ' | b',') => {
                    return Err(Failure::new(i, DecodeErrorKind::EmptyFieldValue, i));
                }
                Some(_) => {
                    while i < buf.len() && !FIELD_VALUE_STOP[buf[i] as usize] {
                        i += 1;
                    }
                    return Err(Failure::new(v_start, DecodeErrorKind::InvalidFieldValue, i));
                }
            };
            // What follows the value is read before the value is judged.
            let v_end = i;
            // A macro: its uses return early through `?`.
            macro_rules! keep {
                ($value:expr) => {{
                    let (kind, bits) = $value;
                    if offsets_fit {
                        let key_kind = if k_escaped { kind | KEY_ESCAPED } else { kind };
                        let (key_end, value_end) = (k_end - fields_start, v_end - fields_start);
                        if usize::from(known_fields.count) < KNOWN {
                            known_fields.record(key_end, value_end, key_kind, bits);
                        } else {
                            if more_fields.capacity() == 0 {
                                *more_fields = spare_more_fields();
                            }
                            more_fields.push(KnownField {
                                key_end: key_end as u32,
                                value_end: value_end as u32,
                                kind: key_kind,
                                bits,
                            });
                        }
                    }
                }};
            }
            match buf.get(i) {
                None => {
                    keep!(value_ok.map_err(|kind| Failure::after_line(v_start, kind, i))?);
                    fields_end = i;
                    next = i;
                    break;
                }
                Some(b',') => {
                    i += 1;
                    keep!(value_ok.map_err(|kind| Failure::new(v_start, kind, i))?);
                }
                Some(&b) if is_whitespace(b) => {
                    fields_end = i;
                    i = self.skip_spaces(i);
                    if let Some(end) = self.line_end(i) {
                        keep!(value_ok.map_err(|kind| Failure::after_line(v_start, kind, end))?);
                        next = end;
                    } else {
                        keep!(value_ok.map_err(|kind| Failure::new(v_start, kind, i))?);
                        time_start = Some(i);
                    }
                    break;
                }
                Some(&b) => {
                    let kind = odd_byte(b, DecodeErrorKind::UnexpectedCharacter(b));
                    return Err(Failure::new(i, kind, i));
                }
            }
        }
        let mut content_end = fields_end;

        let mut time = None;
        if let Some(t_start) = time_start {
            i = t_start;
            // The value is built while the digits are found: whole words of digits first
            // (a nanosecond timestamp has 19), then bytes. Only a timestamp of plain digits
            // that fit a u64 unchecked (19) is built here; any other (a sign, more digits)
            // is parsed afterwards.
            let mut raw = 0u64;
            let mut words = 0;
            while words < 2 {
                let Some(word) = buf.get(i..i + 8) else {
                    break;
                };
                let word = u64::from_le_bytes(word.try_into().expect("eight bytes"));
                let n = value::digit_run(word);
                raw = raw * value::POW10_U64[n] + value::digits_value(word, n);
                i += n;
                if n < 8 {
                    break;
                }
                words += 1;
            }
            let mut plain = true;
            while i < buf.len() {
                match buf[i] {
                    b @ b'0'..=b'9' if plain && i - t_start < 19 => {
                        raw = raw * 10 + u64::from(b - b'0');
                    }
                    b'0'..=b'9' | b'-' => plain = false,
                    _ => break,
                }
                i += 1;
            }
            let t_end = i;
            // Without digits the line is as good as read: an error does not skip on.
            let failure = if t_end == t_start {
                Failure::after_line
            } else {
                Failure::new
            };
            match buf.get(i) {
                None => next = i,
                Some(&b) if !is_whitespace(b) => {
                    let eol = i + memchr::memchr2(b'\r', b'\n', &buf[i..]).unwrap_or(buf.len() - i);
                    return Err(failure(t_start, DecodeErrorKind::InvalidTimestamp, eol));
                }
                Some(_) => {
                    i = self.skip_spaces(i);
                    match self.line_end(i) {
                        Some(end) => next = end,
                        None => {
                            let b = buf[i];
                            let eol = i + memchr::memchr2(b'\r', b'\n', &buf[i..])
                                .unwrap_or(buf.len() - i);
                            let kind = odd_byte(b, DecodeErrorKind::UnexpectedCharacter(b));
                            return Err(failure(i, kind, eol));
                        }
                    }
                }
            }
            if t_end > t_start {
                let raw = if plain {
                    i64::try_from(raw).map_err(|_| DecodeErrorKind::OutOfRange)
                } else {
                    value::parse_int(&buf[t_start..t_end])
                };
                let raw = raw.map_err(|kind| {
                    let kind = match kind {
                        DecodeErrorKind::OutOfRange => DecodeErrorKind::TimestampOutOfRange,
                        _ => DecodeErrorKind::InvalidTimestamp,
                    };
                    Failure::after_line(t_start, kind, next)
                })?;
                let nanos = self.precision.to_nanos(raw).ok_or(Failure::after_line(
                    t_start,
                    DecodeErrorKind::TimestampOutOfRange,
                    next,
                ))?;
                time = Some(nanos);
                content_end = t_end;
            }
        }
        if content_end - line_start > self.max_line_len {
            return Err(Failure::after_line(
                line_start + self.max_line_len,
                DecodeErrorKind::LineTooLong {
                    limit: self.max_line_len,
                },
                next,
            ));
        }
        let line = Line {
            raw: &buf[line_start..content_end],
            measurement: Token::new(
                as_str(&buf[start..m_end]),
                m_escaped,
                TokenKind::Measurement,
            ),
            tags: &buf[tags_start..tags_end],
            fields: &buf[fields_start..fields_end],
            time,
            default_time: self.default_time,
            number: self.line_no,
            known_tags,
            known_fields,
            more_fields: if !more_fields.is_empty() {
                publish_more_fields(more_fields)
            } else {
                0
            },
        };
        Ok((line, next, newlines))
    }

    /// After a measurement or tag value: a comma must be followed by a tag key.
    #[inline]
    fn tag_comma(&self, i: usize) -> Result<usize, Failure> {
        if self.buf.get(i) != Some(&b',') {
            return Ok(i);
        }
        match self.buf.get(i + 1) {
            Some(&b) if !is_whitespace(b) => Ok(i + 1),
            _ => Err(Failure::new(i + 1, DecodeErrorKind::EmptyTagKey, i + 1)),
        }
    }
}

impl<'a> Cursor<'a> {
    /// The next line (or error), with fields past the first [`KNOWN`] kept in
    /// `more_fields`.
    #[inline(always)]
    fn next_line(
        &mut self,
        more_fields: &mut Vec<KnownField>,
    ) -> Option<Result<Line<'a>, DecodeError>> {
        let buf = self.buf;
        loop {
            if self.pos >= buf.len() {
                return None;
            }
            let line_start = self.pos;
            let i = self.skip_spaces(line_start);
            match buf.get(i) {
                None => {
                    self.pos = buf.len();
                    return None;
                }
                Some(b'\n' | b'\r') => match self.line_end(i) {
                    Some(next) => {
                        self.pos = next;
                        self.line_no += 1;
                    }
                    None => {
                        let failure =
                            Failure::new(i, DecodeErrorKind::UnexpectedCharacter(b'\r'), i);
                        return Some(Err(self.fail(i, failure)));
                    }
                },
                Some(b'#') => match self.comment(i) {
                    Ok(next) => {
                        self.pos = next;
                        self.line_no += 1;
                    }
                    // The Go decoder reads such a line again from its start.
                    Err(failure) => {
                        let failure = Failure {
                            at: line_start,
                            ..failure
                        };
                        return Some(Err(self.fail(line_start, failure)));
                    }
                },
                Some(_) => {
                    return Some(match self.point(line_start, i, more_fields) {
                        Ok((line, next, newlines)) => {
                            self.pos = next;
                            self.line_no += 1 + newlines;
                            Ok(line)
                        }
                        Err(failure) => Err(self.fail(i, failure)),
                    });
                }
            }
        }
    }
}

/// Scans a measurement or key token from `i` as the Go decoder does: up to the first stop
/// byte, where a backslash followed by one of `escapes` takes that byte into the token and
/// any other backslash is a literal one. Returns the end, whether the token holds a
/// backslash, and whether it holds a byte above 0x7f (its UTF-8 must then be checked).
#[inline]
fn scan_token(
    window: &mut StopWindow,
    buf: &[u8],
    mut i: usize,
    stop: &[bool; 256],
    escapes: &[u8],
) -> (usize, bool, bool) {
    let mut escaped = false;
    let mut high = false;
    let with_equals = stop[usize::from(b'=')];
    loop {
        i = window.skip(buf, i, with_equals);
        match buf.get(i) {
            Some(b'\\') => {
                escaped = true;
                match buf.get(i + 1) {
                    Some(next) if escapes.contains(next) => i += 2,
                    Some(_) => i += 1,
                    None => return (buf.len(), escaped, high),
                }
            }
            Some(&b) if b >= 0x80 => {
                high = true;
                i += 1;
            }
            _ => return (i, escaped, high),
        }
    }
}

/// The end of a key or tag value at `i` in a section the decoder validated, which ends at
/// the first `end` byte (`=` after a key, a comma or the section's end after a tag value)
/// unless a backslash comes first; then the token scanner takes over. Returns the end and
/// whether the token holds a backslash.
#[inline(always)]
fn validated_token_end(section: &[u8], i: usize, end: u8) -> (usize, bool) {
    let at = simd::find2(section, i, end, b'\\');
    if section.get(at) != Some(&b'\\') {
        return (at, false);
    }
    let (at, escaped, _) = scan_token(&mut StopWindow::new(), section, i, &KEY_STOP, b",= ");
    (at, escaped)
}

/// Views bytes of a validated line as text.
#[inline]
fn as_str(bytes: &[u8]) -> &str {
    debug_assert!(std::str::from_utf8(bytes).is_ok());
    // SAFETY: every line is checked to be valid UTF-8 before any `Line` is handed out, and
    // tokens are cut only next to ASCII delimiters, which are always character boundaries.
    unsafe { std::str::from_utf8_unchecked(bytes) }
}

impl<'a> Line<'a> {
    /// The measurement name.
    pub fn measurement(&self) -> Token<'a> {
        self.measurement
    }

    /// The tags in input order (the decoder neither sorts nor de-duplicates them).
    pub fn tags(&self) -> Tags<'a> {
        Tags {
            section: self.tags,
            pos: 0,
            index: 0,
            known: self.known_tags,
        }
    }

    /// The fields in input order; there is always at least one.
    pub fn fields(&self) -> Fields<'a> {
        Fields {
            section: self.fields,
            pos: 0,
            index: 0,
            known: self.known_fields,
            more: self.more_fields,
        }
    }

    /// The first tag with this (unescaped) key.
    pub fn tag(&self, key: &str) -> Option<Token<'a>> {
        self.tags()
            .find(|(k, _)| k.eq_unescaped(key))
            .map(|(_, v)| v)
    }

    /// The first field with this (unescaped) key.
    pub fn field(&self, key: &str) -> Option<FieldValue<'a>> {
        self.fields()
            .find(|(k, _)| k.eq_unescaped(key))
            .map(|(_, v)| v)
    }

    /// How many tags the line has (repeated keys counted each time).
    pub fn tag_count(&self) -> usize {
        let known = usize::from(self.known_tags.count);
        // Fewer than `KNOWN` kept is all of them, unless none could be kept (a buffer too
        // long for the kept offsets) while the section holds some.
        if known < KNOWN && (known > 0 || self.tags.is_empty()) {
            known
        } else {
            self.tags().count()
        }
    }

    /// How many fields the line has (at least one).
    pub fn field_count(&self) -> usize {
        let known = usize::from(self.known_fields.count);
        if known > 0 && known < KNOWN {
            known
        } else {
            self.fields().count()
        }
    }

    /// The line's own timestamp in Unix nanoseconds, if it has one.
    pub fn time(&self) -> Option<i64> {
        self.time
    }

    /// The timestamp, or the decoder's default time (truncated to its precision) when the
    /// line has none.
    pub fn time_or_default(&self) -> Option<i64> {
        self.time.or(self.default_time)
    }

    /// The 1-based number of the line in the input.
    pub fn line_number(&self) -> usize {
        self.number
    }

    /// The whole line as it stands in the input (without the line ending).
    pub fn raw(&self) -> &'a str {
        as_str(self.raw)
    }
}

impl std::fmt::Debug for Line<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Line")
            .field("measurement", &self.measurement)
            .field("tags", &self.tags().collect::<Vec<_>>())
            .field("fields", &self.fields().collect::<Vec<_>>())
            .field("time", &self.time)
            .finish()
    }
}

/// The tags of a [`Line`], as `(key, value)` tokens.
#[derive(Debug, Clone)]
pub struct Tags<'a> {
    /// The line's tag section: `(,key=value)*`, validated.
    section: &'a [u8],
    /// Where the next tag's comma is.
    pos: usize,
    /// How many tags were read.
    index: u8,
    known: KnownTags,
}

impl<'a> Iterator for Tags<'a> {
    type Item = (Token<'a>, Token<'a>);

    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        let section = self.section;
        let k = usize::from(self.index);
        if k < usize::from(self.known.count) {
            // Found by the decoder: nothing to scan.
            self.index += 1;
            let key_end = self.known.key_end[k] as usize;
            let value_end = self.known.value_end[k] as usize;
            let escaped = self.known.escaped >> (2 * k);
            let key = Token::new(
                as_str(&section[self.pos + 1..key_end]),
                escaped & 1 != 0,
                TokenKind::Key,
            );
            let value = Token::new(
                as_str(&section[key_end + 1..value_end]),
                escaped & 2 != 0,
                TokenKind::Key,
            );
            self.pos = value_end;
            return Some((key, value));
        }
        // Past the known tags, the section is scanned again.
        let rest = section.get(self.pos..)?.strip_prefix(b",")?;
        let (k_end, k_escaped) = validated_token_end(rest, 0, b'=');
        let (v_end, v_escaped) = validated_token_end(rest, k_end + 1, b',');
        let key = Token::new(as_str(&rest[..k_end]), k_escaped, TokenKind::Key);
        let value = Token::new(as_str(&rest[k_end + 1..v_end]), v_escaped, TokenKind::Key);
        self.pos += 1 + v_end;
        Some((key, value))
    }
}

/// The fields of a [`Line`], as `(key, value)`.
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    /// The line's field section: `key=value(,key=value)*`, validated.
    section: &'a [u8],
    /// Where the next field's key starts (past the end when there is none).
    pos: usize,
    /// How many fields were read (fewer than 2^32: past the known fields only lines whose
    /// offsets fit in a u32 are kept).
    index: u32,
    known: KnownFields,
    /// The generation of the [`MoreFields`] holding the line's fields past the known ones
    /// (0 for none).
    more: u64,
}

impl<'a> Fields<'a> {
    /// The field whose key ends at `key_end` and value at `value_end` (offsets in the
    /// section, the key starting at `self.pos`), as validation found and parsed it.
    #[inline(always)]
    fn kept(
        &mut self,
        key_end: usize,
        value_end: usize,
        kind: u8,
        bits: u64,
    ) -> (Token<'a>, FieldValue<'a>) {
        let section = self.section;
        self.index += 1;
        let key = Token::new(
            as_str(&section[self.pos..key_end]),
            kind & KEY_ESCAPED != 0,
            TokenKind::Key,
        );
        self.pos = value_end + 1;
        let value = match kind & !KEY_ESCAPED {
            SLOT_FLOAT => FieldValue::Float(f64::from_bits(bits)),
            SLOT_INT => FieldValue::Int(bits as i64),
            SLOT_UINT => FieldValue::Uint(bits),
            SLOT_BOOL => FieldValue::Bool(bits != 0),
            string => value::string_value(
                as_str(&section[key_end + 2..value_end - 1]),
                string == SLOT_ESCAPED_STRING,
            ),
        };
        (key, value)
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = (Token<'a>, FieldValue<'a>);

    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        let section = self.section;
        let k = self.index as usize;
        if k < usize::from(self.known.count) {
            // Found and parsed by the decoder: nothing to scan or parse.
            let known = &self.known;
            let (key_end, value_end) = (known.key_end[k] as usize, known.value_end[k] as usize);
            let (kind, bits) = (known.kind[k], known.bits[k]);
            return Some(self.kept(key_end, value_end, kind, bits));
        }
        if self.more != 0
            && let Some(field) = more_field(self.more, k.wrapping_sub(KNOWN))
        {
            // Past the first few, kept in this thread's table: nothing to scan either.
            return Some(self.kept(
                field.key_end as usize,
                field.value_end as usize,
                field.kind,
                field.bits,
            ));
        }
        // Past the known fields, the section is scanned and parsed again (when the line is
        // too long for the kept offsets, or the thread's table holds another line now).
        let rest = section.get(self.pos..).filter(|rest| !rest.is_empty())?;
        let (k_end, k_escaped) = validated_token_end(rest, 0, b'=');
        let key = Token::new(as_str(&rest[..k_end]), k_escaped, TokenKind::Key);
        let v_start = k_end + 1;
        let (value, end) = if rest.get(v_start) == Some(&b'"') {
            let scan = simd::scan_string(rest, v_start + 1);
            let text = as_str(&rest[v_start + 1..scan.close]);
            (value::string_value(text, scan.escaped), scan.close + 1)
        } else if let Some((end, value)) = value::parse_plain_number(rest, v_start) {
            (value, end)
        } else {
            let mut end = v_start;
            while end < rest.len() && rest[end] != b',' {
                end += 1;
            }
            (value::parse_unquoted_in(rest, v_start, end).ok()?, end)
        };
        self.pos += end + 1;
        Some((key, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
