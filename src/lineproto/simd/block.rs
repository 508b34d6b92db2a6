//! The block types: a `u64` word (portable), SSE2 and AVX2 and AVX-512 registers (x86-64)
//! and NEON registers (aarch64), each turning its bytes into bit masks; and the carry
//! arithmetic that finds which bytes of a block a backslash escapes.

/// A block of input bytes and the masks the algorithms need.
pub(crate) trait Block: Copy {
    /// Bytes per block (at most 32, so masks and their carries fit a `u64`).
    const N: usize;
    /// Loads `N` bytes.
    ///
    /// # Safety
    /// `p..p + N` must be readable.
    unsafe fn load(p: *const u8) -> Self;
    /// Stores the `N` bytes.
    ///
    /// # Safety
    /// `p..p + N` must be writable.
    unsafe fn store(self, p: *mut u8);
    /// Bit `i` set when byte `i` equals `b`.
    fn eq(self, b: u8) -> u64;
    /// Bit `i` set when byte `i` is above 0x7f.
    fn high(self) -> u64;
    /// Bit `i` set when byte `i` is `a`, `b` or `c`.
    #[inline(always)]
    fn eq3(self, a: u8, b: u8, c: u8) -> u64 {
        self.eq(a) | self.eq(b) | self.eq(c)
    }
    /// Whether [`store_without`](Block::store_without) writes every kept byte itself, so
    /// the caller need not store the whole block first.
    const STORES_ALL: bool = false;
    /// Whether any byte is a quote, a backslash, a newline or above 0x7f: what a string
    /// scan must look at more closely.
    #[inline(always)]
    fn any_string_special(self) -> bool {
        self.eq(b'"') | self.eq(b'\\') | self.eq(b'\n') | self.high() != 0
    }
    /// Writes the block without the bytes in `drops` (stored whole at `dst + w` by the
    /// caller already, unless [`STORES_ALL`](Block::STORES_ALL)) from `dst + w`; returns the
    /// new write position.
    ///
    /// The portable way: each run between dropped bytes is loaded afresh from `p` and stored
    /// as a whole block, so a run costs one load and one store whatever its length.
    ///
    /// # Safety
    /// `p..p + 2N` readable, `dst + w..dst + w + 2N` writable, and `p` the block's address.
    #[inline(always)]
    unsafe fn store_without(self, p: *const u8, drops: u64, dst: *mut u8, mut w: usize) -> usize {
        let mut seg = 0;
        let mut d = drops;
        // SAFETY: each load reads N bytes from `p + seg` with `seg <= N`; each store writes N
        // bytes at `dst + w` with `w` advanced by less than N since the call.
        unsafe {
            while d != 0 {
                let at = d.trailing_zeros() as usize;
                if seg > 0 {
                    Self::load(p.add(seg)).store(dst.add(w));
                }
                w += at - seg;
                seg = at + 1;
                d &= d - 1;
            }
            if seg > 0 {
                Self::load(p.add(seg)).store(dst.add(w));
            }
        }
        w + Self::N - seg
    }
    /// The next narrower block type worth using for the last bytes (itself when none is:
    /// word arithmetic is slower than padding a short tail for 16-byte registers).
    type Half: Block;
    /// The block of the low `N` bytes of `x` (little-endian; the bytes above 16 are zero).
    #[inline(always)]
    fn from_u128(x: u128) -> Self {
        let mut bytes = [0u8; 32];
        bytes[..16].copy_from_slice(&x.to_le_bytes());
        // SAFETY: `bytes` holds 32 >= N readable bytes.
        unsafe { Self::load(bytes.as_ptr()) }
    }
}

/// The portable block: eight bytes in a `u64`, compared with exact SWAR arithmetic.
#[derive(Clone, Copy)]
pub(crate) struct Word(u64);

impl Word {
    /// Packs the high bit of each byte into bit `i` of the result (byte `i` -> bit `i`).
    #[inline(always)]
    fn pack(high_bits: u64) -> u64 {
        ((high_bits >> 7) & 0x0101_0101_0101_0101).wrapping_mul(0x0102_0408_1020_4080) >> 56
    }
}

