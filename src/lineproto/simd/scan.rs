//! Finding where tokens end, block at a time: the closing quote of a string field (with
//! what came before it), and the stop bytes of the other tokens.

#[cfg(any(test, not(any(target_arch = "x86_64", target_arch = "aarch64"))))]
use super::block::Word;
#[cfg(target_arch = "aarch64")]
use super::block::arm;
#[cfg(target_arch = "x86_64")]
use super::block::x86;
use super::block::{Block, escaped_bytes, low_bits};

/// What [`scan_string`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StringScan {
    /// Index of the closing quote, or the input length when there is none.
    pub close: usize,
    /// Whether a backslash came before the close.
    pub escaped: bool,
    /// How many newline bytes (escaped or not) came before the close.
    pub newlines: usize,
    /// Whether a byte above 0x7f came before the close (its UTF-8 must be checked).
    pub high: bool,
}

/// Where a string scan stands: the next byte to look at and what came before it.
#[derive(Debug, Clone, Copy)]
struct ScanState {
    i: usize,
    /// Byte `i` is escaped by the backslash before it (0 or 1).
    carry: u64,
    backslashes: bool,
    high: bool,
    newlines: usize,
}

impl ScanState {
    fn done(&self, close: usize) -> StringScan {
        StringScan {
            close,
            escaped: self.backslashes,
            newlines: self.newlines,
            high: self.high,
        }
    }
}

/// Scans a string field body on from `st.i` to the first quote that no backslash escapes,
/// with blocks of type `B`; every backslash escapes the byte after it here, whatever it is
/// (the unescaping rules are [`unescape_into`](super::unescape_into)'s business).
#[inline(always)]
fn scan_on<B: Block>(buf: &[u8], mut st: ScanState) -> StringScan {
    let n = B::N;
    let mut tail = [0u8; 32];
    loop {
        let i = st.i;
        let (block, real) = if i + n <= buf.len() {
            // SAFETY: `i + n <= buf.len()`.
            (unsafe { B::load(buf.as_ptr().add(i)) }, n)
        } else if i < buf.len() {
            // The last bytes, zero-padded: a zero byte is none of the bytes looked for.
            let real = buf.len() - i;
            tail[..real].copy_from_slice(&buf[i..]);
            // SAFETY: `tail` holds 32 >= n bytes.
            (unsafe { B::load(tail.as_ptr()) }, real)
        } else {
            return st.done(buf.len());
        };
        if real == n && !block.any_string_special() {
            // Nothing to look at (plain text): byte 0 may have been escaped, nothing else.
            st.carry = 0;
            st.i += n;
            continue;
        }
        let bs = block.eq(b'\\');
        let mut closing = block.eq(b'"');
        if bs | st.carry != 0 {
            let (escaped, carry_out) = escaped_bytes(bs, st.carry, n);
            closing &= !escaped;
            st.carry = carry_out;
        }
        let before = if closing != 0 {
            low_bits(closing.trailing_zeros() as usize)
        } else {
            low_bits(n)
        };
        st.backslashes |= bs & before != 0;
        st.high |= block.high() & before != 0;
        let newlines = block.eq(b'\n') & before;
        if newlines != 0 {
            // Rare, and x86-64's baseline has no popcount instruction.
            st.newlines += newlines.count_ones() as usize;
        }
        if closing != 0 {
            return st.done(i + closing.trailing_zeros() as usize);
        }
        if real < n {
            return st.done(buf.len());
        }
        st.i += n;
    }
}

/// A whole scan with blocks of type `B`, from `start` (after the opening quote).
#[cfg(test)]
#[inline(always)]
fn scan_string_with<B: Block>(buf: &[u8], start: usize) -> StringScan {
    let st = ScanState {
        i: start,
        carry: 0,
        backslashes: false,
        high: false,
        newlines: 0,
    };
    scan_on::<B>(buf, st)
}

/// One implementation of a scan; unsafe to call because it may use instructions that only
/// some CPUs have.
#[cfg(target_arch = "x86_64")]
type ScanOnFn = unsafe fn(&[u8], ScanState) -> StringScan;

/// The AVX2 scan, or `None` when this CPU lacks AVX2.
#[cfg(target_arch = "x86_64")]
fn scan_on_avx2() -> Option<ScanOnFn> {
    #[target_feature(enable = "avx2")]
    fn avx2(buf: &[u8], st: ScanState) -> StringScan {
        scan_on::<x86::Avx2>(buf, st)
    }
    std::is_x86_feature_detected!("avx2").then_some(avx2 as ScanOnFn)
}

