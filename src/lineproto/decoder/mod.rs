//! The line-protocol parser: it validates each line in one pass, records where its tokens
//! end (see [`cache`]) and hands out a [`Line`] view of it (see [`line`]).

mod cache;
mod line;
#[cfg(test)]
mod tests;
mod token_scan;

use super::error::{DecodeError, DecodeErrorKind};
use super::kind::TokenKind;
use super::precision::Precision;
use super::simd::{self, StopWindow};
use super::table::{FIELD_VALUE_STOP, KEY_STOP, MEASUREMENT_STOP, is_non_printable};
use super::token::Token;
use super::value;
use cache::{
    KEY_ESCAPED, KNOWN, KnownField, KnownFields, KnownTags, SLOT_ESCAPED_STRING, SLOT_STRING,
    publish_more_fields, slot, spare_more_fields,
};
pub use line::{Fields, Line, Tags};
use token_scan::{as_str, scan_token};

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
