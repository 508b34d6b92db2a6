//! The router and message processor between the agent's plugins and its sinks, as
//! cc-metric-collector's `metricRouter` and cc-lib's `messageProcessor` have them.
//!
//! The agent's `router` key holds a cc-metric-collector `router.json` object. Without it, or
//! when it configures nothing that changes points, batches reach the sinks untouched and
//! undecoded; otherwise the fan-out decodes each batch, routes every point and re-encodes
//! the result. A condition that fails on one point drops that point, is logged once per
//! condition and counted; it never stops the pipeline.

pub mod expr;
pub mod message;
pub mod processor;
#[allow(clippy::module_inception)]
pub mod router;
pub mod topology;
pub mod units;

pub use router::{Routed, Router, RouterConfig, RouterCounters, RouterStats};

#[cfg(test)]
mod tests;
