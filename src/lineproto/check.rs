//! The check of a batch of line protocol that someone else wrote (a plugin) before it is
//! forwarded as it is: every line must decode, with this decoder's rules, which are those of
//! the consumers (cc-metric-store and InfluxDB decode with the Go reference's rules), and the
//! batch must keep within its limits. One bad line refuses the whole batch.
//!
//! What passes is copied out line by line as the decoder accepted it (the bytes of the
//! point, without its line ending), with a timestamp appended to lines that carry none, and
//! a newline after each. Blank lines and comments, which every decoder skips, are left out.
//!
//! ```
//! use ccfleet::lineproto::{BatchLimits, check_batch};
//!
//! let limits = BatchLimits::default();
//! let mut out = Vec::new();
//! let points = check_batch(b"a,t=1 v=1 5\nb v=2i", &limits, &mut || 7, &mut out).unwrap();
//! assert_eq!((points, out.as_slice()), (2, &b"a,t=1 v=1 5\nb v=2i 7\n"[..]));
//! let error = check_batch(b"a v=1\nb v=\n", &limits, &mut || 7, &mut out).unwrap_err();
//! assert_eq!(error.to_string(), "line 2: invalid field value (column 5)");
//! assert_eq!(out.len(), 21, "nothing of a refused batch is kept");
//! ```

use std::fmt;

use super::decoder::{Decoder, DecoderOptions, Line};
use super::error::DecodeError;
use super::precision::Precision;
use crate::untrusted::Untrusted;

/// The limits of one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// The most points (lines) in a batch.
    pub max_points: usize,
    /// The most bytes in a batch, as written (before timestamps are appended).
    pub max_bytes: usize,
    /// The most bytes of one line (without its line ending).
    pub max_line_len: usize,
    /// The most tags of one point.
    pub max_tags: usize,
    /// The most fields of one point.
    pub max_fields: usize,
}

impl Default for BatchLimits {
    /// A plugin's default limits: 10 000 points, 4 MiB, lines of 1 MiB, 64 tags and 1 024
    /// fields per point.
    fn default() -> Self {
        BatchLimits {
            max_points: 10_000,
            max_bytes: 4 << 20,
            max_line_len: 1 << 20,
            max_tags: 64,
            max_fields: 1024,
        }
    }
}

/// Why a batch was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchError {
    /// The batch is larger than [`BatchLimits::max_bytes`]; no line was looked at.
    TooLarge {
        /// The batch's size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// A line does not decode (a line over [`BatchLimits::max_line_len`] included).
    Decode(DecodeError),
    /// The line holds a point past [`BatchLimits::max_points`].
    TooManyPoints {
        /// The 1-based line number.
        line: usize,
        /// The limit.
        limit: usize,
    },
    /// The line's point has more tags than [`BatchLimits::max_tags`].
    TooManyTags {
        /// The 1-based line number.
        line: usize,
        /// The limit.
        limit: usize,
    },
    /// The line's point has more fields than [`BatchLimits::max_fields`].
    TooManyFields {
        /// The 1-based line number.
        line: usize,
        /// The limit.
        limit: usize,
    },
    /// The line's point has a tag key twice (its series would be ambiguous; the encoder
    /// refuses to write one).
    RepeatedTag {
        /// The 1-based line number.
        line: usize,
        /// The key, as written.
        key: String,
    },
}

impl BatchError {
    /// The 1-based number of the line the batch was refused for; `None` for a batch refused
    /// as a whole.
    pub fn line(&self) -> Option<usize> {
        match self {
            BatchError::TooLarge { .. } => None,
            BatchError::Decode(error) => Some(error.line),
            BatchError::TooManyPoints { line, .. }
            | BatchError::TooManyTags { line, .. }
            | BatchError::TooManyFields { line, .. }
            | BatchError::RepeatedTag { line, .. } => Some(*line),
        }
    }
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchError::TooLarge { bytes, limit } => {
                write!(
                    f,
                    "batch of {bytes} bytes exceeds the limit of {limit} bytes"
                )
            }
            BatchError::Decode(e) => {
                write!(f, "line {}: {} (column {})", e.line, e.kind, e.column)
            }
            BatchError::TooManyPoints { line, limit } => {
                write!(f, "line {line}: the batch has more than {limit} points")
            }
            BatchError::TooManyTags { line, limit } => {
                write!(f, "line {line}: the point has more than {limit} tags")
            }
            BatchError::TooManyFields { line, limit } => {
                write!(f, "line {line}: the point has more than {limit} fields")
            }
            BatchError::RepeatedTag { line, key } => {
                write!(
                    f,
                    "line {line}: tag key {} repeated",
                    Untrusted(key).capped(64)
                )
            }
        }
    }
}

impl std::error::Error for BatchError {}

