use super::error::{DecodeError, DecodeErrorKind};
use super::precision::Precision;
use super::scan;
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
/// with the following line. Blank lines and `#` comments are skipped.
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

type Failure = (usize, DecodeErrorKind);

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

    /// Skips the rest of the current line after an error at `at`, and builds the error.
    #[cold]
    fn fail(&mut self, line_start: usize, (at, kind): Failure) -> DecodeError {
        let at = at.min(self.buf.len());
        let before = &self.buf[line_start..at];
        let newlines = memchr::memchr_iter(b'\n', before).count();
        let column_base = memchr::memrchr(b'\n', before).map_or(line_start, |i| line_start + i + 1);
        let error = DecodeError {
            line: self.line_no + newlines,
            column: at - column_base + 1,
            kind,
        };
        match memchr::memchr(b'\n', &self.buf[at..]) {
            Some(offset) => {
                self.pos = at + offset + 1;
                self.line_no = error.line + 1;
            }
            None => {
                self.pos = self.buf.len();
                self.line_no = error.line;
            }
        }
        error
    }

    /// Where a line that ends at `i` continues, or why it cannot end there.
    #[inline]
    fn end_of_line(&self, i: usize) -> Result<usize, Failure> {
        let buf = self.buf;
        match buf.get(i) {
            None => Ok(i),
            Some(b'\n') => Ok(i + 1),
            Some(b'\r') => match buf.get(i + 1) {
                // A trailing CR at the very end of the input is allowed by the grammar.
                None => Ok(i + 1),
                Some(b'\n') => Ok(i + 2),
                Some(_) => Err((i, DecodeErrorKind::UnexpectedCharacter(b'\r'))),
            },
            Some(&b) if is_non_printable(b) => Err((i, DecodeErrorKind::NonPrintable(b))),
            Some(&b) => Err((i, DecodeErrorKind::UnexpectedCharacter(b))),
        }
    }

    #[inline]
    fn skip_spaces(&self, mut i: usize) -> usize {
        while self.buf.get(i) == Some(&b' ') {
            i += 1;
        }
        i
    }

    /// Scans a comment starting at the `#` at `i`; returns where the next line starts.
    fn comment(&self, i: usize) -> Result<usize, Failure> {
        let buf = self.buf;
        let (end, next) = match memchr::memchr(b'\n', &buf[i..]) {
            Some(offset) => (i + offset, i + offset + 1),
            None => (buf.len(), buf.len()),
        };
        let body_end = if end > i && buf[end - 1] == b'\r' {
            end - 1
        } else {
            end
        };
        if let Some(bad) = buf[i..body_end]
            .iter()
            .position(|&b| is_non_printable(b) && b != b'\t')
        {
            return Err((i + bad, DecodeErrorKind::NonPrintable(buf[i + bad])));
        }
        Ok(next)
    }

    /// Parses the point starting at `i` (after leading spaces); returns it and where the
    /// next line starts.
    #[inline]
    fn point(&self, line_start: usize, mut i: usize) -> Result<(Line<'a>, usize, usize), Failure> {
        let buf = self.buf;
        let m_start = i;
        let (m_end, m_escaped) = scan_token(buf, i, &MEASUREMENT_STOP)?;
        if m_end == m_start {
            return Err((i, DecodeErrorKind::EmptyMeasurement));
        }
        i = m_end;

        let tags_start = i;
        while buf.get(i) == Some(&b',') {
            i += 1;
            let k_end = scan_token(buf, i, &KEY_STOP)?.0;
            if k_end == i {
                return Err((i, DecodeErrorKind::EmptyTagKey));
            }
            if buf.get(k_end) != Some(&b'=') {
                return Err(self.unexpected(k_end, DecodeErrorKind::ExpectedTagEquals));
            }
            i = k_end + 1;
            let v_end = scan_token(buf, i, &KEY_STOP)?.0;
            if v_end == i {
                return Err(self.unexpected(i, DecodeErrorKind::EmptyTagValue));
            }
            i = v_end;
        }
        let tags_end = i;

        if buf.get(i) != Some(&b' ') {
            return Err(self.unexpected(i, DecodeErrorKind::NoFields));
        }
        i = self.skip_spaces(i);
        let fields_start = i;
        let mut newlines = 0;
        let mut first_string = StringSpan::default();
        loop {
            let k_end = scan_token(buf, i, &KEY_STOP)?.0;
            if k_end == i {
                return Err(self.unexpected(i, DecodeErrorKind::EmptyFieldKey));
            }
            if buf.get(k_end) != Some(&b'=') {
                return Err(self.unexpected(k_end, DecodeErrorKind::ExpectedFieldEquals));
            }
            i = k_end + 1;
            if buf.get(i) == Some(&b'"') {
                let (end, escaped, lines) = scan_string(buf, i + 1)?;
                if first_string.open == 0 {
                    first_string = StringSpan {
                        open: i - fields_start,
                        close: end - fields_start,
                        escaped,
                    };
                }
                newlines += lines;
                i = end + 1;
            } else {
                let v_start = i;
                while i < buf.len() && !FIELD_VALUE_STOP[buf[i] as usize] {
                    i += 1;
                }
                if i == v_start {
                    return Err(self.unexpected(i, DecodeErrorKind::EmptyFieldValue));
                }
                value::parse_unquoted(&buf[v_start..i]).map_err(|kind| (v_start, kind))?;
            }
            if buf.get(i) == Some(&b',') {
                i += 1;
            } else {
                break;
            }
        }
        let fields_end = i;

        let mut time = None;
        if buf.get(i) == Some(&b' ') {
            i = self.skip_spaces(i);
            let t_start = i;
            while i < buf.len() && (buf[i].is_ascii_digit() || buf[i] == b'-') {
                i += 1;
            }
            if i > t_start {
                let raw = value::parse_int(&buf[t_start..i]).map_err(|kind| {
                    let kind = match kind {
                        DecodeErrorKind::OutOfRange => DecodeErrorKind::TimestampOutOfRange,
                        _ => DecodeErrorKind::InvalidTimestamp,
                    };
                    (t_start, kind)
                })?;
                let nanos = self
                    .precision
                    .to_nanos(raw)
                    .ok_or((t_start, DecodeErrorKind::TimestampOutOfRange))?;
                time = Some(nanos);
                i = self.skip_spaces(i);
            } else if !matches!(buf.get(i), None | Some(b'\n' | b'\r')) {
                return Err(self.unexpected(i, DecodeErrorKind::InvalidTimestamp));
            }
        }
        let next = self.end_of_line(i)?;
        let raw = &buf[line_start..i];
        if !raw.is_ascii()
            && let Err(e) = std::str::from_utf8(raw)
        {
            return Err((line_start + e.valid_up_to(), DecodeErrorKind::InvalidUtf8));
        }
        if i - line_start > self.max_line_len {
            return Err((
                line_start + self.max_line_len,
                DecodeErrorKind::LineTooLong {
                    limit: self.max_line_len,
                },
            ));
        }
        let line = Line {
            raw,
            measurement: Token::new(
                as_str(&buf[m_start..m_end]),
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

    /// The error for a token that stops at `i` with something other than what the grammar
    /// wants: a control character or odd byte is named as such, the end of the line as
    /// `at_end`.
    #[inline]
    fn unexpected(&self, i: usize, at_end: DecodeErrorKind) -> Failure {
        match self.buf.get(i) {
            None | Some(b'\n') => (i, at_end),
            Some(b'\r') if matches!(self.buf.get(i + 1), None | Some(b'\n')) => (i, at_end),
            Some(&b) if is_non_printable(b) => (i, DecodeErrorKind::NonPrintable(b)),
            Some(&b) if matches!(at_end, DecodeErrorKind::NoFields) => {
                (i, DecodeErrorKind::UnexpectedCharacter(b))
            }
            Some(_) => (i, at_end),
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
                Some(b'\n' | b'\r') => match self.end_of_line(i) {
                    Ok(next) => {
                        self.pos = next;
                        self.line_no += 1;
                    }
                    Err(failure) => return Some(Err(self.fail(line_start, failure))),
                },
                Some(b'#') => match self.comment(i) {
                    Ok(next) => {
                        self.pos = next;
                        self.line_no += 1;
                    }
                    Err(failure) => return Some(Err(self.fail(line_start, failure))),
                },
                Some(_) => {
                    return Some(match self.point(line_start, i) {
                        Ok((line, next, newlines)) => {
                            self.pos = next;
                            self.line_no += 1 + newlines;
                            Ok(line)
                        }
                        Err(failure) => Err(self.fail(line_start, failure)),
                    });
                }
            }
        }
    }
}

/// Scans a measurement or key token from `i` up to the first stop byte that is not part of
/// an escape sequence; returns its end and whether it contained a backslash.
#[inline]
fn scan_token(buf: &[u8], mut i: usize, stop: &[bool; 256]) -> Result<(usize, bool), Failure> {
    let mut escaped = false;
    loop {
        while i < buf.len() && !stop[buf[i] as usize] {
            i += 1;
        }
        if buf.get(i) != Some(&b'\\') {
            return Ok((i, escaped));
        }
        // `\` {`\`} followed by any printable byte that is not a backslash.
        escaped = true;
        let mut j = i + 1;
        while buf.get(j) == Some(&b'\\') {
            j += 1;
        }
        match buf.get(j) {
            Some(&b) if !is_non_printable(b) => i = j + 1,
            _ => return Err((j, DecodeErrorKind::InvalidEscape)),
        }
    }
}

/// Scans a string field body starting after its opening quote; returns the index of the
/// closing quote, whether it contained a backslash, and how many raw newlines it holds.
///
/// JSON payloads put a special byte (`\"`) every few bytes, so the scan handles every
/// special of an 8-byte word from one load; after a few words without any it lets
/// `memchr` jump ahead (plain text, long strings).
#[inline]
fn scan_string(buf: &[u8], start: usize) -> Result<(usize, bool, usize), Failure> {
    let unterminated = || (start - 1, DecodeErrorKind::UnterminatedString);
    let mut i = start;
    let mut escaped = false;
    let mut newlines = 0;
    let mut quiet_words = 0;
    loop {
        let word = if i + 8 <= buf.len() {
            scan::load(buf, i)
        } else if i < buf.len() {
            // The last bytes, zero-padded: a zero byte is never special.
            let mut tail = [0u8; 8];
            tail[..buf.len() - i].copy_from_slice(&buf[i..]);
            u64::from_le_bytes(tail)
        } else {
            return Err(unterminated());
        };
        let mut mask = scan::string_specials(word);
        if mask == 0 {
            if i + 8 >= buf.len() {
                // That was the last (possibly zero-padded) word: no closing quote.
                return Err(unterminated());
            }
            quiet_words += 1;
            if quiet_words >= 4 {
                quiet_words = 0;
                i = scan::find3(buf, i + 8, b'"', b'\\', b'\n').ok_or_else(unterminated)?;
            } else {
                i += 8;
            }
            continue;
        }
        quiet_words = 0;
        let mut next = i + 8;
        while mask != 0 {
            let pos = (mask.trailing_zeros() / 8) as usize;
            mask &= mask - 1;
            let at = i + pos;
            match buf[at] {
                b'"' => return Ok((at, escaped, newlines)),
                b'\\' => {
                    escaped = true;
                    match buf.get(at + 1) {
                        None => return Err(unterminated()),
                        Some(b'\n') => newlines += 1,
                        Some(_) => {}
                    }
                    if pos == 7 {
                        // The escaped byte opens the next word.
                        next = at + 2;
                        break;
                    }
                    mask &= !(0xffu64 << ((pos + 1) * 8));
                }
                _ => newlines += 1,
            }
        }
        i = next;
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
        let (k_end, k_escaped) = scan_token(rest, 0, &KEY_STOP).ok()?;
        let (v_end, v_escaped) = scan_token(rest, k_end + 1, &KEY_STOP).ok()?;
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
        let (k_end, k_escaped) = scan_token(rest, 0, &KEY_STOP).ok()?;
        let key = Token::new(as_str(&rest[..k_end]), k_escaped, TokenKind::Key);
        let v_start = k_end + 1;
        let (value, end) = if rest.get(v_start) == Some(&b'"') {
            let known = self.first_string;
            let (close, escaped) = if known.open != 0 && known.open == self.offset + v_start {
                (known.close - self.offset, known.escaped)
            } else {
                let (close, escaped, _) = scan_string(rest, v_start + 1).ok()?;
                (close, escaped)
            };
            let text = as_str(&rest[v_start + 1..close]);
            (value::string_value(text, escaped), close + 1)
        } else {
            let mut end = v_start;
            while end < rest.len() && rest[end] != b',' {
                end += 1;
            }
            (value::parse_unquoted(&rest[v_start..end]).ok()?, end)
        };
        self.rest = rest.get(end + 1..).unwrap_or_default();
        self.offset += end + 1;
        Some((key, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-at-a-time reference for `scan_string`.
    fn reference(buf: &[u8], start: usize) -> Option<(usize, bool, usize)> {
        let (mut i, mut escaped, mut newlines) = (start, false, 0);
        while i < buf.len() {
            match buf[i] {
                b'"' => return Some((i, escaped, newlines)),
                b'\\' => {
                    escaped = true;
                    newlines += usize::from(*buf.get(i + 1)? == b'\n');
                    i += 2;
                }
                b'\n' => {
                    newlines += 1;
                    i += 1;
                }
                _ => i += 1,
            }
        }
        None
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

    /// Every special the string scan looks for, alone and in the pairs that straddle words.
    const STRING_SPECIALS: [&[u8]; 9] = [
        b"", b"\"", b"\\", b"\\\"", b"\\\\", b"\n", b"\\\n", b"\\n", b"\"\"",
    ];

    #[test]
    fn string_scan_agrees_with_a_byte_loop_for_every_length_and_position() {
        // Strings of 0..=80 bytes, with each special at every position (or at the very end,
        // where a backslash has nothing to escape), after openings of every alignment.
        for lead in 0..9 {
            for n in 0..=80 {
                for at in 0..=n {
                    for special in STRING_SPECIALS {
                        let mut buf = vec![b'x'; lead];
                        buf.push(b'"');
                        let start = buf.len();
                        buf.extend(std::iter::repeat_n(b'a', at));
                        buf.extend_from_slice(special);
                        buf.extend(std::iter::repeat_n(b'a', n - at));
                        let got = scan_string(&buf, start).ok();
                        assert_eq!(got, reference(&buf, start), "{:?}", buf.escape_ascii());
                    }
                }
            }
        }
    }

    #[test]
    fn string_scan_agrees_with_a_byte_loop_at_every_alignment() {
        let pieces: [&[u8]; 7] = [
            b"a",
            b"\\\"",
            b"\\\\",
            b"\n",
            b"\\\n",
            b"xyzxyzxyzxyzxyzxyzxyzxyzxyzxyzxyzxyzx",
            b"\"",
        ];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..3000 {
            let mut buf = b"\"".to_vec();
            let len = (seed % 24) as usize;
            for _ in 0..len {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                buf.extend_from_slice(pieces[(seed % pieces.len() as u64) as usize]);
            }
            let got = scan_string(&buf, 1).ok();
            assert_eq!(
                got,
                reference(&buf, 1),
                "{:?}",
                String::from_utf8_lossy(&buf)
            );
        }
    }
}
