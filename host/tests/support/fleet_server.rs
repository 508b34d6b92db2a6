//! The project's fleet server as the agent tests use it: no authentication, a registry file in
//! the test's directory, and a config tree that gives ccmc `{"interval": "10s"}`.

use std::path::Path;

use ccfleet::server::{RunningServer, ServerConfig};
use serde_json::json;

/// Starts the server on a free loopback port with its files under `dir`.
pub async fn start(dir: &Path) -> RunningServer {
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("ccmc")).unwrap();
    std::fs::write(
        tree.join("ccmc").join("defaults.json"),
        json!({"interval": "10s"}).to_string(),
    )
    .unwrap();
    let config = json!({
        "addr": "127.0.0.1:0",
        "db": dir.join("fleet.db"),
        "disable-authentication": true,
        "fleet": {"config-dir": tree, "config-reload-interval": "1h"}
    });
    ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap())
        .await
        .expect("fleet server")
}
