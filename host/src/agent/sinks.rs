//! The agent's metric sinks, as cc-metric-collector has them: `nats` (publish line protocol
//! to a subject), `http` (cc-metric-store's `POST /api/write?cluster=...`, JWT bearer auth,
//! batching, a bounded retry buffer, optional gzip) and `stdout`.
//!
//! ```json
//! {
//!   "fleet": {"url": "http://backend:8080", "cluster": "fritz"},
//!   "nats": {"address": "nats://nats01:4222"},
//!   "sinks": {
//!     "store": {"type": "http", "url": "http://ms01:8082/api/write", "cluster": "fritz",
//!               "jwt-file": "/etc/cc/ccms.jwt", "batch-size": 1000, "flush-delay": "1s",
//!               "gzip": true},
//!     "bus":   {"type": "nats", "subject": "cc.metric.fritz"}
//!   }
//! }
//! ```
//!
//! Plugins hand batches to one bounded channel without waiting; a fan-out task copies each
//! batch into every sink's own bounded queue, again without waiting: a full queue drops the
//! batch for that sink only and counts it. So a stalled cc-metric-store delays nothing but
//! its own sink, and never a plugin.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ccfleet::duration::serde_go;
use ccfleet::untrusted::Untrusted;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, CONTENT_ENCODING, CONTENT_TYPE, HeaderValue};
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::AgentError;
use super::router::Router;
use crate::sink::{Batch, BatchReceiver};

/// Batches queued for one sink by default before new ones are dropped for it.
pub const DEFAULT_QUEUE_SIZE: usize = 1024;
/// Points per cc-metric-store request by default (cc-metric-collector's default too).
pub const DEFAULT_BATCH_SIZE: usize = 1000;
/// Points the HTTP sink keeps for retrying by default; beyond it the oldest are dropped.
pub const DEFAULT_RETRY_BUFFER: usize = 100_000;

/// A sink's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkType {
    /// Publish to NATS.
    Nats,
    /// Write to standard output.
    Stdout,
    /// POST to cc-metric-store's write API.
    Http,
}

impl SinkType {
    /// The name configurations use.
    pub fn as_str(self) -> &'static str {
        match self {
            SinkType::Nats => "nats",
            SinkType::Stdout => "stdout",
            SinkType::Http => "http",
        }
    }
}

/// One entry of the agent's `sinks` object.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SinkConfig {
    /// `nats`, `stdout` or `http`.
    #[serde(rename = "type")]
    pub kind: SinkType,
    /// Batches queued for this sink before further ones are dropped (and counted).
    #[serde(default = "default_queue_size")]
    pub queue_size: usize,
    /// `nats`: the subject (default `cc.metric`, or `cc.metric.<cluster>` with a cluster).
    #[serde(default)]
    pub subject: Option<String>,
    /// `http`: the write endpoint, e.g. `http://ms01:8082/api/write`.
    #[serde(default)]
    pub url: Option<String>,
    /// `http`: the `cluster` query parameter (default: the fleet section's cluster).
    #[serde(default)]
    pub cluster: Option<String>,
    /// `http`: a file holding the JWT sent as `Authorization: Bearer`.
    #[serde(default)]
    pub jwt_file: Option<PathBuf>,
    /// `http`: an environment variable holding the JWT.
    #[serde(default)]
    pub jwt_env: Option<String>,
    /// `http`: points per request; a request is sent once this many are pending.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// `http`: the longest a point waits for its batch to fill.
    #[serde(default = "default_flush_delay", with = "serde_go")]
    pub flush_delay: Duration,
    /// `http`: the bound of one request.
    #[serde(default = "default_timeout", with = "serde_go")]
    pub timeout: Duration,
    /// `http`: points kept for retrying; when full, the oldest batch is dropped.
    #[serde(default = "default_retry_buffer")]
    pub retry_buffer: usize,
    /// `http`: the first retry's delay; it doubles with each failure in a row.
    #[serde(default = "default_retry_backoff", with = "serde_go")]
    pub retry_backoff: Duration,
    /// `http`: the longest delay between retries.
    #[serde(default = "default_max_retry_backoff", with = "serde_go")]
    pub max_retry_backoff: Duration,
    /// `http`: compress request bodies (`Content-Encoding: gzip`).
    #[serde(default)]
    pub gzip: bool,
}

