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

/// Waits for the start-up roster of a subscription to one subject; it lists no one.
async fn empty_start_up_roster(sub: &mut async_nats::Subscriber) {
    let first = tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("the start-up roster")
        .unwrap();
    assert!(decode_roster(&first.payload).unwrap().is_empty());
}

/// Waits until nothing has arrived for longer than a debounce window.
async fn quiet(sub: &mut async_nats::Subscriber, debounce: Duration) {
    while tokio::time::timeout(debounce + Duration::from_millis(500), sub.next())
        .await
        .is_ok()
    {}
}

/// The first roster that lists a provider, if one arrives `within`.
async fn listing_roster(
    sub: &mut async_nats::Subscriber,
    within: Duration,
) -> Option<Vec<Provider>> {
    tokio::time::timeout(within, async {
        loop {
            let message = sub.next().await.unwrap();
            let providers = decode_roster(&message.payload).unwrap();
            if !providers.is_empty() {
                return providers;
            }
        }
    })
    .await
    .ok()
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

/// The value of an unlabelled (or exactly labelled) sample in `GET /metrics`.
async fn metric(
    client: &reqwest::Client,
    server: &ccfleet::server::RunningServer,
    name: &str,
) -> u64 {
    let text = client
        .get(format!("{}/metrics", server.base_url()))
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

/// Registers a service straight into a registry file and makes it active, bypassing the
/// API's checks: rows that a former version accepted.
async fn preexisting(db: &std::path::Path, rows: &[(&str, &str, ServiceType, &str)]) {
    use ccfleet::server::registry::{Registration, Registry};
    use ccfleet::wire::Scope;
    let registry = Registry::open(Some(db)).unwrap();
    for (cluster, host, ty, meta) in rows {
        let id = registry
            .register(Registration {
                scope: Scope::of_cluster(cluster),
                cluster: (*cluster).to_owned(),
                hostname: (*host).to_owned(),
                service_type: *ty,
                meta: [("note".to_owned(), (*meta).to_owned())].into(),
            })
            .await
            .unwrap()
            .instance_id;
        assert_eq!(registry.heartbeat(&id).await.unwrap(), Some(true));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_clusters_that_cannot_name_a_subject_cost_no_other_roster() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fleet.sqlite");
    // A name far beyond NATS's 4 KiB control line, one with a space, and one that would
    // collide with the infra bucket.
    let long = "c".repeat(5000);
    preexisting(
        &db,
        &[
            ("", "mgmt01", ServiceType::Backend, ""),
            ("fritz", "ccb-f", ServiceType::Backend, ""),
            (&long, "ccb-long", ServiceType::Backend, ""),
            ("my cluster", "ccb-space", ServiceType::Backend, ""),
            ("infra", "ccb-infra", ServiceType::Backend, ""),
        ],
    )
    .await;
    let watcher = nats_client(&nats.url()).await;
    let mut sub = watcher.subscribe("cc.fleet.discovery.>").await.unwrap();
    watcher.flush().await.unwrap();
    let server = start(json!({
        "disable-authentication": true,
        "db": db,
        "nats": {"address": nats.url()},
        "fleet": {"discovery-interval": "200ms"}
    }))
    .await;
    let mut seen = HashMap::new();
    latest_rosters(&mut sub, &mut seen, Duration::from_millis(1500)).await;
    assert_eq!(
        hosts(&seen["cc.fleet.discovery.fritz.ccmc"]),
        ["ccb-f", "mgmt01"]
    );
    assert_eq!(
        hosts(&seen["cc.fleet.discovery.infra.ccmc"]),
        ["ccb-f", "mgmt01"],
        "the infra bucket is published, without the skipped rows"
    );
    assert_eq!(
        seen.len(),
        12,
        "fritz and infra, 6 consumer types each: {:?}",
        seen.keys()
    );
    let client = http();
    assert_eq!(
        metric(&client, &server, "ccfleet_roster_skipped_services").await,
        3
    );
    assert_eq!(
        metric(&client, &server, "ccfleet_roster_publish_errors_total").await,
        0
    );
    server.shutdown().await.unwrap();
}

/// Issue 28: one member with large metadata (registered by a version without the cap) made
/// every roster of its cluster larger than NATS's `max_payload`, so the whole cluster lost
/// its rosters. Now the member is left out of the rosters, named in the log and counted,
/// and every roster goes out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_would_push_a_roster_past_the_limit_is_left_out_and_every_roster_published() {
    let nats = NatsServer::start_with_config("max_payload: 4096\n");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fleet.sqlite");
    preexisting(
        &db,
        &[
            ("big", "ccb-big", ServiceType::Backend, &"m".repeat(5000)),
            ("big", "ccb-small", ServiceType::Backend, ""),
            ("fritz", "ccb-f", ServiceType::Backend, ""),
        ],
    )
    .await;
    let watcher = nats_client(&nats.url()).await;
    let mut sub = watcher.subscribe("cc.fleet.discovery.>").await.unwrap();
    watcher.flush().await.unwrap();
    let server = start(json!({
        "disable-authentication": true,
        "db": db,
        "nats": {"address": nats.url()},
        "fleet": {"discovery-interval": "1h"}
    }))
    .await;
    let mut seen = HashMap::new();
    latest_rosters(&mut sub, &mut seen, Duration::from_millis(1500)).await;
    assert_eq!(seen.len(), 18, "big, fritz and infra: {:?}", seen.keys());
    assert_eq!(hosts(&seen["cc.fleet.discovery.big.ccmc"]), ["ccb-small"]);
    assert_eq!(hosts(&seen["cc.fleet.discovery.fritz.ccmc"]), ["ccb-f"]);
    assert_eq!(
        hosts(&seen["cc.fleet.discovery.infra.ccmc"]),
        ["ccb-f", "ccb-small"]
    );
    let client = http();
    assert_eq!(
        metric(&client, &server, "ccfleet_roster_members_left_out").await,
        1
    );
    assert_eq!(
        metric(&client, &server, "ccfleet_roster_publish_errors_total").await,
        0
    );
    server.shutdown().await.unwrap();
}

/// Issue 28: a registration that changes no roster (a second collector of a cluster: rosters
/// list backends) published the cluster's unchanged rosters at once, which opened a debounce
/// window, so a real change right after it waited for the window's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_that_changes_no_roster_publishes_none_and_delays_no_change() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fleet.sqlite");
    preexisting(&db, &[("fritz", "f0101", ServiceType::MetricCollector, "")]).await;
    let watcher = nats_client(&nats.url()).await;
    let mut sub = watcher
        .subscribe("cc.fleet.discovery.fritz.ccmc")
        .await
        .unwrap();
    watcher.flush().await.unwrap();
    let debounce = Duration::from_secs(5);
    let server = start(json!({
        "disable-authentication": true,
        "db": db,
        "nats": {"address": nats.url()},
        "fleet": {"discovery-interval": "1h", "discovery-debounce": "5s"}
    }))
    .await;
    let client = http();
    empty_start_up_roster(&mut sub).await;
    // The debounce window after the start-up publish passes in quiet.
    quiet(&mut sub, debounce).await;
    // Another collector: no roster lists collectors, so none changes.
    let f0102 = register_ok(
        &client,
        &server,
        "cluster",
        r#"{"cluster":"fritz","hostname":"f0102","serviceType":"ccmc"}"#,
    )
    .await;
    assert_eq!(heartbeat(&client, &server, &f0102).await, 204);
    let ccb = register_ok(
        &client,
        &server,
        "cluster",
        r#"{"cluster":"fritz","hostname":"ccb-f","serviceType":"ccb"}"#,
    )
    .await;
    assert_eq!(heartbeat(&client, &server, &ccb).await, 204);
    // Before the fix the backend waited for the window the collector's publish opened (5 s);
    // at once is milliseconds.
    let roster = listing_roster(&mut sub, debounce - Duration::from_millis(1500))
        .await
        .expect("the backend published before the debounce delay");
    assert_eq!(hosts(&roster), ["ccb-f"]);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rosters_count_as_published_only_when_nats_confirms_and_go_out_again_after_a_restart() {
    let mut nats = NatsServer::start();
    let server = start(json!({
        "disable-authentication": true,
        "nats": {"address": nats.url()},
        "fleet": {"discovery-interval": "1h", "discovery-debounce": "100ms"}
    }))
    .await;
    let client = http();
    eventually(
        "the first rosters confirmed",
        Duration::from_secs(10),
        || async { metric(&client, &server, "ccfleet_roster_publishes_total").await >= 6 },
    )
    .await;
    // The connect event may bring one more round within the debounce delay.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let published = metric(&client, &server, "ccfleet_roster_publishes_total").await;

    nats.kill();
    // A change while NATS is down: its rosters cannot be confirmed, so they are errors.
    register_ok(
        &client,
        &server,
        "infra",
        r#"{"hostname":"mgmt01","serviceType":"ccb"}"#,
    )
    .await;
    eventually(
        "the failed round counted",
        Duration::from_secs(15),
        || async { metric(&client, &server, "ccfleet_roster_publish_errors_total").await >= 6 },
    )
    .await;
    assert_eq!(
        metric(&client, &server, "ccfleet_roster_publishes_total").await,
        published,
        "nothing counts as published while NATS is down"
    );

    // No interval falls due for an hour: only the reconnect can bring the rosters back.
    nats.restart();
    eventually(
        "rosters after the reconnect",
        Duration::from_secs(20),
        || async {
            metric(&client, &server, "ccfleet_roster_publishes_total").await >= published + 6
        },
    )
    .await;
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_after_a_quiet_debounce_window_is_published_at_once() {
    let nats = NatsServer::start();
    let watcher = nats_client(&nats.url()).await;
    let mut sub = watcher
        .subscribe("cc.fleet.discovery.infra.ccmc")
        .await
        .unwrap();
    watcher.flush().await.unwrap();
    let debounce = Duration::from_secs(3);
    let server = start(json!({
        "disable-authentication": true,
        "nats": {"address": nats.url()},
        "fleet": {"discovery-interval": "1h", "discovery-debounce": "3s"}
    }))
    .await;
    let client = http();
    empty_start_up_roster(&mut sub).await;
    // A pending member is in no roster: its registration changes none.
    let id = register_ok(
        &client,
        &server,
        "infra",
        r#"{"hostname":"mgmt01","serviceType":"ccb"}"#,
    )
    .await;
    // Let the debounce window after the last publish (the start-up round's, or the connect
    // event's) pass in quiet.
    quiet(&mut sub, debounce).await;
    assert_eq!(heartbeat(&client, &server, &id).await, 204);
    // Waiting out the whole debounce again would take 3 s; at once is milliseconds.
    let roster = listing_roster(&mut sub, debounce - Duration::from_millis(1000))
        .await
        .expect("the activation published before the debounce delay");
    assert_eq!(hosts(&roster), ["mgmt01"]);
    server.shutdown().await.unwrap();
}

/// Issue 28: with a large fleet, a roster round that NATS stops taking (its outgoing buffer
/// full) held the shutdown up until NATS answered again, for minutes. The round now ends with
/// the shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_for_a_roster_round_that_nats_stopped_taking() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fleet.sqlite");
    // 2,000 clusters, each with a backend of 4 KiB of metadata: a round is 12,000 rosters,
    // about 50 MB, far more than socket buffers hold.
    let meta = "m".repeat(4000);
    let clusters: Vec<String> = (0..2000).map(|i| format!("c{i:04}")).collect();
    let rows: Vec<(&str, &str, ServiceType, &str)> = clusters
        .iter()
        .map(|c| (c.as_str(), "ccb", ServiceType::Backend, meta.as_str()))
        .collect();
    preexisting(&db, &rows).await;
    let server = start(json!({
        "disable-authentication": true,
        "db": db,
        "nats": {"address": nats.url()},
        "fleet": {"discovery-interval": "1s"}
    }))
    .await;
    let client = http();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while metric(&client, &server, "ccfleet_roster_publishes_total").await == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no round confirmed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = nats.pid().unwrap().to_string();
    let stop = |signal: &str| {
        let status = std::process::Command::new("kill")
            .args(["-s", signal, &pid])
            .status()
            .unwrap();
        assert!(status.success());
    };
    stop("STOP");
    // The next round starts within the interval and fills the buffers at once; give it
    // time to be well inside.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stopped = tokio::time::timeout(Duration::from_secs(45), server.shutdown()).await;
    stop("CONT");
    assert!(
        stopped.is_ok(),
        "the shutdown waited for NATS (every step of it is bounded by 5 s)"
    );
}