impl Block for Word {
    const N: usize = 8;
    type Half = Word;

    #[inline(always)]
    fn from_u128(x: u128) -> Self {
        Word(x as u64)
    }

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: the caller guarantees eight readable bytes; unaligned reads are allowed.
        Word(u64::from_le(unsafe { p.cast::<u64>().read_unaligned() }))
    }

    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        // SAFETY: the caller guarantees eight writable bytes; unaligned writes are allowed.
        unsafe { p.cast::<u64>().write_unaligned(self.0.to_le()) }
    }

    #[inline(always)]
    fn eq(self, b: u8) -> u64 {
        const LO7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
        let x = self.0 ^ (0x0101_0101_0101_0101 * u64::from(b));
        Self::pack(!(((x & LO7) + LO7) | x | LO7))
    }

    #[inline(always)]
    fn high(self) -> u64 {
        Self::pack(self.0 & 0x8080_8080_8080_8080)
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use super::Block;

    /// 16 bytes in an SSE2 register (SSE2 is part of every x86-64 CPU).
    #[derive(Clone, Copy)]
    pub(crate) struct Sse2(__m128i);

    impl Block for Sse2 {
        const N: usize = 16;
        type Half = Self;

        #[inline(always)]
        fn from_u128(x: u128) -> Self {
            // SAFETY: SSE2 is part of the x86-64 baseline. Built in registers: a block
            // stored to memory in two halves and loaded whole would wait for the stores.
            Sse2(unsafe { _mm_set_epi64x((x >> 64) as i64, x as i64) })
        }

        #[inline(always)]
        fn any_string_special(self) -> bool {
            // SAFETY: SSE2 is part of the x86-64 baseline.
            unsafe {
                let v = self.0;
                let special = _mm_or_si128(
                    _mm_or_si128(
                        _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8)),
                        _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8)),
                    ),
                    _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(b'\n' as i8)), v),
                );
                _mm_movemask_epi8(special) != 0
            }
        }

        #[inline(always)]
        unsafe fn load(p: *const u8) -> Self {
            // SAFETY: the caller guarantees 16 readable bytes; `loadu` allows any alignment.
            Sse2(unsafe { _mm_loadu_si128(p.cast()) })
        }

        #[inline(always)]
        unsafe fn store(self, p: *mut u8) {
            // SAFETY: the caller guarantees 16 writable bytes; `storeu` allows any alignment.
            unsafe { _mm_storeu_si128(p.cast(), self.0) }
        }

        #[inline(always)]
        fn eq(self, b: u8) -> u64 {
            // SAFETY: SSE2 is part of the x86-64 baseline.
            unsafe {
                let v = _mm_cmpeq_epi8(self.0, _mm_set1_epi8(b as i8));
                _mm_movemask_epi8(v) as u32 as u64
            }
        }

        #[inline(always)]
        fn high(self) -> u64 {
            // SAFETY: SSE2 is part of the x86-64 baseline.
            unsafe { _mm_movemask_epi8(self.0) as u32 as u64 }
        }

        #[inline(always)]
        fn eq3(self, a: u8, b: u8, c: u8) -> u64 {
            // SAFETY: SSE2 is part of the x86-64 baseline.
            unsafe {
                let eq = |x: u8| _mm_cmpeq_epi8(self.0, _mm_set1_epi8(x as i8));
                _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(eq(a), eq(b)), eq(c))) as u32 as u64
            }
        }
    }

    /// 32 bytes in an AVX2 register; only used where AVX2 was detected at run time.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx2(__m256i);

    /// For each byte `m` (bit `j` set = byte `j` dropped): the indices of the kept bytes of
    /// an 8-byte group in order, as a `pshufb` control (unused lanes 0x80, which zero).
    static COMPACT: [u64; 256] = {
        let mut table = [0u64; 256];
        let mut m = 0;
        while m < 256 {
            let mut control = [0x80u8; 8];
            let (mut j, mut k) = (0, 0);
            while j < 8 {
                if m >> j & 1 == 0 {
                    control[k] = j as u8;
                    k += 1;
                }
                j += 1;
            }
            table[m] = u64::from_le_bytes(control);
            m += 1;
        }
        table
    };

    /// [`COMPACT`] for the upper 8 bytes of a 16-byte half (indices 8 up; 0x80 + 8 still
    /// zeroes).
    static COMPACT_HI: [u64; 256] = {
        let mut table = [0u64; 256];
        let mut m = 0;
        while m < 256 {
            table[m] = COMPACT[m] + 0x0808_0808_0808_0808;
            m += 1;
        }
        table
    };

    impl Block for Avx2 {
        const N: usize = 32;
        type Half = Sse2;
        const STORES_ALL: bool = true;

        /// Branch-free: each 8-byte group is compacted with one `pshufb` (AVX2 implies
        /// SSSE3) from a table of shuffle controls and stored as 8 bytes, the write position
        /// advancing by the bytes it kept. Dense escapes (a JSON payload) would otherwise
        /// cost a hard-to-predict loop exit per block.
        #[inline(always)]
        unsafe fn store_without(
            self,
            _p: *const u8,
            drops: u64,
            dst: *mut u8,
            mut w: usize,
        ) -> usize {
            // SAFETY: an `Avx2` value exists only on CPUs with AVX2 (see `load`); each store
            // writes 8 bytes at `dst + w` with `w` advanced by at most 24 since the call.
            unsafe {
                let halves = [
                    _mm256_castsi256_si128(self.0),
                    _mm256_extracti128_si256::<1>(self.0),
                ];
                for (h, half) in halves.into_iter().enumerate() {
                    let m0 = (drops >> (16 * h)) as usize & 0xff;
                    let m1 = (drops >> (16 * h + 8)) as usize & 0xff;
                    let control = _mm_set_epi64x(COMPACT_HI[m1] as i64, COMPACT[m0] as i64);
                    let packed = _mm_shuffle_epi8(half, control);
                    _mm_storel_epi64(dst.add(w).cast(), packed);
                    w += 8 - (m0 as u8).count_ones() as usize;
                    _mm_storel_epi64(dst.add(w).cast(), _mm_unpackhi_epi64(packed, packed));
                    w += 8 - (m1 as u8).count_ones() as usize;
                }
            }
            w
        }

        #[inline(always)]
        fn any_string_special(self) -> bool {
            // SAFETY: an `Avx2` value exists only on CPUs with AVX2 (see `load`).
            unsafe {
                let v = self.0;
                let special = _mm256_or_si256(
                    _mm256_or_si256(
                        _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'"' as i8)),
                        _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'\\' as i8)),
                    ),
                    _mm256_or_si256(_mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'\n' as i8)), v),
                );
                _mm256_movemask_epi8(special) != 0
            }
        }

        #[inline(always)]
        unsafe fn load(p: *const u8) -> Self {
            // SAFETY: the caller guarantees 32 readable bytes and that the CPU has AVX2 (this
            // type is only used inside `#[target_feature(enable = "avx2")]` functions that
            // are called after `is_x86_feature_detected!("avx2")`).
            Avx2(unsafe { _mm256_loadu_si256(p.cast()) })
        }

        #[inline(always)]
        unsafe fn store(self, p: *mut u8) {
            // SAFETY: as for `load`, with 32 writable bytes.
            unsafe { _mm256_storeu_si256(p.cast(), self.0) }
        }

        #[inline(always)]
        fn eq(self, b: u8) -> u64 {
            // SAFETY: an `Avx2` value exists only on CPUs with AVX2 (see `load`).
            unsafe {
                let v = _mm256_cmpeq_epi8(self.0, _mm256_set1_epi8(b as i8));
                _mm256_movemask_epi8(v) as u32 as u64
            }
        }

        #[inline(always)]
        fn high(self) -> u64 {
            // SAFETY: an `Avx2` value exists only on CPUs with AVX2 (see `load`).
            unsafe { _mm256_movemask_epi8(self.0) as u32 as u64 }
        }

        #[inline(always)]
        fn eq3(self, a: u8, b: u8, c: u8) -> u64 {
            // SAFETY: an `Avx2` value exists only on CPUs with AVX2 (see `load`).
            unsafe {
                let eq = |x: u8| _mm256_cmpeq_epi8(self.0, _mm256_set1_epi8(x as i8));
                let any = _mm256_or_si256(_mm256_or_si256(eq(a), eq(b)), eq(c));
                _mm256_movemask_epi8(any) as u32 as u64
            }
        }
    }

    /// 32 bytes in an AVX2 register, on a CPU that also has AVX-512 VBMI2 (with BW and VL):
    /// the escapes are taken out of a block with one `vpcompressb` instead of a table
    /// lookup and a shuffle per 8 bytes. Only used where those were detected at run time.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx512(__m256i);

    impl Block for Avx512 {
        const N: usize = 32;
        type Half = Sse2;
        const STORES_ALL: bool = true;

        #[inline(always)]
        unsafe fn store_without(self, _p: *const u8, drops: u64, dst: *mut u8, w: usize) -> usize {
            // SAFETY: an `Avx512` value exists only on CPUs with AVX-512 VBMI2, BW and VL
            // (see `load`); the store writes 32 bytes at `dst + w`, within the caller's
            // writable range.
            unsafe {
                let packed = _mm256_maskz_compress_epi8(!(drops as u32), self.0);
                _mm256_storeu_si256(dst.add(w).cast(), packed);
            }
            w + 32 - (drops as u32).count_ones() as usize
        }

        #[inline(always)]
        fn any_string_special(self) -> bool {
            Avx2(self.0).any_string_special()
        }

        #[inline(always)]
        unsafe fn load(p: *const u8) -> Self {
            // SAFETY: the caller guarantees 32 readable bytes and that the CPU has AVX-512
            // VBMI2, BW and VL (this type is only used inside `#[target_feature]` functions
            // that are called after `is_x86_feature_detected!` found them).
            Avx512(unsafe { _mm256_loadu_si256(p.cast()) })
        }

        #[inline(always)]
        unsafe fn store(self, p: *mut u8) {
            // SAFETY: as for `load`, with 32 writable bytes.
            unsafe { _mm256_storeu_si256(p.cast(), self.0) }
        }

        #[inline(always)]
        fn eq(self, b: u8) -> u64 {
            // SAFETY: an `Avx512` value exists only on CPUs with AVX-512 BW and VL.
            unsafe { u64::from(_mm256_cmpeq_epi8_mask(self.0, _mm256_set1_epi8(b as i8))) }
        }

        #[inline(always)]
        fn high(self) -> u64 {
            // SAFETY: an `Avx512` value exists only on CPUs with AVX-512 BW and VL.
            unsafe { u64::from(_mm256_movepi8_mask(self.0)) }
        }
    }
}

