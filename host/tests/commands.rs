//! Granted commands (`capabilities.run`): what runs, how, and what a hostile or broken
//! command can do to the agent (nothing: each ends with a clear error, and the next run
//! works); then end to end, a plugin built from `guest/plugins/run-command` running them
//! through `cc:fleet/commands`, and the agent counting them in `/metrics`. The stand-ins are
//! the shell scripts of `tests/fixtures/commands/`.

#[path = "support/guests.rs"]
mod guests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccfleet_host::agent::{Agent, AgentConfig};
use ccfleet_host::events::EventKind;
use ccfleet_host::plugin::commands::{self, CommandGrants, CommandStats, RunGrant, RunResult};
use ccfleet_host::sink;
use ccfleet_host::{FeedSenders, PluginEvent, PluginSpec, PluginState, Runtime, RuntimeOptions};
use tokio::sync::broadcast;

/// The stand-ins, copied to a directory every user may read (a command may run as
/// `nobody`), which the tests may change.
struct Fixtures {
    dir: tempfile::TempDir,
}

impl Fixtures {
    fn new() -> Fixtures {
        let dir = tempfile::tempdir().unwrap();
        set_mode(dir.path(), 0o755);
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/commands");
        for entry in std::fs::read_dir(source).unwrap() {
            let entry = entry.unwrap();
            let to = dir.path().join(entry.file_name());
            std::fs::copy(entry.path(), &to).unwrap();
            set_mode(&to, 0o755);
        }
        Fixtures { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A directory anyone may write to, for the process-id files of the hostile stand-ins.
    fn drop_box(&self) -> PathBuf {
        let path = self.path("box");
        std::fs::create_dir_all(&path).unwrap();
        set_mode(&path, 0o777);
        path
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn grant(path: PathBuf, args: &[&str]) -> RunGrant {
    RunGrant {
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        ..RunGrant::new(path)
    }
}

fn open(grants: &[(&str, RunGrant)]) -> CommandGrants {
    let grants: BTreeMap<String, RunGrant> = grants
        .iter()
        .map(|(name, grant)| ((*name).to_owned(), grant.clone()))
        .collect();
    commands::validate(&grants).unwrap();
    CommandGrants::open(&grants, Arc::new(CommandStats::default()))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The processes of process group `pgid` that are still alive (not zombies).
fn live_members(pgid: i32) -> Vec<i32> {
    let mut live = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
        let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let (Some(state), Some(pgrp)) = (fields.first(), fields.get(2)) else {
            continue;
        };
        if pgrp.parse::<i32>().ok() == Some(pgid) && !matches!(*state, "Z" | "X") {
            live.push(pid);
        }
    }
    live
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_owned))
        })
        .is_some_and(|state| state != "Z" && state != "X")
}

