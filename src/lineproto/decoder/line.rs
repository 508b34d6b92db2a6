//! The views of a decoded line: [`Line`] and its [`Tags`] and [`Fields`] iterators, which
//! read the tokens the decoder validated without checking them again.

use super::cache::{
    KEY_ESCAPED, KNOWN, KnownFields, KnownTags, SLOT_BOOL, SLOT_ESCAPED_STRING, SLOT_FLOAT,
    SLOT_INT, SLOT_UINT, more_field,
};
use super::token_scan::{as_str, validated_token_end};
use crate::lineproto::kind::TokenKind;
use crate::lineproto::simd;
use crate::lineproto::token::Token;
use crate::lineproto::value::{self, FieldValue};

/// One decoded point: views into the input, already validated.
#[derive(Clone, Copy)]
pub struct Line<'a> {
    pub(super) raw: &'a [u8],
    pub(super) measurement: Token<'a>,
    pub(super) tags: &'a [u8],
    pub(super) fields: &'a [u8],
    pub(super) time: Option<i64>,
    pub(super) default_time: Option<i64>,
    pub(super) number: usize,
    pub(super) known_tags: KnownTags,
    pub(super) known_fields: KnownFields,
    /// Which [`MoreFields`] table holds the fields past the first [`KNOWN`]; 0 for none.
    pub(super) more_fields: u64,
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
        // long for the kept offsets) while the section holds some; `KNOWN` kept is all of
        // them when the last one ends the section.
        if (known < KNOWN && (known > 0 || self.tags.is_empty()))
            || (known == KNOWN && self.known_tags.value_end[KNOWN - 1] as usize == self.tags.len())
        {
            known
        } else {
            self.tags().count()
        }
    }

    /// How many fields the line has (at least one).
    pub fn field_count(&self) -> usize {
        let known = usize::from(self.known_fields.count);
        if (known > 0 && known < KNOWN)
            || (known == KNOWN
                && self.known_fields.value_end[KNOWN - 1] as usize == self.fields.len())
        {
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
    pub(super) section: &'a [u8],
    /// Where the next tag's comma is.
    pub(super) pos: usize,
    /// How many tags were read.
    pub(super) index: u8,
    pub(super) known: KnownTags,
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
    pub(super) section: &'a [u8],
    /// Where the next field's key starts (past the end when there is none).
    pub(super) pos: usize,
    /// How many fields were read (fewer than 2^32: past the known fields only lines whose
    /// offsets fit in a u32 are kept).
    pub(super) index: u32,
    pub(super) known: KnownFields,
    /// The generation of the [`MoreFields`] holding the line's fields past the known ones
    /// (0 for none).
    pub(super) more: u64,
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