#[cfg(target_arch = "aarch64")]
pub(super) mod arm {
    use std::arch::aarch64::*;

    use super::Block;

    /// 16 bytes in a NEON register (NEON is part of every aarch64 CPU).
    ///
    /// This implementation is compile-checked (`cargo check --target
    /// aarch64-unknown-linux-gnu`) but its tests only run on aarch64 machines.
    #[derive(Clone, Copy)]
    pub(crate) struct Neon(uint8x16_t);

    impl Neon {
        /// NEON has no movemask: weight each lane's 0x00/0xff by its bit and add the halves.
        #[inline(always)]
        fn pack(lanes: uint8x16_t) -> u64 {
            const WEIGHTS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
            // SAFETY: NEON is mandatory on aarch64; the weights array is 16 readable bytes.
            unsafe {
                let bits = vandq_u8(lanes, vld1q_u8(WEIGHTS.as_ptr()));
                let lo = vaddv_u8(vget_low_u8(bits)) as u64;
                let hi = vaddv_u8(vget_high_u8(bits)) as u64;
                lo | hi << 8
            }
        }
    }

    impl Block for Neon {
        const N: usize = 16;
        type Half = Self;

        #[inline(always)]
        unsafe fn load(p: *const u8) -> Self {
            // SAFETY: the caller guarantees 16 readable bytes; `vld1q_u8` allows any alignment.
            Neon(unsafe { vld1q_u8(p) })
        }

