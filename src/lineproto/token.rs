use std::borrow::Cow;
use std::fmt;

use super::escape;

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

/// A token of a decoded line: a view into the input, unescaped only on demand.
#[derive(Clone, Copy)]
pub struct Token<'a> {
    raw: &'a str,
    escaped: bool,
    kind: TokenKind,
}

impl<'a> Token<'a> {
    pub(crate) fn new(raw: &'a str, escaped: bool, kind: TokenKind) -> Self {
        Token { raw, escaped, kind }
    }

    /// The token as it stands in the input, escapes included (without the quotes of a
    /// string field).
    pub fn raw(&self) -> &'a str {
        self.raw
    }

    /// The escape rules of this token.
    pub fn kind(&self) -> TokenKind {
        self.kind
    }

    /// Whether the token contains a backslash, so that unescaping may change it.
    pub fn has_escapes(&self) -> bool {
        self.escaped
    }

    /// The unescaped text: borrowed unless the token contained an escape.
    pub fn unescape(&self) -> Cow<'a, str> {
        if !self.escaped {
            return Cow::Borrowed(self.raw);
        }
        let mut out = String::with_capacity(self.raw.len());
        escape::unescape_into(self.raw, self.kind, &mut out);
        Cow::Owned(out)
    }

    /// The unescaped text, using `scratch` (cleared first) only when the token contained an
    /// escape: the allocation-free way to read many tokens.
    pub fn unescape_with<'s>(&self, scratch: &'s mut String) -> &'s str
    where
        'a: 's,
    {
        if !self.escaped {
            return self.raw;
        }
        scratch.clear();
        escape::unescape_into(self.raw, self.kind, scratch);
        scratch.as_str()
    }

    /// Compares the unescaped text with `s` without allocating.
    pub fn eq_unescaped(&self, s: &str) -> bool {
        if !self.escaped {
            return self.raw == s;
        }
        escape::unescaped_eq(self.raw, self.kind, s)
    }
}

impl fmt::Debug for Token<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.unescape(), f)
    }
}

impl PartialEq for Token<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.unescape() == other.unescape()
    }
}

impl PartialEq<str> for Token<'_> {
    fn eq(&self, other: &str) -> bool {
        self.eq_unescaped(other)
    }
}

impl PartialEq<&str> for Token<'_> {
    fn eq(&self, other: &&str) -> bool {
        self.eq_unescaped(other)
    }
}
