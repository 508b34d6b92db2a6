//! The scaled-out fleet under faults, checked as Jepsen checks a database: three `ccfleet`
//! server processes share a registry in a replicated JetStream bucket on a three-node NATS
//! cluster; clients register, heartbeat, pull configurations, deregister and re-register
//! members through random servers and record every request and its answer, while a seeded
//! nemesis kills (SIGKILL), pauses (SIGSTOP/SIGCONT) and restarts servers and NATS nodes
//! (at most one NATS node at a time, so JetStream keeps its majority). After healing, every
//! server is asked about every instance id a client was ever given:
//!
//! - every acknowledged registration nothing later replaced is served (with its member's
//!   configuration); every acknowledged deregistration and every replaced id is refused;
//!   no id was given to two members; all servers give the same answers; none answers 5xx;
//! - the heartbeat stream applied every heartbeat it acknowledged (the members that only
//!   heartbeat through it are in their cluster's roster);
//! - no server exited on its own (a restart while JetStream elects leaders must wait, not
//!   fail), and no acknowledged registration was ever answered "unknown" (404), faults or
//!   not: a server that cannot tell answers 503.
//!
//! The servers are real processes: this test binary started again with
//! [`CHILD_CONFIG`] naming a server configuration (see `chaos_server_process`).
//!
//! Short by default (about a minute); the long form is set by environment variables (see
//! the book, "Scale-out and high availability: Chaos test"): `CHAOS_DURATION` (fault phase, e.g. `30m`), `CHAOS_SEEDS`
//! (comma-separated; each seed is one run), `CHAOS_MEMBERS`, `CHAOS_LOG_DIR` (keeps the
//! servers' logs there). A violation fails the test
//! and names its seed; the same seed replays the same faults (timing still varies).
#![cfg(all(feature = "server", feature = "client"))]

#[path = "support/nats.rs"]
mod nats;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccfleet::wire::{ServiceType, decode_roster, discovery_subject, encode_heartbeat, now_ns};
use futures::StreamExt;
use nats::NatsCluster;
use serde_json::json;

/// The environment variable that turns this test binary into a fleet server: the path of
/// its configuration.
const CHILD_CONFIG: &str = "CCFLEET_CHAOS_SERVER_CONFIG";
const SUBJECT: &str = "cc.fleet.event";
/// The cluster of the members that heartbeat only through the heartbeat stream.
const STREAM_CLUSTER: &str = "chaosjs";
const CLUSTER: &str = "chaos";
/// How long a client waits for an answer: a paused server answers nothing.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(4);
/// How long the healed fleet has to converge before its answers count as violations.
const CONVERGE: Duration = Duration::from_secs(60);

/// Runs the fleet server when started as a child of the chaos test; otherwise does nothing.
#[test]
fn chaos_server_process() {
    let Some(path) = std::env::var_os(CHILD_CONFIG) else {
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .try_init();
    let text = std::fs::read_to_string(path).expect("the chaos server's config");
    let config = ccfleet::server::ServerConfig::from_json(&text).expect("a valid config");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        match ccfleet::server::start(config).await {
            Ok(server) => {
                eprintln!("chaos server: serving on {}", server.base_url());
                std::future::pending::<()>().await;
            }
            // As `ccfleet server` does.
            Err(e) => {
                eprintln!("chaos server: start-up failed: {e}");
                std::process::exit(2);
            }
        }
    });
}

/// A seeded generator (SplitMix64): the nemesis' choices depend on the seed only.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from))
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

struct Settings {
    duration: Duration,
    seeds: Vec<u64>,
    members: usize,
    stream_members: usize,
    workers: usize,
}

