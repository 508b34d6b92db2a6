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