/// Waits (up to a bound generous for a loaded machine) until `ready` holds.
async fn eventually(what: &str, mut ready: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(Instant::now() < until, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Reads the process id a stand-in wrote to `file`, waiting until it is there.
async fn pid_in(file: &Path) -> i32 {
    let mut pid = None;
    eventually("the stand-in wrote its process id", || {
        pid = std::fs::read_to_string(file)
            .ok()
            .and_then(|t| t.split_whitespace().next()?.parse().ok());
        pid.is_some()
    })
    .await;
    pid.unwrap()
}

/// The agent is unharmed: a granted command still runs.
async fn still_runs(grants: &CommandGrants) {
    let out = grants.run("report").await.expect("a good command runs");
    assert_eq!(out.status, Some(0));
}

fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap()
}

#[tokio::test]
async fn a_granted_command_runs_with_only_its_fixed_arguments_and_a_clean_environment() {
    let fx = Fixtures::new();
    let grants = open(&[(
        "report",
        grant(fx.path("report.sh"), &["one", "two words", "$HOME;*"]),
    )]);
    let out = grants.run("report").await.unwrap();
    assert_eq!(out.status, Some(0));
    let stdout = text(&out.stdout);
    // Arguments arrive as given, one each: no shell split or expanded them.
    assert!(
        stdout.starts_with("arg one\narg two words\narg $HOME;*\n"),
        "{stdout}"
    );
    // Only PATH and LC_ALL come from the host (the shell adds PWD itself); nothing of the
    // agent's environment (cargo's variables, HOME) reaches the command.
    let env: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("env "))
        .collect();
    assert!(env.contains(&"PATH=/usr/bin:/bin"), "{env:?}");
    assert!(env.contains(&"LC_ALL=C"), "{env:?}");
    for var in &env {
        let name = var.split('=').next().unwrap();
        assert!(
            matches!(name, "PATH" | "LC_ALL" | "PWD" | "OLDPWD" | "SHLVL" | "_"),
            "{var} leaked into the command's environment"
        );
    }
    assert!(stdout.contains("stdin empty\n"), "{stdout}");
    assert!(stdout.contains("cwd /\n"), "{stdout}");
    assert_eq!(text(&out.stderr), "report done\n");
    let snap = grants.stats().snapshot();
    assert_eq!(snap.count(RunResult::Ok), 1);
    assert!(snap.seconds > 0.0);
}

#[tokio::test]
async fn an_exit_status_comes_back_with_the_output() {
    let fx = Fixtures::new();
    let grants = open(&[("failing", grant(fx.path("report.sh"), &["fail"]))]);
    let out = grants.run("failing").await.unwrap();
    assert_eq!(out.status, Some(3));
    assert!(text(&out.stdout).starts_with("arg fail\n"));
    assert_eq!(
        grants.stats().snapshot().count(RunResult::ExitNonzero),
        1,
        "a status other than 0 is counted"
    );
}

#[tokio::test]
async fn an_ungranted_name_runs_nothing() {
    let fx = Fixtures::new();
    let grants = open(&[("report", grant(fx.path("report.sh"), &[]))]);
    for name in ["rm", "/bin/sh", "report ", "report\n-rf", ""] {
        let err = grants.run(name).await.unwrap_err();
        assert_eq!(err.result, RunResult::Refused, "{name:?}");
        assert!(
            err.message.contains("is not granted to this plugin"),
            "{}",
            err.message
        );
        assert!(
            !err.message.contains('\n'),
            "the plugin's name is escaped: {}",
            err.message
        );
    }
    assert_eq!(grants.stats().snapshot().count(RunResult::Refused), 5);
    still_runs(&grants).await;
}

#[tokio::test]
async fn a_hanging_command_is_killed_with_its_children_at_its_timeout() {
    let fx = Fixtures::new();
    let pid_file = fx.drop_box().join("hang.pid");
    let grants = open(&[
        (
            "hang",
            RunGrant {
                timeout: Duration::from_millis(300),
                ..grant(fx.path("hang.sh"), &[pid_file.to_str().unwrap()])
            },
        ),
        ("report", grant(fx.path("report.sh"), &[])),
    ]);
    let err = grants.run("hang").await.unwrap_err();
    assert_eq!(err.result, RunResult::Timeout);
    assert!(
        err.message
            .contains("command hang did not finish within 300ms (its timeout); it was killed"),
        "{}",
        err.message
    );
    let pgid = pid_in(&pid_file).await;
    eventually("the command's process group is gone", || {
        live_members(pgid).is_empty()
    })
    .await;
    assert_eq!(grants.stats().snapshot().count(RunResult::Timeout), 1);
    still_runs(&grants).await;
}

