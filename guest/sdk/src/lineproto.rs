//! The host crate's line-protocol encoder (`ccfleet::lineproto::Encoder`), compiled from the
//! very same source files: what a plugin writes is what the host's encoder writes, and the
//! host checks it with the decoder written beside that encoder.
// Parts of the shared files serve only the host's decoder (its byte tables).
#![allow(dead_code)]

#[path = "../../../src/lineproto/encoder.rs"]
mod encoder;
#[path = "../../../src/lineproto/format.rs"]
mod format;
#[path = "../../../src/lineproto/precision.rs"]
mod precision;
#[path = "../../../src/lineproto/table.rs"]
mod table;

pub use encoder::{EncodeError, Encoder, FieldRef};
pub use precision::{Precision, PrecisionError};
