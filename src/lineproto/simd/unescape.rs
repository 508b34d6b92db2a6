//! Unescaping a token block at a time, with one implementation per instruction set and
//! the fastest this CPU runs chosen once per process.

#[cfg(target_arch = "aarch64")]
use super::block::arm;
#[cfg(target_arch = "x86_64")]
use super::block::x86;
use super::block::{Block, Word, escaped_bytes, low_bits};
use crate::lineproto::kind::TokenKind;

/// Token kinds as const-generic parameters, so that each kind gets its own loop.
const MEASUREMENT: u8 = 0;
const KEY: u8 = 1;
const STRING: u8 = 2;

/// Extra bytes past the unescaped text that the block stores may write.
pub(crate) const OVERHANG: usize = 64;

/// Whether `b` completes an escape in a token of kind `K` when a backslash precedes it.
#[inline(always)]
fn completes_escape<const K: u8>(b: u8) -> bool {
    match K {
        MEASUREMENT => matches!(b, b' ' | b','),
        KEY => matches!(b, b' ' | b',' | b'='),
        _ => matches!(b, b'\\' | b'"' | b'n' | b'r' | b't'),
    }
}

/// The state carried from one block to the next while unescaping.
#[derive(Default)]
struct Carry {
    /// Byte 0 of the block follows a backslash that starts an escape (strings only).
    escaped: u64,
    /// That escape was a real one, so byte 0 is its (possibly translated) byte.
    translated: u64,
}

/// What unescaping does to one block of a token of kind `K` whose following byte is
/// `next`: the bytes it drops (each escaping backslash) and the bytes it translates (the
/// `n`, `r`, `t` of an escape); advances the carried escape state.
///
/// The first `skip` bytes of the block are left out (they were done already): the masks
/// returned describe bytes `skip..N` as bits `0..N - skip`.
#[inline(always)]
fn escape_masks<B: Block, const K: u8>(
    block: B,
    next: u8,
    carry: &mut Carry,
    skip: usize,
) -> (u64, u64) {
    let n = B::N - skip;
    let bs = block.eq(b'\\') >> skip;
    let next_completes = u64::from(completes_escape::<K>(next)) << (n - 1);
    if K == STRING {
        if bs | carry.escaped == 0 {
            (0, 0)
        } else {
            let nrt = block.eq3(b'n', b'r', b't') >> skip;
            let completes = bs | block.eq(b'"') >> skip | nrt;
            let (escaped, carry_out) = escaped_bytes(bs, carry.escaped, n);
            let starts = (escaped >> 1) | (carry_out << (n - 1));
            let drops = starts & ((completes >> 1) | next_completes);
            let translate = (((drops << 1) & low_bits(n)) | carry.translated) & nrt;
            carry.escaped = carry_out;
            carry.translated = drops >> (n - 1);
            (drops, translate)
        }
    } else if bs == 0 {
        (0, 0)
    } else {
        let completes = if K == KEY {
            block.eq3(b' ', b',', b'=')
        } else {
            block.eq(b' ') | block.eq(b',')
        } >> skip;
        (bs & ((completes >> 1) | next_completes), 0)
    }
}

/// Unescapes one block at `p` whose following byte is `next`, writing from `dst + w`;
/// returns the new write position.
///
/// # Safety
/// `p..p + N` must be readable, and `p..p + 2 * N` unless `B::STORES_ALL`;
/// `dst + w..dst + w + 2 * N` must be writable.
#[inline(always)]
unsafe fn unescape_block<B: Block, const K: u8>(
    p: *const u8,
    next: u8,
    carry: &mut Carry,
    dst: *mut u8,
    w: usize,
) -> usize {
    // SAFETY: `p..p + N` is readable (caller).
    let block = unsafe { B::load(p) };
    let (drops, translate) = escape_masks::<B, K>(block, next, carry, 0);
    // SAFETY: the caller's guarantees.
    unsafe { store_unescaped(block, p, drops, translate, dst, w) }
}

