//! `Cached` (background refresh, last good set, errors) and `Merged` (union, precedence,
//! error propagation), driven by a scripted source.
#![cfg(feature = "discovery")]

use std::collections::VecDeque;
use std::future::pending;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ccfleet::discovery::{
    CACHE_REFRESH_INTERVAL, Cached, Discoverer, DiscoveryError, Instance, Merged, Static,
};

#[path = "support/logs.rs"]
mod logs;
use logs::Logs;

/// Generous bound for anything that should happen promptly; never a performance assertion.
const PROMPTLY: Duration = Duration::from_secs(5);

type Script = Result<Vec<Instance>, u16>;

/// A source answering from a script, repeating its last entry, or hanging forever.
struct Scripted {
    name: &'static str,
    script: Mutex<VecDeque<Script>>,
    last: Mutex<Option<Script>>,
    hang: bool,
    delay: Duration,
    calls: AtomicUsize,
    log: Arc<Mutex<Vec<String>>>,
}

impl Scripted {
    fn new(name: &'static str, script: Vec<Script>) -> Arc<Scripted> {
        Arc::new(Scripted {
            name,
            script: Mutex::new(script.into()),
            last: Mutex::new(None),
            hang: false,
            delay: Duration::ZERO,
            calls: AtomicUsize::new(0),
            log: Arc::default(),
        })
    }

    fn hanging() -> Arc<Scripted> {
        Arc::new(Scripted {
            hang: true,
            ..Arc::into_inner(Scripted::new("hanging", vec![])).unwrap()
        })
    }

    fn delayed(name: &'static str, delay: Duration, script: Vec<Script>) -> Arc<Scripted> {
        Arc::new(Scripted {
            delay,
            ..Arc::into_inner(Scripted::new(name, script)).unwrap()
        })
    }

