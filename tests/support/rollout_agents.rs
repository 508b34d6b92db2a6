//! In-process fleet clients that behave as agents do in a staged rollout: each registers,
//! heartbeats once, polls its configuration and reports what the last poll served with the
//! next poll: the plugin version it was served, `running`, or `quarantined` where the new
//! version traps on its host. Shared by the staged-rollout tests.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ccfleet::client::{Client, Config, Options};
use ccfleet::wire::{AgentReport, PluginHealth, ReportedPlugin, ServiceType};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The cluster every agent is in.
pub const CLUSTER: &str = "fritz";

/// Agent `i`'s host name.
pub fn host(i: usize) -> String {
    format!("f{i:04}")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Two versions of a plugin in `plugin-dir`: (old sha256, new sha256).
pub fn plugin_versions(dir: &Path) -> (String, String) {
    let mut hashes = Vec::new();
    for (file, body) in [
        ("loadavg-1.wasm", b"version one".as_slice()),
        ("loadavg-2.wasm", b"version two"),
    ] {
        std::fs::write(dir.join(file), body).unwrap();
        hashes.push(hex(&Sha256::digest(body)));
    }
    (hashes[0].clone(), hashes[1].clone())
}

/// A configuration layer naming the plugin `loadavg` by `sha`.
pub fn plugins_layer(sha: &str) -> Value {
    json!({"plugins": [{"name": "loadavg", "sha256": sha, "collect-interval": "10s"}]})
}

/// What the agents were served, by host.
#[derive(Default)]
pub struct Seen {
    /// Every version each host was served.
    pub all: BTreeMap<String, BTreeSet<String>>,
    /// The version each host was served last.
    pub latest: BTreeMap<String, String>,
    /// Hosts served another version after the new one, once armed.
    pub taken_back: BTreeSet<String>,
    /// Whether `taken_back` records.
    pub armed: bool,
}

/// [`Seen`], shared by the agents and the test.
pub type Shared = Arc<Mutex<Seen>>;

/// Whether all `agents` were served `sha256` last.
pub fn all_served(seen: &Shared, agents: usize, sha256: &str) -> bool {
    let seen = seen.lock().unwrap();
    seen.latest.len() == agents && seen.latest.values().all(|s| s == sha256)
}

/// One agent.
pub struct Agent {
    /// The fleet server URLs, the first tried first.
    pub urls: Vec<String>,
    /// Its index (host name [`host`]).
    pub i: usize,
    /// The new version's sha256.
    pub new: String,
    /// Whether the new version traps on this host.
    pub traps: bool,
    /// The pause between polls.
    pub poll: Duration,
}

impl Agent {
    /// Runs the agent until the task is aborted.
    pub async fn run(self, seen: Shared) {
        let mut config = Config::new(self.urls[0].clone());
        config.failover_urls = self.urls[1..].to_vec();
        config.cluster = CLUSTER.to_owned();
        config.hostname = host(self.i);
        config.heartbeat_interval = Duration::from_secs(3600);
        config.config_poll_interval = Duration::from_secs(3600);
        config.timeout = Duration::from_secs(2);
        let client = Client::new(Options::new(config, ServiceType::MetricCollector)).unwrap();
        // Registered and heartbeating once: a live (active) member.
        while client.register().await.is_err() || client.heartbeat().await.is_err() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let me = host(self.i);
        loop {
            if let Ok((update, _)) = client.pull_config().await
                && let Some(body) = update.config
            {
                let served: Value = serde_json::from_str(&body).unwrap();
                let sha = served["plugins"][0]["sha256"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                {
                    let mut seen = seen.lock().unwrap();
                    seen.all.entry(me.clone()).or_default().insert(sha.clone());
                    if let Some(before) = seen.latest.insert(me.clone(), sha.clone())
                        && before == self.new
                        && sha != self.new
                        && seen.armed
                    {
                        seen.taken_back.insert(me.clone());
                    }
                }
                // The plugin world traps this version on this host: the agent quarantines it.
                let health = if self.traps && sha == self.new {
                    PluginHealth::Quarantined
                } else {
                    PluginHealth::Running
                };
                client.set_report(&AgentReport {
                    applied: update.revision.parse().unwrap_or(0),
                    plugins: vec![ReportedPlugin {
                        name: "loadavg".to_owned(),
                        sha256: Some(sha),
                        health,
                        why: None,
                    }],
                });
            }
            tokio::time::sleep(self.poll).await;
        }
    }
}
