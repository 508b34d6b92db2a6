//! A ClusterCockpit-style service joining the fleet: the usage pattern of cc-lib's Go `fleet`
//! package (register, pull configuration, heartbeat, receive rosters, deregister), in Rust.
//!
//! ```text
//! cargo run -p ccfleet --example fleet_client --features client -- config.json
//! ```
//!
//! `config.json` is the service's config file; its `fleet` section says how to reach
//! cc-backend and an optional `nats` section (`{"address": "nats://..."}`) enables NATS
//! heartbeats and discovery rosters:
//!
//! ```json
//! {
//!   "fleet": {
//!     "url": "http://127.0.0.1:8080",
//!     "token": "<jwt with api role>",
//!     "cluster": "fritz",
//!     "heartbeat-interval": "30s",
//!     "config-poll-interval": "60s",
//!     "heartbeat-subject": "cc.fleet.event",
//!     "cache-path": "./var/fleet-config.json"
//!   },
//!   "nats": { "address": "nats://127.0.0.1:4222" }
//! }
//! ```
//!
//! Stop it with Ctrl-C: it then closes the client, which deregisters.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ccfleet::client::{Client, Config, NatsProvider, Options, Update};
use ccfleet::wire::{Provider, ServiceType};
use serde_json::Value;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: fleet_client CONFIG.json")?;
    let file: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let section = file
        .get("fleet")
        .cloned()
        .ok_or("the config file has no \"fleet\" section")?;
    let config = Config::from_value(section)?;

    // The application owns its NATS connection; the fleet client only borrows it. With
    // `retry_on_initial_connect` it connects in the background, and the fleet client sends
    // heartbeats over REST until it is connected.
    let nats: Option<NatsProvider> = match file.pointer("/nats/address").and_then(Value::as_str) {
        Some(address) => {
            let connection = async_nats::ConnectOptions::new()
                .retry_on_initial_connect()
                .connect(address)
                .await?;
            Some(Arc::new(move || Some(connection.clone())))
        }
        None => None,
    };

    let client = Client::new(Options {
        config,
        service_type: ServiceType::MetricCollector,
        // Broadcast in rosters: no secrets.
        meta: BTreeMap::from([("version".to_owned(), env!("CARGO_PKG_VERSION").to_owned())]),
        nats,
        http_client: None,
    })?;

    let initial = match client.bootstrap(Duration::from_secs(10)).await {
        // Source::Fleet, or Source::None when nothing is authored.
        Ok(update) => update,
        // The cached configuration (Source::Cache) or none.
        Err(e) if e.is_unreachable() => {
            eprintln!(
                "{e}; starting with the {} configuration",
                e.fallback().source
            );
            e.into_fallback()
        }
        // Unauthorized: a token or IP allowlist problem the operator must fix.
        Err(e) => return Err(e.into()),
    };
    apply_config(&initial);

    let runner = client.clone();
    let run = tokio::spawn(async move { runner.run().await });

    let mut configs = client.configs();
    let mut rosters = client.rosters();
    loop {
        tokio::select! {
            Some(update) = configs.recv() => apply_config(&update),
            Some(providers) = rosters.recv() => replace_providers(&providers),
            _ = tokio::signal::ctrl_c() => break,
        }
    }

    // Stops run, then deregisters.
    client.close(Duration::from_secs(5)).await?;
    run.await??;
    Ok(())
}

/// Merging with the local configuration is the application's business; this one prints it.
fn apply_config(update: &Update) {
    match &update.config {
        Some(config) => println!(
            "configuration revision {:?} from {}: {config}",
            update.revision, update.source
        ),
        None => println!("no configuration authored: running with the local one"),
    }
}

/// Rosters are full lists, not deltas.
fn replace_providers(providers: &[Provider]) {
    println!("{} provider(s):", providers.len());
    for p in providers {
        println!("  {} on {} ({})", p.service_type, p.hostname, p.state);
    }
}