/// Writes the block loaded from `p` from `dst + w` without the bytes in `drops`,
/// translating the bytes in `translate` (the `n`, `r`, `t` of escapes); returns the new
/// write position.
///
/// # Safety
/// `p..p + N` must be readable, and `p..p + 2 * N` unless `B::STORES_ALL`;
/// `dst + w..dst + w + 2 * N` must be writable.
#[inline(always)]
unsafe fn store_unescaped<B: Block>(
    block: B,
    p: *const u8,
    drops: u64,
    translate: u64,
    dst: *mut u8,
    mut w: usize,
) -> usize {
    let n = B::N;
    // SAFETY (all stores and loads below): each store writes N bytes at `dst + w` where `w`
    // has advanced by at most N since the call, within the caller's writable range; each
    // load reads N bytes from `p + seg` with `seg <= N`, within `p..p + 2 * N` (only blocks
    // that are not `STORES_ALL` load again); translated bytes are read below `p + N`.
    unsafe {
        if drops == 0 && translate == 0 {
            block.store(dst.add(w));
            return w + n;
        }
        if !B::STORES_ALL || drops == 0 {
            block.store(dst.add(w));
        }
        let start = w;
        w = block.store_without(p, drops, dst, w);
        let mut t = translate;
        while t != 0 {
            let at = t.trailing_zeros() as usize;
            let out = start + at - (drops & low_bits(at)).count_ones() as usize;
            *dst.add(out) = match *p.add(at) {
                b'n' => b'\n',
                b'r' => b'\r',
                _ => b'\t',
            };
            t &= t - 1;
        }
    }
    w
}

/// Unescapes blocks of `src` from `*r` (writing from `*w`) while two whole blocks remain,
/// or, for blocks that store without loading again (`STORES_ALL`), while a whole block and
/// the byte after it remain.
///
/// # Safety
/// `dst..dst + src.len() + OVERHANG` must be writable, and `*w <= *r`.
#[inline(always)]
unsafe fn unescape_run<B: Block, const K: u8>(
    src: &[u8],
    r: &mut usize,
    w: &mut usize,
    carry: &mut Carry,
    dst: *mut u8,
) {
    let n = B::N;
    let ahead = if B::STORES_ALL { 1 } else { n };
    while *r + n + ahead <= src.len() {
        // SAFETY: `src[r..r + N + ahead]` is readable, which is what the block reads; it
        // writes at most `2N` bytes past `w <= r` (unescaping never grows the text), within
        // `src.len() + OVERHANG`.
        *w = unsafe { unescape_block::<B, K>(src.as_ptr().add(*r), src[*r + n], carry, dst, *w) };
        *r += n;
    }
}

/// Unescapes `src` (a token of kind `K`) into `dst` with blocks of type `B`, and the last
/// bytes with blocks of type `T` (at most 16 bytes wide) or, when `B` stores without
/// loading again and `src` holds a whole block, with one last block of type `B` that ends
/// with `src`; returns the length written.
///
/// # Safety
/// `dst..dst + src.len() + OVERHANG` must be writable.
#[inline(always)]
unsafe fn unescape_with<B: Block, T: Block, const K: u8>(src: &[u8], dst: *mut u8) -> usize {
    let mut carry = Carry::default();
    let (mut r, mut w) = (0, 0);
    // SAFETY: the caller's guarantee, and `w <= r` throughout. Narrower blocks take over
    // as fewer bytes remain; the escape state carries over whatever the width.
    unsafe {
        unescape_run::<B, K>(src, &mut r, &mut w, &mut carry, dst);
        if B::STORES_ALL && src.len() >= B::N {
            // The last 1 to N bytes: one block that ends with `src`, its first bytes (done
            // already) dropped.
            if r < src.len() {
                let q = src.len() - B::N;
                let skip = r - q;
                let p = src.as_ptr().add(q);
                let block = B::load(p);
                let (drops, translate) = escape_masks::<B, K>(block, 0, &mut carry, skip);
                let drops = (drops << skip) | low_bits(skip);
                w = store_unescaped(block, p, drops, translate << skip, dst, w);
            }
            return w;
        }
        unescape_run::<B::Half, K>(src, &mut r, &mut w, &mut carry, dst);
        unescape_run::<T, K>(src, &mut r, &mut w, &mut carry, dst);
    }
    // The last bytes (fewer than two blocks of `T`), zero-padded so the same masks apply:
    // a zero byte is never a backslash nor completes an escape, so it is kept as it is and
    // the padding written past the text is simply not counted. The padded block is built
    // in registers from loads that overlap bytes already done (a copy into a padded buffer
    // made each block load wait for the copy's stores: a quarter of unescaping a heartbeat),
    // and the escapes are taken out of it in registers too.
    let n = T::N;
    debug_assert!(n <= 16);
    let rest = src.len() - r;
    debug_assert!(rest < 2 * n);
    let mut t = 0;
    while t < rest {
        let at = r + t;
        let mut x = load_padded(src, at);
        let next = src.get(at + n).copied().unwrap_or(0);
        let (drops, translate) = escape_masks::<T, K>(T::from_u128(x), next, &mut carry, 0);
        let mut tr = translate;
        while tr != 0 {
            let shift = 8 * tr.trailing_zeros();
            let to = match (x >> shift) as u8 {
                b'n' => b'\n',
                b'r' => b'\r',
                _ => b'\t',
            };
            x = (x & !(0xff << shift)) | u128::from(to) << shift;
            tr &= tr - 1;
        }
        // From the highest dropped byte down, so that the lower ones stay where they are.
        let mut d = drops;
        let mut kept = n;
        while d != 0 {
            let at = 63 - d.leading_zeros();
            let below = (1u128 << (8 * at)) - 1;
            x = (x & below) | ((x >> 8) & !below);
            d &= !(1 << at);
            kept -= 1;
        }
        // SAFETY: `w <= at < src.len()`, so the 16 bytes written end before
        // `src.len() + 16 <= src.len() + OVERHANG`.
        unsafe { dst.add(w).cast::<u128>().write_unaligned(x.to_le()) };
        w += kept;
        t += n;
    }
    w - (t.max(rest) - rest)
}