fn default_queue_size() -> usize {
    DEFAULT_QUEUE_SIZE
}
fn default_batch_size() -> usize {
    DEFAULT_BATCH_SIZE
}
fn default_flush_delay() -> Duration {
    Duration::from_secs(1)
}
fn default_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_retry_buffer() -> usize {
    DEFAULT_RETRY_BUFFER
}
fn default_retry_backoff() -> Duration {
    Duration::from_millis(500)
}
fn default_max_retry_backoff() -> Duration {
    Duration::from_secs(30)
}

impl SinkConfig {
    /// A sink of `kind` with every default.
    pub fn new(kind: SinkType) -> SinkConfig {
        SinkConfig {
            kind,
            queue_size: DEFAULT_QUEUE_SIZE,
            subject: None,
            url: None,
            cluster: None,
            jwt_file: None,
            jwt_env: None,
            batch_size: DEFAULT_BATCH_SIZE,
            flush_delay: default_flush_delay(),
            timeout: default_timeout(),
            retry_buffer: DEFAULT_RETRY_BUFFER,
            retry_backoff: default_retry_backoff(),
            max_retry_backoff: default_max_retry_backoff(),
            gzip: false,
        }
    }

    /// Checks the entry named `name` for keys of another kind and impossible values.
    pub fn validate(&self, name: &str) -> Result<(), String> {
        let fail = |why: &str| Err(format!("sinks.{name}: {why}"));
        if self.queue_size == 0 {
            return fail("queue-size must be positive");
        }
        let http_only = self.url.is_some()
            || self.cluster.is_some()
            || self.jwt_file.is_some()
            || self.jwt_env.is_some()
            || self.gzip;
        match self.kind {
            SinkType::Http => {
                let Some(url) = &self.url else {
                    return fail("type http needs a url (e.g. http://ms01:8082/api/write)");
                };
                match reqwest::Url::parse(url) {
                    Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                    Ok(_) => return fail("url must be http:// or https://"),
                    Err(e) => return fail(&format!("url is not a URL: {e}")),
                }
                if self.jwt_file.is_some() && self.jwt_env.is_some() {
                    return fail("give jwt-file or jwt-env, not both");
                }
                if self.batch_size == 0 || self.retry_buffer == 0 {
                    return fail("batch-size and retry-buffer must be positive");
                }
                if self.retry_buffer < self.batch_size {
                    return fail("retry-buffer must hold at least one batch (batch-size points)");
                }
                if self.flush_delay.is_zero()
                    || self.timeout.is_zero()
                    || self.retry_backoff.is_zero()
                {
                    return fail("flush-delay, timeout and retry-backoff must be positive");
                }
                if self.subject.is_some() {
                    return fail("subject is a key of type nats");
                }
            }
            SinkType::Nats | SinkType::Stdout => {
                if http_only {
                    return fail("url, cluster, jwt-file, jwt-env and gzip are keys of type http");
                }
                if self.kind == SinkType::Stdout && self.subject.is_some() {
                    return fail("subject is a key of type nats");
                }
            }
        }
        Ok(())
    }

    /// Resolves a relative `jwt-file` against `base`.
    pub fn resolve_paths(&mut self, base: &Path) {
        if let Some(file) = &mut self.jwt_file
            && file.is_relative()
        {
            *file = base.join(&*file);
        }
    }
}