/// Checks a batch and appends what passes to `out`: the whole batch, or nothing (`out` is
/// left as it was on an error). Returns the number of points. Timestamps are nanoseconds;
/// `now_ns` is called once, and only when a line has no timestamp.
pub fn check_batch(
    input: &[u8],
    limits: &BatchLimits,
    now_ns: &mut dyn FnMut() -> i64,
    out: &mut Vec<u8>,
) -> Result<usize, BatchError> {
    if input.len() > limits.max_bytes {
        return Err(BatchError::TooLarge {
            bytes: input.len(),
            limit: limits.max_bytes,
        });
    }
    let start = out.len();
    let result = check_into(input, limits, now_ns, out);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn check_into(
    input: &[u8],
    limits: &BatchLimits,
    now_ns: &mut dyn FnMut() -> i64,
    out: &mut Vec<u8>,
) -> Result<usize, BatchError> {
    // Room for the batch and a newline; appended timestamps grow it once if at all.
    out.reserve(input.len() + 1);
    let options = DecoderOptions {
        precision: Precision::Nanosecond,
        default_time: None,
        max_line_len: limits.max_line_len,
    };
    let mut now: Option<i64> = None;
    let mut points = 0usize;
    // Lines that stand in the input exactly as they go out (a timestamp, then a bare `\n`)
    // are copied as one run rather than line by line: a collector's batch is one such run.
    let mut run = 0..0;
    for line in Decoder::with_options(input, options) {
        let line = line.map_err(BatchError::Decode)?;
        let number = line.line_number();
        points += 1;
        if points > limits.max_points {
            return Err(BatchError::TooManyPoints {
                line: number,
                limit: limits.max_points,
            });
        }
        if line.tag_count() > limits.max_tags {
            return Err(BatchError::TooManyTags {
                line: number,
                limit: limits.max_tags,
            });
        }
        if let Some(key) = repeated_tag(&line) {
            return Err(BatchError::RepeatedTag {
                line: number,
                key: key.to_owned(),
            });
        }
        if line.field_count() > limits.max_fields {
            return Err(BatchError::TooManyFields {
                line: number,
                limit: limits.max_fields,
            });
        }
        let raw = line.raw().as_bytes();
        // The line's offset in the input: `raw` is a view into it.
        let start = raw.as_ptr() as usize - input.as_ptr() as usize;
        let end = start + raw.len();
        if start == run.end && line.time().is_some() && input.get(end) == Some(&b'\n') {
            run.end = end + 1;
            continue;
        }
        if run.start < run.end {
            out.extend_from_slice(&input[run.clone()]);
        }
        out.extend_from_slice(raw);
        if line.time().is_none() {
            let time = *now.get_or_insert_with(&mut *now_ns);
            out.push(b' ');
            out.extend_from_slice(itoa::Buffer::new().format(time).as_bytes());
        }
        out.push(b'\n');
        // A run starts again after this line's ending (when the next line follows it
        // directly).
        let resume = match input.get(end) {
            Some(b'\n') => end + 1,
            Some(b'\r') if input.get(end + 1) == Some(&b'\n') => end + 2,
            // Not followed by a line ending of its own: no run continues it.
            _ => usize::MAX,
        };
        run = resume..resume;
    }
    if run.start < run.end {
        out.extend_from_slice(&input[run]);
    }
    Ok(points)
}

/// A tag key the line has twice, compared as written: a key's escapes stand for bytes that
/// cannot appear in it unescaped, so two keys are the same exactly when they are written the
/// same.
fn repeated_tag<'a>(line: &Line<'a>) -> Option<&'a str> {
    // Keys in strictly increasing order are all different: encoders write tags sorted, so
    // one pass over neighbours settles almost every line.
    let mut keys = line.tags().map(|(key, _)| key.raw().as_bytes());
    let mut previous = keys.next()?;
    if keys.all(|key| before(std::mem::replace(&mut previous, key), key)) {
        return None;
    }
    let mut tags = line.tags();
    while let Some((key, _)) = tags.next() {
        if tags.clone().any(|(other, _)| other.raw() == key.raw()) {
            return Some(key.raw());
        }
    }
    None
}

