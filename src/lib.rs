//! ccfleet: a Rust runtime that lets a service join a ClusterCockpit-style fleet.
//!
//! - [`lineproto`]: a zero-copy InfluxDB line-protocol decoder and encoder, byte-compatible
//!   with the Go reference (`github.com/influxdata/line-protocol/v2`).
//! - [`wire`]: the fleet's messages (service types, registration bodies, heartbeats and
//!   discovery rosters) as cc-lib's Go `fleet` package defines them.
//! - `client` (feature `client`): registers with cc-backend, pulls configuration, heartbeats,
//!   receives rosters and deregisters.
//! - `server` (feature `server`): a cc-backend-compatible fleet service.
//! - [`untrusted`]: untrusted strings escaped and capped for logs.
//! - [`hostlist`]: Slurm-style host lists (`f[0101-0188,0201]`): parsed, matched, written.
//! - [`json_config`]: configuration files read so that a mistake names its key and form.
//! - [`wasm_signature`]: the signature section a signed plugin component carries, read
//!   without trusting its lengths.
//! - `discovery` (feature `discovery`): one `Discoverer` over Nomad, Kubernetes, DNS, static,
//!   local, remote and fleet rosters.
#![warn(missing_docs)]

// `alloc` by name: the line-protocol encoder's files are shared with the no_std guest SDK.
extern crate alloc;

pub mod duration;
pub mod hostlist;
pub mod json_config;
pub mod lineproto;
pub mod secret;
pub mod untrusted;
pub mod wasm_signature;
pub mod wire;

#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "discovery")]
pub mod discovery;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "client")]
pub mod tls;

/// The Rust examples of `README.md`, compiled and run as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
