//! The discovery roster publisher (cc-backend's `discovery.go`).
//!
//! Every consumer type that depends on others receives, per bucket (each cluster with an
//! active member, plus `infra`), the full list of its active providers on
//! `<prefix>.<bucket>.<consumer>`. Rosters are whole replacements over core NATS, so they
//! are re-published periodically, and after the registry changes: at once when the previous
//! publish lies more than the debounce delay back, else when that window ends (so a burst of
//! changes costs one publish per window). A reconnect to NATS counts as a change.
//!
//! A publish counts as done only once NATS has confirmed the round (a flush); a roster that
//! is larger than the NATS server's `max_payload`, or that NATS refuses, is an error counted
//! per subject and logged. Rows whose cluster cannot be a subject token (or is named `infra`,
//! the bucket of infrastructure services) are left out of every roster, counted and logged:
//! one such row must not cost every other roster its delivery.
//!
//! With a private key, every roster carries an Ed25519 signature in the
//! [`ROSTER_SIGNATURE_HEADER`] header over [`roster_signing_input`]; the roster bytes stay
//! exactly what cc-lib's Go client decodes.
//!
//! `build` groups the active services into buckets and rosters, `encode` turns a roster's
//! members into the bytes consumers accept, and `publish` sends them over NATS.

mod build;
mod encode;
mod publish;
#[cfg(test)]
mod tests;

pub use build::{Roster, Skipped, build_rosters, relevant_providers};
pub use encode::ROSTER_LIMIT;
pub use publish::RosterNotify;
pub(crate) use publish::{PublisherConfig, spawn};