    fn with_log(
        name: &'static str,
        script: Vec<Script>,
        log: Arc<Mutex<Vec<String>>>,
    ) -> Arc<Scripted> {
        Arc::new(Scripted {
            log,
            ..Arc::into_inner(Scripted::new(name, script)).unwrap()
        })
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Discoverer for Scripted {
    async fn list_instances(&self) -> Result<Vec<Instance>, DiscoveryError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.log.lock().unwrap().push(format!("{}:list", self.name));
        if self.hang {
            pending::<()>().await;
        }
        tokio::time::sleep(self.delay).await;
        let next = {
            let mut script = self.script.lock().unwrap();
            let mut last = self.last.lock().unwrap();
            if let Some(s) = script.pop_front() {
                *last = Some(s);
            }
            last.clone().expect("a scripted result")
        };
        next.map_err(|status| DiscoveryError::Status {
            operation: format!("listing {}", self.name),
            status,
            message: None,
        })
    }

    async fn start(&self) {
        self.log
            .lock()
            .unwrap()
            .push(format!("{}:start", self.name));
    }

    async fn stop(&self) {
        self.log.lock().unwrap().push(format!("{}:stop", self.name));
    }
}

fn instance(id: &str, ip: &str, port: u16) -> Instance {
    Instance {
        workload_id: id.to_owned(),
        node_id: format!("{id}-node"),
        ip_address: ip.to_owned(),
        port,
        backend: "test".to_owned(),
    }
}

/// Waits until the cache has completed `n` refreshes.
async fn refreshes(cache: &Cached, n: u64) {
    let mut rx = cache.subscribe();
    tokio::time::timeout(PROMPTLY, rx.wait_for(|s| s.refreshes >= n))
        .await
        .expect("refreshes happen")
        .expect("cache alive");
}

#[tokio::test]
async fn reports_not_yet_synced_before_the_first_refresh() {
    let source = Scripted::new("src", vec![Ok(vec![])]);
    let cache = Cached::new(source.clone());
    let err = cache.list_instances().await.unwrap_err();
    assert!(matches!(err, DiscoveryError::NotYetSynced), "{err:?}");
    assert!(err.is_not_yet_synced());
    assert_eq!(
        err.to_string(),
        "service discovery has not completed a refresh yet"
    );
    assert_eq!(
        source.calls(),
        0,
        "listing a cache never touches the source"
    );
}

#[tokio::test]
async fn start_refreshes_immediately_and_serves_the_set() {
    let set = vec![instance("a", "10.0.0.1", 5008)];
    let source = Scripted::new("src", vec![Ok(set.clone())]);
    // The default 10 s interval: only the immediate refresh can land within the test.
    let cache = Cached::new(source.clone());
    cache.start().await;
    refreshes(&cache, 1).await;
    assert_eq!(cache.list_instances().await.unwrap(), set);
    assert_eq!(source.calls(), 1);
    cache.stop().await;
}

#[tokio::test]
async fn an_empty_source_is_an_empty_set_not_unsynced() {
    let cache = Cached::new(Scripted::new("src", vec![Ok(vec![])]));
    cache.refresh().await.unwrap();
    assert_eq!(cache.list_instances().await.unwrap(), vec![]);
}

#[tokio::test]
async fn a_failed_refresh_keeps_the_last_set_and_reports_the_error() {
    let first = vec![
        instance("a", "10.0.0.1", 5008),
        instance("b", "10.0.0.2", 5008),
    ];
    let second = vec![instance("c", "10.0.0.3", 5008)];
    let source = Scripted::new("src", vec![Ok(first.clone()), Err(503), Ok(second.clone())]);
    let cache = Cached::new(source.clone());

    cache.refresh().await.unwrap();
    assert_eq!(cache.list_instances().await.unwrap(), first);

    let refresh_err = cache.refresh().await.unwrap_err();
    assert!(matches!(
        *refresh_err,
        DiscoveryError::Status { status: 503, .. }
    ));
    let err = cache.list_instances().await.unwrap_err();
    match &err {
        DiscoveryError::RefreshFailed { last_known, error } => {
            assert_eq!(last_known.as_deref(), Some(&first[..]));
            assert!(matches!(
                **error,
                DiscoveryError::Status { status: 503, .. }
            ));
        }
        other => panic!("expected RefreshFailed, got {other:?}"),
    }
    assert_eq!(
        err.last_known(),
        Some(&first[..]),
        "a blip does not empty the fleet"
    );
    let text = err.to_string();
    assert!(text.contains("2 instances"), "{text}");
    assert!(
        text.contains("listing src: unexpected HTTP status 503"),
        "{text}"
    );

    // The next good refresh clears the error.
    cache.refresh().await.unwrap();
    assert_eq!(cache.list_instances().await.unwrap(), second);
}

#[tokio::test]
async fn a_first_refresh_failure_is_reported_without_a_set() {
    let cache = Cached::new(Scripted::new("src", vec![Err(500)]));
    let _ = cache.refresh().await;
    let err = cache.list_instances().await.unwrap_err();
    assert!(
        !err.is_not_yet_synced(),
        "a failed refresh is not 'not yet synced'"
    );
    assert!(
        matches!(
            err,
            DiscoveryError::RefreshFailed {
                last_known: None,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.last_known(), None);
}

/// Waits, on the paused clock, until the cache has completed `n` refreshes.
async fn refreshes_paused(cache: &Cached, n: u64) {
    let mut rx = cache.subscribe();
    // Virtual time: the bound only turns a hang into a failure, it costs nothing.
    tokio::time::timeout(Duration::from_secs(600), rx.wait_for(|s| s.refreshes >= n))
        .await
        .expect("refreshes happen")
        .expect("cache alive");
}

#[tokio::test(start_paused = true)]
async fn start_refreshes_immediately_then_every_ten_seconds_until_stopped() {
    let source = Scripted::new("src", vec![Ok(vec![instance("a", "10.0.0.1", 1)])]);
    let cache = Cached::new(source.clone());
    let t0 = tokio::time::Instant::now();
    cache.start().await;
    cache.start().await; // already running: no second loop
    refreshes_paused(&cache, 1).await;
    assert_eq!(
        t0.elapsed(),
        Duration::ZERO,
        "the first refresh is immediate"
    );
    refreshes_paused(&cache, 2).await;
    assert_eq!(t0.elapsed(), Duration::from_secs(10));
    refreshes_paused(&cache, 3).await;
    assert_eq!(t0.elapsed(), Duration::from_secs(20));
    assert_eq!(source.calls(), 3);
    assert!(cache.is_running());

    cache.stop().await;
    assert!(!cache.is_running());
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(source.calls(), 3, "no refresh after stop");
    // The set survives the loop.
    assert_eq!(cache.list_instances().await.unwrap().len(), 1);

    // And the loop can be started again, refreshing at once.
    let t1 = tokio::time::Instant::now();
    cache.start().await;
    refreshes_paused(&cache, 4).await;
    assert_eq!(t1.elapsed(), Duration::ZERO);
    cache.stop().await;
}

#[tokio::test(start_paused = true)]
async fn each_refresh_is_bounded_by_the_timeout() {
    let cache = Cached::new(Scripted::hanging());
    let t0 = tokio::time::Instant::now();
    let err = cache.refresh().await.unwrap_err();
    assert_eq!(t0.elapsed(), CACHE_REFRESH_INTERVAL);
    assert!(matches!(*err, DiscoveryError::TimedOut { after } if after == CACHE_REFRESH_INTERVAL));
    let listed = cache.list_instances().await.unwrap_err();
    assert!(
        listed.to_string().contains("did not finish within 10s"),
        "{listed}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_source_times_out_inside_the_loop_too() {
    let source = Scripted::hanging();
    let cache = Cached::with_timing(
        source.clone(),
        Duration::from_secs(10),
        Duration::from_secs(3),
    );
    let t0 = tokio::time::Instant::now();
    cache.start().await;
    refreshes_paused(&cache, 1).await;
    assert_eq!(t0.elapsed(), Duration::from_secs(3));
    let snapshot = cache.snapshot();
    assert!(snapshot.instances.is_none());
    assert!(matches!(
        snapshot.error.as_deref(),
        Some(DiscoveryError::TimedOut { .. })
    ));
    // The next refresh is still on the interval, not right after the timeout.
    refreshes_paused(&cache, 2).await;
    assert_eq!(t0.elapsed(), Duration::from_secs(13));
    assert_eq!(source.calls(), 2);
    cache.stop().await;
}

#[tokio::test(start_paused = true)]
async fn stop_cancels_a_refresh_in_flight() {
    let source = Scripted::hanging();
    let cache = Cached::new(source.clone());
    let t0 = tokio::time::Instant::now();
    cache.start().await;
    while source.calls() == 0 {
        tokio::task::yield_now().await;
    }
    cache.stop().await;
    assert!(
        t0.elapsed() < CACHE_REFRESH_INTERVAL,
        "stop did not wait for the refresh timeout"
    );
    assert!(
        cache
            .list_instances()
            .await
            .unwrap_err()
            .is_not_yet_synced()
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_the_cache_ends_its_loop() {
    let source = Scripted::new("src", vec![Ok(vec![])]);
    let cache = Cached::new(source.clone());
    cache.start().await;
    refreshes_paused(&cache, 2).await;
    drop(cache);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(source.calls(), 2);
}

#[tokio::test]
async fn start_and_stop_reach_the_wrapped_source() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let source = Scripted::with_log("src", vec![Ok(vec![])], log.clone());
    let cache = Cached::new(source);
    cache.start().await;
    refreshes(&cache, 1).await;
    cache.stop().await;
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log.first().map(String::as_str),
        Some("src:start"),
        "{log:?}"
    );
    assert_eq!(log.last().map(String::as_str), Some("src:stop"), "{log:?}");
}

#[tokio::test]
async fn a_source_still_warming_up_is_not_a_refresh() {
    // A nested cache that was never started has read nothing, and neither has this one.
    let nested = Arc::new(Cached::new(Scripted::new("src", vec![Ok(vec![])])));
    let cache = Cached::new(nested);
    let err = cache.refresh().await.unwrap_err();
    assert!(err.is_not_yet_synced());
    assert_eq!(cache.snapshot().refreshes, 0);
    assert!(cache.snapshot().error.is_none());
    assert!(
        cache
            .list_instances()
            .await
            .unwrap_err()
            .is_not_yet_synced()
    );
}

#[tokio::test(start_paused = true)]
async fn nested_caches_start_together_and_the_outer_one_syncs_soon_after_the_inner() {
    let slow = Scripted::delayed(
        "slow",
        Duration::from_secs(1),
        vec![Ok(vec![instance("a", "10.0.0.1", 1)])],
    );
    let inner = Arc::new(Cached::new(slow));
    let outer = Cached::new(Arc::new(Merged::new(
        inner.clone(),
        Arc::new(Static::new(&["10.0.0.2"], 5008).unwrap()),
    )));
    let t0 = tokio::time::Instant::now();
    outer.start().await;
    assert!(inner.is_running(), "start reached the nested cache");
    refreshes_paused(&outer, 1).await;
    // The inner cache read its source after 1 s; the outer one asked again within a
    // fraction of its 10 s interval instead of waiting for the next tick.
    assert!(
        t0.elapsed() >= Duration::from_secs(1) && t0.elapsed() < Duration::from_secs(3),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(outer.list_instances().await.unwrap().len(), 2);
    outer.stop().await;
    assert!(!inner.is_running(), "stop reached the nested cache");
}

#[test]
fn the_default_interval_is_ten_seconds() {
    assert_eq!(CACHE_REFRESH_INTERVAL, Duration::from_secs(10));
}

#[tokio::test]
async fn merged_deduplicates_by_workload_id_and_the_primary_wins() {
    let primary = Scripted::new(
        "primary",
        vec![Ok(vec![instance("aaaaaaaa", "10.0.0.1", 6123)])],
    );
    let fallback = Scripted::new(
        "fallback",
        vec![Ok(vec![
            instance("aaaaaaaa", "10.0.0.1", 5008),
            instance("bbbbbbbb", "10.0.0.2", 5008),
            instance("bbbbbbbb", "10.0.0.3", 5008),
        ])],
    );
    let merged = Merged::new(primary, fallback);
    let got = merged.list_instances().await.unwrap();
    let addresses: Vec<String> = got.iter().map(Instance::address).collect();
    assert_eq!(addresses, ["10.0.0.1:6123", "10.0.0.2:5008"]);
}

#[tokio::test]
async fn merged_propagates_a_primary_error() {
    let primary = Scripted::new("primary", vec![Err(500)]);
    let fallback = Scripted::new("fallback", vec![Ok(vec![instance("b", "10.0.0.2", 1)])]);
    let err = Merged::new(primary, fallback.clone())
        .list_instances()
        .await
        .unwrap_err();
    match &err {
        DiscoveryError::Primary(inner) => {
            assert!(matches!(
                **inner,
                DiscoveryError::Status { status: 500, .. }
            ))
        }
        other => panic!("expected Primary, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "primary discovery failed: listing primary: unexpected HTTP status 500"
    );
    assert_eq!(fallback.calls(), 0);
}

#[tokio::test]
async fn merged_propagates_a_fallback_error_rather_than_a_partial_list() {
    let primary = Scripted::new("primary", vec![Ok(vec![instance("a", "10.0.0.1", 1)])]);
    let fallback = Scripted::new("fallback", vec![Err(502)]);
    let err = Merged::new(primary, fallback)
        .list_instances()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, DiscoveryError::Fallback(inner) if matches!(**inner, DiscoveryError::Status { status: 502, .. }))
    );
    assert!(
        err.to_string().starts_with("fallback discovery failed: "),
        "{err}"
    );
}

#[tokio::test]
async fn merged_forwards_start_and_stop_to_both_in_order() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let primary = Scripted::with_log("primary", vec![Ok(vec![])], log.clone());
    let fallback = Scripted::with_log("fallback", vec![Ok(vec![])], log.clone());
    let merged = Merged::new(primary, fallback);
    merged.start().await;
    merged.stop().await;
    assert_eq!(
        *log.lock().unwrap(),
        [
            "primary:start",
            "fallback:start",
            "primary:stop",
            "fallback:stop"
        ]
    );
}

#[tokio::test]
async fn merged_caches_report_not_yet_synced_until_both_refreshed() {
    let primary = Arc::new(Cached::new(Arc::new(
        Static::new(&["10.0.0.1"], 5008).unwrap(),
    )));
    let fallback = Arc::new(Cached::new(Arc::new(
        Static::new(&["10.0.0.2"], 5008).unwrap(),
    )));
    let merged = Merged::new(primary.clone(), fallback.clone());
    assert!(
        merged
            .list_instances()
            .await
            .unwrap_err()
            .is_not_yet_synced()
    );
    primary.refresh().await.unwrap();
    let err = merged.list_instances().await.unwrap_err();
    assert!(matches!(err, DiscoveryError::Fallback(_)) && err.is_not_yet_synced());
    fallback.refresh().await.unwrap();
    assert_eq!(merged.list_instances().await.unwrap().len(), 2);
}

#[tokio::test]
async fn stopping_the_refresh_loop_is_logged_at_info() {
    let (logs, _guard) = Logs::capture();
    let cached = Cached::new(Arc::new(Static::new(&["10.0.0.1"], 5008).unwrap()));
    cached.start().await;
    cached.stop().await;
    let lines = logs.lines();
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" INFO ") && l.contains("stopping service discovery keep-in-sync")),
        "{lines:#?}"
    );
}
