//! What the fleet status page costs a person's browser for a fleet of 20,005 members (40
//! clusters of 500 collectors and 5 infra backends; per cluster a rack of 25 stale hosts and
//! 25 pending ones scattered over the rest: 18,005 active, 1,000 stale, 1,000 pending),
//! measured in headless Chromium driven over WebDriver (chromedriver, as the browser test
//! drives it):
//!
//! - the time from sending the login form to the summary drawn: `performance.now()` when
//!   the page first drew it, which counts from the start of the navigation the form's post
//!   began (the post, its redirect, the page, its script and style sheet, the summary's
//!   request and drawing it), and, as an upper bound, the wall time from the WebDriver
//!   click to the test seeing it;
//! - over `MEASURE_SECONDS` (default 30) of the page refreshing itself: the resident memory
//!   (`VmRSS`) of Chromium's renderer processes (the largest sample, taken every second) and
//!   the CPU time they used (`utime + stime` of `/proc/PID/stat`), as a share of one core;
//! - the bytes per refresh of the unchanged fleet, counted on the wire by a TCP relay
//!   between the browser and the server (requests and answers, headers included), divided
//!   by the rounds the page made (its requests for the summary); and the `transferSize`
//!   the page's Resource Timing entries give for the same rounds.
//!
//! The fleet is written into a registry file before the server starts (active members with
//! a heartbeat now, the stale rack's an hour and more ago, pending members without one)
//! and `stale-after` is an hour, so nothing changes while the page is measured: every
//! refresh is a refresh of an unchanged fleet. Only Chromium processes started by this
//! run's chromedriver are measured. Needs Debian's `chromium` and `chromium-driver`
//! (`CHROMEDRIVER` and `CHROMIUM` name other binaries).
//!
//! ```text
//! cargo run --release -p ccfleet --features server --example status_page_measure
//! MEASURE_SECONDS=60 cargo run -p ccfleet --features server --example status_page_measure
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ccfleet::server::ServerConfig;
use ccfleet::server::auth::Keypair;
use ccfleet::server::registry::{Registration, Registry, unix_seconds};
use ccfleet::wire::{Scope, ServiceType, parse_instance_id};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CLUSTERS: usize = 40;
const PER_CLUSTER: usize = 500;
const BACKENDS: usize = 5;
/// How long anything the run waits for may take on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(120);

type Failure = Box<dyn std::error::Error>;

fn main() -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run())
}

/// The state each member of the issue's fleet is to be in: per cluster a rack of 25 stale
/// (`c01n[0101-0125]`) and every 19th of the others pending.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wanted {
    Active,
    Stale,
    Pending,
}

fn fleet() -> Vec<(Registration, Wanted)> {
    let mut all = Vec::new();
    for c in 1..=CLUSTERS {
        let cluster = format!("c{c:02}");
        let mut others = 0;
        for n in 1..=PER_CLUSTER {
            let wanted = if (101..=125).contains(&n) {
                Wanted::Stale
            } else {
                others += 1;
                if others % 19 == 7 {
                    Wanted::Pending
                } else {
                    Wanted::Active
                }
            };
            all.push((
                Registration {
                    scope: Scope::of_cluster(&cluster),
                    cluster: cluster.clone(),
                    hostname: format!("{cluster}n{n:04}"),
                    service_type: ServiceType::MetricCollector,
                    meta: Default::default(),
                },
                wanted,
            ));
        }
    }
    for n in 1..=BACKENDS {
        all.push((
            Registration {
                scope: Scope::of_cluster(""),
                cluster: String::new(),
                hostname: format!("backend{n}"),
                service_type: ServiceType::Backend,
                meta: Default::default(),
            },
            Wanted::Active,
        ));
    }
    all
}

/// Writes the fleet into the registry file at `db`.
async fn write_fleet(db: &std::path::Path) -> Result<(), Failure> {
    let registry = Registry::open(Some(db))?;
    let mut registering = tokio::task::JoinSet::new();
    for (registration, wanted) in fleet() {
        let registry = registry.clone();
        registering.spawn(async move { (registry.register(registration).await, wanted) });
    }
    let now = unix_seconds();
    let mut beats = Vec::new();
    while let Some(done) = registering.join_next().await {
        let (registered, wanted) = done?;
        let id = parse_instance_id(&registered?.instance_id).ok_or("a malformed instance id")?;
        match wanted {
            Wanted::Active => beats.push((id, now)),
            // Silent for two hours: stale once the cutoff below passes.
            Wanted::Stale => beats.push((id, now - 7_200 - (id % 600) as i64)),
            Wanted::Pending => {}
        }
    }
    registry.heartbeat_batch(beats).await?;
    registry.mark_stale(now - 3_600).await?;
    registry.flush_last_seen().await?;
    Ok(())
}

