//! The fleet server's NATS side: heartbeat consumer and roster publisher, against a real
//! nats-server.
#![cfg(all(feature = "server", feature = "client"))]

#[path = "support/nats.rs"]
mod nats;
mod server_common;

use std::collections::HashMap;
use std::time::Duration;

use ccfleet::server::registry::State;
use ccfleet::wire::{Provider, ServiceType, decode_roster, encode_heartbeat, now_ns};
use futures::StreamExt;
use nats::NatsServer;
use serde_json::json;
use server_common::*;

const SUBJECT: &str = "cc.fleet.event";

fn line(id: &str) -> String {
    format!(
        "fleet,function=heartbeat event=\"{{\\\"instanceId\\\":\\\"{id}\\\"}}\" {}",
        now_ns()
    )
}

async fn nats_client(url: &str) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .reconnect_delay_callback(|_| Duration::from_millis(100))
        .connect(url)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_over_nats() {
    let nats = NatsServer::start();
    let server = start(json!({
        "disable-authentication": true,
        "nats": {"address": nats.url()},
        "fleet": {"heartbeat-subject": SUBJECT}
    }))
    .await;
    let client = http();
    let mut ids = Vec::new();
    for host in ["f01", "f02", "f03", "f04", "f05"] {
        let body = format!(r#"{{"cluster":"fritz","hostname":"{host}","serviceType":"ccmc"}}"#);
        ids.push(register_ok(&client, &server, "cluster", &body).await);
    }
    let gone = ids.pop().unwrap();
    assert_eq!(deregister(&client, &server, &gone).await, 204);
    let publisher = nats_client(&nats.url()).await;
    let ts = now_ns();

    // One message with cc-backend's accepted, rejected and ignored lines.
    let message = [
        line(&ids[0]),
        format!(
            "fleet,function=register event=\"{{\\\"instanceId\\\":\\\"{}\\\"}}\" {ts}",
            ids[3]
        ),
        format!(
            "fleet,function=deregister event=\"{{\\\"instanceId\\\":\\\"{}\\\"}}\" {ts}",
            ids[3]
        ),
        format!("fleet,function=ack_config event=\"{{}}\" {ts}"),
        format!("fleet,function=stop_job event=\"{{}}\" {ts}"),
        format!(
            "fleet event=\"{{\\\"instanceId\\\":\\\"{}\\\"}}\" {ts}",
            ids[3]
        ),
        format!(
            "fleet,function=heartbeat event=\"{{\\\"instance_id\\\":\\\"{}\\\"}}\" {ts}",
            ids[3]
        ),
        format!(
            "fleet,function=heartbeat event=\"{{\\\"instanceId\\\":\\\"{}\\\",\\\"x\\\":1}}\" {ts}",
            ids[3]
        ),
        format!("fleet,function=heartbeat event=\"\" {ts}"),
        format!("fleet,function=heartbeat event=\"{{}}\" {ts}"),
        format!("job,function=start_job event=\"{{\\\"jobId\\\":1}}\" {ts}"),
        format!("fleet,function=heartbeat value=1 {ts}"),
        line(&gone),
        line("0123456789abcdef0123456789abcdef"),
        line(&ids[1]),
    ]
    .join("\n");
    publisher
        .publish(SUBJECT, message.into_bytes().into())
        .await
        .unwrap();
    // A batch as the fleet client encodes it.
    let batch = encode_heartbeat(ts, &[ids[2].as_str()]).unwrap();
    publisher.publish(SUBJECT, batch.into()).await.unwrap();
    // A decode error aborts the rest of its message: ids[3] must stay pending.
    let broken = format!(
        "{}\nthis is not line protocol\n{}\n",
        line(&ids[0]),
        line(&ids[3])
    );
    publisher
        .publish(SUBJECT, broken.into_bytes().into())
        .await
        .unwrap();
    publisher.flush().await.unwrap();

    eventually("heartbeats applied", Duration::from_secs(10), || async {
        let stats = server.heartbeat_stats();
        stats.messages == 3
            && stats.applied + stats.unknown == stats.accepted
            && stats.accepted == 6
    })
    .await;
    let stats = server.heartbeat_stats();
    assert_eq!(stats.applied, 4, "{stats:?}");
    assert_eq!(stats.unknown, 2, "deregistered and unknown ids: {stats:?}");
    assert_eq!(
        stats.rejected, 10,
        "9 bad lines and one undecodable message: {stats:?}"
    );
    assert_eq!(stats.ignored, 2, "{stats:?}");
    for id in &ids[..3] {
        assert_eq!(server.registry().lookup(id).unwrap().state, State::Active);
    }
    assert_eq!(
        server.registry().lookup(&ids[3]).unwrap().state,
        State::Pending
    );
    assert_eq!(
        server.registry().lookup(&gone).unwrap().state,
        State::Deregistered,
        "a heartbeat never resurrects"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flushes_pending_heartbeats_and_state_survives() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = json!({
        "disable-authentication": true,
        "db": dir.path().join("fleet.sqlite"),
        "nats": {"address": nats.url()},
        "fleet": {"heartbeat-subject": SUBJECT}
    });
    let server = start(config.clone()).await;
    let client = http();
    let id = register_ok(
        &client,
        &server,
        "infra",
        r#"{"hostname":"m1","serviceType":"ccms"}"#,
    )
    .await;
    let publisher = nats_client(&nats.url()).await;
    // Let the consumer's first (immediate) flush tick pass, so the heartbeat waits in the
    // coalescing buffer for the next one when shutdown comes.
    tokio::time::sleep(Duration::from_millis(100)).await;
    publisher
        .publish(SUBJECT, line(&id).into_bytes().into())
        .await
        .unwrap();
    publisher.flush().await.unwrap();
    eventually("the heartbeat decoded", Duration::from_secs(10), || async {
        server.heartbeat_stats().accepted == 1
    })
    .await;
    server.shutdown().await.unwrap();

    let server = start(config).await;
    assert_eq!(server.registry().lookup(&id).unwrap().state, State::Active);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_survives_nats_restart() {
    let mut nats = NatsServer::start();
    let server = start(json!({
        "disable-authentication": true,
        "nats": {"address": nats.url()},
        "fleet": {"heartbeat-subject": SUBJECT}
    }))
    .await;
    let client = http();
    let before = register_ok(
        &client,
        &server,
        "infra",
        r#"{"hostname":"a","serviceType":"ccms"}"#,
    )
    .await;
    let after = register_ok(
        &client,
        &server,
        "infra",
        r#"{"hostname":"b","serviceType":"ccms"}"#,
    )
    .await;
    let publisher = nats_client(&nats.url()).await;
    let publish = |id: String| {
        let publisher = publisher.clone();
        async move {
            let _ = publisher
                .publish(SUBJECT, line(&id).into_bytes().into())
                .await;
            let _ = publisher.flush().await;
        }
    };
    publish(before.clone()).await;
    eventually("first heartbeat", Duration::from_secs(10), || async {
        server.registry().lookup(&before).unwrap().state == State::Active
    })
    .await;

    nats.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    nats.restart();

    // Core NATS has no replay: keep publishing until the re-established subscription
    // delivers.
    eventually(
        "heartbeat after the restart",
        Duration::from_secs(20),
        || {
            let (server, after) = (&server, &after);
            async move {
                publish(after.clone()).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                server.registry().lookup(after).unwrap().state == State::Active
            }
        },
    )
    .await;
    server.shutdown().await.unwrap();
}

/// Collects the latest roster per subject.
async fn latest_rosters(
    sub: &mut async_nats::Subscriber,
    seen: &mut HashMap<String, Vec<Provider>>,
    wait: Duration,
) {
    let deadline = tokio::time::Instant::now() + wait;
    while let Ok(Some(message)) = tokio::time::timeout_at(deadline, sub.next()).await {
        let providers = decode_roster(&message.payload).expect("a valid roster");
        seen.insert(message.subject.to_string(), providers);
    }
}

fn hosts(providers: &[Provider]) -> Vec<&str> {
    providers.iter().map(|p| p.hostname.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rosters_follow_registrations() {
    let nats = NatsServer::start();
    let watcher = nats_client(&nats.url()).await;
    let mut sub = watcher.subscribe("site.disc.>").await.unwrap();
    watcher.flush().await.unwrap();
    let server = start(json!({
        "disable-authentication": true,
        "nats": {"address": nats.url()},
        "fleet": {
            "discovery-subject-prefix": "site.disc",
            "discovery-interval": "1h",
            "discovery-debounce": "100ms"
        }
    }))
    .await;
    let client = http();
    let mut seen = HashMap::new();

    // At start: only the infra bucket, with empty rosters for each consumer type.
    latest_rosters(&mut sub, &mut seen, Duration::from_millis(500)).await;
    let mut subjects: Vec<&String> = seen.keys().collect();
    subjects.sort();
    assert_eq!(
        subjects,
        [
            "site.disc.infra.ccem",
            "site.disc.infra.cces",
            "site.disc.infra.ccmc",
            "site.disc.infra.ccms",
            "site.disc.infra.ccnc",
            "site.disc.infra.ccsa",
        ]
    );
    assert!(seen.values().all(Vec::is_empty));

    // A backend registers and becomes active; a collector in cluster fritz too.
    let ccb = register_ok(
        &client,
        &server,
        "infra",
        r#"{"hostname":"mgmt01","serviceType":"ccb","metaData":{"port":"8080"}}"#,
    )
    .await;
    assert_eq!(heartbeat(&client, &server, &ccb).await, 204);
    let ccmc = register_ok(
        &client,
        &server,
        "cluster",
        r#"{"cluster":"fritz","hostname":"f0101","serviceType":"ccmc"}"#,
    )
    .await;
    assert_eq!(heartbeat(&client, &server, &ccmc).await, 204);
    seen.clear();
    latest_rosters(&mut sub, &mut seen, Duration::from_millis(800)).await;
    let fritz = &seen["site.disc.fritz.ccmc"];
    assert_eq!(hosts(fritz), ["mgmt01"]);
    assert_eq!(fritz[0].service_type, ServiceType::Backend);
    assert_eq!(fritz[0].state, "active");
    assert_eq!(fritz[0].meta["port"], "8080");
    assert_eq!(hosts(&seen["site.disc.infra.ccms"]), ["mgmt01"]);
    assert!(
        !seen.keys().any(|s| s.ends_with(".ccb")),
        "ccb consumes nothing"
    );

    // Deregistration empties the rosters.
    assert_eq!(deregister(&client, &server, &ccb).await, 204);
    seen.clear();
    latest_rosters(&mut sub, &mut seen, Duration::from_millis(800)).await;
    assert!(seen["site.disc.fritz.ccmc"].is_empty());
    assert!(seen["site.disc.infra.ccmc"].is_empty());
    server.shutdown().await.unwrap();
}
