//! The JetStream registry while JetStream is briefly unavailable (a NATS node restarting, a
//! cluster electing leaders), on a real `nats-server -js`:
//!
//! - start-up waits for it (bounded, logged) instead of failing: loading the bucket is
//!   retried as opening it is;
//! - a request naming an instance the server does not know, while it cannot catch up with
//!   the bucket, is answered 503 with `Retry-After` (the instance may have been registered
//!   through another server a moment ago): never 404 (an agent would re-register and lose
//!   its identity), and a deregistration never 204 (nothing was deregistered).
#![cfg(all(feature = "server", feature = "client"))]

#[path = "support/nats.rs"]
mod nats;
mod server_common;

use std::time::Duration;

use ccfleet::server::registry::Registry;
use ccfleet::server::registry::jetstream::{self, JetStreamSettings, JetStreamStore};
use serde_json::json;
use server_common::*;

fn settings() -> JetStreamSettings {
    JetStreamSettings {
        bucket: "fleet".to_owned(),
        replicas: 1,
        lease_ttl: Duration::from_secs(2),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_the_bucket_waits_while_jetstream_is_briefly_unavailable() {
    let mut nats = nats::NatsServer::start_jetstream();
    let client = nats_client(&nats.url()).await;
    let kv = jetstream::bucket(&client, &settings(), true).await.unwrap();
    let store = JetStreamStore::with_bucket(client, kv, settings());
    // The bucket was opened; JetStream goes away before it is loaded, for longer than one
    // request waits for its answer, and comes back.
    nats.kill();
    let load = tokio::task::spawn_blocking(move || Registry::new(store));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!load.is_finished(), "loading the bucket gave up at once");
    tokio::task::block_in_place(|| nats.restart());
    let registry = load
        .await
        .unwrap()
        .expect("start-up waits for JetStream instead of failing");
    assert_eq!(registry.counts().pending, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_instance_is_answered_503_while_the_bucket_cannot_be_caught_up_with() {
    let mut nats = nats::NatsServer::start_jetstream();
    let server = start(json!({
        "disable-authentication": true,
        "nats": {"address": nats.url()},
        "registry": {"type": "jetstream-kv", "bucket": "fleet", "replicas": 1, "lease-ttl": "2s"},
    }))
    .await;
    let http = http();
    let known = register_ok(
        &http,
        &server,
        "cluster",
        r#"{"cluster":"fritz","hostname":"f0101","serviceType":"ccmc"}"#,
    )
    .await;
    // Registered through another server, as far as this one can tell.
    let elsewhere = "0123456789abcdef0123456789abcdef";

    nats.kill();
    let unavailable = |response: &reqwest::Response| {
        response.status() == 503 && response.headers()["retry-after"] == "1"
    };
    let beat = http
        .post(format!(
            "{}/api/fleet/heartbeat/{elsewhere}",
            server.base_url()
        ))
        .send()
        .await
        .unwrap();
    assert!(unavailable(&beat), "heartbeat: {}", beat.status());
    let pulled = pull(&http, &server, elsewhere, None).await;
    assert!(unavailable(&pulled), "config pull: {}", pulled.status());
    let gone = http
        .delete(format!(
            "{}/api/fleet/deregister/{elsewhere}",
            server.base_url()
        ))
        .send()
        .await
        .unwrap();
    assert!(unavailable(&gone), "deregistration: {}", gone.status());
    // What the server knows is served from memory meanwhile.
    assert_eq!(pull(&http, &server, &known, None).await.status(), 204);

    tokio::task::block_in_place(|| nats.restart());
    // Once the bucket answers, an id nobody registered is unknown.
    eventually(
        "the bucket to answer again",
        Duration::from_secs(20),
        || async { heartbeat(&http, &server, elsewhere).await == 404 },
    )
    .await;
    assert_eq!(pull(&http, &server, elsewhere, None).await.status(), 404);
    assert_eq!(deregister(&http, &server, elsewhere).await, 204);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_started_while_jetstream_has_no_majority_waits_for_its_heartbeat_stream() {
    let mut cluster = nats::NatsCluster::start();
    let js = async_nats::jetstream::new(nats_client(&cluster.url(0)).await);
    eventually("JetStream to answer", Duration::from_secs(30), || async {
        js.query_account().await.is_ok()
    })
    .await;
    // Two of three nodes down: JetStream has no majority, so its API times out or answers
    // 503 until they are back.
    cluster.nodes[1].kill();
    cluster.nodes[2].kill();
    let config = ccfleet::server::ServerConfig::from_json(
        &json!({
            "addr": "127.0.0.1:0",
            "disable-authentication": true,
            "nats": {"address": cluster.url(0)},
            "fleet": {
                "heartbeat-subject": "cc.fleet.event",
                "heartbeat-stream": {"replicas": 3},
            },
        })
        .to_string(),
    )
    .unwrap();
    let starting = tokio::spawn(ccfleet::server::start(config));
    // Longer than one JetStream request waits for its answer.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(
        !starting.is_finished(),
        "start-up ended while JetStream was unavailable: {:?}",
        starting.await.unwrap().err()
    );
    tokio::task::block_in_place(|| {
        cluster.nodes[1].restart();
        cluster.nodes[2].restart();
    });
    let server = starting
        .await
        .unwrap()
        .expect("start-up waits for JetStream instead of failing");
    server.shutdown().await.unwrap();
}
