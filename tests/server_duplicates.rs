//! Issue 26, duplicate identities: two fleet clients configured with the same cluster, host
//! name and type took turns replacing each other's registration at every heartbeat, for
//! ever, logged only at info. Now the server warns once per episode, naming both peers and
//! the member, counts it in `/metrics` and answers which members are duplicates; each client
//! warns that its instance keeps being replaced and names the likely cause.
//!
//! Real peers: the project's server over HTTP on loopback, and two clients whose connections
//! come from two loopback addresses (127.0.0.2 and 127.0.0.3), as two hosts would.

#![cfg(all(feature = "server", feature = "client"))]

#[path = "support/logs.rs"]
mod logs;
#[path = "server_common/mod.rs"]
mod server_common;

use std::net::IpAddr;
use std::time::Duration;

use ccfleet::client::{Client, Config, Options};
use ccfleet::wire::{Scope, ServiceType};
use logs::Logs;
use serde_json::json;
use server_common::{eventually, http, start};

const WAIT: Duration = Duration::from_secs(30);

/// A client of `base` registering as fritz/ccmc/`hostname`, its connections from `from`.
fn client(base: &str, hostname: &str, from: &str) -> Client {
    let mut config = Config::new(base);
    config.cluster = "fritz".into();
    config.hostname = hostname.into();
    config.heartbeat_interval = Duration::from_millis(200);
    config.config_poll_interval = Duration::from_millis(200);
    let mut options = Options::new(config, ServiceType::MetricCollector);
    let _ = rustls::crypto::ring::default_provider().install_default();
    options.http_client = Some(
        reqwest::Client::builder()
            .no_proxy()
            .local_address(from.parse::<IpAddr>().unwrap())
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap(),
    );
    Client::new(options).unwrap()
}

async fn metric(base: &str, name: &str) -> u64 {
    let text = http()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map_or(0, |v| v.parse().unwrap())
}

#[tokio::test]
async fn two_clients_with_one_identity_are_reported_once_by_the_server_and_warned_by_each() {
    let (logs, _guard) = Logs::capture();
    let server = start(json!({"disable-authentication": true})).await;
    let base = server.base_url();
    let first = client(&base, "node01", "127.0.0.2");
    let second = client(&base, "node01", "127.0.0.3");
    // A third client with an identity of its own, on the first one's address: no duplicate.
    let third = client(&base, "node02", "127.0.0.2");
    let runs: Vec<_> = [&first, &second, &third]
        .into_iter()
        .map(|c| {
            let c = c.clone();
            tokio::spawn(async move { c.run().await })
        })
        .collect();

    eventually("the server counting a duplicate episode", WAIT, || async {
        metric(&base, "ccfleet_duplicate_episodes_total").await >= 1
    })
    .await;
    assert!(server.duplicates().is_duplicate(
        Scope::Cluster,
        "fritz",
        "node01",
        ServiceType::MetricCollector
    ));
    assert!(!server.duplicates().is_duplicate(
        Scope::Cluster,
        "fritz",
        "node02",
        ServiceType::MetricCollector
    ));
    // The status view marks the member's instance, and only it.
    let listed: serde_json::Value = reqwest::get(format!("{base}/api/fleet/instances"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let marked: Vec<(&str, bool)> = listed["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["hostname"].as_str().unwrap(), i["duplicate"].as_bool().unwrap()))
        .collect();
    assert!(marked.contains(&("node01", true)), "{marked:?}");
    assert!(marked.contains(&("node02", false)), "{marked:?}");
    let episodes = server.duplicates().episodes();
    assert_eq!(episodes.len(), 1, "{episodes:?}");
    let mut peers: Vec<String> = episodes[0]
        .peers
        .iter()
        .map(|p| p.ip().to_string())
        .collect();
    peers.sort();
    assert_eq!(peers, ["127.0.0.2", "127.0.0.3"]);
    assert_eq!(metric(&base, "ccfleet_duplicate_members").await, 1);

    // Each client sees its instance replaced again and again, and says why.
    eventually(
        "both clients warning of a duplicate identity",
        WAIT,
        || async {
            let lines = logs.lines();
            lines
                .iter()
                .filter(|l| {
                    l.contains("WARN")
                        && l.contains("replaced")
                        && l.contains("same cluster, host name and type")
                })
                .count()
                >= 2
        },
    )
    .await;
    assert!(first.replacements() >= 3 && second.replacements() >= 3);
    assert_eq!(third.replacements(), 0);

    // Turns go on; still one warning of the server for the episode.
    let seen = first.replacements();
    eventually("more turns", WAIT, || async {
        first.replacements() >= seen + 3
    })
    .await;
    let lines = logs.lines();
    let warnings: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("WARN") && l.contains("duplicate member"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    let warning = warnings[0];
    assert!(warning.contains("fritz/ccmc/node01"), "{warning}");
    assert!(
        warning.contains("127.0.0.2:") && warning.contains("127.0.0.3:"),
        "{warning}"
    );
    assert_eq!(metric(&base, "ccfleet_duplicate_episodes_total").await, 1);

    for c in [&first, &second, &third] {
        let _ = c.close(Duration::from_secs(5)).await;
    }
    for run in runs {
        let _ = run.await;
    }
    server.shutdown().await.unwrap();
}

/// A hostile host name is escaped in the server's warning.
#[tokio::test]
async fn a_duplicate_warning_escapes_the_member_name() {
    let (logs, _guard) = Logs::capture();
    let server = start(json!({"disable-authentication": true})).await;
    let base = server.base_url();
    // Validation refuses control characters; a quote and a right-to-left override pass
    // and must be escaped.
    let name = "node\"01\u{202e}x";
    let clients = [
        client(&base, name, "127.0.0.2"),
        client(&base, name, "127.0.0.3"),
    ];
    let runs: Vec<_> = clients
        .iter()
        .map(|c| {
            let c = c.clone();
            tokio::spawn(async move { c.run().await })
        })
        .collect();
    eventually("a duplicate episode", WAIT, || async {
        metric(&base, "ccfleet_duplicate_episodes_total").await >= 1
    })
    .await;
    let lines = logs.lines();
    let warning = lines
        .iter()
        .find(|l| l.contains("duplicate member"))
        .expect("a warning");
    assert!(warning.contains(r#"node\"01\u{202e}x"#), "{warning}");
    assert!(!warning.contains('\u{202e}'), "{warning}");
    for c in &clients {
        let _ = c.close(Duration::from_secs(5)).await;
    }
    for run in runs {
        let _ = run.await;
    }
    server.shutdown().await.unwrap();
}
