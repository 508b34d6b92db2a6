//! File access for plugins: no grant reaches the agent's own process.
//!
//! The `hostile-proc-probe` plugin tries every path that leads to the agent's secrets
//! (`/proc/self/environ` holds its token and NATS password, `/proc/self/mem` its memory),
//! through `cc:fleet/files` and through WASI, with the broadest grants the agent accepts.

#[path = "support/guests.rs"]
mod guests;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use ccfleet_host::events::EventKind;
use ccfleet_host::sink;
use ccfleet_host::{FeedSenders, HostError, PluginEvent, PluginSpec, Runtime, RuntimeOptions};
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

/// Collects the probe's lines (`probe <how> <path>: <outcome>`) until `probe done`.
async fn probe_lines(
    events: &mut broadcast::Receiver<PluginEvent>,
) -> BTreeMap<(String, String), String> {
    let mut lines = BTreeMap::new();
    tokio::time::timeout(WAIT, async {
        loop {
            match events.recv().await {
                Ok(PluginEvent {
                    kind: EventKind::Log { message, .. },
                    ..
                }) => {
                    if message == "probe done" {
                        return;
                    }
                    let rest = message.strip_prefix("probe ").expect("a probe line");
                    let (how, rest) = rest.split_once(' ').unwrap();
                    let (path, outcome) = rest.split_once(": ").unwrap();
                    lines.insert((how.to_owned(), path.to_owned()), outcome.to_owned());
                }
                Ok(PluginEvent {
                    kind: EventKind::Crashed { failure },
                    ..
                }) => panic!("the probe crashed: {failure}"),
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(n)) => panic!("lost {n} events"),
                Err(broadcast::error::RecvError::Closed) => panic!("event channel closed"),
            }
        }
    })
    .await
    .expect("the probe finishes");
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proc_sys_and_the_root_are_never_preopened_for_wasi() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    for dir in ["/proc", "/proc/self", "/sys", "/", "/dev"] {
        let mut spec = PluginSpec::new(guests::component("hostile-proc-probe"));
        spec.capabilities.wasi = true;
        spec.capabilities.read_dirs = vec![dir.into()];
        let error = runtime.load(&spec).await.err().expect("refused");
        assert!(matches!(error, HostError::Spec { .. }), "{dir}: {error}");
        assert!(
            error
                .to_string()
                .contains("capabilities.read-files instead"),
            "{dir}: {error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_grant_reaches_the_agents_own_process() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let mut events = runtime.subscribe();

    // A directory a plugin may legitimately be given, with links planted into /proc.
    let fixture = tempfile::tempdir().unwrap();
    let fx = fixture.path().to_str().unwrap().to_owned();
    std::fs::write(fixture.path().join("plain.txt"), "harmless").unwrap();
    std::os::unix::fs::symlink("/proc/self/environ", fixture.path().join("env")).unwrap();
    let depth = fixture.path().components().count();
    let up = format!("{}proc/self/environ", "../".repeat(depth));
    std::os::unix::fs::symlink(&up, fixture.path().join("up")).unwrap();
    std::os::unix::fs::symlink("/proc/self", fixture.path().join("pself")).unwrap();
    std::os::unix::fs::symlink("/proc", fixture.path().join("pproc")).unwrap();

    let pid = std::process::id();
    let tids: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(!tids.is_empty());

    let mut forbidden_files: Vec<String> = Vec::new();
    for base in ["/proc/self", "/proc/thread-self", &format!("/proc/{pid}")] {
        for entry in [
            "environ",
            "mem",
            "maps",
            "cmdline",
            "status",
            "fd/0",
            "fd/1",
            "root/etc/hostname",
            "cwd/Cargo.toml",
        ] {
            forbidden_files.push(format!("{base}/{entry}"));
        }
    }
    for tid in &tids {
        forbidden_files.push(format!("/proc/{tid}/environ"));
        forbidden_files.push(format!("/proc/{tid}/mem"));
        forbidden_files.push(format!("/proc/{pid}/task/{tid}/environ"));
        forbidden_files.push(format!("/proc/self/task/{tid}/environ"));
    }
    for path in [
        "/proc/net/../self/environ",
        "/proc/./self/environ",
        "//proc//self//environ",
        "/proc/self/../self/environ",
        "/sys/../proc/self/environ",
        "/proc/net/../../proc/self/environ",
        "proc/self/environ",
        "/proc/self/net/../environ",
        "/proc/mounts",
        "/proc/kcore",
        "/dev/mem",
    ] {
        forbidden_files.push(path.to_owned());
    }
    for link in [
        "env",
        "up",
        "pself/environ",
        "pself/mem",
        "pproc/self/environ",
    ] {
        forbidden_files.push(format!("{fx}/{link}"));
    }
    let allowed_files = [
        "/proc/loadavg".to_owned(),
        "/proc/stat".to_owned(),
        "/proc/net/dev".to_owned(),
        format!("{fx}/plain.txt"),
    ];
    let forbidden_dirs = [
        "/proc/self".to_owned(),
        "/proc/thread-self".to_owned(),
        format!("/proc/{pid}"),
        "/proc/self/fd".to_owned(),
        format!("/proc/{pid}/task"),
        format!("{fx}/pself"),
    ];
    let forbidden_wasi = [
        format!("{fx}/env"),
        format!("{fx}/up"),
        format!("{fx}/pself/environ"),
        format!("{fx}/pproc/self/environ"),
        "/proc/self/environ".to_owned(),
    ];

    let mut spec = PluginSpec::new(guests::component("hostile-proc-probe"));
    spec.limits.log_burst = 10_000;
    // The broadest grants the agent accepts.
    spec.capabilities.wasi = true;
    spec.capabilities.read_dirs = vec![fixture.path().to_path_buf()];
    spec.capabilities.read_files = vec!["/proc/**".into(), "/sys/**".into(), format!("{fx}/**")];
    spec.config = serde_json::json!({
        "files": forbidden_files.iter().chain(&allowed_files).collect::<Vec<_>>(),
        "dirs": forbidden_dirs.iter().chain([&"/proc".to_owned()]).collect::<Vec<_>>(),
        "wasi": forbidden_wasi.iter().chain([&format!("{fx}/plain.txt")]).collect::<Vec<_>>(),
    });
    let (sink, _rx) = sink::channel(4);
    let feeds = FeedSenders::new();
    let plugin = runtime.spawn(spec, feeds.subscribe(), sink);
    let lines = probe_lines(&mut events).await;
    plugin.stop().await;

    let outcome = |how: &str, path: &str| {
        lines
            .get(&(how.to_owned(), path.to_owned()))
            .unwrap_or_else(|| panic!("no probe line for {how} {path}"))
            .clone()
    };
    let mut leaks = Vec::new();
    for path in &forbidden_files {
        let got = outcome("files", path);
        if !got.starts_with("refused ") {
            leaks.push(format!("files {path}: {got}"));
        }
    }
    for path in &forbidden_dirs {
        let got = outcome("dirs", path);
        if !got.starts_with("refused ") {
            leaks.push(format!("dirs {path}: {got}"));
        }
    }
    for path in &forbidden_wasi {
        let got = outcome("wasi", path);
        if !got.starts_with("refused ") {
            leaks.push(format!("wasi {path}: {got}"));
        }
    }
    assert!(leaks.is_empty(), "the probe read: {leaks:#?}");

    // The probe works: what is granted and harmless is read.
    for path in &allowed_files {
        let got = outcome("files", path);
        assert!(got.starts_with("read "), "files {path}: {got}");
    }
    assert_eq!(outcome("wasi", &format!("{fx}/plain.txt")), "read 8 bytes");
    let listed = outcome("dirs", "/proc");
    let names = listed
        .strip_prefix("listed [")
        .and_then(|l| l.strip_suffix(']'))
        .unwrap_or_else(|| panic!("dirs /proc: {listed}"));
    let names: Vec<&str> = names.split(',').collect();
    assert!(
        names.contains(&"loadavg") && names.contains(&"net"),
        "{names:?}"
    );
    for name in names {
        assert!(
            name != "self" && name != "thread-self" && !name.bytes().all(|b| b.is_ascii_digit()),
            "/proc lists the per-process entry {name}"
        );
    }
    // Refusals say why.
    let why = outcome("files", "/proc/self/environ");
    assert!(why.contains("per-process entries of /proc"), "{why}");
    let why = outcome("files", "/proc/net/../self/environ");
    assert!(why.contains("`..`"), "{why}");
    let why = outcome("files", &format!("{fx}/env"));
    assert!(why.contains("leads outside"), "{why}");
}