/// A TCP relay to `to` that counts the bytes it carries (both ways) and the requests for the
/// summary it sees going to the server.
struct Relay {
    address: std::net::SocketAddr,
    bytes: Arc<AtomicU64>,
    summaries: Arc<AtomicU64>,
}

const SUMMARY_REQUEST: &[u8] = b"GET /fleet/summary.json";

async fn relay(to: std::net::SocketAddr) -> Result<Relay, Failure> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let bytes = Arc::new(AtomicU64::new(0));
    let summaries = Arc::new(AtomicU64::new(0));
    let (b, s) = (bytes.clone(), summaries.clone());
    tokio::spawn(async move {
        while let Ok((browser, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(to).await else {
                continue;
            };
            let (browser_read, browser_write) = browser.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::spawn(pump(browser_read, server_write, b.clone(), Some(s.clone())));
            tokio::spawn(pump(server_read, browser_write, b.clone(), None));
        }
    });
    Ok(Relay {
        address,
        bytes,
        summaries,
    })
}

/// Copies `from` to `to`, counting; counts the summary requests when given `summaries`. A
/// browser sends a request's head in one write, so a request line is never split here.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    bytes: Arc<AtomicU64>,
    summaries: Option<Arc<AtomicU64>>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        bytes.fetch_add(n as u64, Ordering::Relaxed);
        if let Some(summaries) = &summaries {
            let seen = buffer[..n]
                .windows(SUMMARY_REQUEST.len())
                .filter(|w| *w == SUMMARY_REQUEST)
                .count();
            summaries.fetch_add(seen as u64, Ordering::Relaxed);
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// chromedriver, stopped when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn binary(variable: &str, default: &str) -> String {
    std::env::var(variable).unwrap_or_else(|_| default.to_owned())
}

/// Polls `check` until it holds, or fails naming `what`.
async fn eventually<F, Fut>(what: &str, mut check: F) -> Result<(), Failure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + PATIENCE;
    while !check().await {
        if Instant::now() > deadline {
            return Err(format!("gave up waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

async fn start_driver() -> Result<Driver, Failure> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let program = binary("CHROMEDRIVER", "/usr/bin/chromedriver");
    let child = Command::new(&program)
        .arg(format!("--port={port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {program}: {e} (install chromium-driver)"))?;
    let driver = Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let client = reqwest::Client::builder().no_proxy().build()?;
    let status = format!("{}/status", driver.url);
    eventually("chromedriver to answer", || async {
        match client.get(&status).send().await {
            Ok(r) => r
                .json::<Value>()
                .await
                .is_ok_and(|v| v["value"]["ready"] == true),
            Err(_) => false,
        }
    })
    .await?;
    Ok(driver)
}

async fn browser(driver: &Driver, profile: &std::path::Path) -> Result<Client, Failure> {
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".to_owned(),
        json!({
            "binary": binary("CHROMIUM", "/usr/bin/chromium"),
            // As root Chromium needs --no-sandbox; the profile is this run's own.
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1024",
                     format!("--user-data-dir={}", profile.display())],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    Ok(ClientBuilder::new(connector)
        .capabilities(capabilities)
        .connect(&driver.url)
        .await?)
}

async fn page_value(client: &Client, script: &str) -> Value {
    client.execute(script, vec![]).await.unwrap_or(Value::Null)
}

/// The processes descending from `root` (its children, theirs, ...).
fn descendants(root: u32) -> BTreeSet<u32> {
    let mut parent_of = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // The name in parentheses may hold spaces: the fields follow its last ')'.
            let Some(after) = stat.rsplit_once(')').map(|(_, a)| a) else {
                continue;
            };
            if let Some(ppid) = after.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut found = BTreeSet::from([root]);
    loop {
        let before = found.len();
        for &(pid, ppid) in &parent_of {
            if found.contains(&ppid) {
                found.insert(pid);
            }
        }
        if found.len() == before {
            break;
        }
    }
    found.remove(&root);
    found
}

/// Chromium's renderer processes among `root`'s descendants.
fn renderers(root: u32) -> Vec<u32> {
    descendants(root)
        .into_iter()
        .filter(|pid| {
            // Chromium rewrites the command lines of the processes its zygote forks: the
            // arguments may be one string, separated by spaces.
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.split(|b| *b == 0 || *b == b' ')
                    .any(|arg| arg == b"--type=renderer")
            })
        })
        .collect()
}

/// CPU time `pid` used so far (user and system), seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after = stat.rsplit_once(')')?.1.to_owned();
            let fields: Vec<&str> = after.split_whitespace().collect();
            // After the name: state is field 3 of the line, utime 14 and stime 15.
            let utime: f64 = fields.get(11)?.parse().ok()?;
            let stime: f64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) / ticks)
        })
        .unwrap_or(0.0)
}