/// The bytes of `src` from `at` (which is inside it), zero-padded to 16 bytes as a
/// little-endian number, read without touching memory past `src`: from the last 16 bytes
/// of `src` when it has that many, else from smaller loads that overlap.
#[inline(always)]
fn load_padded(src: &[u8], at: usize) -> u128 {
    let len = src.len();
    debug_assert!(at < len);
    let u128_at = |i: usize| u128::from_le_bytes(src[i..i + 16].try_into().expect("16 bytes"));
    if at + 16 <= len {
        return u128_at(at);
    }
    if len >= 16 {
        // 1 to 15 bytes of the last 16 are before `at`.
        return u128_at(len - 16) >> (8 * (at + 16 - len));
    }
    let s = &src[at..];
    let k = s.len();
    let word = |i: usize| u128::from(u64::from_le_bytes(s[i..i + 8].try_into().expect("8")));
    let half = |i: usize| u128::from(u32::from_le_bytes(s[i..i + 4].try_into().expect("4")));
    match k {
        8.. => word(0) | (word(k - 8) >> (8 * (16 - k))) << 64,
        4.. => half(0) | (half(k - 4) >> (8 * (8 - k))) << 32,
        // 1 to 3 bytes: the first, middle and last (some the same byte).
        _ => {
            let byte = |i: usize| u128::from(s[i]) << (8 * i);
            byte(0) | byte(k / 2) | byte(k - 1)
        }
    }
}

/// One unescaping implementation: appends the unescaped token to the string. Not a stable
/// API.
pub type UnescapeFn = fn(&str, TokenKind, &mut String);

/// Appends the unescaped `raw` to `out`, using blocks of type `B`.
///
/// # Safety
/// The CPU must support `B`'s instructions.
#[inline(always)]
unsafe fn unescape_into_with<B: Block, T: Block>(raw: &str, kind: TokenKind, out: &mut String) {
    let src = raw.as_bytes();
    // SAFETY: the bytes written are `raw`'s bytes with whole escape sequences (ASCII) either
    // kept, or replaced by a single ASCII byte; runs between them are cut next to ASCII
    // backslashes, so every multi-byte character is copied whole and the result is UTF-8.
    let buf = unsafe { out.as_mut_vec() };
    buf.reserve(src.len() + OVERHANG);
    let base = buf.len();
    // SAFETY: `reserve` made `src.len() + OVERHANG` bytes writable after `base`; the
    // length set afterwards covers only bytes that were written.
    unsafe {
        let dst = buf.as_mut_ptr().add(base);
        let written = match kind {
            TokenKind::Measurement => unescape_with::<B, T, MEASUREMENT>(src, dst),
            TokenKind::Key => unescape_with::<B, T, KEY>(src, dst),
            TokenKind::StringField => unescape_with::<B, T, STRING>(src, dst),
        };
        buf.set_len(base + written);
    }
}

/// The portable implementation (eight bytes at a time).
pub(crate) fn unescape_word(raw: &str, kind: TokenKind, out: &mut String) {
    // SAFETY: `Word` uses plain integer arithmetic only.
    unsafe { unescape_into_with::<Word, Word>(raw, kind, out) }
}

/// The SSE2 implementation.
#[cfg(target_arch = "x86_64")]
pub(crate) fn unescape_sse2(raw: &str, kind: TokenKind, out: &mut String) {
    // SAFETY: SSE2 is part of the x86-64 baseline.
    unsafe { unescape_into_with::<x86::Sse2, x86::Sse2>(raw, kind, out) }
}