/// One whole string scan.
#[cfg(test)]
type ScanFn = fn(&[u8], usize) -> StringScan;

/// Every string scan this CPU can run, by name, the portable one first.
#[cfg(test)]
fn scan_implementations() -> Vec<(&'static str, ScanFn)> {
    let mut all: Vec<(&'static str, ScanFn)> =
        vec![("word", scan_string_with::<Word>), ("default", scan_string)];
    #[cfg(target_arch = "x86_64")]
    {
        all.push(("sse2", scan_string_with::<x86::Sse2>));
        #[target_feature(enable = "avx2")]
        fn unchecked(buf: &[u8], start: usize) -> StringScan {
            scan_string_with::<x86::Avx2>(buf, start)
        }
        fn avx2(buf: &[u8], start: usize) -> StringScan {
            // SAFETY: only handed out after `is_x86_feature_detected!("avx2")`.
            unsafe { unchecked(buf, start) }
        }
        if std::is_x86_feature_detected!("avx2") {
            all.push(("avx2", avx2));
        }
    }
    #[cfg(target_arch = "aarch64")]
    all.push(("neon", scan_string_with::<arm::Neon>));
    all
}

/// Scans a string field body from `start` (after its opening quote) with the widest blocks
/// this CPU has. On x86-64 that is AVX2 when present, chosen on first use: a heartbeat's
/// 50-byte payload is then two blocks instead of four SSE2 ones, which saves more than the
/// call through a pointer costs (a tenth of decoding a heartbeat, against inlined SSE2
/// blocks for the first 64 bytes). NEON, which every aarch64 CPU has, is inlined.
#[inline(always)]
pub(crate) fn scan_string(buf: &[u8], start: usize) -> StringScan {
    let st = ScanState {
        i: start,
        carry: 0,
        backslashes: false,
        high: false,
        newlines: 0,
    };
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static SCAN: OnceLock<ScanOnFn> = OnceLock::new();
        // Chosen without allocating: decoding allocates nothing, not even on first use.
        let scan = SCAN.get_or_init(|| scan_on_avx2().unwrap_or(scan_on::<x86::Sse2>));
        // SAFETY: `scan` runs only with instructions this CPU has (see `scan_on_avx2`).
        unsafe { scan(buf, st) }
    }
    #[cfg(target_arch = "aarch64")]
    return scan_on::<arm::Neon>(buf, st);
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    return scan_on::<Word>(buf, st);
}

/// The index of the first `a` or `b` at or after `i`, or `buf.len()`: how a token of an
/// already validated section is found again (a key ends at its first `=` and a tag value at
/// its first comma unless a backslash comes first), with two comparisons per 16 bytes
/// instead of the token scanner's six.
#[inline(always)]
pub(crate) fn find2(buf: &[u8], mut i: usize, a: u8, b: u8) -> usize {
    #[cfg(target_arch = "x86_64")]
    while i + 16 <= buf.len() {
        use std::arch::x86_64::*;
        // SAFETY: SSE2 is part of the x86-64 baseline, and `buf[i..i + 16]` is readable.
        let found = unsafe {
            let v = _mm_loadu_si128(buf.as_ptr().add(i).cast());
            let eq = |x: u8| _mm_cmpeq_epi8(v, _mm_set1_epi8(x as i8));
            _mm_movemask_epi8(_mm_or_si128(eq(a), eq(b))) as u32
        };
        if found != 0 {
            return i + found.trailing_zeros() as usize;
        }
        i += 16;
    }
    while i < buf.len() && buf[i] != a && buf[i] != b {
        i += 1;
    }
    i
}

/// The stop bytes of 64 bytes of the input, found once for every token that lies in them.
///
/// A line's measurement, tag keys and values and field keys are mostly a few bytes long, and
/// where one ends decides where the next starts: with a block load and six comparisons per
/// token, each token waited for the previous one's whole chain of loads, comparisons and
/// counts. A window finds the stops of 64 bytes at a time, so the tokens of a short line are
/// each ended with a shift and a count of bits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StopWindow {
    /// Where the window starts in the input.
    base: usize,
    /// 64 once the window holds masks, 0 before.
    len: usize,
    /// Bit `k`: byte `base + k` is a space, comma, backslash, control character, DEL or above
    /// 0x7f (what ends or needs a closer look in a measurement), or lies past the input.
    plain: u64,
    /// Bit `k`: byte `base + k` is `=` (what also ends a key or tag value).
    equals: u64,
}

