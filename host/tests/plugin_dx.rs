//! The plugin author's commands (`ccfleet plugin new`, `build`, `run`), guest panics in the
//! log, and the agent's own secrets kept from plugins.
//!
//! The scaffold tests build real crates with the wasm toolchain `plugin build` selects,
//! offline (`CARGO_NET_OFFLINE`): the registry crates the SDK needs come from cargo's cache,
//! the SDK itself from the scaffold.

#[path = "support/guests.rs"]
mod guests;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use ccfleet_host::events::EventKind;
use ccfleet_host::sink;
use ccfleet_host::{FeedSenders, PluginEvent, PluginSpec, Runtime, RuntimeOptions};

fn ccfleet() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ccfleet"));
    command.env_remove("RUST_LOG").env("NO_COLOR", "1");
    command
}

fn run(command: &mut Command) -> Output {
    let output = command.output().expect("running ccfleet");
    eprintln!(
        "$ {command:?}\n--- status {}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A cargo target directory kept between test runs, so only the first run compiles the
/// SDK's registry dependencies and the wasm `core`; the crates themselves are fresh.
fn scaffold_target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("plugin-scaffolds")
}

/// `ccfleet plugin build DIR`, offline; the component paths it prints.
fn plugin_build(dir: &Path) -> Vec<PathBuf> {
    let output = run(ccfleet()
        .args(["plugin", "build"])
        .arg(dir)
        .arg("--target-dir")
        .arg(scaffold_target_dir())
        .env("CARGO_NET_OFFLINE", "true"));
    assert!(output.status.success(), "plugin build failed");
    text(&output.stdout).lines().map(PathBuf::from).collect()
}

#[test]
fn a_first_plugin_takes_four_commands_new_edit_build_run_outside_the_repository() {
    let home = tempfile::tempdir().unwrap();
    assert!(!home.path().starts_with(guests::repo_root()));

    // 1. new
    let output = run(ccfleet()
        .args(["plugin", "new", "hello"])
        .current_dir(home.path()));
    assert!(output.status.success());
    let crate_dir = home.path().join("hello");

    // 2. edit: the author's own measurement and a field from the configuration.
    let lib = crate_dir.join("src/lib.rs");
    let source = std::fs::read_to_string(&lib).unwrap();
    let edited = source
        .replace("\"hello_collections\"", "\"my_first_metric\"")
        .replace(
            ".tag(\"type\", \"node\")",
            ".tag(\"type\", \"node\").tag(\"author\", \"me\")",
        );
    assert_ne!(edited, source, "the template changed: adapt the edit");
    std::fs::write(&lib, edited).unwrap();

    // 3. build
    let built = plugin_build(&crate_dir);
    assert_eq!(built.len(), 1, "{built:?}");
    assert_eq!(built[0].file_name().unwrap(), "hello.wasm");

    // 4. run
    let output = run(ccfleet().args(["plugin", "run"]).arg(&built[0]).args([
        "--config",
        r#"{"greeting":"hi"}"#,
        "--collect",
        "2",
        "--interval",
        "10ms",
    ]));
    assert!(output.status.success());
    let stdout = text(&output.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    for (n, line) in lines.iter().enumerate() {
        let prefix = format!("my_first_metric,author=me,type=node value={}u ", n + 1);
        assert!(line.starts_with(&prefix), "{line}");
    }
    let stderr = text(&output.stderr);
    // The log escapes what a plugin writes (quotes included).
    assert!(
        stderr.contains(r#"hello ready, configuration {\"greeting\":\"hi\"}"#),
        "{stderr}"
    );
}

#[test]
fn a_std_plugin_scaffold_builds_for_wasi_runs_with_wasi_granted_and_logs_its_panics() {
    let home = tempfile::tempdir().unwrap();
    let crate_dir = home.path().join("std-hello");
    let output = run(ccfleet().args(["plugin", "new", "--std"]).arg(&crate_dir));
    assert!(output.status.success());
    // The second collect panics: std's panic hook (installed by the SDK) logs it.
    let lib = crate_dir.join("src/lib.rs");
    let source = std::fs::read_to_string(&lib).unwrap();
    let edited = source.replace(
        "self.collections += 1;",
        "self.collections += 1;\n        assert!(self.collections < 2, \"std boom {}\", self.collections);",
    );
    assert_ne!(edited, source, "the template changed: adapt the edit");
    std::fs::write(&lib, edited).unwrap();
    let built = plugin_build(&crate_dir);
    assert_eq!(built.len(), 1, "{built:?}");
    let output = run(ccfleet().args(["plugin", "run"]).arg(&built[0]));
    assert!(!output.status.success(), "a std plugin needs WASI granted");
    assert!(
        text(&output.stderr).contains("--wasi"),
        "{}",
        text(&output.stderr)
    );
    let output = run(ccfleet()
        .args([
            "plugin",
            "run",
            "--wasi",
            "--collect",
            "2",
            "--interval",
            "1ms",
        ])
        .arg(&built[0]));
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output.stdout).starts_with("std-hello_collections,type=node value=1u "));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("panicked at src/lib.rs:"), "{stderr}");
    assert!(stderr.contains("std boom 2"), "{stderr}");
}

#[test]
fn plugin_new_refuses_an_existing_directory_and_a_bad_name() {
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(home.path().join("taken")).unwrap();
    let output = run(ccfleet()
        .args(["plugin", "new", "taken"])
        .current_dir(home.path()));
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("already exists"));
    let output = run(ccfleet()
        .args(["plugin", "new", "9lives"])
        .current_dir(home.path()));
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("is not a plugin name"));
}

