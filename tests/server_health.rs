//! `GET /healthz` names each dependency: 200 with details when all work, 503 naming what is
//! down. A full disk (the database) is covered in `server_registry_faults.rs`.
#![cfg(all(feature = "server", feature = "client"))]

#[path = "support/nats.rs"]
mod nats;
mod server_common;

use std::time::Duration;

use ccfleet::server::RunningServer;
use nats::NatsServer;
use serde_json::{Value, json};
use server_common::*;

async fn healthz(client: &reqwest::Client, server: &RunningServer) -> (u16, Value) {
    let response = client
        .get(format!("{}/healthz", server.base_url()))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    assert_eq!(response.headers()["content-type"], "application/json");
    (status, response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_names_nats_while_it_is_down_and_is_ok_again_once_it_is_back() {
    let mut nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let server = start(json!({
        "disable-authentication": true,
        "db": dir.path().join("fleet.sqlite"),
        "nats": {"address": nats.url()},
    }))
    .await;
    let client = http();
    let (status, body) = healthz(&client, &server).await;
    assert_eq!(
        (status, body),
        (
            200,
            json!({"status": "ok", "down": [], "checks": {"database": "ok", "nats": "ok"}})
        )
    );

    nats.kill();
    eventually(
        "healthz to name nats as down",
        Duration::from_secs(10),
        || {
            let client = client.clone();
            let server = &server;
            async move {
                let (status, body) = healthz(&client, server).await;
                status == 503 && body["down"] == json!(["nats"])
            }
        },
    )
    .await;
    let (_, body) = healthz(&client, &server).await;
    assert_eq!(body["status"], "unavailable");
    assert_eq!(body["checks"]["database"], "ok");
    assert_ne!(body["checks"]["nats"], "ok");

    nats.restart();
    eventually("healthz to be ok again", Duration::from_secs(20), || {
        let client = client.clone();
        let server = &server;
        async move { healthz(&client, server).await.0 == 200 }
    })
    .await;
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_of_a_rest_only_server_reports_nats_as_not_configured() {
    let server = start(json!({"disable-authentication": true})).await;
    let (status, body) = healthz(&http(), &server).await;
    assert_eq!(
        (status, body),
        (
            200,
            json!({"status": "ok", "down": [], "checks": {"database": "ok", "nats": "not configured"}})
        )
    );
    server.shutdown().await.unwrap();
}

/// Issue 28: a configuration tree whose rescan fails (here a named pipe where a file should
/// be) left `/healthz` at plain `ok` while the server kept serving an old generation. It is
/// reported as `config-tree`, with the reason, until a rescan succeeds again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_config_tree_rescan_degrades_healthz_until_one_succeeds() {
    let tree = tempfile::tempdir().unwrap();
    std::fs::write(tree.path().join("defaults.json"), r#"{"a":1}"#).unwrap();
    let server = start(json!({
        "disable-authentication": true,
        "fleet": {"config-dir": tree.path()}
    }))
    .await;
    let client = http();
    assert_eq!(healthz(&client, &server).await.1["status"], "ok");

    let fifo = tree.path().join("ccmc.json");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    assert!(server.reload_config().await.is_err());
    let (status, body) = healthz(&client, &server).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "degraded", "{body}");
    assert_eq!(body["degraded"], json!(["config-tree"]), "{body}");
    let reason = body["checks"]["config-tree"].as_str().unwrap();
    assert!(reason.contains("ccmc.json"), "{reason}");

    std::fs::remove_file(&fifo).unwrap();
    server.reload_config().await.unwrap();
    assert_eq!(healthz(&client, &server).await.1["status"], "ok");
    server.shutdown().await.unwrap();
}