impl StopWindow {
    /// A window that holds nothing yet.
    #[inline(always)]
    pub(crate) const fn new() -> Self {
        StopWindow {
            base: 0,
            len: 0,
            plain: 0,
            equals: 0,
        }
    }

    /// The index of the first byte at or after `i` that the token scanner's stop table
    /// holds (`MEASUREMENT_STOP`, or `KEY_STOP` when `with_equals`), or `buf.len()`.
    #[inline(always)]
    pub(crate) fn skip(&mut self, buf: &[u8], i: usize, with_equals: bool) -> usize {
        #[cfg(target_arch = "x86_64")]
        {
            let mut i = i;
            loop {
                let off = i.wrapping_sub(self.base);
                if off < self.len {
                    let stops = self.plain | if with_equals { self.equals } else { 0 };
                    let m = stops >> off;
                    if m != 0 {
                        // Past the input every byte counts as a stop: the first is its end.
                        return (i + m.trailing_zeros() as usize).min(buf.len());
                    }
                    i = self.base + self.len;
                }
                if i >= buf.len() {
                    return buf.len();
                }
                self.fill(buf, i);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            use crate::lineproto::table::{KEY_STOP, MEASUREMENT_STOP};
            let _ = self;
            let stop = if with_equals {
                &KEY_STOP
            } else {
                &MEASUREMENT_STOP
            };
            let mut i = i;
            while i < buf.len() && !stop[usize::from(buf[i])] {
                i += 1;
            }
            i
        }
    }

    /// Finds the stops of the 64 bytes from `i` (`i < buf.len()`); bytes past the input
    /// count as stops.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn fill(&mut self, buf: &[u8], i: usize) {
        use std::arch::x86_64::*;
        let mut padded = [0u8; 64];
        let p = if i + 64 <= buf.len() {
            // SAFETY: `i + 64 <= buf.len()`.
            unsafe { buf.as_ptr().add(i) }
        } else {
            // The last bytes: zeros are control characters, so stops.
            padded[..buf.len() - i].copy_from_slice(&buf[i..]);
            padded.as_ptr()
        };
        let (mut plain, mut equals) = (0u64, 0u64);
        for k in 0..4 {
            // SAFETY: SSE2 is part of the x86-64 baseline, and `p..p + 64` is readable.
            let (s, e) = unsafe {
                let v = _mm_loadu_si128(p.add(16 * k).cast());
                let eq = |b: u8| _mm_cmpeq_epi8(v, _mm_set1_epi8(b as i8));
                let stops = _mm_or_si128(
                    _mm_or_si128(_mm_or_si128(eq(b' '), eq(b',')), eq(b'\\')),
                    // Signed: bytes above 0x7f are negative, so one comparison finds them and
                    // the control characters.
                    _mm_or_si128(_mm_cmplt_epi8(v, _mm_set1_epi8(0x20)), eq(0x7f)),
                );
                (
                    _mm_movemask_epi8(stops) as u32 as u64,
                    _mm_movemask_epi8(eq(b'=')) as u32 as u64,
                )
            };
            plain |= s << (16 * k);
            equals |= e << (16 * k);
        }
        *self = StopWindow {
            base: i,
            len: 64,
            plain,
            equals,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_window_stops_exactly_where_the_stop_tables_do() {
        use crate::lineproto::table::{KEY_STOP, MEASUREMENT_STOP};
        for (stop, with_equals) in [(&KEY_STOP, true), (&MEASUREMENT_STOP, false)] {
            let by_table = |buf: &[u8], mut i: usize| {
                while i < buf.len() && !stop[usize::from(buf[i])] {
                    i += 1;
                }
                i
            };
            for byte in 0..=255u8 {
                // Inputs shorter than a window, as long, and longer (the window moves on).
                for len in [1, 15, 16, 17, 63, 64, 65, 100, 130] {
                    for at in (0..len).step_by(if len > 70 { 7 } else { 1 }) {
                        let mut buf = vec![b'a'; len];
                        buf[at] = byte;
                        for from in 0..=at {
                            let mut window = StopWindow::new();
                            assert_eq!(
                                window.skip(&buf, from, with_equals),
                                by_table(&buf, from),
                                "byte {byte} at {at} of {len}, from {from}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn one_stop_window_ends_every_token_of_a_line_as_the_stop_tables_do() {
        use crate::lineproto::table::{KEY_STOP, MEASUREMENT_STOP};
        // Tokens of many lengths in a row, read with one window as the decoder does: each
        // from just past the previous one's stop, with or without `=` as a stop.
        let mut line = Vec::new();
        for n in 0..40usize {
            line.extend(std::iter::repeat_n(b'x', n % 23));
            line.push([b' ', b',', b'=', b'\\', 0x7f, 0x80, b'\t'][n % 7]);
        }
        for (stop, with_equals) in [(&KEY_STOP, true), (&MEASUREMENT_STOP, false)] {
            for first in 0..70 {
                let mut window = StopWindow::new();
                let mut i = first;
                while i < line.len() {
                    let mut expected = i;
                    while expected < line.len() && !stop[usize::from(line[expected])] {
                        expected += 1;
                    }
                    assert_eq!(window.skip(&line, i, with_equals), expected, "from {i}");
                    i = expected + 1;
                }
            }
        }
    }

    #[test]
    fn find2_finds_the_first_of_two_bytes_for_every_length_position_and_start() {
        for len in 0..=40usize {
            for at in (0..len).map(Some).chain([None]) {
                for (needle, other) in [(b'=', b'\\'), (b'\\', b'='), (b',', b'\\')] {
                    let mut buf = vec![b'a'; len];
                    if let Some(at) = at {
                        buf[at] = needle;
                        // The other byte later on, where it must not be found first.
                        if at + 3 < len {
                            buf[at + 3] = other;
                        }
                    }
                    for from in 0..=len {
                        let want = (from..len)
                            .find(|&i| buf[i] == needle || buf[i] == other)
                            .unwrap_or(len);
                        assert_eq!(
                            find2(&buf, from, needle, other),
                            want,
                            "{len} {at:?} {from}"
                        );
                    }
                }
            }
        }
    }

    /// A byte-at-a-time reference for `scan_string`.
    fn reference_scan(buf: &[u8], start: usize) -> StringScan {
        let (mut i, mut escaped, mut newlines, mut high) = (start, false, 0, false);
        while i < buf.len() {
            match buf[i] {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    match buf.get(i + 1) {
                        Some(b'\n') => newlines += 1,
                        Some(&b) if b >= 0x80 => high = true,
                        _ => {}
                    }
                    i += 2;
                }
                b => {
                    newlines += usize::from(b == b'\n');
                    high |= b >= 0x80;
                    i += 1;
                }
            }
        }
        StringScan {
            close: i.min(buf.len()),
            escaped,
            newlines,
            high,
        }
    }

    /// Every special the string scan looks for, alone and in the pairs that straddle blocks.
    const STRING_SPECIALS: [&[u8]; 11] = [
        b"",
        b"\"",
        b"\\",
        b"\\\"",
        b"\\\\",
        b"\n",
        b"\\\n",
        b"\\n",
        b"\"\"",
        b"\\\\\\\"",
        "é".as_bytes(),
    ];

    #[test]
    fn string_scans_agree_with_a_byte_loop_for_every_length_and_position() {
        // Strings of 0..=80 bytes, with each special at every position (or at the very end,
        // where a backslash has nothing to escape), after openings of every alignment.
        for (name, scan) in scan_implementations() {
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
                            assert_eq!(
                                scan(&buf, start),
                                reference_scan(&buf, start),
                                "{name} {:?}",
                                buf.escape_ascii()
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn string_scans_agree_with_a_byte_loop_on_random_strings() {
        let pieces: [&[u8]; 9] = [
            b"a",
            b"\\",
            b"\\\"",
            b"\\\\",
            b"\n",
            b"\\\n",
            b"xyzxyzxyzxyzxyzxyzxyzxyzxyzxyzxyzxyzx",
            b"\"",
            "é".as_bytes(),
        ];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for (name, scan) in scan_implementations() {
            for _ in 0..5000 {
                let mut buf = b"\"".to_vec();
                for _ in 0..seed % 40 {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    buf.extend_from_slice(pieces[(seed % pieces.len() as u64) as usize]);
                }
                assert_eq!(
                    scan(&buf, 1),
                    reference_scan(&buf, 1),
                    "{name} {:?}",
                    buf.escape_ascii()
                );
            }
        }
    }
}
