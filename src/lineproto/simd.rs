//! Block-at-a-time string scanning and unescaping: 8 (a `u64` word), 16 (SSE2, NEON) or 32
//! (AVX2, or AVX-512 VBMI2 whose `vpcompressb` takes the escapes out of a block in one
//! instruction) bytes per step, each step turning the block into bit masks (bit `i` = byte
//! `i`).
//!
//! JSON payloads (every fleet message) put an escape every few bytes, so anything that
//! handles escapes one at a time with a search in between pays that search per escape. Here
//! a block is loaded once; the backslashes that start an escape are found for the whole
//! block with carry arithmetic (a run of backslashes pairs up from its start, so its
//! parity decides whether the byte after it is escaped), and the bytes between escapes are
//! moved with whole-block stores.
//!
//! The implementations share one generic algorithm over [`Block`]; the instruction set is
//! picked once per process ([`unescape_into`]) or at compile time ([`scan_string`]: SSE2 is
//! part of x86-64 and NEON of aarch64).

use super::kind::TokenKind;

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
mod x86 {
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
mod arm {
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
const fn low_bits(n: usize) -> u64 {
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
/// (the unescaping rules are [`unescape_into`]'s business).
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
            use super::table::{KEY_STOP, MEASUREMENT_STOP};
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
    fn a_stop_window_stops_exactly_where_the_stop_tables_do() {
        use super::super::table::{KEY_STOP, MEASUREMENT_STOP};
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
        use super::super::table::{KEY_STOP, MEASUREMENT_STOP};
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
