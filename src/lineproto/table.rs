//! Byte classes of line protocol. Needs only `core`: the guest SDK compiles this file too.
//!
//! 256-entry byte-class tables: one lookup per byte on the hot path, as the Go decoder does.

/// Bytes that may not appear unescaped outside string fields (0x00-0x1f and 0x7f).
pub(crate) const fn is_non_printable(b: u8) -> bool {
    b < 0x20 || b == 0x7f
}

/// A table of the bytes in `stops`, plus the control characters and the bytes above 0x7f
/// when asked (the token scanner steps over the latter itself, noting that UTF-8 must be
/// checked).
const fn build(stops: &[u8], controls_and_high: bool) -> [bool; 256] {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = controls_and_high && (is_non_printable(b as u8) || b >= 0x80);
        b += 1;
    }
    let mut i = 0;
    while i < stops.len() {
        table[stops[i] as usize] = true;
        i += 1;
    }
    table
}

/// Bytes that end (or need a closer look in) a measurement.
pub(crate) static MEASUREMENT_STOP: [bool; 256] = build(b" ,\\", true);
/// Bytes that end (or need a closer look in) a tag key, tag value or field key.
pub(crate) static KEY_STOP: [bool; 256] = build(b" ,=\\", true);
/// Bytes that end a non-string field value: only a comma or white space (the value's own
/// parser rejects anything else).
pub(crate) static FIELD_VALUE_STOP: [bool; 256] = build(b" ,\r\n", false);