#[tokio::test]
async fn a_fork_bomb_dies_with_its_process_group() {
    let fx = Fixtures::new();
    let pid_file = fx.drop_box().join("bomb.pid");
    // As root, the bomb runs as `nobody` under a process limit (which the kernel does not
    // apply to root); the stand-in's own loop is bounded either way.
    let (user, max_processes) = if is_root() {
        (Some("nobody".to_owned()), Some(16))
    } else {
        (None, None)
    };
    let grants = Arc::new(open(&[
        (
            "bomb",
            RunGrant {
                timeout: Duration::from_secs(2),
                user,
                max_processes,
                ..grant(fx.path("fork-bomb.sh"), &[pid_file.to_str().unwrap()])
            },
        ),
        ("report", grant(fx.path("report.sh"), &[])),
    ]));
    let running = tokio::spawn({
        let grants = grants.clone();
        async move { grants.run("bomb").await }
    });
    let pgid = pid_in(&pid_file).await;
    let mut most = 0;
    while !running.is_finished() {
        most = most.max(live_members(pgid).len());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Killed at its timeout, or ended by the shell itself once a fork failed under the
    // process limit: either way its whole group goes with it.
    match running.await.unwrap() {
        Err(err) => assert_eq!(err.result, RunResult::Timeout, "{}", err.message),
        Ok(out) => {
            assert!(max_processes.is_some(), "the unlimited bomb ended: {out:?}");
            assert!(
                text(&out.stderr).contains("Cannot fork"),
                "{}",
                text(&out.stderr)
            );
        }
    }
    let forks = std::fs::read_to_string(pid_file.with_extension("pid.forks")).unwrap_or_default();
    assert!(forks.lines().count() >= 1, "the bomb never forked");
    if max_processes.is_some() {
        assert!(
            most <= 16,
            "{most} processes ran under a limit of 16 (RLIMIT_NPROC was not applied)"
        );
    }
    eventually("every process of the bomb is gone", || {
        live_members(pgid).is_empty()
    })
    .await;
    still_runs(&grants).await;
}

#[tokio::test]
async fn a_flood_of_output_is_refused_at_the_cap() {
    let fx = Fixtures::new();
    let grants = open(&[
        ("flood", grant(fx.path("flood.sh"), &[])),
        (
            "small",
            RunGrant {
                max_output_bytes: 100,
                ..grant(fx.path("report.sh"), &["x"; 40])
            },
        ),
        ("report", grant(fx.path("report.sh"), &[])),
    ]);
    let err = grants.run("flood").await.unwrap_err();
    assert_eq!(err.result, RunResult::OutputCap);
    assert!(
        err.message
            .contains("command flood wrote more than its 1048576 bytes of output"),
        "{}",
        err.message
    );
    // A small cap counts what is written, not what a single read returns.
    let err = grants.run("small").await.unwrap_err();
    assert_eq!(err.result, RunResult::OutputCap, "{}", err.message);
    assert_eq!(grants.stats().snapshot().count(RunResult::OutputCap), 2);
    still_runs(&grants).await;
}

#[tokio::test]
async fn what_a_finished_command_leaves_behind_is_killed() {
    let fx = Fixtures::new();
    let pid_file = fx.drop_box().join("background.pids");
    let grants = open(&[(
        "background",
        RunGrant {
            // Far beyond the test: the run ends when the leader exits, not at the timeout.
            timeout: Duration::from_secs(600),
            ..grant(fx.path("background.sh"), &[pid_file.to_str().unwrap()])
        },
    )]);
    let out = grants.run("background").await.unwrap();
    assert_eq!(out.status, Some(0));
    assert_eq!(text(&out.stdout), "leader done\n");
    let pids = std::fs::read_to_string(&pid_file).unwrap();
    let child: i32 = pids.split_whitespace().nth(1).unwrap().parse().unwrap();
    eventually("the left-behind child is gone", || !alive(child)).await;
}

#[tokio::test]
async fn an_executable_replaced_after_start_up_is_refused() {
    let fx = Fixtures::new();
    // Granted directly, and through a link resolved at start-up.
    let tool = fx.path("tool");
    std::fs::copy(fx.path("report.sh"), &tool).unwrap();
    let link = fx.path("tool-link");
    std::os::unix::fs::symlink(fx.path("report.sh"), &link).unwrap();
    let grants = open(&[
        ("tool", grant(tool.clone(), &[])),
        ("linked", grant(link.clone(), &[])),
        ("report", grant(fx.path("report.sh"), &[])),
    ]);
    assert_eq!(grants.run("tool").await.unwrap().status, Some(0));
    assert_eq!(grants.run("linked").await.unwrap().status, Some(0));

    // The file becomes a link to another program; the link is pointed at another one.
    let swap = fx.path("swap");
    std::os::unix::fs::symlink(fx.path("other.sh"), &swap).unwrap();
    std::fs::rename(&swap, &tool).unwrap();
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(fx.path("other.sh"), &link).unwrap();
    for name in ["tool", "linked"] {
        let err = grants.run(name).await.unwrap_err();
        assert_eq!(err.result, RunResult::Failed, "{name}");
        assert!(
            err.message
                .contains("is no longer the file checked when the plugin started"),
            "{}",
            err.message
        );
    }
    // A new file with the same content in its place is another file too.
    std::fs::remove_file(&tool).unwrap();
    std::fs::copy(fx.path("report.sh"), &tool).unwrap();
    assert_eq!(
        grants.run("tool").await.unwrap_err().result,
        RunResult::Failed
    );
    // The file kept its inode but is now writable by anyone: refused as well.
    set_mode(&fx.path("report.sh"), 0o777);
    let err = grants.run("report").await.unwrap_err();
    assert!(
        err.message.contains("writable by every user"),
        "{}",
        err.message
    );
    set_mode(&fx.path("report.sh"), 0o755);
    still_runs(&grants).await;
    assert_eq!(grants.stats().snapshot().count(RunResult::Failed), 4);
}

#[tokio::test]
async fn a_grant_unusable_at_start_up_names_its_reason_at_every_run() {
    let fx = Fixtures::new();
    let plain = fx.path("plain.txt");
    std::fs::write(&plain, "not a program\n").unwrap();
    set_mode(&plain, 0o644);
    let open_to_all = fx.path("open.sh");
    std::fs::copy(fx.path("report.sh"), &open_to_all).unwrap();
    set_mode(&open_to_all, 0o777);
    let cases = [
        (
            "missing",
            grant(fx.path("no-such-tool"), &[]),
            "cannot open",
        ),
        ("plain", grant(plain, &[]), "not executable"),
        (
            "dir",
            grant(fx.dir.path().to_path_buf(), &[]),
            "not a regular file",
        ),
        ("open", grant(open_to_all, &[]), "writable by every user"),
        (
            "stranger",
            RunGrant {
                user: Some("no-such-user-ccfleet".to_owned()),
                ..grant(fx.path("report.sh"), &[])
            },
            "unknown user no-such-user-ccfleet",
        ),
    ];
    let grants: Vec<(&str, RunGrant)> = cases.iter().map(|(n, g, _)| (*n, g.clone())).collect();
    let opened = open(&grants);
    let unusable: Vec<&str> = opened.unusable().map(|(name, _)| name).collect();
    assert_eq!(unusable, ["dir", "missing", "open", "plain", "stranger"]);
    let checks = commands::check(
        &grants
            .iter()
            .map(|(n, g)| ((*n).to_owned(), g.clone()))
            .collect(),
    );
    for (name, _, reason) in &cases {
        let err = opened.run(name).await.unwrap_err();
        assert_eq!(err.result, RunResult::Failed);
        assert!(
            err.message
                .starts_with(&format!("command {name} cannot be run: ")),
            "{}",
            err.message
        );
        assert!(err.message.contains(reason), "{name}: {}", err.message);
        let check = checks.iter().find(|c| c.name == *name).unwrap();
        assert!(
            check.error.as_deref().is_some_and(|e| e.contains(reason)),
            "--check-config misses {name}: {check:?}"
        );
    }
}

#[tokio::test]
async fn a_command_runs_as_its_granted_user() {
    if !is_root() {
        eprintln!("skipped: switching users needs root");
        return;
    }
    let fx = Fixtures::new();
    let grants = open(&[(
        "as-nobody",
        RunGrant {
            user: Some("nobody".to_owned()),
            ..grant(fx.path("report.sh"), &[])
        },
    )]);
    let out = grants.run("as-nobody").await.unwrap();
    let stdout = text(&out.stdout);
    let nobody = std::process::Command::new("id")
        .args(["-u", "nobody"])
        .output()
        .unwrap();
    let uid = text(&nobody.stdout).trim();
    assert!(stdout.contains(&format!("uid {uid}\n")), "{stdout}");
    let checks = commands::check(&BTreeMap::from([(
        "as-nobody".to_owned(),
        RunGrant {
            user: Some("nobody".to_owned()),
            ..grant(fx.path("report.sh"), &[])
        },
    )]));
    assert_eq!(checks[0].error, None);
    assert_eq!(checks[0].warning, None, "the agent runs as root here");
}

#[test]
fn check_config_reports_a_grant_that_cannot_run() {
    let fx = Fixtures::new();
    let config = serde_json::json!({
        "fleet": {"url": "http://127.0.0.1:1", "token": "t"},
        "plugins": [{
            "name": "sensors",
            "path": fx.path("sensors.wasm"),
            "capabilities": {"run": {
                "good": {"path": fx.path("report.sh")},
                "gone": {"path": fx.path("no-such-tool")},
                "stranger": {"path": fx.path("report.sh"), "user": "no-such-user-ccfleet"}
            }}
        }]
    });
    let path = fx.path("agent.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ccfleet"))
        .args(["agent", "--check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let report = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        report.contains(&format!(
            "error: plugin sensors: capabilities.run.gone: cannot open {}",
            fx.path("no-such-tool").display()
        )),
        "{report}"
    );
    assert!(
        report.contains(
            "error: plugin sensors: capabilities.run.stranger: unknown user no-such-user-ccfleet"
        ),
        "{report}"
    );
    assert!(!report.contains("capabilities.run.good"), "{report}");

    // A relative path is refused by the configuration parser itself.
    let relative = serde_json::json!({
        "fleet": {"url": "http://127.0.0.1:1", "token": "t"},
        "plugins": [{"path": fx.path("x.wasm"), "capabilities": {"run": {"x": {"path": "report.sh"}}}}]
    });
    std::fs::write(&path, relative.to_string()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ccfleet"))
        .args(["agent", "--check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let report = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(report.contains("must be an absolute path"), "{report}");
}

/// End to end: the `run-command` plugin (guest/plugins/run-command, built from source) runs
/// the commands it is granted through `cc:fleet/commands`, and gets a clear error for the
/// rest. Time in a command is not the plugin's own: a command running past the plugin's
/// call timeout does not end the plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_runs_its_granted_commands_through_the_host() {
    let fx = Fixtures::new();
    let pid_file = fx.drop_box().join("hang.pid");
    let cache = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: Some(cache.path().to_path_buf()),
        ..RuntimeOptions::default()
    })
    .unwrap();
    let mut spec = PluginSpec::new(guests::component("run-command"));
    spec.config = serde_json::json!(["report", "failing", "hang", "flood", "rm"]);
    spec.collect_interval = Some(Duration::from_millis(100));
    spec.limits.call_timeout = Duration::from_millis(200);
    spec.capabilities.run = BTreeMap::from([
        ("report".to_owned(), grant(fx.path("report.sh"), &["one"])),
        ("failing".to_owned(), grant(fx.path("report.sh"), &["fail"])),
        ("flood".to_owned(), grant(fx.path("flood.sh"), &[])),
        (
            "hang".to_owned(),
            RunGrant {
                timeout: Duration::from_millis(400),
                ..grant(fx.path("hang.sh"), &[pid_file.to_str().unwrap()])
            },
        ),
    ]);
    let mut events = runtime.subscribe();
    let (sink, mut batches) = sink::channel(16);
    let feeds = FeedSenders::new();
    let plugin = runtime.spawn(spec, feeds.subscribe(), sink);

    for needle in [
        "run report: status 0: arg one",
        "run failing: status 3: arg fail",
        "run hang: error command hang did not finish within 400ms (its timeout); it was killed",
        "run flood: error command flood wrote more than its 1048576 bytes of output",
        "run rm: error command rm is not granted to this plugin (capabilities.run)",
    ] {
        wait_for_log(&mut events, needle).await;
    }
    let batch = tokio::time::timeout(Duration::from_secs(30), batches.recv())
        .await
        .expect("a batch")
        .expect("the sink is open");
    let lines = text(&batch.lines);
    assert!(
        lines.contains("command,name=report status=0i,stdout=\"arg one\n"),
        "{lines}"
    );
    assert!(
        lines.contains("command,name=failing status=3i,stdout=\"arg fail\n"),
        "{lines}"
    );
    assert!(!lines.contains("name=hang"), "{lines}");
    let pgid = pid_in(&pid_file).await;
    eventually("the hanging command's group is gone", || {
        live_members(pgid).is_empty()
    })
    .await;

    let stats = plugin.stats().snapshot();
    for result in [
        RunResult::Ok,
        RunResult::ExitNonzero,
        RunResult::Timeout,
        RunResult::OutputCap,
        RunResult::Refused,
    ] {
        assert!(stats.commands.count(result) >= 1, "{result:?}: {stats:?}");
    }
    let status = plugin.status().borrow().clone();
    assert_eq!(status.state, PluginState::Running, "{status:?}");
    assert_eq!(
        status.restarts, 0,
        "a slow command ended the plugin: {status:?}"
    );
    plugin.stop().await;
}

