//! The plugin host against real components built from guest/ during the test run.

#[path = "support/guests.rs"]
mod guests;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccfleet::lineproto::{Decoder, FieldValue as LpValue};
use ccfleet_host::events::EventKind;
use ccfleet_host::sink::{self, Batch, BatchReceiver};
use ccfleet_host::types::{ConfigUpdate, Level, Provider, Source};
use ccfleet_host::{
    Failure, FeedSenders, HostError, PluginEvent, PluginSpec, PluginState, Runtime, RuntimeOptions,
};
use tokio::sync::broadcast;

const WAIT: Duration = Duration::from_secs(30);

fn runtime(cache: &Path) -> Runtime {
    Runtime::new(RuntimeOptions {
        cache_dir: Some(cache.to_path_buf()),
        watch_interval: Duration::from_millis(50),
        ..RuntimeOptions::default()
    })
    .expect("runtime")
}

fn spec(component: &str) -> PluginSpec {
    let mut spec = PluginSpec::new(guests::component(component));
    spec.limits.restart_backoff = Duration::from_millis(10);
    spec.limits.max_restart_backoff = Duration::from_millis(50);
    spec
}

fn config(revision: &str, body: &str) -> ConfigUpdate {
    ConfigUpdate {
        config: Some(body.to_owned()),
        revision: revision.to_owned(),
        source: Source::Fleet,
    }
}

fn provider(service_type: &str, hostname: &str) -> Provider {
    Provider {
        service_type: service_type.to_owned(),
        hostname: hostname.to_owned(),
        state: "active".to_owned(),
        meta: vec![("port".to_owned(), "8080".to_owned())],
    }
}

