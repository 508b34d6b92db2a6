//! The fleet client with several server URLs, against the project's fleet server: requests
//! move to the next server on connection errors, server errors and 429 (not on other
//! statuses), keep the instance id and the ETag, return to the preferred server once its
//! `/healthz` answers, and log each change once without credentials.
//!
//! Both "servers" here are recording relays in front of one fleet server, so they share its
//! registry and configuration tree the way servers of one fleet share theirs; a relay told to
//! answer 503 stands for a failing server, a closed port for a dead one. The agent test
//! `host/tests/agent_failover.rs` kills real server processes.

mod client_support;
#[path = "support/logs.rs"]
mod logs;

use std::sync::OnceLock;
use std::time::Duration;

use ccfleet::client::{Client, Error};
use client_support::{Fleet, FleetSetup, Relay, eventually};
use logs::Logs;

const WAIT: Duration = Duration::from_secs(20);

/// Every log line of this test binary. A global subscriber, not a per-thread one: tests run
/// in parallel, and a callsite first hit on a thread without a subscriber could otherwise be
/// cached as disabled while another test captures. Tests pick their lines by their servers'
/// URLs (each test has its own ports); the checks for secrets look at every line.
fn logs() -> &'static Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(logs.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
        logs
    })
}

/// A URL on which nothing listens.
fn closed_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

/// The instance id in the path of the first config pull the relay saw.
fn instance_id(relay: &Relay) -> String {
    relay
        .records()
        .iter()
        .find_map(|r| r.path.strip_prefix("/api/fleet/config/").map(str::to_owned))
        .expect("a config pull")
}