/// Counters of one sink, shown on the agent's `/metrics`.
#[derive(Debug, Default)]
pub struct SinkCounters {
    /// Writes (publishes, requests, stdout writes) that succeeded.
    pub batches: AtomicU64,
    /// Points written.
    pub sent: AtomicU64,
    /// Writes that failed (each failed attempt, retried or not).
    pub errors: AtomicU64,
    /// Failed requests that are retried later.
    pub retried: AtomicU64,
    /// Points dropped because the sink's queue was full (the sink fell behind).
    pub dropped_queue_full: AtomicU64,
    /// Points dropped from a full retry buffer (oldest first).
    pub dropped_retry_buffer: AtomicU64,
    /// Points the receiver refused (a 4xx other than 429): not retried.
    pub dropped_rejected: AtomicU64,
    /// Points whose write failed with no retry left (NATS or stdout errors, shutdown).
    pub dropped_failed: AtomicU64,
    /// Why the latest write failed; `None` once a write succeeds (and before the first).
    failing: std::sync::Mutex<Option<String>>,
}

impl SinkCounters {
    fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Records a write that went through: the sink delivers.
    fn delivered(&self) {
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        if failing.is_some() {
            *failing = None;
        }
    }

    /// Records a write that failed for `why`: the sink does not deliver until one succeeds.
    fn failed(&self, why: impl Into<String>) {
        *self.failing.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.into());
    }

    /// Why the sink's latest write failed; `None` while it delivers (or has not written).
    pub fn delivery_failure(&self) -> Option<String> {
        self.failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Every dropped point, whatever the reason.
    pub fn dropped(&self) -> u64 {
        [
            &self.dropped_queue_full,
            &self.dropped_retry_buffer,
            &self.dropped_rejected,
            &self.dropped_failed,
        ]
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .sum()
    }
}

/// One configured sink as `/metrics` names it.
#[derive(Debug, Clone)]
pub struct SinkInfo {
    /// The key in `sinks` (or `nats`/`stdout` for the legacy `metrics` section).
    pub name: String,
    /// Its kind.
    pub kind: SinkType,
    /// Its counters.
    pub counters: Arc<SinkCounters>,
}

/// A JWT: shown nowhere (`Debug` prints a placeholder).
#[derive(Clone)]
struct Jwt(HeaderValue);

impl std::fmt::Debug for Jwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<jwt>")
    }
}

/// Reads the JWT of an HTTP sink: errors name the file or variable, never the value.
fn read_jwt(name: &str, config: &SinkConfig) -> Result<Option<Jwt>, AgentError> {
    let raw = if let Some(file) = &config.jwt_file {
        std::fs::read_to_string(file).map_err(|e| {
            AgentError::Config(format!(
                "sinks.{name}: cannot read jwt-file {}: {}",
                file.display(),
                e.kind()
            ))
        })?
    } else if let Some(var) = &config.jwt_env {
        std::env::var(var).map_err(|_| {
            AgentError::Config(format!(
                "sinks.{name}: environment variable {var} (jwt-env) is not set or not UTF-8"
            ))
        })?
    } else {
        return Ok(None);
    };
    let token = raw.trim();
    if token.is_empty() {
        return Err(AgentError::Config(format!(
            "sinks.{name}: the JWT is empty"
        )));
    }
    let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
        AgentError::Config(format!(
            "sinks.{name}: the JWT holds characters a header cannot carry"
        ))
    })?;
    value.set_sensitive(true);
    Ok(Some(Jwt(value)))
}

/// What the HTTP sink posts to, resolved from its configuration.
fn write_url(config: &SinkConfig, fleet_cluster: &str) -> reqwest::Url {
    let mut url = reqwest::Url::parse(config.url.as_deref().unwrap_or_default())
        .expect("validated when the configuration was read");
    let cluster = config.cluster.as_deref().unwrap_or(fleet_cluster);
    if !cluster.is_empty() && !url.query_pairs().any(|(k, _)| k == "cluster") {
        url.query_pairs_mut().append_pair("cluster", cluster);
    }
    url
}

/// A sink's receiving end and its task.
struct Queue {
    tx: mpsc::Sender<Batch>,
    counters: Arc<SinkCounters>,
}

/// The running sinks: the fan-out task (which ends when every plugin's sink handle is gone,
/// after the sinks have written what they hold).
pub(crate) struct Sinks {
    pub info: Vec<SinkInfo>,
    pub task: JoinHandle<()>,
}