/// Waits for the first event of `plugin` matching `pred`, skipping others.
async fn wait_for(
    events: &mut broadcast::Receiver<PluginEvent>,
    plugin: &str,
    what: &str,
    pred: impl Fn(&PluginEvent) -> bool,
) -> PluginEvent {
    let found = tokio::time::timeout(WAIT, async {
        loop {
            match events.recv().await {
                Ok(event) if &*event.plugin == plugin && pred(&event) => return event,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("event channel closed"),
            }
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("timed out waiting for {plugin}: {what}"))
}

fn is_log(event: &PluginEvent, needle: &str) -> bool {
    matches!(&event.kind, EventKind::Log { message, .. } if message.contains(needle))
}

async fn next_batch(rx: &mut BatchReceiver) -> Batch {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("timed out waiting for a metric batch")
        .expect("sink closed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_and_roster_reach_the_plugin() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let mut events = runtime.subscribe();
    let (sink, _rx) = sink::channel(16);
    let feeds = FeedSenders::new();
    feeds.set_config(config("7", r#"{"interval":"10s"}"#));
    let plugin = runtime.spawn(spec("roster-logger"), feeds.subscribe(), sink);

    let name = plugin.name().to_owned();
    wait_for(&mut events, &name, "ready log", |e| {
        is_log(e, "roster-logger ready")
    })
    .await;
    // A value published before the plugin started is replayed to it.
    let logged = wait_for(&mut events, &name, "config log", |e| {
        is_log(e, "config revision 7 from fleet (18 bytes)")
    })
    .await;
    assert_eq!(logged.generation, 1);
    assert!(matches!(
        &logged.kind,
        EventKind::Log {
            level: Level::Info,
            ..
        }
    ));

    feeds.set_roster(vec![provider("ccms", "m1"), provider("ccb", "b1")]);
    wait_for(&mut events, &name, "first roster", |e| {
        is_log(
            e,
            "roster: 2 providers; joined: [ccb/b1, ccms/m1]; left: []",
        )
    })
    .await;
    feeds.set_roster(vec![provider("ccms", "m1"), provider("ccms", "m2")]);
    wait_for(&mut events, &name, "second roster", |e| {
        is_log(e, "roster: 2 providers; joined: [ccms/m2]; left: [ccb/b1]")
    })
    .await;
    feeds.set_config(config("8", "{}"));
    wait_for(&mut events, &name, "delivery event", |e| {
        e.kind
            == EventKind::ConfigDelivered {
                revision: "8".to_owned(),
            }
    })
    .await;
    let status = plugin.status().borrow().clone();
    assert_eq!(status.state, PluginState::Running);
    assert_eq!(status.restarts, 0);
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trapped_plugin_is_restarted_and_replayed() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let mut events = runtime.subscribe();
    let (sink, _rx) = sink::channel(16);
    let feeds = FeedSenders::new();
    let mut spec = spec("hostile-trap");
    spec.collect_interval = Some(Duration::from_millis(100));
    let plugin = runtime.spawn(spec, feeds.subscribe(), sink);
    let name = plugin.name().to_owned();

    wait_for(&mut events, &name, "first start", |e| {
        e.kind == EventKind::Started
    })
    .await;
    feeds.set_config(config("3", r#"{"a":1}"#));
    feeds.set_roster(vec![provider("ccms", "m1"), provider("ccms", "m2")]);
    wait_for(&mut events, &name, "roster in generation 1", |e| {
        e.generation == 1 && is_log(e, "roster: 2 providers")
    })
    .await;

    let crash = wait_for(&mut events, &name, "trap", |e| {
        matches!(e.kind, EventKind::Crashed { .. })
    })
    .await;
    let EventKind::Crashed { failure } = crash.kind else {
        unreachable!()
    };
    assert!(
        matches!(&failure, Failure::Trap { call: "collect", message } if message.contains("unreachable")),
        "{failure:?}"
    );

    // The new instance is replayed the latest snapshots before anything else.
    let generation = crash.generation + 1;
    wait_for(&mut events, &name, "restart", |e| {
        e.generation == generation && e.kind == EventKind::Started
    })
    .await;
    wait_for(&mut events, &name, "config replay", |e| {
        e.generation == generation && is_log(e, "config revision 3")
    })
    .await;
    wait_for(&mut events, &name, "roster replay", |e| {
        e.generation == generation && is_log(e, "roster: 2 providers")
    })
    .await;
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_loop_is_stopped_at_its_deadline_while_others_keep_running() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let mut events = runtime.subscribe();
    let mut logger_started = runtime.subscribe();
    let (sink, _rx) = sink::channel(16);
    let feeds = FeedSenders::new();
    let mut spinner = spec("hostile-loop");
    spinner.limits.call_timeout = Duration::from_millis(200);
    spinner.limits.restart_budget = 1;
    let spinner = runtime.spawn(spinner, feeds.subscribe(), sink.clone());
    let logger = runtime.spawn(spec("roster-logger"), feeds.subscribe(), sink);
    // The two start in either order (whichever compiles first), so each start is awaited
    // on a receiver of its own: one wait must not skip past the other plugin's event.
    wait_for(&mut events, spinner.name(), "start", |e| {
        e.kind == EventKind::Started
    })
    .await;
    wait_for(&mut logger_started, logger.name(), "start", |e| {
        e.kind == EventKind::Started
    })
    .await;

    // The two plugins' events interleave; each is followed on its own receiver.
    let mut logger_events = runtime.subscribe();
    feeds.set_config(config("1", "{}"));
    let started = Instant::now();
    let crash = wait_for(&mut events, spinner.name(), "deadline", |e| {
        matches!(e.kind, EventKind::Crashed { .. })
    })
    .await;
    let elapsed = started.elapsed();
    assert_eq!(
        crash.kind,
        EventKind::Crashed {
            failure: Failure::Deadline {
                call: "on-config",
                limit: Duration::from_millis(200)
            }
        }
    );
    // Not a performance bound: it shows the call was cut off rather than left spinning.
    assert!(
        elapsed < Duration::from_secs(10),
        "stopped after {elapsed:?}"
    );

    // The other plugin got the same snapshot and keeps getting new ones.
    wait_for(&mut logger_events, logger.name(), "config 1", |e| {
        is_log(e, "config revision 1 from fleet")
    })
    .await;
    feeds.set_config(config("2", "{}"));
    wait_for(&mut logger_events, logger.name(), "config 2", |e| {
        is_log(e, "config revision 2 from fleet")
    })
    .await;

    // The spinner is replayed revision 2 after its restart, spins again and, with its budget
    // of one restart spent, is quarantined.
    wait_for(&mut events, spinner.name(), "quarantine", |e| {
        e.kind == EventKind::Quarantined { restarts: 1 }
    })
    .await;
    assert_eq!(spinner.status().borrow().state, PluginState::Quarantined);
    assert_eq!(logger.status().borrow().state, PluginState::Running);
    spinner.stop().await;
    logger.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_bomb_is_refused_at_its_limit() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let mut events = runtime.subscribe();
    let (sink, _rx) = sink::channel(16);
    let feeds = FeedSenders::new();
    let mut bomb = spec("hostile-memory-bomb");
    bomb.limits.memory_mb = 16;
    bomb.limits.restart_budget = 0;
    let bomb = runtime.spawn(bomb, feeds.subscribe(), sink);
    feeds.set_config(config("1", "{}"));
    let crash = wait_for(&mut events, bomb.name(), "memory limit", |e| {
        matches!(e.kind, EventKind::Crashed { .. })
    })
    .await;
    let EventKind::Crashed { failure } = crash.kind else {
        unreachable!()
    };
    match failure {
        Failure::MemoryLimit {
            call,
            limit,
            requested,
        } => {
            assert_eq!(call, "on-config");
            assert_eq!(limit, 16 << 20);
            assert!(requested > limit);
        }
        other => panic!("expected a memory-limit failure, got {other:?}"),
    }
    wait_for(&mut events, bomb.name(), "quarantine", |e| {
        matches!(e.kind, EventKind::Quarantined { .. })
    })
    .await;
    bomb.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasi_is_granted_only_by_configuration() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());

    // No grant: the component, which imports WASI, is refused at load.
    let error = runtime
        .load(&spec("hostile-proc-probe"))
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(&error, HostError::WasiNotGranted { import, .. } if import.starts_with("wasi:")),
        "{error}"
    );
    assert!(error.to_string().contains("grants no WASI"), "{error}");

    // WASI with one directory: the plugin reads inside it and nowhere else.
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("inside.txt"), "12345").unwrap();
    let outside = tempfile::NamedTempFile::new().unwrap();
    let inside = data.path().join("inside.txt");
    let mut events = runtime.subscribe();
    let (sink, _rx) = sink::channel(4);
    let feeds = FeedSenders::new();
    let mut granted = spec("hostile-proc-probe");
    granted.capabilities.wasi = true;
    granted.capabilities.read_dirs = vec![data.path().to_path_buf()];
    granted.config = serde_json::json!({"wasi": [inside, outside.path()]});
    let plugin = runtime.spawn(granted, feeds.subscribe(), sink);
    let name = plugin.name().to_owned();
    let read = wait_for(&mut events, &name, "inside", |e| {
        is_log(e, &format!("probe wasi {}:", inside.display()))
    })
    .await;
    assert!(is_log(&read, "read 5 bytes"), "{read:?}");
    let refused = wait_for(&mut events, &name, "outside", |e| {
        is_log(e, &format!("probe wasi {}:", outside.path().display()))
    })
    .await;
    assert!(is_log(&refused, "refused"), "{refused:?}");
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_reads_only_the_files_it_is_granted() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let mut events = runtime.subscribe();
    let (sink, mut rx) = sink::channel(16);
    let feeds = FeedSenders::new();

    // The collector needs no WASI at all.
    runtime
        .load(&spec("loadavg"))
        .await
        .expect("loads without WASI");

    // Nothing granted: it runs, but cannot read /proc/loadavg.
    let mut blind = spec("loadavg");
    blind.name = Some("blind".to_owned());
    blind.config = serde_json::json!({"hostname": "n1"});
    blind.collect_interval = Some(Duration::from_millis(50));
    let blind = runtime.spawn(blind, feeds.subscribe(), sink.clone());
    let failed = wait_for(&mut events, "blind", "collect failure", |e| {
        matches!(
            e.kind,
            EventKind::CallFailed {
                call: "collect",
                ..
            }
        )
    })
    .await;
    let EventKind::CallFailed { message, .. } = failed.kind else {
        unreachable!()
    };
    assert!(
        message.contains("cannot read /proc/loadavg: /proc/loadavg is not granted"),
        "{message}"
    );
    blind.stop().await;
    assert!(
        rx.try_recv().is_err(),
        "nothing may be emitted without the file"
    );

    // A fixture root: the plugin asks for /proc/loadavg and gets the fixture's.
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("proc/sys/kernel")).unwrap();
    std::fs::write(
        root.path().join("proc/loadavg"),
        "0.50 1.25 2.00 1/100 42\n",
    )
    .unwrap();
    std::fs::write(
        root.path().join("proc/sys/kernel/hostname"),
        "fixture-host\n",
    )
    .unwrap();
    let mut fixture = spec("loadavg");
    fixture.name = Some("fixture".to_owned());
    fixture.capabilities.read_files = vec![
        "/proc/loadavg".to_owned(),
        "/proc/sys/kernel/hostname".to_owned(),
    ];
    fixture.capabilities.files_root = Some(root.path().to_path_buf());
    fixture.collect_interval = Some(Duration::from_millis(50));
    let fixture = runtime.spawn(fixture, feeds.subscribe(), sink.clone());
    let batch = next_batch(&mut rx).await;
    assert_eq!(&*batch.plugin, "fixture");
    let mut seen = Vec::new();
    for line in Decoder::new(&batch.lines) {
        let line = line.expect("valid line protocol");
        let tags: Vec<(String, String)> = line
            .tags()
            .map(|(k, v)| (k.raw().to_owned(), v.unescape().into_owned()))
            .collect();
        assert_eq!(
            tags,
            [("hostname", "fixture-host"), ("type", "node")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        let fields: Vec<_> = line.fields().collect();
        let value = match fields[0].1 {
            LpValue::Float(value) => value,
            LpValue::Int(count) => count as f64,
            ref other => panic!("a number, not {other:?}"),
        };
        seen.push((line.measurement().unescape().into_owned(), value));
    }
    assert_eq!(
        seen,
        [
            ("load_one", 0.5),
            ("load_five", 1.25),
            ("load_fifteen", 2.0),
            ("proc_run", 1.0),
            ("proc_total", 100.0)
        ]
        .map(|(m, v)| (m.to_owned(), v))
    );
    fixture.stop().await;
    while rx.try_recv().is_ok() {}

    // Granting the real file: real load averages in cc-metric-store's shape.
    let mut granted = spec("loadavg");
    granted.capabilities.read_files = vec!["/proc/loadavg".to_owned()];
    granted.config = serde_json::json!({"hostname": "n1", "cluster": "fritz"});
    granted.collect_interval = Some(Duration::from_millis(50));
    let granted = runtime.spawn(granted, feeds.subscribe(), sink);
    let batch = next_batch(&mut rx).await;
    assert_eq!(&*batch.plugin, "loadavg");
    assert_eq!(batch.points, 5);
    let mut names = Vec::new();
    for line in Decoder::new(&batch.lines) {
        let line = line.expect("valid line protocol");
        names.push(line.measurement().unescape().into_owned());
        let tags: Vec<(String, String)> = line
            .tags()
            .map(|(k, v)| (k.raw().to_owned(), v.unescape().into_owned()))
            .collect();
        assert_eq!(
            tags,
            [("cluster", "fritz"), ("hostname", "n1"), ("type", "node")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        let fields: Vec<_> = line.fields().collect();
        assert_eq!(fields.len(), 1);
        assert_eq!(fields[0].0.raw(), "value");
        assert!(
            matches!(fields[0].1, LpValue::Float(v) if v >= 0.0)
                || matches!(fields[0].1, LpValue::Int(n) if n >= 0)
        );
        assert!(line.time().is_some());
    }
    assert_eq!(
        names,
        [
            "load_one",
            "load_five",
            "load_fifteen",
            "proc_run",
            "proc_total"
        ]
    );
    granted.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_component_is_hot_reloaded() {
    let cache = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let mut events = runtime.subscribe();
    let (sink, _rx) = sink::channel(16);
    let feeds = FeedSenders::new();
    feeds.set_config(config("5", "{}"));
    let path = dir.path().join("live.wasm");
    std::fs::copy(guests::component("roster-logger"), &path).unwrap();
    let mut live = PluginSpec::new(&path);
    live.limits.restart_backoff = Duration::from_millis(10);
    let plugin = runtime.spawn(live, feeds.subscribe(), sink);

    wait_for(&mut events, "live", "old version", |e| {
        is_log(e, "config revision 5 from fleet")
    })
    .await;
    let old_hash = plugin.status().borrow().hash.clone().expect("hash");

    // Replace the file the way a deployment would: write aside, rename over.
    let staged = dir.path().join("live.wasm.new");
    std::fs::copy(guests::component("hostile-trap"), &staged).unwrap();
    std::fs::rename(&staged, &path).unwrap();
    wait_for(&mut events, "live", "reload", |e| {
        e.kind == EventKind::Reloading
    })
    .await;
    // The new version (which logs "config revision N" without a source) gets the replay.
    let replayed = wait_for(
        &mut events,
        "live",
        "new version",
        |e| matches!(&e.kind, EventKind::Log { message, .. } if message == "config revision 5"),
    )
    .await;
    assert_eq!(replayed.generation, 2);
    let new_hash = plugin.status().borrow().hash.clone().expect("hash");
    assert_ne!(old_hash, new_hash);

    // A broken file does not take the running version down.
    std::fs::write(&staged, b"\0asm\x0d\0\x01\0broken").unwrap();
    std::fs::rename(&staged, &path).unwrap();
    let failed = wait_for(&mut events, "live", "reload failure", |e| {
        matches!(e.kind, EventKind::ReloadFailed { .. })
    })
    .await;
    assert_eq!(failed.generation, 2);
    assert_eq!(plugin.status().borrow().state, PluginState::Running);
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_component_is_rejected_with_a_clear_error() {
    let cache = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());

    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, b"this is not wasm").unwrap();
    let error = runtime
        .load(&PluginSpec::new(&garbage))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(error, HostError::InvalidComponent { .. }),
        "{error}"
    );
    let text = error.to_string();
    assert!(
        text.contains("garbage.wasm is not a valid WebAssembly component"),
        "{text}"
    );

    let module = dir.path().join("module.wasm");
    std::fs::write(&module, b"\0asm\x01\0\0\0").unwrap();
    let error = runtime.load(&PluginSpec::new(&module)).await.err().unwrap();
    assert!(
        error
            .to_string()
            .contains("core WebAssembly module, not a component"),
        "{error}"
    );

    let missing = dir.path().join("missing.wasm");
    let error = runtime
        .load(&PluginSpec::new(&missing))
        .await
        .err()
        .unwrap();
    assert!(
        error.to_string().starts_with("cannot read plugin file"),
        "{error}"
    );

    // A supervised plugin with a bad file reports it and waits for a fix.
    let mut events = runtime.subscribe();
    let (sink, _rx) = sink::channel(4);
    let feeds = FeedSenders::new();
    let plugin = runtime.spawn(PluginSpec::new(&garbage), feeds.subscribe(), sink);
    let failed = wait_for(&mut events, "garbage", "load failure", |e| {
        matches!(e.kind, EventKind::LoadFailed { .. })
    })
    .await;
    assert!(
        matches!(&failed.kind, EventKind::LoadFailed { error } if error.contains("not a valid"))
    );
    assert_eq!(plugin.status().borrow().state, PluginState::LoadFailed);
    std::fs::copy(guests::component("roster-logger"), &garbage).unwrap();
    wait_for(&mut events, "garbage", "start after fix", |e| {
        e.kind == EventKind::Started
    })
    .await;
    plugin.stop().await;
}

/// Whether `reason` is the refusal of a batch of line protocol over `limit` bytes.
fn over_bytes(reason: &str, limit: usize) -> bool {
    reason.starts_with("batch of ")
        && reason.ends_with(&format!(
            " bytes exceeds this plugin's limit of {limit} bytes"
        ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_emit_is_refused_and_nothing_is_sent() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let mut events = runtime.subscribe();
    let (sink, mut rx) = sink::channel(16);
    let feeds = FeedSenders::new();

    // Both ways into the host: `emit-lines` (what the SDK uses), and the typed `emit` of
    // 0.2 (`"typed": 1`).
    for typed in [false, true] {
        // Over the point limit: `emit` fails, the plugin survives.
        let name = if typed { "flood-typed" } else { "flood" };
        let mut flood = spec("hostile-oversized-emit");
        flood.name = Some(name.to_owned());
        flood.config = serde_json::json!({"points": 5000, "typed": u8::from(typed)});
        flood.limits.max_points = 1000;
        flood.collect_interval = Some(Duration::from_millis(50));
        let flood = runtime.spawn(flood, feeds.subscribe(), sink.clone());
        let refused = wait_for(&mut events, name, "refusal", |e| {
            matches!(e.kind, EventKind::EmitRefused { .. })
        })
        .await;
        let expected = if typed {
            "batch of 5000 points exceeds this plugin's limit of 1000"
        } else {
            "line 1001: the batch has more than 1000 points"
        };
        assert_eq!(
            refused.kind,
            EventKind::EmitRefused {
                reason: expected.to_owned()
            }
        );
        wait_for(&mut events, name, "plugin's own error", |e| {
            matches!(&e.kind, EventKind::CallFailed { call: "collect", message } if message == expected)
        })
        .await;
        assert_eq!(flood.status().borrow().state, PluginState::Running);
        flood.stop().await;

        // Far over the byte limit: copying the batch to the host runs past the batch's
        // budget long before it is all copied (typed), or the batch's size alone refuses it
        // (lines); `emit` fails, the plugin is not trapped.
        let name = if typed { "huge-typed" } else { "huge" };
        let mut huge = spec("hostile-oversized-emit");
        huge.name = Some(name.to_owned());
        huge.config =
            serde_json::json!({"points": 64, "text-bytes": 65536, "typed": u8::from(typed)});
        huge.limits.max_emit_bytes = 256 << 10;
        huge.limits.restart_budget = 0;
        huge.collect_interval = Some(Duration::from_millis(50));
        let huge = runtime.spawn(huge, feeds.subscribe(), sink.clone());
        let refused = wait_for(&mut events, name, "refusal", |e| {
            matches!(
                e.kind,
                EventKind::EmitRefused { .. } | EventKind::Crashed { .. }
            )
        })
        .await;
        let EventKind::EmitRefused { reason } = &refused.kind else {
            panic!("{name}: {:?}", refused.kind)
        };
        if typed {
            assert_eq!(reason, "batch exceeds this plugin's limit of 262144 bytes");
        } else {
            assert!(over_bytes(reason, 256 << 10), "{reason}");
        }
        assert_eq!(huge.status().borrow().state, PluginState::Running);
        huge.stop().await;
    }
    assert!(rx.try_recv().is_err(), "no batch may reach the sink");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emit_of_any_size_fails_without_trapping_under_default_limits() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let mut events = runtime.subscribe();
    let (sink, mut rx) = sink::channel(16);
    let feeds = FeedSenders::new();
    // 100,000 points (the records alone are more than the default host-call budget) and one
    // point of 9 MB: both are refused by the size checks, with the plugin running on; both
    // through `emit-lines` and through the typed `emit`.
    for typed in [false, true] {
        for (name, config, typed_reason) in [
            (
                "many",
                serde_json::json!({"points": 100_000, "typed": u8::from(typed)}),
                "batch of 100000 points exceeds this plugin's limit of 10000",
            ),
            (
                "big",
                serde_json::json!({"points": 1, "text-bytes": 9_000_000, "typed": u8::from(typed)}),
                "batch exceeds this plugin's limit of 4194304 bytes",
            ),
        ] {
            let name = format!("{name}{}", if typed { "-typed" } else { "" });
            let mut flood = spec("hostile-oversized-emit");
            flood.name = Some(name.clone());
            flood.config = config;
            flood.limits.restart_budget = 0;
            flood.collect_interval = Some(Duration::from_millis(100));
            let flood = runtime.spawn(flood, feeds.subscribe(), sink.clone());
            let outcome = wait_for(&mut events, &name, "refusal", |e| {
                matches!(
                    e.kind,
                    EventKind::EmitRefused { .. } | EventKind::Crashed { .. }
                )
            })
            .await;
            let EventKind::EmitRefused { reason } = outcome.kind else {
                panic!("{name}: {:?}", outcome.kind)
            };
            if typed {
                assert_eq!(reason, typed_reason, "{name}");
            } else {
                assert!(over_bytes(&reason, 4 << 20), "{name}: {reason}");
            }
            wait_for(&mut events, &name, "plugin's own error", |e| {
                matches!(&e.kind, EventKind::CallFailed { call: "collect", message } if *message == reason)
            })
            .await;
            assert_eq!(flood.status().borrow().state, PluginState::Running);
            flood.stop().await;
        }
    }
    assert!(rx.try_recv().is_err(), "no batch may reach the sink");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_flood_is_rate_limited_counted_and_capped() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: Some(cache.path().to_path_buf()),
        event_capacity: 1 << 16,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let mut events = runtime.subscribe();
    let (sink, _rx) = sink::channel(4);
    let feeds = FeedSenders::new();
    let mut flood = spec("hostile-log-flood");
    flood.config =
        serde_json::json!({"lines": 20_000, "line-bytes": 8192, "error-bytes": 7_000_000});
    flood.limits.log_lines_per_second = 10;
    flood.limits.log_burst = 20;
    // Room for the flood on a loaded machine: the test is about the log, not the deadline.
    flood.limits.call_timeout = Duration::from_secs(10);
    flood.collect_interval = Some(Duration::from_millis(200));
    let plugin = runtime.spawn(flood, feeds.subscribe(), sink);
    let name = plugin.name().to_owned();

    // One collect: 20,000 lines of 8 KiB and a 7 MB error.
    let mut logged = 0usize;
    let mut dropped = 0u64;
    let error = tokio::time::timeout(WAIT, async {
        loop {
            match events.recv().await {
                Ok(e) if *e.plugin == *name => match e.kind {
                    EventKind::Log { message, .. } => {
                        logged += 1;
                        assert!(
                            message.len() <= 2048 + 64,
                            "a log line of {} bytes",
                            message.len()
                        );
                    }
                    EventKind::LogsDropped { count } => dropped += count,
                    EventKind::CallFailed { message, .. } => return message,
                    _ => {}
                },
                Ok(_) => {}
                Err(error) => panic!("{error}"),
            }
        }
    })
    .await
    .expect("the collect ends");
    // The burst got through, the rest was dropped (the count of this collect's drops is
    // reported at the latest with the next admitted line).
    // (Refills during a slow collect may let a few more through.)
    assert!(logged <= 120, "{logged} lines logged");
    assert!(logged >= 20, "{logged} lines logged");
    assert!(
        error.len() <= 1024 + 64,
        "an error of {} bytes",
        error.len()
    );
    assert!(error.starts_with("flood error eee"), "{error}");
    let reported = tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(e) = events.recv().await
                && *e.plugin == *name
                && let EventKind::LogsDropped { count } = e.kind
            {
                return count;
            }
        }
    })
    .await
    .expect("the drops are reported");
    assert!(
        dropped + reported >= 19_000,
        "{dropped} + {reported} reported dropped"
    );
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roster_that_traps_the_plugin_is_withheld_instead_of_quarantining_it() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let mut events = runtime.subscribe();
    let (sink, _rx) = sink::channel(4);
    let feeds = FeedSenders::new();
    let mut trap = spec("hostile-trap");
    trap.limits.restart_budget = 1;
    let plugin = runtime.spawn(trap, feeds.subscribe(), sink);
    let name = plugin.name().to_owned();
    wait_for(&mut events, &name, "start", |e| {
        e.kind == EventKind::Started
    })
    .await;

    feeds.set_roster(vec![provider("ccms", "poison")]);
    // Delivered live, then replayed once after the restart: two instances end on it.
    for generation in [1, 2] {
        let crash = wait_for(&mut events, &name, "crash", |e| {
            matches!(e.kind, EventKind::Crashed { .. })
        })
        .await;
        assert_eq!(crash.generation, generation);
        assert!(
            matches!(
                &crash.kind,
                EventKind::Crashed {
                    failure: Failure::Trap {
                        call: "on-roster",
                        ..
                    }
                }
            ),
            "{crash:?}"
        );
    }
    let withheld = wait_for(&mut events, &name, "withheld", |e| {
        matches!(
            e.kind,
            EventKind::SnapshotWithheld { .. } | EventKind::Quarantined { .. }
        )
    })
    .await;
    assert_eq!(
        withheld.kind,
        EventKind::SnapshotWithheld { call: "on-roster" }
    );
    wait_for(&mut events, &name, "third start", |e| {
        e.generation == 3 && e.kind == EventKind::Started
    })
    .await;
    assert_eq!(plugin.status().borrow().state, PluginState::Running);

    // The next roster is delivered as usual.
    feeds.set_roster(vec![provider("ccms", "m1"), provider("ccms", "m2")]);
    wait_for(&mut events, &name, "new roster", |e| {
        e.generation == 3 && is_log(e, "roster: 2 providers")
    })
    .await;
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_quarantined_by_a_roster_is_revived_by_the_next_roster() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let mut events = runtime.subscribe();
    let (sink, _rx) = sink::channel(4);
    let feeds = FeedSenders::new();
    let mut trap = spec("hostile-trap");
    trap.limits.restart_budget = 0;
    let plugin = runtime.spawn(trap, feeds.subscribe(), sink);
    let name = plugin.name().to_owned();
    wait_for(&mut events, &name, "start", |e| {
        e.kind == EventKind::Started
    })
    .await;

    feeds.set_roster(vec![provider("ccms", "poison")]);
    wait_for(&mut events, &name, "quarantine", |e| {
        matches!(e.kind, EventKind::Quarantined { .. })
    })
    .await;
    assert_eq!(plugin.status().borrow().state, PluginState::Quarantined);

    // A new roster gives it another try, and it serves that roster.
    feeds.set_roster(vec![provider("ccms", "m1")]);
    wait_for(&mut events, &name, "new roster", |e| {
        e.generation == 2 && is_log(e, "roster: 1 providers")
    })
    .await;
    assert_eq!(plugin.status().borrow().state, PluginState::Running);

    // Another poisoned roster: quarantined again (no budget), without a restart loop.
    feeds.set_roster(vec![provider("ccb", "poison")]);
    wait_for(&mut events, &name, "second quarantine", |e| {
        e.generation == 2 && matches!(e.kind, EventKind::Quarantined { .. })
    })
    .await;
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiled_components_are_cached_on_disk() {
    let cache = tempfile::tempdir().unwrap();
    let spec = spec("roster-logger");
    let first = runtime(cache.path()).load(&spec).await.unwrap();
    assert!(!first.cached);
    let entries = std::fs::read_dir(cache.path()).unwrap().count();
    assert_eq!(entries, 1);
    // A new runtime (as after an agent restart) takes the compiled code from disk.
    let second = runtime(cache.path()).load(&spec).await.unwrap();
    assert!(second.cached);
    assert_eq!(first.hash, second.hash);

    // The cached code is used for real: the plugin runs.
    let runtime = runtime(cache.path());
    let mut events = runtime.subscribe();
    let (sink, _rx) = sink::channel(4);
    let feeds = FeedSenders::new();
    let plugin = runtime.spawn(spec, feeds.subscribe(), sink);
    let loaded = wait_for(&mut events, "roster-logger", "load", |e| {
        matches!(e.kind, EventKind::Loaded { .. })
    })
    .await;
    assert!(matches!(
        loaded.kind,
        EventKind::Loaded { cached: true, .. }
    ));
    wait_for(&mut events, "roster-logger", "start", |e| {
        e.kind == EventKind::Started
    })
    .await;
    let _: Arc<str> = loaded.plugin;
    plugin.stop().await;
}

/// The agent's log lines of this test binary, as the `tracing` formatter writes them.
fn captured_log() -> &'static std::sync::Mutex<Vec<u8>> {
    static LOG: std::sync::OnceLock<&'static std::sync::Mutex<Vec<u8>>> =
        std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let log: &'static std::sync::Mutex<Vec<u8>> =
            Box::leak(Box::new(std::sync::Mutex::new(Vec::new())));
        struct Writer(&'static std::sync::Mutex<Vec<u8>>);
        impl std::io::Write for Writer {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || Writer(log))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        log
    })
}

/// The captured log lines that hold every one of `needles`.
fn log_lines_with(needles: &[&str]) -> usize {
    let log = captured_log().lock().unwrap();
    String::from_utf8_lossy(&log)
        .lines()
        .filter(|line| needles.iter().all(|n| line.contains(n)))
        .count()
}

/// Waits for `count` failed `collect` calls of `plugin`.
async fn failed_collects(
    events: &mut broadcast::Receiver<PluginEvent>,
    plugin: &str,
    count: usize,
) {
    for n in 0..count {
        wait_for(events, plugin, &format!("failed collect {n}"), |e| {
            matches!(
                e.kind,
                EventKind::CallFailed {
                    call: "collect",
                    ..
                }
            )
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_failing_the_same_way_every_round_is_logged_once_and_again_when_that_changes() {
    captured_log();
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let mut events = runtime.subscribe();
    let (sink, mut rx) = sink::channel(64);
    let feeds = FeedSenders::new();
    // `tempstat` on a node without hwmon: every collect fails, as on most virtual machines.
    let root = tempfile::tempdir().unwrap();
    let name = "tempstat-without-hwmon";
    let mut tempstat = spec("tempstat");
    tempstat.name = Some(name.to_owned());
    tempstat.config = serde_json::json!({"hostname": "node1"});
    tempstat.capabilities.read_files = vec!["/sys/class/hwmon/**".to_owned()];
    tempstat.capabilities.files_root = Some(root.path().to_path_buf());
    tempstat.collect_interval = Some(Duration::from_millis(20));
    let plugin = runtime.spawn(tempstat, feeds.subscribe(), sink);
    let failed = [name, "plugin call failed", "cannot list /sys/class/hwmon"];

    failed_collects(&mut events, name, 5).await;
    assert_eq!(log_lines_with(&failed), 1, "five failed rounds, one report");

    // Sensors appear: the recovery is logged, and points flow.
    let hwmon = root.path().join("sys/class/hwmon/hwmon0");
    std::fs::create_dir_all(&hwmon).unwrap();
    std::fs::write(hwmon.join("name"), "acpitz\n").unwrap();
    std::fs::write(hwmon.join("temp1_input"), "41000\n").unwrap();
    let batch = next_batch(&mut rx).await;
    assert!(
        String::from_utf8_lossy(&batch.lines).contains("temp_acpitz"),
        "{:?}",
        batch.lines
    );
    let recovered = tokio::time::timeout(WAIT, async {
        while log_lines_with(&[name, "plugin call succeeds again", "collect"]) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(recovered.is_ok(), "the recovery is logged");

    // They go away again: that failure is news and is logged, once.
    std::fs::remove_dir_all(root.path().join("sys/class/hwmon")).unwrap();
    failed_collects(&mut events, name, 5).await;
    assert_eq!(
        log_lines_with(&failed),
        2,
        "two failure spells, two reports"
    );
    plugin.stop().await;
}