/// Whether `a` sorts strictly before `b`, bytewise: keys mostly differ in their first byte,
/// which settles it without a call to `memcmp`.
#[inline]
fn before(a: &[u8], b: &[u8]) -> bool {
    match (a.first(), b.first()) {
        (Some(x), Some(y)) if x != y => x < y,
        _ => a < b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, limits: BatchLimits) -> Result<(usize, String), String> {
        let mut out = b"kept\n".to_vec();
        let mut calls = 0;
        let result = check_batch(
            input.as_bytes(),
            &limits,
            &mut || {
                calls += 1;
                99
            },
            &mut out,
        );
        assert!(calls <= 1, "the clock is read once at most");
        match result {
            Ok(points) => Ok((
                points,
                String::from_utf8(out)
                    .unwrap()
                    .strip_prefix("kept\n")
                    .unwrap()
                    .to_owned(),
            )),
            Err(e) => {
                assert_eq!(out, b"kept\n", "a refused batch leaves nothing");
                Err(e.to_string())
            }
        }
    }

    #[test]
    fn passes_lines_as_written_and_stamps_those_without_time() {
        let limits = BatchLimits::default();
        assert_eq!(
            check(
                "# a comment\n\ncpu,host=a\\ b usage=0.5,n=3i 17\r\nmem s=\"x\ny\" \nup ok=true",
                limits
            ),
            Ok((
                3,
                "cpu,host=a\\ b usage=0.5,n=3i 17\nmem s=\"x\ny\" 99\nup ok=true 99\n".to_owned()
            ))
        );
        assert_eq!(check("", limits), Ok((0, String::new())));
    }

    #[test]
    fn one_bad_line_refuses_the_batch_naming_it() {
        let limits = BatchLimits::default();
        assert_eq!(
            check("a v=1\nb v=1\nc\n", limits),
            Err("line 3: no fields (column 2)".to_owned())
        );
        assert_eq!(
            check("a v=NaN", limits),
            Err("line 1: invalid field value (column 5)".to_owned())
        );
        assert_eq!(
            check("a,k=1,j=2,k=3 v=1", limits),
            Err("line 1: tag key k repeated".to_owned())
        );
        assert_eq!(
            check("a v=1 1\n b v=\"x\" 2 3", limits),
            Err("line 2: unexpected character '3' (column 11)".to_owned())
        );
    }

    #[test]
    fn lines_copied_as_a_run_and_one_by_one_come_out_the_same() {
        let limits = BatchLimits::default();
        assert_eq!(
            check(
                "a v=1 1\nb v=2 2\n\n# c\nc v=3 3\n  d v=4 4  \ne v=5 5\r\nf v=6 6\ng v=7",
                limits
            ),
            Ok((
                7,
                "a v=1 1\nb v=2 2\nc v=3 3\n  d v=4 4\ne v=5 5\nf v=6 6\ng v=7 99\n".to_owned()
            ))
        );
        assert_eq!(
            check("a v=1 1\nb v=2\nc v=3 3\n", limits),
            Ok((3, "a v=1 1\nb v=2 99\nc v=3 3\n".to_owned()))
        );
        assert_eq!(
            check("a s=\"x\ny\" 1\nb v=2 2", limits),
            Ok((2, "a s=\"x\ny\" 1\nb v=2 2\n".to_owned()))
        );
    }

    #[test]
    fn repeated_tag_keys_are_found_in_any_order_and_distinct_ones_in_any_order_pass() {
        let limits = BatchLimits::default();
        for (input, key) in [
            ("a,j=1,j=2 v=1", "j"),
            ("a,a=1,b=1,c=1,d=1,e=1,a=2 v=1", "a"),
            ("a,b=1,c=1,d=1,e=1,f=1,f=2 v=1", "f"),
            ("a,z=1,y=1,z=2 v=1", "z"),
        ] {
            assert_eq!(
                check(input, limits),
                Err(format!("line 1: tag key {key} repeated")),
                "{input}"
            );
        }
        for input in [
            "a,z=1,b=2 v=1",
            "a,b=1,c=1,d=1,e=1,f=1,g=1 v=1",
            "a,g=1,f=1,e=1,d=1,c=1,b=1 v=1",
            "a,k=1,k\\ =1 v=1",
        ] {
            assert_eq!(check(input, limits).map(|r| r.0), Ok(1), "{input}");
        }
    }

    #[test]
    fn keeps_the_limits() {
        let limits = BatchLimits {
            max_points: 2,
            max_bytes: 40,
            max_line_len: 17,
            max_tags: 2,
            max_fields: 5,
        };
        assert_eq!(check("a v=1\nb v=1\n", limits).map(|r| r.0), Ok(2));
        assert_eq!(
            check("a v=1\nb v=1\nc v=1\n", limits),
            Err("line 3: the batch has more than 2 points".to_owned())
        );
        assert_eq!(
            check(&"a v=1\n".repeat(7), limits),
            Err("batch of 42 bytes exceeds the limit of 40 bytes".to_owned())
        );
        assert_eq!(
            check("a,x=1,y=2,z=3 v=1", limits),
            Err("line 1: the point has more than 2 tags".to_owned())
        );
        assert_eq!(
            check("a a=1,b=1,c=1,d=1,e=1,f=1", limits),
            Err("line 1: line longer than the limit of 17 bytes (column 18)".to_owned())
        );
        let many = BatchLimits {
            max_line_len: 1024,
            ..limits
        };
        assert_eq!(
            check("a a=1,b=1,c=1,d=1,e=1,f=1", many),
            Err("line 1: the point has more than 5 fields".to_owned())
        );
        assert_eq!(check("a a=1,b=1,c=1,d=1,e=1", many).map(|r| r.0), Ok(1));
        assert_eq!(check("a,x=1,y=2 v=1", many).map(|r| r.0), Ok(1));
    }
}
