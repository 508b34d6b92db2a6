//! A token of a decoded line: a view into the input, unescaped on demand.

use std::borrow::Cow;
use std::fmt;

use super::escape;
use super::kind::TokenKind;

/// A token of a decoded line: a view into the input, unescaped only on demand.
#[derive(Clone, Copy)]
pub struct Token<'a> {
    raw: &'a str,
    flags: Flags,
}

/// A token's kind and whether it holds a backslash, in one byte.
///
/// Tokens are handed out through memory (in a returned `Line`, or the tuple a `Fields`
/// iterator returns); with two separate bytes the reader loaded both with one wider load,
/// which cannot take its data from the two narrower stores just made (a store-forwarding
/// stall that cost a tenth of decoding a heartbeat). An enum keeps a niche, so a
/// `FieldValue` holding a token is no larger than the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Flags {
    Measurement = 0,
    MeasurementEscaped = 1,
    Key = 2,
    KeyEscaped = 3,
    StringField = 4,
    StringFieldEscaped = 5,
}

impl<'a> Token<'a> {
    #[inline(always)]
    pub(crate) fn new(raw: &'a str, escaped: bool, kind: TokenKind) -> Self {
        let flags = match (kind, escaped) {
            (TokenKind::Measurement, false) => Flags::Measurement,
            (TokenKind::Measurement, true) => Flags::MeasurementEscaped,
            (TokenKind::Key, false) => Flags::Key,
            (TokenKind::Key, true) => Flags::KeyEscaped,
            (TokenKind::StringField, false) => Flags::StringField,
            (TokenKind::StringField, true) => Flags::StringFieldEscaped,
        };
        Token { raw, flags }
    }

    /// The token as it stands in the input, escapes included (without the quotes of a
    /// string field).
    pub fn raw(&self) -> &'a str {
        self.raw
    }

    /// The escape rules of this token.
    #[inline]
    pub fn kind(&self) -> TokenKind {
        match self.flags {
            Flags::Measurement | Flags::MeasurementEscaped => TokenKind::Measurement,
            Flags::Key | Flags::KeyEscaped => TokenKind::Key,
            Flags::StringField | Flags::StringFieldEscaped => TokenKind::StringField,
        }
    }

    /// Whether the token contains a backslash, so that unescaping may change it.
    #[inline(always)]
    pub fn has_escapes(&self) -> bool {
        self.flags as u8 & 1 != 0
    }

    /// The unescaped text: borrowed unless the token contained an escape.
    pub fn unescape(&self) -> Cow<'a, str> {
        if !self.has_escapes() {
            return Cow::Borrowed(self.raw);
        }
        let mut out = String::with_capacity(self.raw.len());
        escape::unescape_into(self.raw, self.kind(), &mut out);
        Cow::Owned(out)
    }

    /// The unescaped text, using `scratch` (cleared first) only when the token contained an
    /// escape: the allocation-free way to read many tokens.
    pub fn unescape_with<'s>(&self, scratch: &'s mut String) -> &'s str
    where
        'a: 's,
    {
        if !self.has_escapes() {
            return self.raw;
        }
        scratch.clear();
        escape::unescape_into(self.raw, self.kind(), scratch);
        scratch.as_str()
    }

    /// Compares the unescaped text with `s` without allocating.
    pub fn eq_unescaped(&self, s: &str) -> bool {
        if !self.has_escapes() {
            return self.raw == s;
        }
        escape::unescaped_eq(self.raw, self.kind(), s)
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
