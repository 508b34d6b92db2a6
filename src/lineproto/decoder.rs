use super::error::{DecodeError, DecodeErrorKind};
use super::precision::Precision;
use super::simd;
use super::table::{FIELD_VALUE_STOP, KEY_STOP, MEASUREMENT_STOP, is_non_printable};
use super::token::{Token, TokenKind};
use super::value::{self, FieldValue};

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
    first_string: StringSpan,
}

/// Where the first string field of a line sits within its field section, so that reading
/// it (typically the one `event` payload of a fleet message) does not scan it twice.
#[derive(Debug, Clone, Copy, Default)]
struct StringSpan {
    /// Offset of the opening quote; 0 when the line has no string field (a field section
    /// never starts with a quote).
    open: usize,
    close: usize,
    escaped: bool,
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
            buf,
            pos: 0,
            line_no: 1,
            precision: options.precision,
            default_time: options.default_time.map(|t| options.precision.truncate(t)),
            max_line_len: options.max_line_len,
        }
    }

    /// The 1-based number of the line the decoder will read next.
    pub fn line_number(&self) -> usize {
        self.line_no
    }

    /// The byte offset in the input where the next line starts.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Continues decoding `buf` at byte `pos`, which starts line `line_no`: lets a caller
    /// with its own fast path for common lines hand the odd ones to the full decoder.
    pub fn resume_at(buf: &'a [u8], pos: usize, line_no: usize, options: DecoderOptions) -> Self {
        let mut decoder = Self::with_options(buf, options);
        decoder.pos = pos.min(buf.len());
        decoder.line_no = line_no;
        decoder
    }

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
    #[inline]
    fn point(&self, line_start: usize, start: usize) -> Result<(Line<'a>, usize, usize), Failure> {
        let buf = self.buf;
        let mut i = start;

        // Measurement.
        let (m_end, m_escaped, m_high) = scan_token(buf, i, &MEASUREMENT_STOP, b" ,");
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

        // Tags, until a space starts the fields.
        loop {
            if buf.get(i) == Some(&b' ') {
                break;
            }
            let k_start = i;
            let (k_end, _, k_high) = scan_token(buf, i, &KEY_STOP, b",= ");
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
            let (v_end, _, v_high) = scan_token(buf, i, &KEY_STOP, b",= ");
            if v_high {
                self.check_utf8(v_start, v_end)?;
            }
            i = v_end;
            if v_end == v_start {
                return Err(Failure::new(v_start, DecodeErrorKind::EmptyTagValue, i));
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
        let mut first_string = StringSpan::default();
        let mut time_start = None;
        let fields_end;
        let mut next = 0;
        loop {
            let k_start = i;
            let (k_end, _, k_high) = scan_token(buf, i, &KEY_STOP, b",= ");
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
                    if first_string.open == 0 {
                        first_string = StringSpan {
                            open: i - fields_start,
                            close: end - fields_start,
                            escaped,
                        };
                    }
                    newlines += lines;
                    i = end + 1;
                    Ok(())
                }
                Some(b'-' | b'.' | b'0'..=b'9')
                    if let Some((end, _)) = value::parse_plain_number(buf, i) =>
                {
                    i = end;
                    Ok(())
                }
                Some(b't' | b'T' | b'f' | b'F' | b'-' | b'.' | b'0'..=b'9') => {
                    while i < buf.len() && !FIELD_VALUE_STOP[buf[i] as usize] {
                        i += 1;
                    }
                    value::parse_unquoted_in(buf, v_start, i).map(|_| ())
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
            match buf.get(i) {
                None => {
                    value_ok.map_err(|kind| Failure::after_line(v_start, kind, i))?;
                    fields_end = i;
                    next = i;
                    break;
                }
                Some(b',') => {
                    i += 1;
                    value_ok.map_err(|kind| Failure::new(v_start, kind, i))?;
                }
                Some(&b) if is_whitespace(b) => {
                    fields_end = i;
                    i = self.skip_spaces(i);
                    if let Some(end) = self.line_end(i) {
                        value_ok.map_err(|kind| Failure::after_line(v_start, kind, end))?;
                        next = end;
                    } else {
                        value_ok.map_err(|kind| Failure::new(v_start, kind, i))?;
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
            // Whole words of digits first (a nanosecond timestamp has 19).
            while let Some(word) = buf.get(i..i + 8) {
                if !value::all_digits(word) {
                    break;
                }
                i += 8;
            }
            while i < buf.len() && (buf[i].is_ascii_digit() || buf[i] == b'-') {
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
                let raw = value::parse_int(&buf[t_start..t_end]).map_err(|kind| {
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
            first_string,
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

impl<'a> Iterator for Decoder<'a> {
    type Item = Result<Line<'a>, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
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
                    return Some(match self.point(line_start, i) {
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
fn scan_token(buf: &[u8], mut i: usize, stop: &[bool; 256], escapes: &[u8]) -> (usize, bool, bool) {
    let mut escaped = false;
    let mut high = false;
    let with_equals = stop[usize::from(b'=')];
    loop {
        i = simd::skip_token_bytes(buf, i, with_equals);
        while i < buf.len() && !stop[buf[i] as usize] {
            i += 1;
        }
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
        Tags { rest: self.tags }
    }

    /// The fields in input order; there is always at least one.
    pub fn fields(&self) -> Fields<'a> {
        Fields {
            rest: self.fields,
            offset: 0,
            first_string: self.first_string,
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
    rest: &'a [u8],
}

impl<'a> Iterator for Tags<'a> {
    type Item = (Token<'a>, Token<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        // The section was validated by the decoder: `(,key=value)*`.
        let rest = self.rest.strip_prefix(b",")?;
        let (k_end, k_escaped, _) = scan_token(rest, 0, &KEY_STOP, b",= ");
        let (v_end, v_escaped, _) = scan_token(rest, k_end + 1, &KEY_STOP, b",= ");
        let key = Token::new(as_str(&rest[..k_end]), k_escaped, TokenKind::Key);
        let value = Token::new(as_str(&rest[k_end + 1..v_end]), v_escaped, TokenKind::Key);
        self.rest = &rest[v_end..];
        Some((key, value))
    }
}

/// The fields of a [`Line`], as `(key, value)`.
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    rest: &'a [u8],
    /// Offset of `rest` within the line's field section.
    offset: usize,
    first_string: StringSpan,
}

impl<'a> Iterator for Fields<'a> {
    type Item = (Token<'a>, FieldValue<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        // The section was validated by the decoder: `key=value(,key=value)*`.
        if self.rest.is_empty() {
            return None;
        }
        let rest = self.rest;
        let (k_end, k_escaped, _) = scan_token(rest, 0, &KEY_STOP, b",= ");
        let key = Token::new(as_str(&rest[..k_end]), k_escaped, TokenKind::Key);
        let v_start = k_end + 1;
        let (value, end) = if rest.get(v_start) == Some(&b'"') {
            let known = self.first_string;
            let (close, escaped) = if known.open != 0 && known.open == self.offset + v_start {
                (known.close - self.offset, known.escaped)
            } else {
                let scan = simd::scan_string(rest, v_start + 1);
                (scan.close, scan.escaped)
            };
            let text = as_str(&rest[v_start + 1..close]);
            (value::string_value(text, escaped), close + 1)
        } else if let Some((end, value)) = value::parse_plain_number(rest, v_start) {
            (value, end)
        } else {
            let mut end = v_start;
            while end < rest.len() && rest[end] != b',' {
                end += 1;
            }
            (value::parse_unquoted_in(rest, v_start, end).ok()?, end)
        };
        self.rest = rest.get(end + 1..).unwrap_or_default();
        self.offset += end + 1;
        Some((key, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