async fn wait_for_log(events: &mut broadcast::Receiver<PluginEvent>, needle: &str) {
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match events.recv().await {
                Ok(PluginEvent {
                    kind: EventKind::Log { message, .. },
                    ..
                }) if message.contains(needle) => return,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("event channel closed"),
            }
        }
    })
    .await;
    assert!(
        found.is_ok(),
        "timed out waiting for the log line {needle:?}"
    );
}

/// The agent's `/metrics` counts a plugin's runs by result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_counts_runs_by_result_in_its_metrics() {
    let fx = Fixtures::new();
    let config = serde_json::json!({
        "fleet": {"url": "http://127.0.0.1:1", "token": "t", "hostname": "node01"},
        "plugin-cache-dir": fx.path("compiled"),
        "metrics-addr": "127.0.0.1:0",
        "plugins": [{
            "name": "runner",
            "path": guests::component("run-command"),
            "config": ["report", "rm"],
            "collect-interval": "100ms",
            "capabilities": {"run": {"report": {"path": fx.path("report.sh")}}}
        }]
    });
    let config = AgentConfig::from_json(&config.to_string(), fx.dir.path()).unwrap();
    let agent = Agent::new(config)
        .unwrap()
        .start()
        .await
        .expect("the agent starts");
    let addr = agent.metrics_addr().expect("a metrics listener");
    let ok = "ccfleet_agent_plugin_command_runs_total{plugin=\"runner\",result=\"ok\"}";
    let refused = "ccfleet_agent_plugin_command_runs_total{plugin=\"runner\",result=\"refused\"}";
    let until = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let body = get_metrics(addr).await;
        let counted = |series: &str| {
            body.lines()
                .find_map(|l| l.strip_prefix(series))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .is_some_and(|v| v >= 1.0)
        };
        if counted(ok) && counted(refused) {
            break body;
        }
        assert!(Instant::now() < until, "the runs were not counted:\n{body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        body.contains(
            "ccfleet_agent_plugin_command_runs_total{plugin=\"runner\",result=\"timeout\"} 0"
        ),
        "{body}"
    );
    agent.shutdown().await.unwrap();
}

/// `GET /metrics` over a real socket: the body.
async fn get_metrics(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a full response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}
