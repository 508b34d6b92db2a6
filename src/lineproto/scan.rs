//! Finding the next backslash of a token, where backslashes are dense in JSON payloads (a
//! `\"` every few bytes) and sparse in plain text.
//!
//! A call to `memchr` costs a few nanoseconds of set-up, which dominates when the next match
//! is a handful of bytes away. So the first bytes are searched eight at a time with exact
//! SWAR arithmetic on a `u64` word, and only a longer run falls through to `memchr`'s SIMD.

const LO7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
const ONES: u64 = 0x0101_0101_0101_0101;
/// How far the word-at-a-time search goes before handing over to `memchr`.
const SWAR_SPAN: usize = 32;

/// High bit set in exactly the bytes of `word` equal to `byte` (no false positives).
#[inline(always)]
fn eq_mask(word: u64, byte: u8) -> u64 {
    let x = word ^ (ONES * u64::from(byte));
    !(((x & LO7) + LO7) | x | LO7)
}

#[inline(always)]
pub(crate) fn load(bytes: &[u8], i: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[i..i + 8]);
    u64::from_le_bytes(word)
}

/// The index of the first `byte` at or after `from`; `None` also when `from` is past the end.
#[inline]
pub(crate) fn find1(bytes: &[u8], from: usize, byte: u8) -> Option<usize> {
    if from >= bytes.len() {
        return None;
    }
    let mut i = from;
    let swar_end = bytes.len().min(from.saturating_add(SWAR_SPAN));
    while i + 8 <= swar_end {
        let mask = eq_mask(load(bytes, i), byte);
        if mask != 0 {
            return Some(i + (mask.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    memchr::memchr(byte, &bytes[i..]).map(|offset| i + offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference_mask(word: u64, wanted: impl Fn(u8) -> bool) -> u64 {
        (0..8)
            .filter(|&i| wanted(word.to_le_bytes()[i]))
            .map(|i| 0x80u64 << (i * 8))
            .sum()
    }

    #[test]
    fn word_masks_are_exact_for_every_byte_in_every_lane() {
        for byte in 0..=255u8 {
            for lane in 0..8 {
                for background in [0u8, b'a', 0x7f, 0x80, 0xff, byte ^ 1, byte.wrapping_add(1)] {
                    let mut bytes = [background; 8];
                    bytes[lane] = byte;
                    // A neighbour equal to the byte one below a special is where borrows
                    // in word arithmetic would show.
                    bytes[(lane + 1) % 8] = byte.wrapping_sub(1);
                    let word = u64::from_le_bytes(bytes);
                    assert_eq!(eq_mask(word, byte), reference_mask(word, |b| b == byte));
                }
            }
        }
    }

    #[test]
    fn searches_agree_with_a_byte_loop_for_every_length_position_and_start() {
        // Haystacks of 0..=80 bytes with the needle at every position (or absent), searched
        // from every start including past the end: every split between the word loop and
        // `memchr`, and every tail.
        for len in 0..=80usize {
            for at in (0..len).map(Some).chain([None]) {
                for needle in [b'"', b'\\', b'\n'] {
                    let mut hay = vec![b'a'; len];
                    if let Some(at) = at {
                        hay[at] = needle;
                    }
                    for from in 0..=len + 9 {
                        let want1 = hay
                            .iter()
                            .enumerate()
                            .skip(from)
                            .find(|&(_, &b)| b == needle)
                            .map(|(i, _)| i);
                        assert_eq!(find1(&hay, from, needle), want1, "{len} {at:?} {from}");
                    }
                }
            }
        }
    }

    #[test]
    fn agrees_with_a_plain_search() {
        let hay: Vec<u8> = (0..300u32).map(|i| (i * 37 % 251) as u8).collect();
        for from in 0..hay.len() {
            for a in [b'"', b'\\', b'\n', 0, 1, 0x7f, 0x80, 0xff, 200] {
                let want1 = hay[from..].iter().position(|&x| x == a).map(|p| p + from);
                assert_eq!(find1(&hay, from, a), want1);
            }
        }
    }
}