        #[inline(always)]
        unsafe fn store(self, p: *mut u8) {
            // SAFETY: the caller guarantees 16 writable bytes.
            unsafe { vst1q_u8(p, self.0) }
        }

        #[inline(always)]
        fn eq(self, b: u8) -> u64 {
            // SAFETY: NEON is mandatory on aarch64.
            Self::pack(unsafe { vceqq_u8(self.0, vdupq_n_u8(b)) })
        }

        #[inline(always)]
        fn high(self) -> u64 {
            // SAFETY: NEON is mandatory on aarch64.
            Self::pack(unsafe { vcgtq_u8(self.0, vdupq_n_u8(0x7f)) })
        }
    }
}

/// Bits `0..n`.
#[inline(always)]
pub(super) const fn low_bits(n: usize) -> u64 {
    (1u64 << n) - 1
}

/// The bytes of a block escaped by a backslash (the byte after a backslash that starts an
/// escape), given the backslash mask `bs` and whether byte 0 is escaped by the previous
/// block (`carry_in`, 0 or 1); returns that mask and the same carry for the next block.
///
/// A run of backslashes pairs up from its start: in a run starting at an even position,
/// the backslashes at even positions start escapes; in one starting at an odd position,
/// those at odd positions. Adding each odd-start run's first bit to the run carries through
/// it, which tells the two kinds apart without a loop.
#[inline(always)]
pub(crate) fn escaped_bytes(bs: u64, carry_in: u64, n: usize) -> (u64, u64) {
    let full = low_bits(n);
    let even = 0x5555_5555_5555_5555 & full;
    let bs = bs & !carry_in;
    let follows = ((bs << 1) | carry_in) & full;
    let odd_starts = bs & !even & !follows;
    // n <= 32, so the sum cannot overflow the u64; its bit n is the carry out.
    let sum = odd_starts + bs;
    let carry_out = (sum >> n) & 1;
    let invert = (sum << 1) & full;
    ((even ^ invert) & follows, carry_out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-at-a-time reference for `escaped_bytes`.
    fn reference_escaped(bs: u64, carry_in: u64, n: usize) -> (u64, u64) {
        let mut escaped = 0;
        let mut pending = carry_in == 1;
        for i in 0..n {
            if pending {
                escaped |= 1 << i;
                pending = false;
            } else if bs >> i & 1 == 1 {
                pending = true;
            }
        }
        (escaped, u64::from(pending))
    }

    #[test]
    fn escaped_bytes_agree_with_a_byte_loop_for_every_backslash_pattern() {
        for n in [8, 16] {
            for bs in 0..1u64 << n {
                for carry in [0, 1] {
                    assert_eq!(
                        escaped_bytes(bs, carry, n),
                        reference_escaped(bs, carry, n),
                        "{bs:b} {carry}"
                    );
                }
            }
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..100_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Dense runs of backslashes: the AND of two random words.
            let bs = (seed & seed.rotate_left(17)) & low_bits(32);
            let carry = seed >> 63;
            assert_eq!(
                escaped_bytes(bs, carry, 32),
                reference_escaped(bs, carry, 32)
            );
        }
    }

    #[test]
    fn word_masks_are_exact_for_every_byte_in_every_lane() {
        for byte in 0..=255u8 {
            for lane in 0..8 {
                for background in [0u8, b'a', 0x7f, 0x80, 0xff, byte ^ 1, byte.wrapping_add(1)] {
                    let mut bytes = [background; 8];
                    bytes[lane] = byte;
                    bytes[(lane + 1) % 8] = byte.wrapping_sub(1);
                    // SAFETY: eight readable bytes.
                    let word = unsafe { Word::load(bytes.as_ptr()) };
                    let want = |f: &dyn Fn(u8) -> bool| {
                        (0..8)
                            .filter(|&i| f(bytes[i]))
                            .map(|i| 1u64 << i)
                            .sum::<u64>()
                    };
                    assert_eq!(word.eq(byte), want(&|b| b == byte), "{bytes:?}");
                    assert_eq!(word.high(), want(&|b| b >= 0x80), "{bytes:?}");
                }
            }
        }
    }
}