#[test]
fn a_guest_panic_reaches_the_log_with_its_message_and_plugin_run_exits_with_the_failure() {
    let output = run(ccfleet()
        .args(["plugin", "run"])
        .arg(guests::component("hostile-trap")));
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    // The SDK's panic handler logs the message before the trap (wasm `unreachable`).
    assert!(stderr.contains("panicked at"), "{stderr}");
    assert!(stderr.contains("collect always traps"), "{stderr}");
    assert!(
        stderr.contains("the plugin failed: collect trapped"),
        "{stderr}"
    );
}

#[test]
fn plugin_run_grants_files_hands_over_a_roster_and_prints_line_protocol() {
    let fixtures = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(fixtures.path().join("proc")).unwrap();
    std::fs::write(
        fixtures.path().join("proc/loadavg"),
        "0.50 0.25 0.10 1/100 42\n",
    )
    .unwrap();
    let output = run(ccfleet()
        .args(["plugin", "run"])
        .arg(guests::component("loadavg"))
        .args(["--read", "/proc/loadavg", "--files-root"])
        .arg(fixtures.path())
        .args(["--config", r#"{"hostname":"node1"}"#]));
    assert!(output.status.success());
    let stdout = text(&output.stdout);
    assert!(
        stdout.contains("load_one,hostname=node1,type=node value=0.5 "),
        "{stdout}"
    );
    assert_eq!(stdout.lines().count(), 5, "{stdout}");
    // Without the grant the plugin's collect fails, and so does the command.
    let output = run(ccfleet()
        .args(["plugin", "run"])
        .arg(guests::component("loadavg"))
        .args(["--config", r#"{"hostname":"node1"}"#]));
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output.stderr).contains("not granted"));

    let providers: Vec<ccfleet::wire::Provider> = serde_json::from_str(
        r#"[{"type":"ccms","hostname":"ms1","state":"active"},
            {"type":"ccms","hostname":"ms2","state":"active"}]"#,
    )
    .unwrap();
    let roster = ccfleet::wire::encode_roster(
        "fleet",
        ccfleet::wire::ServiceType::MetricCollector,
        &providers,
        1,
    )
    .unwrap();
    let roster_file = fixtures.path().join("roster.json");
    std::fs::write(&roster_file, roster).unwrap();
    let output = run(ccfleet()
        .args(["plugin", "run"])
        .arg(guests::component("roster-logger"))
        .arg("--roster")
        .arg(&roster_file)
        .args(["--collect", "0"]));
    assert!(output.status.success());
    let stderr = text(&output.stderr);
    assert!(stderr.contains("roster: 2 providers"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_secret_files_are_refused_under_the_broadest_grant() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("fleet.token");
    let config = dir.path().join("agent.json");
    let other = dir.path().join("data.txt");
    let linked = dir.path().join("innocent-name");
    std::fs::write(&token, "secret-token").unwrap();
    std::fs::write(&config, "{}").unwrap();
    std::fs::write(&other, "fine").unwrap();
    std::fs::hard_link(&token, &linked).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: Some(cache.path().to_path_buf()),
        secret_files: vec![token.clone(), config.clone()],
        ..RuntimeOptions::default()
    })
    .unwrap();
    let mut events = runtime.subscribe();
    let mut spec = PluginSpec::new(guests::component("hostile-proc-probe"));
    spec.capabilities.wasi = true;
    spec.capabilities.read_files = vec!["/**".to_owned()];
    let paths = [&token, &config, &linked, &other];
    spec.config = serde_json::json!({ "files": paths });
    let feeds = FeedSenders::new();
    let (sink, _batches) = sink::channel(8);
    let handle = runtime.spawn(spec, feeds.subscribe(), sink);
    let mut outcome = std::collections::BTreeMap::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let event: PluginEvent = events.recv().await.expect("events");
            match event.kind {
                EventKind::Log { message, .. } if message == "probe done" => return,
                EventKind::Log { message, .. } => {
                    if let Some(rest) = message.strip_prefix("probe files ") {
                        let (path, result) = rest.split_once(": ").unwrap();
                        outcome.insert(PathBuf::from(path), result.to_owned());
                    }
                }
                EventKind::Crashed { failure } => panic!("the probe crashed: {failure}"),
                _ => {}
            }
        }
    })
    .await
    .expect("the probe finishes");
    handle.stop().await;
    for secret in [&token, &config, &linked] {
        let result = &outcome[secret];
        assert!(
            result.starts_with("refused") && result.contains("agent's own secrets"),
            "{}: {result}",
            secret.display()
        );
    }
    assert_eq!(outcome[&other], "read 4 bytes");
}

#[test]
fn plugin_run_grants_commands_and_other_capabilities_as_json() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/commands");
    let grants = serde_json::json!({"run": {"ps-top": {
        "path": fixtures.join("replay.sh"),
        "args": [fixtures.join("ps-pcpu.txt")]
    }}});
    let output = run(ccfleet()
        .args(["plugin", "run"])
        .arg(guests::component("topprocs"))
        .args(["--capabilities", &grants.to_string()])
        .args(["--config", r#"{"hostname":"node1","num_procs":2}"#]));
    assert!(output.status.success());
    let stdout = text(&output.stdout);
    assert!(
        stdout.contains("topproc1,hostname=node1,type=node value=\"stress-ng-cpu\" "),
        "{stdout}"
    );
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    // A grant the agent would refuse is refused here too, before anything runs.
    let output = run(ccfleet()
        .args(["plugin", "run"])
        .arg(guests::component("topprocs"))
        .args(["--capabilities", r#"{"run": {"ps-top": {"path": "ps"}}}"#]));
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("must be an absolute path"));
    let output = run(ccfleet()
        .args(["plugin", "run"])
        .arg(guests::component("topprocs"))
        .args(["--capabilities", r#"{"root": true}"#]));
    assert!(text(&output.stderr).contains("unknown field `root`"));
}