/// Starts every sink of `configs` and the fan-out from `batches`; `legacy` when they come
/// from the `metrics` section (its log line names the choice).
pub(crate) fn start(
    batches: BatchReceiver,
    configs: &BTreeMap<String, SinkConfig>,
    nats: Option<&async_nats::Client>,
    fleet_cluster: &str,
    legacy: bool,
    alive: super::health::LoopToken,
    router: Option<Router>,
) -> Result<Sinks, AgentError> {
    let mut info = Vec::new();
    let mut queues = Vec::new();
    let mut tasks = Vec::new();
    for (name, config) in configs {
        config.validate(name).map_err(AgentError::Config)?;
        let counters = Arc::new(SinkCounters::default());
        let (tx, rx) = mpsc::channel(config.queue_size);
        let task = match config.kind {
            SinkType::Stdout => {
                if legacy {
                    tracing::info!(
                        "metrics go to standard output (no nats section, or metrics.type is stdout)"
                    );
                } else {
                    tracing::info!(sink = %name, "metrics go to standard output");
                }
                tokio::spawn(run_stdout(rx, counters.clone()))
            }
            SinkType::Nats => {
                let Some(client) = nats else {
                    return Err(AgentError::Config(format!(
                        "sinks.{name}: type nats needs a nats section"
                    )));
                };
                let subject = config.subject.clone().unwrap_or_else(|| {
                    if fleet_cluster.is_empty() {
                        "cc.metric".to_owned()
                    } else {
                        format!("cc.metric.{fleet_cluster}")
                    }
                });
                tracing::info!(sink = %name, %subject, "metrics go to NATS");
                tokio::spawn(run_nats(rx, client.clone(), subject, counters.clone()))
            }
            SinkType::Http => {
                let jwt_stamp = config.jwt_file.as_deref().and_then(FileStamp::of);
                let jwt = read_jwt(name, config)?;
                let url = write_url(config, fleet_cluster);
                if jwt.is_none() {
                    tracing::warn!(sink = %name, "no jwt-file or jwt-env: cc-metric-store answers 401 unless its authentication is off");
                }
                // Trust anchors read at the first TLS handshake, not here.
                let client = ccfleet::tls::http_client_builder()
                    .timeout(config.timeout)
                    .build()
                    .map_err(|e| AgentError::Config(format!("sinks.{name}: HTTP client: {e}")))?;
                tracing::info!(sink = %name, host = url.host_str().unwrap_or(""), "metrics go to cc-metric-store");
                let sink = HttpSink {
                    name: name.clone(),
                    client,
                    url,
                    jwt,
                    jwt_stamp,
                    jwt_unreadable: false,
                    config: config.clone(),
                    counters: counters.clone(),
                };
                tokio::spawn(sink.run(rx))
            }
        };
        info.push(SinkInfo {
            name: name.clone(),
            kind: config.kind,
            counters: counters.clone(),
        });
        queues.push(Queue { tx, counters });
        tasks.push(task);
    }
    let task = tokio::spawn(async move {
        let _alive = alive;
        match router {
            Some(router) => fan_out_routed(batches, queues, router).await,
            None => fan_out(batches, queues).await,
        }
        for task in tasks {
            let _ = task.await;
        }
    });
    Ok(Sinks { info, task })
}

/// Copies every batch into every sink's queue without waiting.
async fn fan_out(mut batches: BatchReceiver, queues: Vec<Queue>) {
    while let Some(batch) = batches.recv().await {
        deliver(&queues, batch);
    }
}

