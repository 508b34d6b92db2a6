//! Helpers shared by the fleet server integration tests.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use ccfleet::server::{RunningServer, ServerConfig};
use serde_json::Value;

/// Starts a server from JSON text (with `addr` defaulted to a free loopback port).
pub async fn start(json: Value) -> RunningServer {
    let mut json = json;
    if json.get("addr").is_none() {
        json["addr"] = Value::from("127.0.0.1:0");
    }
    let config = ServerConfig::from_json(&json.to_string()).expect("valid test config");
    ccfleet::server::start(config).await.expect("server starts")
}

#[path = "../support/http.rs"]
mod http_client;
#[allow(unused_imports)]
pub use http_client::http;

/// Writes a config tree file, creating directories.
pub fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Registers over REST and returns (status, body JSON).
pub async fn register(
    client: &reqwest::Client,
    server: &RunningServer,
    scope: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, Value) {
    let mut request = client
        .post(format!("{}/api/fleet/register/{scope}/", server.base_url()))
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(token) = token {
        request = request.header("X-Auth-Token", token);
    }
    let response = request.send().await.expect("register request");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Registers and returns the instance id, asserting 201.
pub async fn register_ok(
    client: &reqwest::Client,
    server: &RunningServer,
    scope: &str,
    body: &str,
) -> String {
    let (status, json) = register(client, server, scope, body, None).await;
    assert_eq!(status, 201, "registration failed: {json}");
    json["instanceId"].as_str().unwrap().to_owned()
}

/// `POST /api/fleet/heartbeat/{id}` status.
pub async fn heartbeat(client: &reqwest::Client, server: &RunningServer, id: &str) -> u16 {
    client
        .post(format!("{}/api/fleet/heartbeat/{id}", server.base_url()))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// `DELETE /api/fleet/deregister/{id}` status.
pub async fn deregister(client: &reqwest::Client, server: &RunningServer, id: &str) -> u16 {
    client
        .delete(format!("{}/api/fleet/deregister/{id}", server.base_url()))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// `GET /api/fleet/config/{id}` with an optional If-None-Match.
pub async fn pull(
    client: &reqwest::Client,
    server: &RunningServer,
    id: &str,
    if_none_match: Option<&str>,
) -> reqwest::Response {
    let mut request = client.get(format!("{}/api/fleet/config/{id}", server.base_url()));
    if let Some(tag) = if_none_match {
        request = request.header("If-None-Match", tag);
    }
    request.send().await.unwrap()
}

#[path = "../support/wait.rs"]
mod wait;
pub use wait::eventually;

/// A NATS client that retries its first connection and reconnects every 100 ms, as a
/// fleet member's publisher does (nodes of a test cluster are killed and restarted).
pub async fn nats_client(url: &str) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .reconnect_delay_callback(|_| Duration::from_millis(100))
        .connect(url)
        .await
        .expect("a NATS connection")
}