/// The AVX2 implementation.
///
/// # Safety
/// The CPU must support AVX2 and POPCNT (every AVX2 CPU has both).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn unescape_avx2_unchecked(raw: &str, kind: TokenKind, out: &mut String) {
    // SAFETY: the caller checked for AVX2.
    unsafe { unescape_into_with::<x86::Avx2, x86::Sse2>(raw, kind, out) }
}

/// The AVX-512 implementation (32-byte blocks compacted with VBMI2's `vpcompressb`).
///
/// # Safety
/// The CPU must support AVX2, AVX-512 F, BW, VL and VBMI2, and POPCNT.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vbmi2,popcnt")]
unsafe fn unescape_avx512_unchecked(raw: &str, kind: TokenKind, out: &mut String) {
    // SAFETY: the caller checked for these features.
    unsafe { unescape_into_with::<x86::Avx512, x86::Sse2>(raw, kind, out) }
}

/// The AVX-512 VBMI2 implementation, or `None` when this CPU lacks it.
#[cfg(target_arch = "x86_64")]
pub(crate) fn unescape_avx512() -> Option<UnescapeFn> {
    fn avx512(raw: &str, kind: TokenKind, out: &mut String) {
        // SAFETY: this function is only handed out after `is_x86_feature_detected!` found
        // every feature it needs.
        unsafe { unescape_avx512_unchecked(raw, kind, out) }
    }
    (std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512bw")
        && std::is_x86_feature_detected!("avx512vl")
        && std::is_x86_feature_detected!("avx512vbmi2")
        && std::is_x86_feature_detected!("popcnt"))
    .then_some(avx512 as UnescapeFn)
}

/// The AVX2 implementation, or `None` when this CPU lacks AVX2.
#[cfg(target_arch = "x86_64")]
pub(crate) fn unescape_avx2() -> Option<UnescapeFn> {
    fn avx2(raw: &str, kind: TokenKind, out: &mut String) {
        // SAFETY: this function is only handed out after `is_x86_feature_detected!` found
        // AVX2 and POPCNT.
        unsafe { unescape_avx2_unchecked(raw, kind, out) }
    }
    (std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("popcnt"))
        .then_some(avx2 as UnescapeFn)
}

/// The NEON implementation.
#[cfg(target_arch = "aarch64")]
pub(crate) fn unescape_neon(raw: &str, kind: TokenKind, out: &mut String) {
    // SAFETY: NEON is part of the aarch64 baseline.
    unsafe { unescape_into_with::<arm::Neon, arm::Neon>(raw, kind, out) }
}

/// Every implementation this CPU can run, by name, the portable one first.
pub(crate) fn unescape_implementations() -> Vec<(&'static str, UnescapeFn)> {
    let mut all: Vec<(&'static str, UnescapeFn)> = vec![("word", unescape_word)];
    #[cfg(target_arch = "x86_64")]
    {
        all.push(("sse2", unescape_sse2));
        if let Some(avx2) = unescape_avx2() {
            all.push(("avx2", avx2));
        }
        if let Some(avx512) = unescape_avx512() {
            all.push(("avx512", avx512));
        }
    }
    #[cfg(target_arch = "aarch64")]
    all.push(("neon", unescape_neon));
    all
}

/// The fastest implementation for this CPU, chosen on first use.
fn best() -> UnescapeFn {
    use std::sync::OnceLock;
    static BEST: OnceLock<UnescapeFn> = OnceLock::new();
    // Chosen without allocating: decoding allocates nothing, not even on first use.
    *BEST.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        return unescape_avx512()
            .or_else(unescape_avx2)
            .unwrap_or(unescape_sse2);
        #[cfg(target_arch = "aarch64")]
        return unescape_neon;
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        return unescape_word;
    })
}

/// Appends the unescaped form of `raw` (a token of `kind`) to `out`.
#[inline]
pub(crate) fn unescape_into(raw: &str, kind: TokenKind, out: &mut String) {
    // Below 32 bytes AVX2 blocks would not be used (one must fit), so a short token (most
    // of them) skips the indirect call.
    #[cfg(target_arch = "x86_64")]
    if raw.len() < 32 {
        return unescape_sse2(raw, kind, out);
    }
    best()(raw, kind, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_loads_hold_the_bytes_from_the_position_then_zeros_for_every_length() {
        for len in 1..=48usize {
            let src: Vec<u8> = (0..len).map(|i| 0x80 | (i as u8).wrapping_mul(7)).collect();
            for at in 0..len {
                let mut want = [0u8; 16];
                let real = (len - at).min(16);
                want[..real].copy_from_slice(&src[at..at + real]);
                assert_eq!(
                    load_padded(&src, at),
                    u128::from_le_bytes(want),
                    "{len} {at}"
                );
            }
        }
    }
}