fn unix_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// [`fan_out`] with the router applied to each batch first; a timer ends the aggregates'
/// intervals when no batch does.
async fn fan_out_routed(mut batches: BatchReceiver, queues: Vec<Queue>, mut router: Router) {
    let period = Duration::from_nanos(router.interval_ns().clamp(1_000_000, 1_000_000_000) as u64);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let plugin: Arc<str> = Arc::from("router");
    loop {
        let (routed, from) = tokio::select! {
            batch = batches.recv() => {
                let Some(batch) = batch else { return };
                (router.route(&batch.lines, unix_nanos()), batch.plugin)
            }
            _ = tick.tick() => (router.flush(unix_nanos()), plugin.clone()),
        };
        if routed.points > 0 {
            deliver(
                &queues,
                Batch {
                    plugin: from,
                    lines: bytes::Bytes::from(routed.lines),
                    points: routed.points,
                },
            );
        }
    }
}

fn deliver(queues: &[Queue], batch: Batch) {
    for queue in queues {
        let points = batch.points;
        match queue.tx.try_send(batch.clone()) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                SinkCounters::add(&queue.counters.dropped_queue_full, points)
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                SinkCounters::add(&queue.counters.dropped_failed, points)
            }
        }
    }
}

async fn run_stdout(mut rx: mpsc::Receiver<Batch>, counters: Arc<SinkCounters>) {
    // The plugins of one collect round emit one after the other: what has arrived by the
    // time this task runs goes out in one write rather than one per plugin.
    let mut batches = Vec::new();
    let mut text = Vec::new();
    while rx.recv_many(&mut batches, STDOUT_BATCHES_PER_WRITE).await > 0 {
        text.clear();
        let mut points = 0;
        for batch in &batches {
            text.extend_from_slice(&batch.lines);
            points += batch.points;
        }
        let mut out = std::io::stdout().lock();
        match out.write_all(&text).and_then(|()| out.flush()) {
            Ok(()) => {
                SinkCounters::add(&counters.batches, batches.len());
                SinkCounters::add(&counters.sent, points);
                counters.delivered();
            }
            Err(error) => {
                tracing::warn!(%error, "cannot write metrics to stdout");
                counters.failed(format!("cannot write to standard output: {error}"));
                SinkCounters::add(&counters.errors, 1);
                SinkCounters::add(&counters.dropped_failed, points);
            }
        }
        batches.clear();
    }
}

/// The most batches the stdout sink writes at once.
const STDOUT_BATCHES_PER_WRITE: usize = 64;

async fn run_nats(
    mut rx: mpsc::Receiver<Batch>,
    client: async_nats::Client,
    subject: String,
    counters: Arc<SinkCounters>,
) {
    while let Some(batch) = rx.recv().await {
        match client.publish(subject.clone(), batch.lines.clone()).await {
            Ok(()) => {
                SinkCounters::add(&counters.batches, 1);
                SinkCounters::add(&counters.sent, batch.points);
                counters.delivered();
            }
            Err(error) => {
                // NATS errors may quote the server URL with its credentials.
                let error = ccfleet::nats::scrub(&error, &[]);
                tracing::warn!(plugin = %batch.plugin, %error, "cannot publish metrics to NATS");
                counters.failed(format!("cannot publish to NATS: {error}"));
                SinkCounters::add(&counters.errors, 1);
                SinkCounters::add(&counters.dropped_failed, batch.points);
            }
        }
    }
    if let Err(error) = client.flush().await {
        let error = ccfleet::nats::scrub(&error, &[]);
        tracing::warn!(%error, "cannot flush metrics to NATS");
    }
}

/// One request body ready to send (compressed already when gzip is on).
struct Chunk {
    body: bytes::Bytes,
    points: usize,
}

/// How one request ended.
enum Outcome {
    Sent,
    /// Refused for good (a 4xx other than 429).
    Rejected(StatusCode),
    /// Worth another try (429, 5xx, a connection error or a timeout).
    Retry(String),
}

struct HttpSink {
    name: String,
    client: reqwest::Client,
    url: reqwest::Url,
    jwt: Option<Jwt>,
    /// What `jwt-file` looked like when `jwt` was read from it, to notice a rotated token.
    jwt_stamp: Option<FileStamp>,
    /// Whether the latest attempt to re-read `jwt-file` failed (logged once per spell).
    jwt_unreadable: bool,
    config: SinkConfig,
    counters: Arc<SinkCounters>,
}

