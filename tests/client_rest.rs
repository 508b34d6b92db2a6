//! The fleet client against the project's fleet server over REST (no NATS): the config status
//! sequence, ETag handling, the cache, bootstrap failures, re-registration, backoff and close.

mod client_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use ccfleet::client::{BootstrapError, Client, Error, Options, Source, Update};
use ccfleet::server::registry::State as ServiceState;
use ccfleet::wire::ServiceType;
use client_support::{CLUSTER, Fleet, FleetSetup, HOST, cache_path, eventually};
use serde_json::Value;

const LEAF: &str = "ccmc/fritz/f0101.json";

fn json(text: &str) -> Value {
    serde_json::from_str(text).expect("JSON")
}

fn config_json(update: &Update) -> Value {
    json(update.config.as_deref().expect("a configuration"))
}

/// A URL on which nothing listens.
fn closed_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_status_sequence_204_200_304_200_204_404() {
    let fleet = Fleet::start(FleetSetup::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_path(&dir);
    let mut opts = fleet.options();
    opts.config.cache_path = Some(cache.clone());
    let client = Client::new(opts).unwrap();

    assert!(matches!(
        client.pull_config().await,
        Err(Error::NotRegistered)
    ));
    let registration = client.register().await.unwrap();
    let id = registration.instance_id;
    assert_eq!(registration.config_revision, 0);
    assert!(client.registered());

    // 204: nothing authored, nothing known before: no change.
    let (update, changed) = client.pull_config().await.unwrap();
    assert_eq!(update, Update::none());
    assert!(!changed);
    assert!(!cache.exists());

    // 200: the first configuration.
    fleet.author(LEAF, r#"{"a": 1}"#).await;
    let (update, changed) = client.pull_config().await.unwrap();
    assert!(changed);
    assert_eq!(update.source, Source::Fleet);
    assert_eq!(config_json(&update), json(r#"{"a":1}"#));
    let first_revision = update.revision.clone();
    assert!(
        !first_revision.is_empty() && first_revision.bytes().all(|b| b.is_ascii_digit()),
        "{first_revision:?}"
    );
    let cached = std::fs::read_to_string(&cache).expect("cache written on change");
    assert!(
        !cached.contains(&id),
        "the cache must not hold the instance id"
    );
    assert_eq!(json(&cached)["config"], json(r#"{"a":1}"#));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&cache), 0o600);
        assert_eq!(mode(cache.parent().unwrap()), 0o700);
    }

    // 304: the ETag is sent back and the configuration is unchanged.
    let (again, changed) = client.pull_config().await.unwrap();
    assert!(!changed);
    assert_eq!(again, update);

    // A cosmetic edit keeps the revision: still 304 and no change.
    fleet.author(LEAF, "{\n  \"a\" : 1\n}\n").await;
    let (again, changed) = client.pull_config().await.unwrap();
    assert!(!changed);
    assert_eq!(again.revision, first_revision);

    // 200 with a new body.
    fleet.author(LEAF, r#"{"a": 2}"#).await;
    let (update, changed) = client.pull_config().await.unwrap();
    assert!(changed);
    assert_eq!(config_json(&update), json(r#"{"a":2}"#));
    assert_ne!(update.revision, first_revision);

    // 204 after a configuration: a change, and the cache is deleted.
    fleet.unauthor(LEAF).await;
    let (update, changed) = client.pull_config().await.unwrap();
    assert!(changed);
    assert_eq!(update, Update::none());
    assert!(!cache.exists());

    // 404 once the instance is deregistered: the id is forgotten and never shown.
    fleet.deregister_direct(&id).await;
    let err = client.pull_config().await.unwrap_err();
    assert!(err.is_unknown_instance(), "{err}");
    assert_eq!(err.status().unwrap().code, 404);
    assert!(!err.to_string().contains(&id), "{err}");
    assert!(!format!("{err:?}").contains(&id), "{err:?}");
    assert!(!client.registered());

    let records = fleet.relay.records();
    let summaries: Vec<String> = records.iter().map(|r| r.summary()).collect();
    assert_eq!(
        summaries,
        [
            "POST register 201",
            "GET config 204",
            "GET config 200",
            "GET config 304",
            "GET config 304",
            "GET config 200",
            "GET config 204",
            "GET config 404",
        ]
    );
    for record in &records {
        assert_eq!(record.header("x-auth-token"), Some(fleet.token.as_str()));
        assert_eq!(record.header("accept"), Some("application/json"));
        let has_body = record.method == "POST" && record.path.contains("/register/");
        assert_eq!(record.body_len > 0, has_body, "{}", record.summary());
        assert_eq!(
            record.header("content-type"),
            has_body.then_some("application/json"),
            "Content-Type only with a body: {}",
            record.summary()
        );
    }
    let quoted = format!("\"{first_revision}\"");
    let if_none_match: Vec<Option<&str>> = records[1..]
        .iter()
        .map(|r| r.header("if-none-match"))
        .collect();
    assert_eq!(if_none_match[0], None);
    assert_eq!(if_none_match[1], None);
    assert_eq!(if_none_match[2], Some(quoted.as_str()));
    assert_eq!(if_none_match[3], Some(quoted.as_str()));
    assert_eq!(if_none_match[4], Some(quoted.as_str()));
    // After the 204 the ETag is cleared.
    assert_eq!(if_none_match[6], None);
    // Every body was drained, so connections were reused. (hyper hands a connection back to
    // its pool asynchronously, so a request may occasionally open a second one; a body left
    // unread would cost a connection per response with a body, four here.)
    let mut peers: Vec<_> = records.iter().map(|r| r.peer).collect();
    peers.sort();
    peers.dedup();
    assert!(peers.len() <= 2, "connections were not reused: {peers:?}");
}

/// The project's server always sends an ETag with a 200, so this path is tested against a
/// tiny local responder that answers without one.
#[tokio::test]
async fn same_body_without_etag_is_no_change() {
    #[derive(Clone, Default)]
    struct Responder {
        body: Arc<Mutex<String>>,
        if_none_match: Arc<Mutex<Vec<Option<String>>>>,
    }
    async fn register() -> impl IntoResponse {
        (
            StatusCode::CREATED,
            [("content-type", "application/json")],
            "{\"instanceId\":\"0123456789abcdef0123456789abcdef\",\"configRevision\":0}\n",
        )
    }
    async fn config(State(r): State<Responder>, headers: HeaderMap) -> impl IntoResponse {
        r.if_none_match.lock().unwrap().push(
            headers
                .get("if-none-match")
                .map(|v| v.to_str().unwrap().to_owned()),
        );
        let body = r.body.lock().unwrap().clone();
        (StatusCode::OK, [("content-type", "application/json")], body)
    }
    let responder = Responder::default();
    *responder.body.lock().unwrap() = r#"{"a":1}"#.into();
    let app = Router::new()
        .route("/api/fleet/register/cluster/", post(register))
        .route("/api/fleet/config/{id}", get(config))
        .with_state(responder.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let mut config = ccfleet::client::Config::new(url);
    config.cluster = CLUSTER.into();
    config.hostname = HOST.into();
    let client = Client::new(Options::new(config, ServiceType::MetricCollector)).unwrap();
    client.register().await.unwrap();

    let (update, changed) = client.pull_config().await.unwrap();
    assert!(changed);
    assert_eq!(update.config.as_deref(), Some(r#"{"a":1}"#));
    assert_eq!(update.revision, "");
    let (update, changed) = client.pull_config().await.unwrap();
    assert!(!changed, "same body without ETag must not be a change");
    assert_eq!(update.config.as_deref(), Some(r#"{"a":1}"#));

    *responder.body.lock().unwrap() = r#"{"a":2}"#.into();
    let (update, changed) = client.pull_config().await.unwrap();
    assert!(changed);
    assert_eq!(update.config.as_deref(), Some(r#"{"a":2}"#));
    let (_, changed) = client.pull_config().await.unwrap();
    assert!(!changed);

    // Not a JSON body: an error, and the known configuration stays.
    *responder.body.lock().unwrap() = "not json".into();
    let err = client.pull_config().await.unwrap_err();
    assert!(matches!(err, Error::InvalidResponse { .. }), "{err}");
    *responder.body.lock().unwrap() = r#"{"a":2}"#.into();
    let (_, changed) = client.pull_config().await.unwrap();
    assert!(!changed);

    // Bodies over 16 MiB are refused.
    *responder.body.lock().unwrap() = format!(r#"{{"a":"{}"}}"#, "x".repeat(16 << 20));
    let err = client.pull_config().await.unwrap_err();
    assert!(matches!(err, Error::InvalidResponse { .. }), "{err}");
    assert!(err.to_string().contains("exceeds 16777216 bytes"), "{err}");

    // Without an ETag there is nothing to send back.
    assert!(
        responder
            .if_none_match
            .lock()
            .unwrap()
            .iter()
            .all(Option::is_none)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_confirms_the_cache_with_304_and_falls_back_to_it_offline() {
    let fleet = Fleet::start(FleetSetup::default()).await;
    fleet.author(LEAF, r#"{"interval": "5s"}"#).await;
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_path(&dir);
    let options = |url: Option<String>, host: &str| {
        let mut opts = fleet.options();
        opts.config.cache_path = Some(cache.clone());
        opts.config.hostname = host.into();
        if let Some(url) = url {
            opts.config.url = url;
        }
        opts
    };

    // Online: the configuration arrives and is cached.
    let first = Client::new(options(None, HOST)).unwrap();
    let update = first.bootstrap(Duration::from_secs(5)).await.unwrap();
    assert_eq!(update.source, Source::Fleet);
    assert_eq!(config_json(&update), json(r#"{"interval":"5s"}"#));
    assert!(cache.exists());

    // A restarted service sends the cached ETag; the unchanged server answers 304.
    let second = Client::new(options(None, HOST)).unwrap();
    let from = fleet.relay.len();
    let confirmed = second.bootstrap(Duration::from_secs(5)).await.unwrap();
    assert_eq!(confirmed, update);
    assert_eq!(
        fleet.relay.summaries_since(from),
        ["POST register 201", "GET config 304"]
    );
    let quoted = format!("\"{}\"", update.revision);
    assert_eq!(
        fleet
            .relay
            .records()
            .last()
            .unwrap()
            .header("if-none-match"),
        Some(quoted.as_str())
    );
    // Its run loop does not deliver the cached configuration again.
    assert!(second.configs().try_recv().is_none());

    // Offline: the cached configuration is the fallback.
    let offline = Client::new(options(Some(closed_url()), HOST)).unwrap();
    let err = offline.bootstrap(Duration::from_secs(5)).await.unwrap_err();
    assert!(err.is_unreachable(), "{err}");
    assert!(matches!(err.error(), Error::Unreachable { .. }), "{err}");
    let fallback = err.into_fallback();
    assert_eq!(fallback.source, Source::Cache);
    assert_eq!(fallback.revision, update.revision);
    assert_eq!(fallback.config, update.config);

    // A cache written for another host, cluster or type is ignored.
    let other_host = Client::new(options(Some(closed_url()), "f0102")).unwrap();
    let err = other_host
        .bootstrap(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(err.is_unreachable());
    assert_eq!(err.fallback(), &Update::none());
    let mut other_cluster = options(Some(closed_url()), HOST);
    other_cluster.config.cluster = "alex".into();
    let err = Client::new(other_cluster)
        .unwrap()
        .bootstrap(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(err.fallback(), &Update::none());
    let mut other_type = options(Some(closed_url()), HOST);
    other_type.service_type = ServiceType::MetricStore;
    let err = Client::new(other_type)
        .unwrap()
        .bootstrap(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(err.fallback(), &Update::none());
    // The mismatching clients left the cache alone.
    let cached: Value = json(&std::fs::read_to_string(&cache).unwrap());
    assert_eq!(cached["identity"]["hostname"], HOST);
}

/// A proxy answering 503 (or 429) while cc-backend restarts must not stop a service that has
/// a cached configuration: bootstrap offers the cache as unreachable, and the run loop
/// registers once the proxy forwards again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_503_at_start_falls_back_to_the_cache_and_the_run_loop_recovers() {
    let fleet = Fleet::start(FleetSetup::default()).await;
    fleet.author(LEAF, r#"{"interval": "5s"}"#).await;
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_path(&dir);
    let options = || {
        let mut opts = fleet.options();
        opts.config.cache_path = Some(cache.clone());
        opts.config.heartbeat_interval = Duration::from_millis(100);
        opts.config.config_poll_interval = Duration::from_millis(100);
        opts
    };
    let first = Client::new(options()).unwrap();
    let cached = first.bootstrap(Duration::from_secs(5)).await.unwrap();
    assert_eq!(cached.source, Source::Fleet);
    first.close(Duration::from_secs(5)).await.unwrap();

    for status in [429, 502, 504] {
        fleet.relay.answer_with(Some(status));
        let err = Client::new(options())
            .unwrap()
            .bootstrap(Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(err.is_unreachable(), "{status}: {err}");
        assert_eq!(err.fallback().source, Source::Cache, "{status}");
    }
    // A client error is not transient: the service is told, with the cache still offered.
    fleet.relay.answer_with(Some(400));
    let err = Client::new(options())
        .unwrap()
        .bootstrap(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, BootstrapError::Failed { .. }), "{err}");

    fleet.relay.answer_with(Some(503));
    let client = Client::new(options()).unwrap();
    let err = client.bootstrap(Duration::from_secs(5)).await.unwrap_err();
    assert!(err.is_unreachable(), "{err}");
    assert_eq!(err.error().status().map(|s| s.code), Some(503));
    assert!(
        err.to_string().contains("cc-backend unreachable") && err.to_string().contains("503"),
        "{err}"
    );
    let fallback = err.into_fallback();
    assert_eq!(fallback.source, Source::Cache);
    assert_eq!(fallback.config, cached.config);
    assert_eq!(fallback.revision, cached.revision);

    let run = tokio::spawn({
        let client = client.clone();
        async move { client.run().await }
    });
    // Registration is retried with backoff (1 s, 2 s, ...) while the proxy answers 503,
    // although heartbeats and polls tick every 100 ms.
    eventually(
        "a retried registration",
        Duration::from_secs(10),
        || async { fleet.relay.count("POST register 503") >= 2 },
    )
    .await;
    let retries = fleet.relay.count("POST register 503");
    assert!(
        retries <= 3,
        "{retries} registrations within about a second"
    );
    fleet.relay.answer_with(None);
    eventually(
        "registration once the proxy forwards again",
        Duration::from_secs(10),
        || async { client.registered() },
    )
    .await;
    // The cached configuration is still current: confirmed by 304.
    eventually("the cache confirmed", Duration::from_secs(10), || async {
        fleet.relay.count("GET config 304") >= 1
    })
    .await;
    client.close(Duration::from_secs(5)).await.unwrap();
    run.await.unwrap().unwrap();
}

#[tokio::test]
async fn bootstrap_times_out_as_unreachable() {
    // Accepts connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let mut config = ccfleet::client::Config::new(url);
    config.cluster = CLUSTER.into();
    config.hostname = HOST.into();
    let client = Client::new(Options::new(config, ServiceType::MetricCollector)).unwrap();
    let err = client
        .bootstrap(Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(err.is_unreachable(), "{err}");
    assert!(
        matches!(
            err.error(),
            Error::Timeout {
                op: ccfleet::client::Op::Bootstrap,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.fallback().source, Source::None);
    silent.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthorized_is_not_unreachable() {
    let fleet = Fleet::start(FleetSetup::default()).await;
    fleet.author(LEAF, r#"{"a": 1}"#).await;
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_path(&dir);
    let mut good = fleet.options();
    good.config.cache_path = Some(cache.clone());
    Client::new(good)
        .unwrap()
        .bootstrap(Duration::from_secs(5))
        .await
        .unwrap();

    let foreign_token = {
        // A well-formed token, signed by another key: rejected like a bad one.
        let other = ccfleet::server::auth::Keypair::generate();
        other.sign_token("fleetbot", &["api"], None)
    };
    for token in ["not-a-token".to_owned(), foreign_token] {
        let mut bad = fleet.options();
        bad.config.cache_path = Some(cache.clone());
        bad.config.token = token.clone();
        let client = Client::new(bad).unwrap();
        let err = client.bootstrap(Duration::from_secs(5)).await.unwrap_err();
        assert!(matches!(err, BootstrapError::Unauthorized { .. }), "{err}");
        assert!(err.is_unauthorized() && !err.is_unreachable());
        assert_eq!(err.error().status().unwrap().code, 401);
        assert!(!err.to_string().contains(&token), "{err}");
        // The cached configuration is still offered.
        assert_eq!(err.fallback().source, Source::Cache);
        assert!(client.register().await.unwrap_err().is_unauthorized());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reregisters_and_pulls_at_once_after_a_rest_heartbeat_404() {
    let fleet = Fleet::start(FleetSetup::default()).await;
    let mut opts = fleet.options();
    opts.config.heartbeat_interval = Duration::from_millis(50);
    let client = Client::new(opts).unwrap();
    let mut configs = client.configs();
    let run = tokio::spawn({
        let client = client.clone();
        async move { client.run().await }
    });
    eventually(
        "the member to be active",
        Duration::from_secs(5),
        || async { fleet.instances(ServiceState::Active) == 1 },
    )
    .await;
    // Nothing authored: the initial pull delivered nothing.
    assert!(configs.try_recv().is_none());

    // Author a configuration; the poll interval is an hour, so only a re-registration's
    // immediate pull can bring it.
    fleet.author(LEAF, r#"{"v": 2}"#).await;
    let from = fleet.relay.len();
    // Another registration of the same cluster/host/type rotates the id.
    let rotated = fleet
        .register_direct(CLUSTER, HOST, ServiceType::MetricCollector)
        .await;

    let update = tokio::time::timeout(Duration::from_secs(5), configs.recv())
        .await
        .expect("the configuration after re-registration")
        .expect("client open");
    assert_eq!(config_json(&update), json(r#"{"v":2}"#));
    let seen = fleet.relay.summaries_since(from);
    let at = seen
        .iter()
        .position(|s| s == "POST heartbeat 404")
        .unwrap_or_else(|| panic!("no heartbeat 404 in {seen:?}"));
    assert_eq!(
        seen[at..at + 4],
        [
            "POST heartbeat 404",
            "POST register 201",
            "POST heartbeat 204",
            "GET config 200"
        ]
    );
    // The client's registration rotated the id again: the test's id is gone.
    assert_eq!(fleet.heartbeat_direct(&rotated).await, 404);

    client.close(Duration::from_secs(5)).await.unwrap();
    run.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_waits_for_run_then_deregisters() {
    let fleet = Fleet::start(FleetSetup::default()).await;
    let mut opts = fleet.options();
    opts.config.heartbeat_interval = Duration::from_millis(50);
    let client = Client::new(opts).unwrap();
    let mut configs = client.configs();
    let mut rosters = client.rosters();
    let run = tokio::spawn({
        let client = client.clone();
        async move { client.run().await }
    });
    eventually("a REST heartbeat", Duration::from_secs(5), || async {
        fleet.rest_heartbeats().await >= 1
    })
    .await;
    assert!(matches!(client.run().await, Err(Error::AlreadyRunning)));

    client.close(Duration::from_secs(5)).await.unwrap();
    assert!(run.is_finished(), "close returned before run did");
    run.await.unwrap().unwrap();
    assert!(!client.registered());

    let records = fleet.relay.records();
    let last = records.last().unwrap();
    assert_eq!(last.summary(), "DELETE deregister 204");
    let id = last.path.rsplit('/').next().unwrap();
    assert_eq!(fleet.lookup(id).unwrap().state, ServiceState::Deregistered);

    // Nothing runs any more: no request within several heartbeat intervals.
    let count = fleet.relay.len();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fleet.relay.len(), count);

    assert_eq!(configs.recv().await, None);
    assert_eq!(rosters.recv().await, None);
    assert!(matches!(client.run().await, Err(Error::Closed)));
    // Closing again has nothing left to deregister.
    client.close(Duration::from_secs(1)).await.unwrap();
    assert_eq!(fleet.relay.len(), count);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_consumer_sees_only_the_latest_config() {
    let fleet = Fleet::start(FleetSetup::default()).await;
    let mut opts = fleet.options();
    opts.config.config_poll_interval = Duration::from_millis(30);
    let client = Client::new(opts).unwrap();
    let mut configs = client.configs();
    let run = tokio::spawn({
        let client = client.clone();
        async move { client.run().await }
    });
    // Values of different lengths, so the server sees each edit even where file times are
    // coarse.
    for (pulled, v) in [1, 22, 333].into_iter().enumerate() {
        fleet.author(LEAF, &format!(r#"{{"v": {v}}}"#)).await;
        // The client fetched this version (and delivered it into the slot, unread).
        eventually(
            "the new version to be pulled",
            Duration::from_secs(5),
            || async { fleet.relay.count("GET config 200") == pulled + 1 },
        )
        .await;
        // The relay counts the answer before the client has handled it: wait until the
        // version is in the slot (a fresh receiver starts at the newest value).
        let expected = json(&format!(r#"{{"v":{v}}}"#));
        eventually(
            "the new version to be delivered",
            Duration::from_secs(5),
            || async {
                client
                    .configs()
                    .try_recv()
                    .is_some_and(|u| config_json(&u) == expected)
            },
        )
        .await;
    }
    let update = configs.recv().await.unwrap();
    assert_eq!(config_json(&update), json(r#"{"v":333}"#));
    assert!(configs.try_recv().is_none(), "older versions must be gone");

    client.close(Duration::from_secs(5)).await.unwrap();
    run.await.unwrap().unwrap();
}

/// Registration backs off 1 s, 2 s, 4 s, ... (paused clock, driven tick by tick). The server
/// runs on its own runtime in real time; auto-advance of this runtime's clock is held off by
/// a blocking task, so the client's HTTP requests complete while virtual time stands still.
#[tokio::test(start_paused = true)]
async fn registration_backs_off_exponentially() {
    let (release, hold) = std::sync::mpsc::channel::<()>();
    let inhibitor = tokio::task::spawn_blocking(move || {
        let _ = hold.recv();
    });
    let fleet = Fleet::start(FleetSetup::default()).await;

    let mut opts = fleet.options();
    opts.config.token = "not-a-token".into();
    opts.config.heartbeat_interval = Duration::from_millis(20);
    // The run loop asks the NATS provider once per heartbeat tick, after the tick's
    // registration attempt: a precise "tick done" signal.
    let ticks = Arc::new(tokio::sync::watch::Sender::new(0usize));
    let provider_ticks = ticks.clone();
    opts.nats = Some(Arc::new(move || {
        provider_ticks.send_modify(|n| *n += 1);
        None
    }));
    let client = Client::new(opts).unwrap();
    let start = tokio::time::Instant::now();
    let run = tokio::spawn({
        let client = client.clone();
        async move { client.run().await }
    });
    let mut done = ticks.subscribe();
    let mut expected = 1;
    done.wait_for(|n| *n >= expected).await.unwrap();
    let mut attempts = vec![start.elapsed()];
    assert_eq!(fleet.relay.count("POST register"), 1);
    while start.elapsed() < Duration::from_millis(7_500) {
        tokio::time::advance(Duration::from_millis(20)).await;
        expected += 1;
        done.wait_for(|n| *n >= expected).await.unwrap();
        if start.elapsed() == Duration::from_millis(300) {
            assert_eq!(
                fleet.relay.count("POST register"),
                1,
                "20 ms ticks over 300 ms make exactly one attempt"
            );
        }
        if fleet.relay.count("POST register") > attempts.len() {
            attempts.push(start.elapsed());
        }
    }
    assert_eq!(
        attempts,
        [0, 1_000, 3_000, 7_000].map(Duration::from_millis),
        "attempts at 0 s, then after 1 s, 2 s and 4 s"
    );
    assert!(
        fleet
            .relay
            .records()
            .iter()
            .all(|r| r.summary() == "POST register 401"),
        "nothing but rejected registrations"
    );

    client.close(Duration::from_secs(1)).await.unwrap();
    run.await.unwrap().unwrap();
    drop(release);
    inhibitor.await.unwrap();
}