impl Settings {
    fn from_env() -> Settings {
        let duration = std::env::var("CHAOS_DURATION")
            .ok()
            .map(|d| ccfleet::duration::parse(&d).expect("CHAOS_DURATION: a duration like 30m"))
            .unwrap_or(Duration::from_secs(25));
        let seeds = std::env::var("CHAOS_SEEDS")
            .ok()
            .map(|s| {
                s.split(',')
                    .map(|seed| seed.trim().parse().expect("CHAOS_SEEDS: numbers"))
                    .collect()
            })
            .unwrap_or_else(|| {
                vec![
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_millis() as u64
                        % 100_000,
                ]
            });
        let members = std::env::var("CHAOS_MEMBERS")
            .ok()
            .map(|m| m.parse().expect("CHAOS_MEMBERS: a number"))
            .unwrap_or(150);
        Settings {
            duration,
            seeds,
            members,
            stream_members: (members / 5).max(1),
            workers: 16,
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One fleet server process slot: its port and configuration stay across restarts.
struct ServerProc {
    index: usize,
    port: u16,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
}

impl ServerProc {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["chaos_server_process", "--exact", "--nocapture"])
            .env(CHILD_CONFIG, &self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting a chaos server");
        self.child = Some(child);
        self.paused = false;
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    fn signal(&mut self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
        }
    }

    /// The exit status, if the process ended without being killed.
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status)
    }

    fn log_tail(&self, lines: usize) -> String {
        let Ok(file) = std::fs::File::open(&self.log) else {
            return String::new();
        };
        let all: Vec<String> = std::io::BufReader::new(file)
            .lines()
            .map_while(Result::ok)
            .collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        if self.paused {
            self.signal("-CONT");
        }
        self.kill();
    }
}

/// Violations by kind, with examples.
#[derive(Default)]
struct Violations(BTreeMap<&'static str, Vec<String>>);

impl Violations {
    fn add(&mut self, kind: &'static str, detail: String) {
        self.0.entry(kind).or_default().push(detail);
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn summary(&self) -> String {
        let mut out = String::new();
        for (kind, details) in &self.0 {
            out.push_str(&format!("  {kind}: {}\n", details.len()));
            for d in details.iter().take(5) {
                out.push_str(&format!("    {d}\n"));
            }
        }
        out
    }
}

/// How long a server that holds a request whose client gave up may still act on it: the
/// request waits in a paused server's socket and is served when it resumes. A server that
/// ran this long without a pause, or was killed, holds none.
const LATE_EFFECT: Duration = Duration::from_secs(15);

/// When each server was up (running and not paused), to bound when a request whose answer
/// never came can still take effect.
#[derive(Default, Clone)]
struct Timeline {
    /// Per server: (when, up after it, killed).
    events: Vec<Vec<(Instant, bool, bool)>>,
}

impl Timeline {
    fn new(servers: usize) -> Timeline {
        let now = Instant::now();
        Timeline {
            events: vec![vec![(now, true, false)]; servers],
        }
    }

    fn record(&mut self, server: usize, up: bool, killed: bool) {
        self.events[server].push((Instant::now(), up, killed));
    }

    /// Whether a request sent to `server` at `sent` can no longer take effect at `at`: the
    /// server was killed in between, or ran unpaused for [`LATE_EFFECT`] in between.
    fn void(&self, server: usize, sent: Instant, at: Instant) -> bool {
        let events = &self.events[server];
        // Up time is counted from `sent` on.
        let up_at_sent = events
            .iter()
            .take_while(|e| e.0 <= sent)
            .last()
            .is_some_and(|e| e.1);
        let mut up_since = up_at_sent.then_some(sent);
        for &(when, up, killed) in events.iter().filter(|e| e.0 > sent && e.0 <= at) {
            if killed {
                return true;
            }
            if let Some(since) = up_since
                && when.duration_since(since) >= LATE_EFFECT
            {
                return true;
            }
            up_since = match (up, up_since) {
                (true, Some(since)) => Some(since),
                (true, None) => Some(when),
                (false, _) => None,
            };
        }
        up_since.is_some_and(|since| at.saturating_duration_since(since) >= LATE_EFFECT)
    }
}

/// What a client learned about one member from the answers it got.
#[derive(Default, Clone)]
struct Member {
    host: String,
    /// The id of the latest acknowledged registration, unless deregistered since, and when
    /// its registration was sent.
    current: Option<String>,
    current_sent: Option<Instant>,
    /// Whether `current` is known to be live: no registration or deregistration of the
    /// member since has an unknown outcome.
    certain: bool,
    /// Registrations sent (server, when) whose answer never came: one may still replace
    /// `current` until the timeline says it cannot.
    unanswered: Vec<(usize, Instant)>,
    /// Ids that must be refused: deregistered, or replaced by an acknowledged registration.
    dead: Vec<String>,
    /// Every id given to the member.
    given: Vec<String>,
}

/// The outcome of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Status(u16, String),
    /// Never reached the server (connection refused).
    NotSent,
    /// Sent; what the server did is unknown (timeout, broken connection).
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    Register,
    Heartbeat,
    Pull,
    Deregister,
}

/// Everything the clients did and saw.
#[derive(Default)]
struct History {
    /// Operations by kind and answer class.
    ops: BTreeMap<(Op, String), u64>,
    violations: Violations,
    /// Every acknowledged id and the member it was given to.
    owners: HashMap<String, usize>,
}

impl History {
    fn record(&mut self, op: Op, answer: &Answer) {
        let class = match answer {
            Answer::Status(s, _) => s.to_string(),
            Answer::NotSent => "not sent".to_owned(),
            Answer::Unknown => "no answer".to_owned(),
        };
        *self.ops.entry((op, class)).or_default() += 1;
    }
}

async fn send(request: reqwest::RequestBuilder) -> Answer {
    match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            match response.text().await {
                Ok(body) => Answer::Status(status, body),
                Err(_) => Answer::Unknown,
            }
        }
        Err(e) if e.is_connect() => Answer::NotSent,
        Err(_) => Answer::Unknown,
    }
}

fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .unwrap()
}

fn register_body(cluster: &str, host: &str, kind: &str) -> String {
    json!({"cluster": cluster, "hostname": host, "serviceType": kind}).to_string()
}

/// The configuration body a member's pull must carry.
fn host_config(host: &str) -> serde_json::Value {
    json!({"host": host})
}

impl Member {
    /// Whether `current` must be served: no outcome since its registration is unknown, and
    /// no registration left unanswered before it could still replace it afterwards.
    fn live(&self, timeline: &Timeline) -> bool {
        let (Some(_), Some(sent)) = (&self.current, self.current_sent) else {
            return false;
        };
        self.certain
            && self
                .unanswered
                .iter()
                .all(|&(server, asked)| asked < sent && timeline.void(server, asked, sent))
    }
}

/// One client working on its share of the members, sequentially per member.
async fn client(
    urls: Arc<Vec<String>>,
    members: Vec<usize>,
    state: Arc<Mutex<Vec<Member>>>,
    history: Arc<Mutex<History>>,
    timeline: Arc<Mutex<Timeline>>,
    seed: u64,
    until: Instant,
) {
    let http = http();
    let mut rng = Rng(seed);
    while Instant::now() < until {
        let m = members[rng.below(members.len() as u64) as usize];
        let server = rng.below(urls.len() as u64) as usize;
        let base = &urls[server];
        let (host, current, certain) = {
            let state = state.lock().unwrap();
            let member = &state[m];
            let live = member.live(&timeline.lock().unwrap());
            (
                member.host.clone(),
                member.current.clone(),
                member.certain && live,
            )
        };
        let sent = Instant::now();
        let op = match &current {
            None => Op::Register,
            Some(_) if !certain && rng.chance(70) => Op::Register,
            Some(_) => match rng.below(100) {
                0..45 => Op::Heartbeat,
                45..75 => Op::Pull,
                75..88 => Op::Register,
                _ => Op::Deregister,
            },
        };
        let answer = match (op, &current) {
            (Op::Register, _) => {
                send(
                    http.post(format!("{base}/api/fleet/register/cluster/"))
                        .header("content-type", "application/json")
                        .body(register_body(CLUSTER, &host, "ccmc")),
                )
                .await
            }
            (Op::Heartbeat, Some(id)) => {
                send(http.post(format!("{base}/api/fleet/heartbeat/{id}"))).await
            }
            (Op::Pull, Some(id)) => send(http.get(format!("{base}/api/fleet/config/{id}"))).await,
            (Op::Deregister, Some(id)) => {
                send(http.delete(format!("{base}/api/fleet/deregister/{id}"))).await
            }
            _ => unreachable!("only registrations without an id"),
        };
        // The bookkeeping holds both locks, and no lock is held across an await.
        {
            let mut history = history.lock().unwrap();
            history.record(op, &answer);
            let mut state = state.lock().unwrap();
            let member = &mut state[m];
            let at = format!("member {host} through server {server}");
            match (op, &answer) {
                (_, Answer::NotSent) => {}
                (Op::Register, Answer::Status(201, body)) => {
                    let id = serde_json::from_str::<serde_json::Value>(body)
                        .ok()
                        .and_then(|v| v["instanceId"].as_str().map(str::to_owned))
                        .unwrap_or_default();
                    if let Some(other) = history.owners.insert(id.clone(), m)
                        && other != m
                    {
                        history
                            .violations
                            .add("an instance id given to two members", at.clone());
                    }
                    // Everything given before is replaced (the registration is an upsert).
                    let before: Vec<String> = member.given.clone();
                    member.dead.extend(before);
                    member.given.push(id.clone());
                    member.current = Some(id);
                    member.current_sent = Some(sent);
                    member.certain = true;
                    let timeline = timeline.lock().unwrap();
                    member
                        .unanswered
                        .retain(|&(server, asked)| !timeline.void(server, asked, sent));
                }
                // A registration without a 201 may still have been stored; one without an
                // answer may even be stored later.
                (Op::Register, Answer::Unknown) => {
                    member.certain = false;
                    member.unanswered.push((server, sent));
                }
                (Op::Register, _) => member.certain = false,
                (Op::Deregister, Answer::Status(204, _)) => {
                    if let Some(id) = member.current.take() {
                        member.dead.push(id);
                    }
                    member.certain = true;
                }
                (Op::Deregister, _) => member.certain = false,
                (Op::Heartbeat | Op::Pull, Answer::Status(404, _)) if certain => {
                    history.violations.add(
                        "an acknowledged registration answered unknown (404)",
                        format!("{op:?} of {at}"),
                    )
                }
                (Op::Pull, Answer::Status(200, body))
                    if serde_json::from_str::<serde_json::Value>(body).ok()
                        != Some(host_config(&host)) =>
                {
                    history.violations.add(
                        "an instance id served another member's configuration",
                        format!("{at}: {body}"),
                    );
                }
                _ => {}
            }
        }
        // A server that refuses connections is restarting: no need to hammer it.
        let pause = if answer == Answer::NotSent {
            rng.millis(50, 150)
        } else {
            rng.millis(5, 30)
        };
        tokio::time::sleep(pause).await;
    }
}

