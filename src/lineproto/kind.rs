//! The kinds of token, each with its own escape rules.

/// Which escape rules a token follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenKind {
    /// A measurement: `\ ` and `\,` are escapes; any other backslash is literal.
    Measurement,
    /// A tag key, tag value or field key: `\ `, `\,` and `\=` are escapes.
    Key,
    /// A string field value: `\\`, `\"`, `\n`, `\r` and `\t` are escapes.
    StringField,
}
