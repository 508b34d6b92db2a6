//! Shared setup of the fleet client integration tests: the project's fleet server (on its own
//! runtime, so a test may pause its own clock), a recording HTTP relay in front of it, and
//! helpers to author configs and inspect what the server saw.
#![allow(dead_code)]

pub mod relay;

use std::path::{Path, PathBuf};
use std::time::Duration;

use ccfleet::client::{Config, Options};
use ccfleet::server::auth::Keypair;
use ccfleet::server::{RunningServer, ServerConfig};
use ccfleet::wire::ServiceType;
use serde_json::{Value, json};

pub use relay::Relay;

/// Cluster and host the tests register as.
pub const CLUSTER: &str = "fritz";
/// Host name the tests register as.
pub const HOST: &str = "f0101";

#[path = "../support/http.rs"]
mod http_client;
#[allow(unused_imports)]
pub use http_client::{http, install_crypto};

/// What the server is started with besides the defaults.
#[derive(Default, Clone)]
pub struct FleetSetup {
    /// NATS URL; the server then consumes heartbeats and publishes rosters.
    pub nats_url: Option<String>,
}

/// The fleet server, its config tree, credentials and a recording relay in front of it.
pub struct Fleet {
    runtime: Option<tokio::runtime::Runtime>,
    server: Option<RunningServer>,
    /// The recording relay; clients under test talk to [`Fleet::url`].
    pub relay: Relay,
    config_dir: tempfile::TempDir,
    /// A token with the api role.
    pub token: String,
    direct: reqwest::Client,
}

/// The heartbeat subject used when NATS is configured.
pub const HEARTBEAT_SUBJECT: &str = "cc.fleet.event";

impl Fleet {
    /// Starts the server (on a runtime of its own) and the relay.
    pub async fn start(setup: FleetSetup) -> Fleet {
        install_crypto();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("server runtime");
        let config_dir = tempfile::tempdir().expect("config dir");
        let keypair = Keypair::generate();
        let token = keypair.sign_token("fleetbot", &["api"], None);
        let mut config = json!({
            "addr": "127.0.0.1:0",
            "jwt-public-key": keypair.public_key_base64(),
            "fleet": {
                "config-dir": config_dir.path(),
                // Tests reload explicitly; no timer should race them.
                "config-reload-interval": "1h",
            },
        });
        if let Some(url) = &setup.nats_url {
            config["nats"] = json!({ "address": url });
            config["fleet"]["heartbeat-subject"] = json!(HEARTBEAT_SUBJECT);
            config["fleet"]["discovery-interval"] = json!("300ms");
            config["fleet"]["discovery-debounce"] = json!("50ms");
        }
        let config = ServerConfig::from_json(&config.to_string()).expect("server config");
        let server = runtime
            .spawn(ccfleet::server::start(config))
            .await
            .expect("server task")
            .expect("server starts");
        let relay = runtime
            .spawn(Relay::start(server.base_url()))
            .await
            .expect("relay task");
        Fleet {
            runtime: Some(runtime),
            server: Some(server),
            relay,
            config_dir,
            token,
            direct: http(),
        }
    }

    fn server(&self) -> &RunningServer {
        self.server.as_ref().expect("server running")
    }

    /// The URL clients under test use (the relay).
    pub fn url(&self) -> String {
        self.relay.url()
    }

    /// The server's own URL.
    pub fn server_url(&self) -> String {
        self.server().base_url()
    }

    /// A client config for `cluster`/`host` with the test token and long intervals.
    pub fn config(&self, cluster: &str, host: &str) -> Config {
        let mut config = Config::new(self.url());
        config.token = self.token.clone();
        config.cluster = cluster.to_owned();
        config.hostname = host.to_owned();
        config.heartbeat_interval = Duration::from_secs(3600);
        config.config_poll_interval = Duration::from_secs(3600);
        config
    }

    /// Options for a ccmc on fritz/f0101.
    pub fn options(&self) -> Options {
        Options::new(self.config(CLUSTER, HOST), ServiceType::MetricCollector)
    }

    /// The root of the server's config tree.
    pub fn config_dir(&self) -> &Path {
        self.config_dir.path()
    }

