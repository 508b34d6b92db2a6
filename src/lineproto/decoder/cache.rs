//! What the decoder found while validating a line, kept for reading it: where its first
//! tags and fields end and their parsed values (in the `Line`), and the fields past those
//! (in a per-thread table), so that reading a line scans and parses nothing again.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::lineproto::value::FieldValue;

/// How many tags, and how many fields, of a line the `Line` keeps what the decoder found
/// while validating them: enough for fleet messages and most metric lines. Tags past these
/// are scanned again when read; fields past these are kept in [`MoreFields`].
pub(super) const KNOWN: usize = 4;

/// Where the first tags of a line end, found while validating it, so that reading them
/// scans nothing again. Offsets count from the start of the tag section (its first comma).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct KnownTags {
    /// How many tags are known (a prefix of the line's tags).
    pub(super) count: u8,
    /// Bit `2k`: the key of tag `k` holds a backslash; bit `2k + 1`: its value does.
    pub(super) escaped: u8,
    pub(super) key_end: [u32; KNOWN],
    pub(super) value_end: [u32; KNOWN],
}

/// The first fields of a line, found and parsed while validating it, so that reading them
/// neither scans nor parses them again. Offsets count from the start of the field section.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct KnownFields {
    /// How many fields are known (a prefix of the line's fields).
    pub(super) count: u8,
    /// The value's type (`SLOT_*`), and [`KEY_ESCAPED`] when the key holds a backslash.
    pub(super) kind: [u8; KNOWN],
    pub(super) key_end: [u32; KNOWN],
    /// Just past the value (past the closing quote of a string).
    pub(super) value_end: [u32; KNOWN],
    /// The number's bits, or the boolean.
    pub(super) bits: [u64; KNOWN],
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
pub(super) struct MoreFields {
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
pub(super) static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Makes `fields` (taking them, and leaving the previous table's storage as the spare, so
/// no line allocates in steady state) this thread's [`MoreFields`]; returns their
/// generation, or 0 when the thread's table cannot be used (while the thread ends).
#[inline(never)]
pub(super) fn publish_more_fields(fields: &mut Vec<KnownField>) -> u64 {
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
pub(super) fn spare_more_fields() -> Vec<KnownField> {
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
pub(super) fn more_field(generation: u64, index: usize) -> Option<KnownField> {
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
pub(super) struct KnownField {
    pub(super) key_end: u32,
    pub(super) value_end: u32,
    /// The value's type (`SLOT_*`), and [`KEY_ESCAPED`] when the key holds a backslash.
    pub(super) kind: u8,
    pub(super) bits: u64,
}

pub(super) const SLOT_FLOAT: u8 = 0;
pub(super) const SLOT_INT: u8 = 1;
pub(super) const SLOT_UINT: u8 = 2;
pub(super) const SLOT_BOOL: u8 = 3;
pub(super) const SLOT_STRING: u8 = 4;
pub(super) const SLOT_ESCAPED_STRING: u8 = 5;
pub(super) const KEY_ESCAPED: u8 = 0x80;

/// A parsed value as a known field keeps it: type and bits (strings are read from the
/// input).
#[inline(always)]
pub(super) fn slot(value: FieldValue<'_>) -> (u8, u64) {
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
    pub(super) fn record(&mut self, key_end: usize, value_end: usize, kind: u8, bits: u64) {
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
