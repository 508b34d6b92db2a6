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
//! The implementations share one generic algorithm over [`Block`](block::Block); the
//! instruction set is picked once per process ([`unescape_into`]) or at compile time
//! ([`scan_string`]: SSE2 is part of x86-64 and NEON of aarch64).
//!
//! [`block`] holds the block types, [`scan`] the string and token scans, [`unescape`] the
//! unescaping.

mod block;
mod scan;
mod unescape;

pub(crate) use scan::{StopWindow, StringScan, find2, scan_string};
pub use unescape::UnescapeFn;
pub(crate) use unescape::{unescape_implementations, unescape_into};