    /// Writes a config tree file and makes the server rescan.
    pub async fn author(&self, rel: &str, json: &str) {
        let path = self.config_dir().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, json).unwrap();
        self.reload().await;
    }

    /// Removes a config tree file and makes the server rescan.
    pub async fn unauthor(&self, rel: &str) {
        std::fs::remove_file(self.config_dir().join(rel)).unwrap();
        self.reload().await;
    }

    async fn reload(&self) {
        self.server().reload_config().await.expect("config reload");
    }

    /// Registers cluster/host/type directly (rotating the id of an existing registration)
    /// and returns the new instance id.
    pub async fn register_direct(&self, cluster: &str, host: &str, ty: ServiceType) -> String {
        let scope = if cluster.is_empty() {
            "infra"
        } else {
            "cluster"
        };
        let mut body = json!({ "hostname": host, "serviceType": ty.code() });
        if !cluster.is_empty() {
            body["cluster"] = json!(cluster);
        }
        let response = self
            .direct
            .post(format!("{}/api/fleet/register/{scope}/", self.server_url()))
            .header("X-Auth-Token", &self.token)
            .json(&body)
            .send()
            .await
            .expect("register request");
        assert_eq!(response.status(), 201);
        let body: Value = response.json().await.expect("registration body");
        body["instanceId"].as_str().unwrap().to_owned()
    }

    /// Deregisters an instance id directly.
    pub async fn deregister_direct(&self, id: &str) {
        let response = self
            .direct
            .delete(format!("{}/api/fleet/deregister/{id}", self.server_url()))
            .header("X-Auth-Token", &self.token)
            .send()
            .await
            .expect("deregister request");
        assert_eq!(response.status(), 204);
    }

    /// Sends a REST heartbeat for `id` directly and returns the status.
    pub async fn heartbeat_direct(&self, id: &str) -> u16 {
        self.direct
            .post(format!("{}/api/fleet/heartbeat/{id}", self.server_url()))
            .header("X-Auth-Token", &self.token)
            .send()
            .await
            .expect("heartbeat request")
            .status()
            .as_u16()
    }

    /// Heartbeats the server applied over REST.
    pub async fn rest_heartbeats(&self) -> u64 {
        self.metric("ccfleet_heartbeats_total{source=\"rest\",result=\"applied\"}")
            .await
    }

    /// Heartbeat lines the server accepted over NATS.
    pub fn nats_heartbeats(&self) -> u64 {
        self.server().heartbeat_stats().accepted
    }

    /// Instances in `state` according to the registry.
    pub fn instances(&self, state: ccfleet::server::registry::State) -> u64 {
        self.server().registry().counts().get(state)
    }

    /// The registry entry of an instance id.
    pub fn lookup(&self, id: &str) -> Option<ccfleet::server::registry::Service> {
        self.server().registry().lookup(id)
    }

    async fn metric(&self, series: &str) -> u64 {
        let text = self
            .direct
            .get(format!("{}/metrics", self.server_url()))
            .send()
            .await
            .expect("metrics request")
            .text()
            .await
            .expect("metrics body");
        text.lines()
            .find_map(|line| line.strip_prefix(series))
            .unwrap_or_else(|| panic!("{series} missing from /metrics"))
            .trim()
            .parse()
            .expect("counter value")
    }

    /// Stops the server gracefully (the relay keeps running and then answers 502).
    pub async fn stop_server(&mut self) {
        let server = self.server.take().expect("server running");
        let runtime = self.runtime.as_ref().unwrap();
        runtime
            .spawn(server.shutdown())
            .await
            .expect("shutdown task")
            .expect("server shuts down");
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            // Dropping the server on its own runtime; the test runtime may not block.
            if let Some(server) = self.server.take() {
                runtime.spawn(async move { drop(server) });
            }
            runtime.shutdown_background();
        }
    }
}

/// A cache path inside a fresh directory that does not exist yet.
pub fn cache_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("state").join("fleet-config.json")
}

#[path = "../support/wait.rs"]
mod wait;
pub use wait::eventually;