/// The identity of a file's contents as far as `stat` tells: a token rotated by rewriting
/// the file or by renaming a new one over it changes at least one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    inode: u64,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl FileStamp {
    fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(FileStamp {
            inode: meta.ino(),
            len: meta.len(),
            modified: meta.modified().ok(),
        })
    }
}

impl HttpSink {
    /// Batches what arrives into chunks of `batch-size` points (or what `flush-delay`
    /// gathered), keeps them in the bounded retry buffer until cc-metric-store takes them,
    /// and backs off exponentially while it fails.
    async fn run(mut self, mut rx: mpsc::Receiver<Batch>) {
        let mut pending: Vec<u8> = Vec::new();
        let mut pending_points = 0usize;
        let mut pending_since: Option<Instant> = None;
        let mut outbox: VecDeque<Chunk> = VecDeque::new();
        let mut outbox_points = 0usize;
        let mut retry_at: Option<Instant> = None;
        let mut backoff = self.config.retry_backoff;
        let mut closed = false;
        loop {
            let now = Instant::now();
            let due = pending_since.is_some_and(|t| now >= t + self.config.flush_delay);
            if pending_points > 0 && (pending_points >= self.config.batch_size || due || closed) {
                let chunk = self.chunk(std::mem::take(&mut pending), pending_points);
                pending_points = 0;
                pending_since = None;
                // Drop-oldest: the newest points are the ones worth having.
                while outbox_points + chunk.points > self.config.retry_buffer {
                    let Some(old) = outbox.pop_front() else { break };
                    outbox_points -= old.points;
                    SinkCounters::add(&self.counters.dropped_retry_buffer, old.points);
                }
                outbox_points += chunk.points;
                outbox.push_back(chunk);
            }
            if let Some(front) = outbox.front()
                && (closed || retry_at.is_none_or(|t| now >= t))
            {
                let points = front.points;
                let body = front.body.clone();
                self.refresh_jwt();
                match self.post(body).await {
                    Outcome::Sent => {
                        SinkCounters::add(&self.counters.batches, 1);
                        SinkCounters::add(&self.counters.sent, points);
                        self.counters.delivered();
                        backoff = self.config.retry_backoff;
                        retry_at = None;
                        outbox.pop_front();
                        outbox_points -= points;
                    }
                    Outcome::Rejected(status) => {
                        SinkCounters::add(&self.counters.errors, 1);
                        self.counters.failed(format!(
                            "{} refused a batch: status {status}",
                            self.shown_url()
                        ));
                        SinkCounters::add(&self.counters.dropped_rejected, points);
                        tracing::warn!(sink = %self.name, %status, points, "cc-metric-store refused a batch; dropped (not retried)");
                        outbox.pop_front();
                        outbox_points -= points;
                    }
                    Outcome::Retry(why) => {
                        SinkCounters::add(&self.counters.errors, 1);
                        self.counters
                            .failed(format!("cannot write to {}: {why}", self.shown_url()));
                        if closed {
                            // Shutting down: no time for another round.
                            SinkCounters::add(&self.counters.dropped_failed, outbox_points);
                            tracing::warn!(sink = %self.name, points = outbox_points, "cannot write to cc-metric-store while shutting down ({why}); dropped");
                            return;
                        }
                        SinkCounters::add(&self.counters.retried, 1);
                        if backoff == self.config.retry_backoff {
                            tracing::warn!(sink = %self.name, "cannot write to cc-metric-store ({why}); retrying with backoff");
                        }
                        retry_at = Some(Instant::now() + backoff);
                        backoff = (backoff * 2).min(self.config.max_retry_backoff);
                    }
                }
                continue;
            }
            if closed && outbox.is_empty() && pending_points == 0 {
                return;
            }
            let flush_at = pending_since.map(|t| t + self.config.flush_delay);
            let wake = match (flush_at, retry_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            tokio::select! {
                batch = rx.recv(), if !closed => match batch {
                    Some(batch) => {
                        pending.extend_from_slice(&batch.lines);
                        pending_points += batch.points;
                        pending_since.get_or_insert_with(Instant::now);
                    }
                    None => closed = true,
                },
                () = sleep_until(wake) => {}
            }
        }
    }

    /// The write URL as health reports show it: scheme, host, port and path only (no user
    /// information, no query).
    fn shown_url(&self) -> String {
        let mut url = self.url.clone();
        let _ = url.set_username("");
        let _ = url.set_password(None);
        url.set_query(None);
        url.set_fragment(None);
        url.to_string()
    }

    fn chunk(&self, lines: Vec<u8>, points: usize) -> Chunk {
        let body = if self.config.gzip {
            gzip(&lines)
        } else {
            lines
        };
        Chunk {
            body: body.into(),
            points,
        }
    }

    /// Takes a rotated token from `jwt-file`: JWTs expire, and an operator who replaces the
    /// file must not have to restart the agent. One `stat` per request; the file is read
    /// again only when it changed. An unreadable or invalid file keeps the previous token.
    fn refresh_jwt(&mut self) {
        let Some(file) = &self.config.jwt_file else {
            return;
        };
        let stamp = FileStamp::of(file);
        if stamp.is_some() && stamp == self.jwt_stamp {
            return;
        }
        match read_jwt(&self.name, &self.config) {
            Ok(jwt) => {
                if self.jwt_unreadable || self.jwt_stamp.is_some() {
                    tracing::info!(sink = %self.name, "read the JWT again from jwt-file (it changed)");
                }
                self.jwt = jwt;
                self.jwt_stamp = stamp;
                self.jwt_unreadable = false;
            }
            Err(error) => {
                if !self.jwt_unreadable {
                    tracing::warn!(sink = %self.name, %error, "keeping the previous JWT");
                    self.jwt_unreadable = true;
                }
            }
        }
    }

    async fn post(&self, body: bytes::Bytes) -> Outcome {
        let mut request = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(body);
        if let Some(jwt) = &self.jwt {
            request = request.header(AUTHORIZATION, jwt.0.clone());
        }
        if self.config.gzip {
            request = request.header(CONTENT_ENCODING, "gzip");
        }
        match request.send().await {
            Ok(response) => {
                let status = response.status();
                // A token from a file may be replaced while the batch waits: 401 and 403 keep
                // it (within the bounded buffer) when the token can change without a restart.
                let token_may_change = self.config.jwt_file.is_some()
                    && matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
                if status.is_success() {
                    Outcome::Sent
                } else if token_may_change {
                    Outcome::Retry(format!(
                        "status {status}: cc-metric-store refused the JWT; replace jwt-file and it is read again"
                    ))
                } else if status == StatusCode::TOO_MANY_REQUESTS || !status.is_client_error() {
                    Outcome::Retry(format!("status {status}"))
                } else {
                    Outcome::Rejected(status)
                }
            }
            // reqwest's error names the URL, which may carry credentials: only its kind.
            Err(e) if e.is_timeout() => Outcome::Retry("request timed out".to_owned()),
            Err(e) if e.is_connect() => Outcome::Retry("cannot connect".to_owned()),
            Err(e) => Outcome::Retry(format!(
                "request failed: {}",
                Untrusted(&e.without_url().to_string()).capped(200)
            )),
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// RFC 1952 gzip of `data` (one member, no name, no extra fields).
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let deflated = miniz_oxide::deflate::compress_to_vec(data, 6);
    let mut out = Vec::with_capacity(deflated.len() + 18);
    // Magic, CM=deflate, no flags, no mtime, XFL=0, OS=unknown.
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255]);
    out.extend_from_slice(&deflated);
    out.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

/// The `sinks` the agent runs: the configured ones, else the one the legacy `metrics`
/// section names (`nats` with a NATS section, else `stdout`).
pub(crate) fn effective(
    sinks: &BTreeMap<String, SinkConfig>,
    metrics: &super::MetricsConfig,
    has_nats: bool,
) -> Result<BTreeMap<String, SinkConfig>, AgentError> {
    if !sinks.is_empty() {
        if metrics.kind.is_some() || metrics.subject.is_some() {
            return Err(AgentError::Config(
                "give sinks or metrics, not both (sinks replaces metrics)".to_owned(),
            ));
        }
        return Ok(sinks.clone());
    }
    let kind = match (metrics.kind, has_nats) {
        (Some(super::SinkKind::Stdout), _) | (None, false) => SinkType::Stdout,
        (_, true) => SinkType::Nats,
        (Some(super::SinkKind::Nats), false) => {
            return Err(AgentError::Config(
                "metrics.type is nats but there is no nats section".to_owned(),
            ));
        }
    };
    let mut config = SinkConfig::new(kind);
    config.subject = metrics.subject.clone().filter(|_| kind == SinkType::Nats);
    Ok(BTreeMap::from([(kind.as_str().to_owned(), config)]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_output_inflates_back_to_the_input() {
        let data = b"cpu_load,cluster=fritz,hostname=n1,type=node value=1 1\n".repeat(50);
        let packed = gzip(&data);
        assert_eq!(&packed[..3], &[0x1f, 0x8b, 8]);
        let body = &packed[10..packed.len() - 8];
        let inflated = miniz_oxide::inflate::decompress_to_vec(body).unwrap();
        assert_eq!(inflated, data);
        let crc = u32::from_le_bytes(
            packed[packed.len() - 8..packed.len() - 4]
                .try_into()
                .unwrap(),
        );
        assert_eq!(crc, crc32fast::hash(&data));
    }

    #[test]
    fn http_keys_on_a_nats_sink_and_an_http_sink_without_url_are_refused() {
        let nats: SinkConfig =
            serde_json::from_str(r#"{"type":"nats","url":"http://x/api/write"}"#).unwrap();
        assert!(
            nats.validate("bus")
                .unwrap_err()
                .contains("keys of type http")
        );
        let http: SinkConfig = serde_json::from_str(r#"{"type":"http"}"#).unwrap();
        assert!(http.validate("store").unwrap_err().contains("needs a url"));
        let small: SinkConfig = serde_json::from_str(
            r#"{"type":"http","url":"http://x/api/write","batch-size":10,"retry-buffer":5}"#,
        )
        .unwrap();
        assert!(
            small
                .validate("store")
                .unwrap_err()
                .contains("retry-buffer")
        );
    }

    #[test]
    fn the_cluster_query_defaults_to_the_fleet_cluster_and_is_not_doubled() {
        let mut config = SinkConfig::new(SinkType::Http);
        config.url = Some("http://ms:8082/api/write".to_owned());
        assert_eq!(
            write_url(&config, "fritz").as_str(),
            "http://ms:8082/api/write?cluster=fritz"
        );
        config.cluster = Some("alex".to_owned());
        assert_eq!(
            write_url(&config, "fritz").as_str(),
            "http://ms:8082/api/write?cluster=alex"
        );
        config.url = Some("http://ms:8082/api/write?cluster=woody".to_owned());
        assert_eq!(
            write_url(&config, "fritz").as_str(),
            "http://ms:8082/api/write?cluster=woody"
        );
    }

    #[test]
    fn a_jwt_never_shows_in_debug_output_or_errors() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("jwt");
        std::fs::write(&file, "eyJ.s3cr3t.sig\n").unwrap();
        let mut config = SinkConfig::new(SinkType::Http);
        config.url = Some("http://ms/api/write".to_owned());
        config.jwt_file = Some(file.clone());
        let jwt = read_jwt("store", &config).unwrap().unwrap();
        assert!(!format!("{jwt:?}").contains("s3cr3t"));
        assert_eq!(jwt.0.to_str().unwrap(), "Bearer eyJ.s3cr3t.sig");
        std::fs::write(&file, "bad\ntoken").unwrap();
        let err = read_jwt("store", &config).unwrap_err().to_string();
        assert!(!err.contains("bad") && err.contains("header"), "{err}");
    }
}
