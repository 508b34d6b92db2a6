use std::fmt;

/// What was wrong with a line.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeErrorKind {
    /// The measurement is empty.
    EmptyMeasurement,
    /// A tag key is empty or missing after a comma.
    EmptyTagKey,
    /// A tag key is not followed by `=`.
    ExpectedTagEquals,
    /// A tag has an empty value.
    EmptyTagValue,
    /// The line has no fields.
    NoFields,
    /// A field key is empty or missing after a comma.
    EmptyFieldKey,
    /// A field key is not followed by `=`.
    ExpectedFieldEquals,
    /// A field has no value.
    EmptyFieldValue,
    /// A field value is neither a number, a boolean nor a quoted string.
    InvalidFieldValue,
    /// A number does not fit its type (or a float is not finite).
    OutOfRange,
    /// A string field lacks its closing quote.
    UnterminatedString,
    /// A comment line holds a control character (a tab included).
    InvalidComment,
    /// A control character (0x00-0x1f, 0x7f) outside a string field.
    NonPrintable(u8),
    /// Bytes that are not valid UTF-8.
    InvalidUtf8,
    /// The timestamp is not an optionally signed integer.
    InvalidTimestamp,
    /// The timestamp overflows int64 nanoseconds at the decoder's precision.
    TimestampOutOfRange,
    /// Something follows the timestamp, or a lone carriage return ends the line.
    UnexpectedCharacter(u8),
    /// The line is longer than the decoder's limit.
    LineTooLong {
        /// The limit in bytes.
        limit: usize,
    },
}

/// A line that could not be decoded: where (1-based line and byte column) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The 1-based line number within the decoded input.
    pub line: usize,
    /// The 1-based byte column within that line.
    pub column: usize,
    /// What was wrong.
    pub kind: DecodeErrorKind,
}

impl fmt::Display for DecodeErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeErrorKind::EmptyMeasurement => f.write_str("empty measurement name"),
            DecodeErrorKind::EmptyTagKey => f.write_str("expected tag key after comma"),
            DecodeErrorKind::ExpectedTagEquals => f.write_str("expected '=' after tag key"),
            DecodeErrorKind::EmptyTagValue => f.write_str("empty tag value"),
            DecodeErrorKind::NoFields => f.write_str("no fields"),
            DecodeErrorKind::EmptyFieldKey => f.write_str("expected field key"),
            DecodeErrorKind::ExpectedFieldEquals => f.write_str("expected '=' after field key"),
            DecodeErrorKind::EmptyFieldValue => f.write_str("empty field value"),
            DecodeErrorKind::InvalidFieldValue => f.write_str("invalid field value"),
            DecodeErrorKind::OutOfRange => f.write_str("field value out of range"),
            DecodeErrorKind::UnterminatedString => f.write_str("unterminated string field"),
            DecodeErrorKind::InvalidComment => f.write_str("invalid character in comment line"),
            DecodeErrorKind::NonPrintable(b) => write!(f, "non-printable character 0x{b:02x}"),
            DecodeErrorKind::InvalidUtf8 => f.write_str("invalid UTF-8"),
            DecodeErrorKind::InvalidTimestamp => f.write_str("invalid timestamp"),
            DecodeErrorKind::TimestampOutOfRange => f.write_str("timestamp out of range"),
            DecodeErrorKind::UnexpectedCharacter(b) => {
                write!(f, "unexpected character {:?}", char::from(*b))
            }
            DecodeErrorKind::LineTooLong { limit } => {
                write!(f, "line longer than the limit of {limit} bytes")
            }
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at line {}:{}: {}", self.line, self.column, self.kind)
    }
}

impl std::error::Error for DecodeError {}
