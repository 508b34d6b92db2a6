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
#![cfg_attr(
    feature = "client",
    doc = r#"
# Embedding the fleet client

A service joins the fleet as cc-lib's Go `fleet` package lets it: register, pull the
configuration, heartbeat, receive rosters, deregister (`examples/fleet_client.rs` is a whole
program).

```no_run
use std::time::Duration;

use ccfleet::client::{Client, Config, Options};
use ccfleet::wire::ServiceType;

# async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
// The `fleet` section of the service's own configuration file.
let config = Config::from_value(serde_json::json!({
    "url": "http://127.0.0.1:8080",
    "token": "<a JWT with the api role>",
    "cluster": "fritz",
    "cache-path": "./var/fleet-config.json"
}))?;
let client = Client::new(Options::new(config, ServiceType::MetricCollector))?;

// Register and pull the configuration; with the server unreachable, start from the cached
// configuration (or none) and let `run` register once the server answers.
let initial = match client.bootstrap(Duration::from_secs(10)).await {
    Ok(update) => update,
    Err(e) if e.is_unreachable() => e.into_fallback(),
    Err(e) => return Err(e.into()),
};
println!("configuration {:?} from {}", initial.revision, initial.source);

// Heartbeats, configuration pulls and rosters run in the background.
let runner = client.clone();
let run = tokio::spawn(async move { runner.run().await });
let mut configs = client.configs();
let mut rosters = client.rosters();
tokio::select! {
    Some(update) = configs.recv() => println!("new configuration {:?}", update.revision),
    Some(providers) = rosters.recv() => println!("{} providers", providers.len()),
}

// Stops `run`, then deregisters.
client.close(Duration::from_secs(5)).await?;
run.await??;
# Ok(())
# }
```
"#
)]
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

/// The Rust examples of the book (`docs/`), compiled and run as doc tests so they stay
/// true; `host/tests/docs_snippets.rs` checks that every page with one is listed here.
#[cfg(doctest)]
#[doc = include_str!("../docs/src/architecture/codec.md")]
pub struct BookDoctests;