/// Resident memory of `pid`, bytes.
fn resident_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

/// Proportional set size of `pid` (its own pages, and its share of those it shares),
/// bytes.
fn proportional_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

/// What one renderer process used while the page refreshed.
struct Renderer {
    pid: u32,
    /// CPU seconds.
    cpu: f64,
    /// The largest resident memory sampled, bytes.
    peak_rss: u64,
    /// Proportional set size at the end, bytes.
    pss: u64,
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1_000_000.0
}

async fn run() -> Result<(), Failure> {
    // reqwest is built without a default TLS provider; this run speaks plain HTTP, but a
    // client cannot be built without one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let seconds: u64 = match std::env::var("MEASURE_SECONDS") {
        Ok(v) => v.parse().map_err(|_| format!("MEASURE_SECONDS={v:?}"))?,
        Err(_) => 30,
    };
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("fleet.sqlite");
    let written = Instant::now();
    write_fleet(&db).await?;
    eprintln!(
        "status_page_measure: {} members written in {:.1} s",
        CLUSTERS * PER_CLUSTER + BACKENDS,
        written.elapsed().as_secs_f64()
    );

    let keys = Keypair::generate();
    let config = json!({
        "addr": "127.0.0.1:0",
        "db": db,
        "jwt-public-key": keys.public_key_base64(),
        "fleet": {"stale-after": "1h"}
    });
    let server = ccfleet::server::start(ServerConfig::from_json(&config.to_string())?).await?;
    let server_address: std::net::SocketAddr =
        server.base_url().trim_start_matches("http://").parse()?;
    let relay = relay(server_address).await?;
    let base = format!("http://{}", relay.address);

    // The fleet is as meant before the page sees it.
    let admin = keys.sign_token("operator", &["admin"], Some(Duration::from_secs(3600)));
    let api = reqwest::Client::builder().no_proxy().build()?;
    let summary: Value = api
        .get(format!("{}/api/fleet/summary", server.base_url()))
        .header("X-Auth-Token", &admin)
        .send()
        .await?
        .json()
        .await?;
    let total = &summary["total"];
    if (&total["active"], &total["stale"], &total["pending"])
        != (&json!(18_005), &json!(1_000), &json!(1_000))
    {
        return Err(format!("the fleet is not as meant: {total}").into());
    }

    let driver = start_driver().await?;
    let profile = tempfile::tempdir()?;
    let client = browser(&driver, profile.path()).await?;
    client.goto(&format!("{base}/fleet/")).await?;
    client
        .wait()
        .at_most(PATIENCE)
        .for_element(Locator::Id("token"))
        .await?
        .send_keys(&admin)
        .await?;
    let clicked = Instant::now();
    client.find(Locator::Id("login")).await?.click().await?;
    let drawn_at = loop {
        let drawn = page_value(
            &client,
            "return location.pathname === '/fleet/' && window.ccfleetSummaryDrawnAt !== undefined
                ? window.ccfleetSummaryDrawnAt : null",
        )
        .await;
        if !drawn.is_null() {
            break drawn;
        }
        if clicked.elapsed() > PATIENCE {
            return Err("gave up waiting for the summary drawn after the login".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let seen_after = clicked.elapsed();
    let drawn_ms = drawn_at.as_f64().unwrap_or(f64::NAN);
    let shown = page_value(
        &client,
        "return document.getElementById('summary').textContent",
    )
    .await;
    if !shown
        .as_str()
        .is_some_and(|t| t.starts_with("20005 instance(s)"))
    {
        return Err(format!("the page shows another summary: {shown}").into());
    }
    let groups = page_value(
        &client,
        "return document.querySelectorAll('tr.group').length",
    )
    .await;

    // The page refreshes itself; measure a whole number of seconds of it.
    let root = driver.child.id();
    let pids = renderers(root);
    if pids.is_empty() {
        let found: Vec<String> = descendants(root)
            .iter()
            .map(|p| {
                let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                format!(
                    "{p}: {}",
                    String::from_utf8_lossy(&cmdline).replace('\0', " ")
                )
            })
            .collect();
        return Err(format!(
            "no Chromium renderer process among chromedriver's: {}",
            found.join("; ")
        )
        .into());
    }
    let resources_before = page_value(
        &client,
        "return performance.getEntriesByType('resource').length",
    )
    .await;
    let bytes_before = relay.bytes.load(Ordering::Relaxed);
    let rounds_before = relay.summaries.load(Ordering::Relaxed);
    // Per renderer: CPU seconds at the start, the largest RSS seen.
    let mut watched: BTreeMap<u32, (f64, u64)> =
        pids.iter().map(|&p| (p, (cpu_seconds(p), 0))).collect();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        for pid in renderers(root) {
            let entry = watched.entry(pid).or_insert((cpu_seconds(pid), 0));
            entry.1 = entry.1.max(resident_bytes(pid));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let measured: Vec<Renderer> = watched
        .iter()
        .map(|(&pid, &(cpu_before, peak_rss))| Renderer {
            pid,
            cpu: cpu_seconds(pid) - cpu_before,
            peak_rss,
            pss: proportional_bytes(pid),
        })
        .collect();
    let bytes = relay.bytes.load(Ordering::Relaxed) - bytes_before;
    let rounds = relay.summaries.load(Ordering::Relaxed) - rounds_before;
    // The entries of the rounds measured: those after the ones there were before.
    let timing = client
        .execute(
            "const entries = performance.getEntriesByType('resource').slice(arguments[0]);
             return [entries.filter(e => e.name.includes('/fleet/summary.json')).length,
                     entries.reduce((sum, e) => sum + e.transferSize, 0)];",
            vec![resources_before],
        )
        .await
        .unwrap_or(Value::Null);

    println!("fleet: 20,005 members, {groups} groups in the summary");
    println!(
        "first useful view: summary drawn {drawn_ms:.0} ms after the login form was sent \
         (performance.now() in the page); seen by WebDriver {} ms after the click",
        seen_after.as_millis()
    );
    // The page's renderer is the one that worked while the page refreshed; the others are
    // Chromium's spare and blank-tab renderers.
    let page_renderer = measured
        .iter()
        .max_by(|a, b| a.cpu.total_cmp(&b.cpu))
        .ok_or("no renderer measured")?;
    println!(
        "the page's renderer over {elapsed:.0} s of refreshes: peak RSS {:.1} MB (PSS now \
         {:.1} MB), CPU {:.2} s = {:.2} % of a core",
        mb(page_renderer.peak_rss),
        mb(page_renderer.pss),
        page_renderer.cpu,
        100.0 * page_renderer.cpu / elapsed
    );
    for r in &measured {
        println!(
            "  renderer {}: peak RSS {:.1} MB, PSS {:.1} MB, CPU {:.2} s",
            r.pid,
            mb(r.peak_rss),
            mb(r.pss),
            r.cpu
        );
    }
    if let Some(per_round) = bytes.checked_div(rounds) {
        println!(
            "per refresh of the unchanged fleet: {per_round} bytes on the wire ({bytes} bytes in \
             {rounds} rounds, requests and answers with their headers)"
        );
    }
    if let (Some(n), Some(size)) = (
        timing.get(0).and_then(Value::as_u64),
        timing.get(1).and_then(Value::as_f64),
    ) && n > 0
    {
        println!(
            "Resource Timing: {n} rounds, transferSize {:.0} bytes per round",
            size / n as f64
        );
    }
    client.close().await?;
    drop(driver);
    server.shutdown().await?;
    Ok(())
}