/// Registers members that heartbeat only through the heartbeat stream (a JetStream publish
/// with an acknowledgement), one at a time over the fault phase; returns the host names
/// whose heartbeat the stream acknowledged, with the instance ids.
async fn stream_client(
    urls: Arc<Vec<String>>,
    nats_url: String,
    count: usize,
    history: Arc<Mutex<History>>,
    seed: u64,
    until: Instant,
) -> Vec<(String, String)> {
    let http = http();
    let mut rng = Rng(seed);
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .reconnect_delay_callback(|_| Duration::from_millis(100))
        .connect(nats_url)
        .await
        .unwrap();
    let mut js = async_nats::jetstream::new(client);
    js.set_timeout(REQUEST_TIMEOUT);
    let pace = until.saturating_duration_since(Instant::now()) / count as u32;
    let mut acknowledged = Vec::new();
    for i in 0..count {
        let host = format!("s{i:04}");
        let mut id = None;
        // An attempt without an answer may still register the member later, replacing the
        // id the heartbeat is for: such members are not judged.
        let mut unanswered = false;
        for _ in 0..40 {
            let base = &urls[rng.below(urls.len() as u64) as usize];
            let answer = send(
                http.post(format!("{base}/api/fleet/register/cluster/"))
                    .header("content-type", "application/json")
                    .body(register_body(STREAM_CLUSTER, &host, "ccb")),
            )
            .await;
            history.lock().unwrap().record(Op::Register, &answer);
            unanswered |= answer == Answer::Unknown;
            if let Answer::Status(201, body) = answer {
                id = serde_json::from_str::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v["instanceId"].as_str().map(str::to_owned));
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let Some(id) = id.filter(|_| !unanswered) else {
            continue;
        };
        // At once: the consumer's server may not have seen the registration yet.
        for _ in 0..40 {
            let message = encode_heartbeat(now_ns(), &[id.as_str()]).unwrap();
            let acked = match js.publish(SUBJECT, message.into()).await {
                Ok(ack) => ack.await.is_ok(),
                Err(_) => false,
            };
            if acked {
                acknowledged.push((host.clone(), id.clone()));
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let next = pace.min(until.saturating_duration_since(Instant::now()));
        tokio::time::sleep(next).await;
    }
    acknowledged
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Target {
    Server(usize),
    Nats(usize),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    Kill,
    Pause,
}

/// The processes the nemesis works on.
struct Fleet {
    nats: NatsCluster,
    servers: Vec<ServerProc>,
    timeline: Arc<Mutex<Timeline>>,
}

impl Fleet {
    fn apply(&mut self, target: Target, fault: Fault) {
        match (target, fault) {
            (Target::Server(i), Fault::Kill) => {
                self.servers[i].kill();
                self.timeline.lock().unwrap().record(i, false, true);
            }
            (Target::Server(i), Fault::Pause) => {
                self.servers[i].signal("-STOP");
                self.servers[i].paused = true;
                self.timeline.lock().unwrap().record(i, false, false);
            }
            (Target::Nats(i), Fault::Kill) => self.nats.nodes[i].kill(),
            (Target::Nats(i), Fault::Pause) => signal_pid(self.nats.nodes[i].pid(), "-STOP"),
        }
    }

    fn heal(&mut self, target: Target, fault: Fault) {
        match (target, fault) {
            (Target::Server(i), Fault::Kill) => {
                self.servers[i].start();
                self.timeline.lock().unwrap().record(i, true, false);
            }
            (Target::Server(i), Fault::Pause) => {
                self.servers[i].signal("-CONT");
                self.servers[i].paused = false;
                self.timeline.lock().unwrap().record(i, true, false);
            }
            (Target::Nats(i), Fault::Kill) => self.nats.nodes[i].restart(),
            (Target::Nats(i), Fault::Pause) => signal_pid(self.nats.nodes[i].pid(), "-CONT"),
        }
    }

    /// Servers that ended on their own (restarted at once), as violations.
    fn check_exits(&mut self, violations: &mut Violations) {
        for server in &mut self.servers {
            if let Some(status) = server.exited() {
                violations.add(
                    "a server exited on its own",
                    format!(
                        "server {} with {status}; its log ends:\n{}",
                        server.index,
                        server.log_tail(8)
                    ),
                );
                server.start();
            }
        }
    }
}

fn signal_pid(pid: Option<u32>, signal: &str) {
    if let Some(pid) = pid {
        let _ = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status();
    }
}

/// Applies seeded faults until `until`, then heals everything; returns faults by kind.
async fn nemesis(
    fleet: &mut Fleet,
    seed: u64,
    until: Instant,
    violations: &Arc<Mutex<History>>,
) -> BTreeMap<String, u64> {
    let mut rng = Rng(seed ^ 0x5eed);
    let mut active: Vec<(Target, Fault, Instant)> = Vec::new();
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    while Instant::now() < until {
        tokio::time::sleep(rng.millis(800, 2000)).await;
        let now = Instant::now();
        let (due, rest): (Vec<_>, Vec<_>) = active.into_iter().partition(|f| f.2 <= now);
        active = rest;
        for (target, fault, _) in due {
            tokio::task::block_in_place(|| fleet.heal(target, fault));
        }
        fleet.check_exits(&mut violations.lock().unwrap().violations);
        let servers_down = active
            .iter()
            .filter(|f| matches!(f.0, Target::Server(_)))
            .count();
        let nats_down = active.iter().any(|f| matches!(f.0, Target::Nats(_)));
        let mut candidates: Vec<Target> = Vec::new();
        if servers_down < 2 {
            candidates.extend(
                (0..fleet.servers.len())
                    .map(Target::Server)
                    .filter(|t| !active.iter().any(|f| f.0 == *t)),
            );
        }
        if !nats_down {
            candidates.extend((0..fleet.nats.nodes.len()).map(Target::Nats));
        }
        if candidates.is_empty() {
            continue;
        }
        let target = candidates[rng.below(candidates.len() as u64) as usize];
        let fault = if rng.chance(50) {
            Fault::Kill
        } else {
            Fault::Pause
        };
        let hold = rng.millis(800, 4000);
        tokio::task::block_in_place(|| fleet.apply(target, fault));
        let kind = match target {
            Target::Server(_) => "server",
            Target::Nats(_) => "NATS node",
        };
        let verb = match fault {
            Fault::Kill => "killed and restarted",
            Fault::Pause => "paused and resumed",
        };
        *faults.entry(format!("{kind} {verb}")).or_default() += 1;
        active.push((target, fault, Instant::now() + hold));
    }
    for (target, fault, _) in active {
        tokio::task::block_in_place(|| fleet.heal(target, fault));
    }
    faults
}

async fn status_of(http: &reqwest::Client, url: &str) -> Option<u16> {
    http.get(url).send().await.ok().map(|r| r.status().as_u16())
}

/// Asks every server about every id; the violations of this round.
async fn check_round(
    http: &reqwest::Client,
    urls: &[String],
    members: &[Member],
    owners: &HashMap<String, usize>,
    timeline: &Timeline,
) -> Violations {
    let mut violations = Violations::default();
    // (id, member, expectation): true = served, false = refused, None = either.
    let mut cases: Vec<(String, usize, Option<bool>)> = Vec::new();
    for (m, member) in members.iter().enumerate() {
        for id in &member.given {
            let expected = if member.dead.contains(id) {
                Some(false)
            } else if member.current.as_ref() == Some(id) && member.live(timeline) {
                Some(true)
            } else {
                None
            };
            cases.push((id.clone(), m, expected));
        }
    }
    debug_assert!(cases.iter().all(|(id, m, _)| owners.get(id) == Some(m)));
    let answers: Vec<Vec<Answer>> = futures::stream::iter(cases.iter())
        .map(|(id, _, _)| async move {
            let mut per_server = Vec::new();
            for base in urls {
                per_server.push(send(http.get(format!("{base}/api/fleet/config/{id}"))).await);
            }
            per_server
        })
        .buffered(8)
        .collect()
        .await;
    for ((_, m, expected), answers) in cases.iter().zip(answers) {
        let host = &members[*m].host;
        for (server, answer) in answers.iter().enumerate() {
            let at = format!("member {host}, server {server}");
            match (answer, expected) {
                (Answer::Status(s, _), _) if *s >= 500 => {
                    violations.add("5xx after healing", format!("{at}: {s}"))
                }
                (Answer::Status(200, body), Some(true) | None) => {
                    if serde_json::from_str::<serde_json::Value>(body).ok()
                        != Some(host_config(host))
                    {
                        violations.add(
                            "an instance id served another member's configuration",
                            format!("{at}: {body}"),
                        );
                    }
                }
                (Answer::Status(404, _), Some(false) | None) => {}
                (Answer::Status(404, _), Some(true)) => violations.add(
                    "an acknowledged registration lost (404 after healing)",
                    at.clone(),
                ),
                (Answer::Status(200, _), Some(false)) => violations.add(
                    "a deregistered or replaced instance id is served",
                    at.clone(),
                ),
                (other, _) => violations.add("an unexpected answer after healing", {
                    format!("{at}: {other:?}")
                }),
            }
        }
        let first = &answers[0];
        if answers.iter().any(|a| a != first) {
            let statuses: Vec<String> = answers
                .iter()
                .map(|a| match a {
                    Answer::Status(s, _) => s.to_string(),
                    other => format!("{other:?}"),
                })
                .collect();
            violations.add(
                "servers disagree",
                format!("member {host}: {}", statuses.join(" / ")),
            );
        }
    }
    violations
}

/// The host names in the next roster of the stream members' cluster (rosters are
/// published again every discovery interval, 1 s): a subscription of its own, so no older
/// roster waits in it.
async fn next_roster(client: &async_nats::Client) -> Option<HashSet<String>> {
    let subject = discovery_subject("", STREAM_CLUSTER, ServiceType::MetricCollector);
    let mut subscriber = client.subscribe(subject).await.ok()?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while let Ok(Some(message)) = tokio::time::timeout_at(deadline, subscriber.next()).await {
        if let Ok(providers) = decode_roster(&message.payload) {
            return Some(providers.into_iter().map(|p| p.hostname).collect());
        }
    }
    None
}

/// A server's heartbeat stream figures from `/metrics`.
async fn stream_metrics(http: &reqwest::Client, url: &str) -> String {
    let Ok(response) = http.get(format!("{url}/metrics")).send().await else {
        return "no metrics".to_owned();
    };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| {
            !l.starts_with('#')
                && (l.starts_with("ccfleet_heartbeat_stream")
                    || l.starts_with("ccfleet_heartbeats_total{source=\"nats\"")
                    || l.starts_with("ccfleet_heartbeat_messages_total"))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn write_config(dir: &Path, port: u16, nats_url: &str, tree: &Path) -> PathBuf {
    let config = json!({
        "addr": format!("127.0.0.1:{port}"),
        "disable-authentication": true,
        "nats": {"address": nats_url},
        "registry": {"type": "jetstream-kv", "bucket": "fleet", "replicas": 3, "lease-ttl": "2s"},
        "fleet": {
            "heartbeat-subject": SUBJECT,
            "heartbeat-stream": {"name": "HEARTBEATS", "replicas": 3},
            "config-dir": tree.display().to_string(),
            "discovery-interval": "1s",
            "discovery-debounce": "100ms",
            "stale-after": "1h",
        },
    });
    let path = dir.join(format!("server-{port}.json"));
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

/// One run of the test with one seed: the report, and whether it found violations.
async fn run(seed: u64, settings: &Settings) -> (String, bool) {
    let dir = tempfile::tempdir().unwrap();
    // Server logs stay where CHAOS_LOG_DIR says, for a long run's post-mortem.
    let logs = std::env::var_os("CHAOS_LOG_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.path().to_owned());
    std::fs::create_dir_all(&logs).unwrap();
    let tree = dir.path().join("tree");
    for i in 0..settings.members {
        let host = format!("h{i:04}");
        let path = tree.join("ccmc").join(CLUSTER).join(format!("{host}.json"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, host_config(&host).to_string()).unwrap();
    }
    let nats = NatsCluster::start();
    let js = async_nats::jetstream::new(
        async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(nats.url(0))
            .await
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while js.query_account().await.is_err() {
        assert!(Instant::now() < deadline, "JetStream did not answer");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let servers: Vec<ServerProc> = (0..3)
        .map(|i| {
            let port = free_port();
            ServerProc {
                index: i,
                port,
                config: write_config(dir.path(), port, &nats.url(i), &tree),
                log: logs.join(format!("seed-{seed}-server-{i}.log")),
                child: None,
                paused: false,
            }
        })
        .collect();
    let timeline = Arc::new(Mutex::new(Timeline::new(servers.len())));
    let mut fleet = Fleet {
        nats,
        servers,
        timeline: timeline.clone(),
    };
    let urls: Arc<Vec<String>> = Arc::new(fleet.servers.iter().map(ServerProc::url).collect());
    let http = http();
    let history = Arc::new(Mutex::new(History::default()));
    for server in &mut fleet.servers {
        server.start();
    }
    for server in &mut fleet.servers {
        let deadline = Instant::now() + Duration::from_secs(60);
        while status_of(&http, &format!("{}/healthz", server.url())).await != Some(200) {
            if let Some(status) = server.exited() {
                panic!(
                    "server {} exited at start with {status}:\n{}",
                    server.index,
                    server.log_tail(20)
                );
            }
            assert!(
                Instant::now() < deadline,
                "server {} did not start",
                server.index
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let roster_watch = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .reconnect_delay_callback(|_| Duration::from_millis(100))
        .connect(fleet.nats.url(1))
        .await
        .unwrap();

    let members = Arc::new(Mutex::new(
        (0..settings.members)
            .map(|i| Member {
                host: format!("h{i:04}"),
                ..Member::default()
            })
            .collect::<Vec<_>>(),
    ));
    let started = Instant::now();
    let until = started + settings.duration;
    let mut clients = Vec::new();
    for w in 0..settings.workers {
        let share: Vec<usize> = (w..settings.members).step_by(settings.workers).collect();
        clients.push(tokio::spawn(client(
            urls.clone(),
            share,
            members.clone(),
            history.clone(),
            timeline.clone(),
            seed.wrapping_mul(31).wrapping_add(w as u64),
            until,
        )));
    }
    let streamed = tokio::spawn(stream_client(
        urls.clone(),
        fleet.nats.url(2),
        settings.stream_members,
        history.clone(),
        seed ^ 0xabc,
        until,
    ));
    let faults = nemesis(&mut fleet, seed, until, &history).await;
    for c in clients {
        c.await.unwrap();
    }
    let streamed = streamed.await.unwrap();
    let healed = Instant::now();

    // Healed: every process runs. Give the fleet time to converge, then judge it.
    let mut last;
    let converge_until = Instant::now() + CONVERGE;
    let mut rounds = 0;
    let mut first_round: Option<String> = None;
    loop {
        rounds += 1;
        fleet.check_exits(&mut history.lock().unwrap().violations);
        let all_healthy = {
            let mut ok = true;
            for url in urls.iter() {
                ok &= status_of(&http, &format!("{url}/healthz")).await == Some(200);
            }
            ok
        };
        if all_healthy {
            let state = members.lock().unwrap().clone();
            let owners = history.lock().unwrap().owners.clone();
            let timeline = timeline.lock().unwrap().clone();
            last = check_round(&http, &urls, &state, &owners, &timeline).await;
            if let Some(roster) = next_roster(&roster_watch).await {
                for (host, _) in &streamed {
                    if !roster.contains(host) {
                        last.add(
                            "a heartbeat the stream acknowledged was not applied",
                            format!("member {host} is not active"),
                        );
                    }
                }
            } else if !streamed.is_empty() {
                last.add(
                    "no roster of the stream members' cluster after healing",
                    String::new(),
                );
            }
            if last.is_empty() {
                break;
            }
        } else {
            last = Violations::default();
            last.add("a server is not healthy after healing", String::new());
        }
        if first_round.is_none() {
            for url in urls.iter() {
                println!("{url}: {}", stream_metrics(&http, url).await);
            }
            first_round = Some(
                last.0
                    .iter()
                    .map(|(k, v)| format!("{k}: {}", v.len()))
                    .collect::<Vec<_>>()
                    .join(", "),
            );
        }
        if Instant::now() >= converge_until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let converged = healed.elapsed();

    let mut history = std::mem::take(&mut *history.lock().unwrap());
    for (kind, details) in last.0 {
        for d in details {
            history.violations.add(kind, d);
        }
    }
    let mut report = format!(
        "chaos seed {seed}: {} of faults, {} members (+{} through the heartbeat stream, {} of them judged: registered without an unanswered attempt, heartbeat acknowledged), judged {} after healing ({rounds} round(s); before converging: {})\n operations:\n",
        ccfleet::duration::format(settings.duration),
        settings.members,
        settings.stream_members,
        streamed.len(),
        ccfleet::duration::format(Duration::from_secs(converged.as_secs())),
        first_round.unwrap_or_else(|| "nothing".to_owned()),
    );
    for ((op, class), n) in &history.ops {
        report.push_str(&format!("  {op:?} {class}: {n}\n"));
    }
    report.push_str(" faults:\n");
    for (kind, n) in &faults {
        report.push_str(&format!("  {kind}: {n}\n"));
    }
    let failed = !history.violations.is_empty();
    if failed {
        report.push_str(" violations:\n");
        report.push_str(&history.violations.summary());
        for server in &fleet.servers {
            report.push_str(&format!(
                " server {} log ends:\n{}\n",
                server.index,
                server.log_tail(15)
            ));
        }
    } else {
        report.push_str(" violations: none\n");
    }
    (report, failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_acknowledged_is_lost_or_duplicated_when_servers_and_nats_nodes_are_killed_and_paused()
 {
    if std::env::var_os(CHILD_CONFIG).is_some() {
        return;
    }
    let settings = Settings::from_env();
    let mut failed = Vec::new();
    for &seed in &settings.seeds {
        let (report, violated) = run(seed, &settings).await;
        println!("{report}");
        let _ = std::io::stdout().flush();
        if violated {
            failed.push((seed, report));
        }
    }
    assert!(
        failed.is_empty(),
        "violations with seed(s) {:?} (replay with CHAOS_SEEDS):\n{}",
        failed.iter().map(|f| f.0).collect::<Vec<_>>(),
        failed
            .iter()
            .map(|f| f.1.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}
