//! A zero-copy InfluxDB line-protocol decoder and encoder.
//!
//! The semantics are those of the Go reference decoder
//! (`github.com/influxdata/line-protocol/v2/lineprotocol`, which ClusterCockpit's
//! `cc-line-protocol` forks): escape sets per token kind, float / int (`i`) / uint (`u`) /
//! bool / string fields (floats in Go's syntax: `1_000`, `0x1p-2`), range-checked numbers,
//! NaN and Inf rejected, UTF-8 checked per token, timestamps with a precision and a default
//! time, comments, blank lines and CRLF. A bad line is reported with its line and column as
//! the Go decoder reports it, and decoding resumes where the Go decoder resumes: after the
//! end of the line it had read to, so nothing inside a rejected string is ever decoded.
//!
//! Decoding borrows: a [`Line`] holds views into the input, and a [`Token`] is unescaped
//! only when it really contained an escape (into a [`Cow`](std::borrow::Cow), or into a
//! caller-owned scratch buffer). Nothing is allocated per line.
//!
//! ```
//! use ccfleet::lineproto::{Decoder, FieldValue};
//!
//! let input = b"cpu,host=node\\ 1 load=0.5,jobs=3i 1700000000000000000\n";
//! let line = Decoder::new(input).next().unwrap().unwrap();
//! assert_eq!(line.measurement().unescape(), "cpu");
//! let (key, value) = line.tags().next().unwrap();
//! assert_eq!((key.raw(), value.unescape().as_ref()), ("host", "node 1"));
//! let fields: Vec<_> = line.fields().map(|(k, v)| (k.raw(), v)).collect();
//! assert_eq!(fields[1], ("jobs", FieldValue::Int(3)));
//! assert_eq!(line.time(), Some(1_700_000_000_000_000_000));
//! ```

mod check;
mod decoder;
mod encoder;
mod error;
mod escape;
mod float;
mod format;
mod point;
mod precision;
mod scan;
mod simd;
mod table;
mod token;
mod value;

pub use check::{BatchError, BatchLimits, check_batch};
pub use decoder::{DEFAULT_MAX_LINE_LEN, Decoder, DecoderOptions, Fields, Line, Tags};
pub use encoder::{EncodeError, Encoder, FieldRef};
pub use error::{DecodeError, DecodeErrorKind};
pub use point::{OwnedValue, Point, PointError};
pub use precision::{Precision, PrecisionError};
pub use token::{Token, TokenKind};
pub use value::FieldValue;

/// One unescaping implementation: appends the unescaped token to the string. Not a stable
/// API.
#[doc(hidden)]
pub type UnescapeFn = fn(&str, TokenKind, &mut String);

/// Every unescaping implementation this CPU can run (portable, SSE2, AVX2, AVX-512, NEON), by
/// name: for differential tests and fuzzing, which compare them with each other. Not a
/// stable API.
#[doc(hidden)]
pub fn unescape_implementations() -> Vec<(&'static str, UnescapeFn)> {
    simd::unescape_implementations()
}