#[tokio::test]
async fn a_server_answering_503_hands_over_to_the_next_which_answers_304_to_the_same_etag() {
    let logs = logs();
    let fleet = Fleet::start(FleetSetup::default()).await;
    fleet
        .author("ccmc/defaults.json", r#"{"interval":"10s"}"#)
        .await;
    let first = fleet.relay.clone();
    let second = Relay::start(fleet.server_url()).await;
    let mut opts = fleet.options();
    opts.config.failover_urls = vec![second.url()];
    let client = Client::new(opts).unwrap();

    let initial = client.bootstrap(WAIT).await.unwrap();
    assert_eq!(client.current_server(), first.url());
    assert_eq!(
        first.summaries_since(0),
        ["POST register 201", "GET config 200"]
    );
    let id = instance_id(&first);
    let etag = first.records()[1]
        .header("if-none-match")
        .map(str::to_owned);
    assert_eq!(etag, None, "nothing known before the first pull");

    first.answer_with(Some(503));
    let (update, changed) = client.pull_config().await.unwrap();
    assert!(!changed);
    assert_eq!(update.revision, initial.revision);
    client.heartbeat().await.unwrap();
    // The second server got the request the first failed, with the same id and ETag, and
    // answered 304; no registration there.
    assert_eq!(first.summaries_since(2), ["GET config 503"]);
    assert_eq!(
        second.summaries_since(0),
        ["GET config 304", "POST heartbeat 204"]
    );
    let pulled = &second.records()[0];
    assert_eq!(pulled.path, format!("/api/fleet/config/{id}"));
    assert_eq!(
        pulled.header("if-none-match"),
        first.records()[2].header("if-none-match")
    );
    assert!(pulled.header("if-none-match").is_some());
    assert_eq!(client.current_server(), second.url());
    assert_eq!(client.server_changes(), 1);
    assert_eq!(
        client.servers(),
        [(first.url(), true), (second.url(), false)]
    );

    // The first server recovers: a /healthz probe finds it and requests go back to it.
    first.answer_with(None);
    eventually("the client returns to the first server", WAIT, || async {
        client.heartbeat().await.unwrap();
        client.current_server() == first.url()
    })
    .await;
    assert!(
        first
            .records()
            .iter()
            .any(|r| r.path == "/healthz" && r.status == 200),
        "returned after a healthy probe"
    );
    let before = first.len();
    client.pull_config().await.unwrap();
    assert_eq!(first.summaries_since(before), ["GET config 304"]);
    assert_eq!(client.server_changes(), 2);
    assert_eq!(
        client.servers(),
        [(first.url(), false), (second.url(), false)]
    );

    // Each change logged once, naming both servers and why; no credential in any line.
    let lines = logs.lines();
    let failovers: Vec<_> = lines
        .iter()
        .filter(|l| l.contains("failing over") && l.contains(&first.url()))
        .collect();
    assert_eq!(failovers.len(), 1, "{lines:#?}");
    assert!(failovers[0].contains("WARN"), "{}", failovers[0]);
    for part in [first.url(), second.url(), "503 Service Unavailable".into()] {
        assert!(failovers[0].contains(&part), "{part}: {}", failovers[0]);
    }
    let returns: Vec<_> = lines
        .iter()
        .filter(|l| l.contains("returning to it") && l.contains(&first.url()))
        .collect();
    assert_eq!(returns.len(), 1, "{lines:#?}");
    for line in &lines {
        assert!(!line.contains(&id), "instance id logged: {line}");
        assert!(!line.contains(&fleet.token), "token logged: {line}");
    }
}

#[tokio::test]
async fn a_registration_answered_429_is_made_with_the_next_server() {
    let _ = logs();
    let fleet = Fleet::start(FleetSetup::default()).await;
    let first = fleet.relay.clone();
    let second = Relay::start(fleet.server_url()).await;
    let mut opts = fleet.options();
    opts.config.failover_urls = vec![second.url()];
    let client = Client::new(opts).unwrap();

    first.answer_with(Some(429));
    client.register().await.unwrap();
    assert!(client.registered());
    assert_eq!(first.summaries_since(0), ["POST register 429"]);
    assert_eq!(second.summaries_since(0), ["POST register 201"]);
    assert_eq!(client.current_server(), second.url());
}

#[tokio::test]
async fn a_status_that_means_never_does_not_fail_over() {
    let _ = logs();
    let fleet = Fleet::start(FleetSetup::default()).await;
    let first = fleet.relay.clone();
    let second = Relay::start(fleet.server_url()).await;
    let mut opts = fleet.options();
    opts.config.failover_urls = vec![second.url()];
    let client = Client::new(opts).unwrap();
    client.register().await.unwrap();

    for (status, unauthorized) in [(401, true), (403, true), (400, false)] {
        first.answer_with(Some(status));
        let err = client.heartbeat().await.unwrap_err();
        assert_eq!(err.is_unauthorized(), unauthorized, "{status}: {err}");
        assert_eq!(err.status().unwrap().code, status);
    }
    assert_eq!(second.len(), 0, "{:?}", second.summaries_since(0));
    assert_eq!(client.current_server(), first.url());
    assert_eq!(client.server_changes(), 0);
}

#[tokio::test]
async fn a_dead_first_server_is_passed_over_and_its_credentials_never_reach_the_logs() {
    let logs = logs();
    let fleet = Fleet::start(FleetSetup::default()).await;
    let dead = closed_url();
    let with_userinfo = dead.replace("http://", "http://fleet:pw-s3cr3t@");
    let mut opts = fleet.options();
    opts.config.url = with_userinfo;
    opts.config.failover_urls = vec![fleet.url()];
    let client = Client::new(opts).unwrap();

    client.bootstrap(WAIT).await.unwrap();
    assert!(client.registered());
    assert_eq!(client.current_server(), fleet.url());
    assert_eq!(
        client.servers(),
        [(dead.clone(), true), (fleet.url(), false)]
    );
    client.heartbeat().await.unwrap();
    assert_eq!(client.current_server(), fleet.url());
    assert_eq!(client.server_changes(), 1);

    let lines = logs.lines();
    let failover = lines
        .iter()
        .find(|l| l.contains("failing over") && l.contains(&dead))
        .unwrap_or_else(|| panic!("no failover logged: {lines:#?}"));
    assert!(failover.contains(&dead), "{failover}");
    assert!(failover.to_lowercase().contains("connect"), "{failover}");
    let registered = lines
        .iter()
        .find(|l| l.contains("registered with cc-backend") && l.contains(&fleet.url()))
        .unwrap_or_else(|| panic!("no registration logged: {lines:#?}"));
    assert!(registered.contains(&fleet.url()), "{registered}");
    for line in &lines {
        assert!(!line.contains("pw-s3cr3t"), "password logged: {line}");
        assert!(!line.contains(&fleet.token), "token logged: {line}");
    }
}

#[tokio::test]
async fn with_every_server_down_an_operation_tries_each_once_and_is_unreachable() {
    let _ = logs();
    let dead = [closed_url(), closed_url()];
    let mut config = ccfleet::client::Config::new(&dead[0]);
    config.failover_urls = vec![dead[1].clone()];
    config.hostname = "f0101".into();
    let client = Client::new(ccfleet::client::Options::new(
        config,
        ccfleet::wire::ServiceType::MetricCollector,
    ))
    .unwrap();
    let err = client.register().await.unwrap_err();
    assert!(matches!(err, Error::Unreachable { .. }), "{err}");
    assert!(err.is_unreachable());
    assert_eq!(
        client.servers(),
        [(dead[0].clone(), true), (dead[1].clone(), true)]
    );
    assert_eq!(client.current_server(), dead[0]);
    assert_eq!(client.server_changes(), 2);
}
