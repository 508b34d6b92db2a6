//! The batching writer behind the HTTP-based sinks (`http`, `influxdb`, `influxasync`):
//! points are gathered into requests of `batch-size` points (or what `flush-delay`
//! gathered), held in a bounded retry buffer until the receiver takes them, and retried with
//! exponential back-off while it fails.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ccfleet::untrusted::Untrusted;
use reqwest::StatusCode;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::counters::SinkCounters;
use crate::sink::Batch;

/// How a sink batches and retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Batching {
    /// Points per request.
    pub batch_size: usize,
    /// The longest a point waits for its batch to fill.
    pub flush_delay: Duration,
    /// Points held for retrying; beyond it the oldest batches are dropped.
    pub retry_buffer: usize,
    /// The first retry's delay.
    pub retry_backoff: Duration,
    /// The longest delay between retries.
    pub max_retry_backoff: Duration,
    /// What the delay is multiplied with after each failure in a row.
    pub backoff_base: u32,
    /// Failed attempts after which a batch is dropped; `None`: as long as the buffer holds it.
    pub max_retries: Option<u32>,
    /// How long a batch is retried before it is dropped; `None`: as long as the buffer holds it.
    pub max_retry_time: Option<Duration>,
    /// Compress request bodies.
    pub gzip: bool,
}

impl Batching {
    /// Checks the values; `fail` gets the reason.
    pub fn validate(&self) -> Result<(), String> {
        if self.batch_size == 0 || self.retry_buffer == 0 {
            return Err("the batch size and the retry buffer must be positive".to_owned());
        }
        if self.retry_buffer < self.batch_size {
            return Err(
                "the retry buffer must hold at least one batch (batch size points)".to_owned(),
            );
        }
        if self.flush_delay.is_zero() || self.retry_backoff.is_zero() {
            return Err("the flush delay and the retry interval must be positive".to_owned());
        }
        if self.backoff_base == 0 {
            return Err("the retry back-off base must be positive".to_owned());
        }
        Ok(())
    }
}

/// How one request ended.
pub(crate) enum Outcome {
    /// Taken.
    Sent,
    /// Refused for good (a 4xx other than 429).
    Rejected(StatusCode),
    /// Worth another try (429, 5xx, a connection error or a timeout).
    Retry(String),
}

/// One receiver the batching writer posts to.
pub(crate) trait Writer: Send + 'static {
    /// What logs call the receiver (`cc-metric-store`, `InfluxDB`).
    fn receiver(&self) -> &'static str;
    /// Where it writes, as health reports show it (no credentials, no query).
    fn shown_url(&self) -> String;
    /// Called before each request (the HTTP sink reads a rotated token here).
    fn prepare(&mut self) {}
    /// Turns the plugins' lines into a request body's lines (before compression), and says
    /// how many points it left out because the receiver cannot take them.
    fn encode(&self, lines: Vec<u8>) -> (Vec<u8>, usize) {
        (lines, 0)
    }
    /// Posts one body.
    fn post(&self, body: bytes::Bytes) -> impl Future<Output = Outcome> + Send;
}

/// One request body ready to send (compressed already when gzip is on).
struct Chunk {
    body: bytes::Bytes,
    points: usize,
    /// Failed attempts so far.
    attempts: u32,
    /// When its first attempt failed.
    failing_since: Option<Instant>,
}

/// Runs `writer` until the queue closes and everything it held is written (or dropped).
pub(crate) async fn run<W: Writer>(
    mut writer: W,
    name: String,
    batching: Batching,
    counters: Arc<SinkCounters>,
    mut rx: mpsc::Receiver<Batch>,
) {
    let receiver = writer.receiver();
    let mut pending: Vec<u8> = Vec::new();
    let mut pending_points = 0usize;
    let mut pending_since: Option<Instant> = None;
    let mut outbox: VecDeque<Chunk> = VecDeque::new();
    let mut outbox_points = 0usize;
    let mut retry_at: Option<Instant> = None;
    let mut backoff = batching.retry_backoff;
    let mut closed = false;
    loop {
        let now = Instant::now();
        let due = pending_since.is_some_and(|t| now >= t + batching.flush_delay);
        if pending_points > 0 && (pending_points >= batching.batch_size || due || closed) {
            let (lines, left_out) = writer.encode(std::mem::take(&mut pending));
            // Points the receiver would refuse count as refused, without costing the rest.
            SinkCounters::add(&counters.dropped_rejected, left_out);
            let points = pending_points.saturating_sub(left_out);
            pending_points = 0;
            pending_since = None;
            if points == 0 {
                continue;
            }
            let body = if batching.gzip { gzip(&lines) } else { lines };
            let chunk = Chunk {
                body: body.into(),
                points,
                attempts: 0,
                failing_since: None,
            };
            // Drop-oldest: the newest points are the ones worth having.
            while outbox_points + chunk.points > batching.retry_buffer {
                let Some(old) = outbox.pop_front() else { break };
                outbox_points -= old.points;
                SinkCounters::add(&counters.dropped_retry_buffer, old.points);
            }
            outbox_points += chunk.points;
            outbox.push_back(chunk);
        }
        if let Some(front) = outbox.front()
            && (closed || retry_at.is_none_or(|t| now >= t))
        {
            let points = front.points;
            let body = front.body.clone();
            writer.prepare();
            match writer.post(body).await {
                Outcome::Sent => {
                    SinkCounters::add(&counters.batches, 1);
                    SinkCounters::add(&counters.sent, points);
                    counters.delivered();
                    backoff = batching.retry_backoff;
                    retry_at = None;
                    outbox.pop_front();
                    outbox_points -= points;
                }
                Outcome::Rejected(status) => {
                    SinkCounters::add(&counters.errors, 1);
                    counters.failed(format!(
                        "{} refused a batch: status {status}",
                        writer.shown_url()
                    ));
                    SinkCounters::add(&counters.dropped_rejected, points);
                    tracing::warn!(sink = %name, %status, points, "{receiver} refused a batch; dropped (not retried)");
                    outbox.pop_front();
                    outbox_points -= points;
                }
                Outcome::Retry(why) => {
                    SinkCounters::add(&counters.errors, 1);
                    counters.failed(format!("cannot write to {}: {why}", writer.shown_url()));
                    if closed {
                        // Shutting down: no time for another round.
                        SinkCounters::add(&counters.dropped_failed, outbox_points);
                        tracing::warn!(sink = %name, points = outbox_points, "cannot write to {receiver} while shutting down ({why}); dropped");
                        return;
                    }
                    let front = outbox.front_mut().expect("the front was just posted");
                    front.attempts += 1;
                    let since = *front.failing_since.get_or_insert(Instant::now());
                    let out_of_tries = batching.max_retries.is_some_and(|n| front.attempts > n)
                        || batching
                            .max_retry_time
                            .is_some_and(|t| Instant::now() >= since + t);
                    if out_of_tries {
                        SinkCounters::add(&counters.dropped_failed, points);
                        tracing::warn!(sink = %name, points, "cannot write to {receiver} ({why}); no retry left for the batch (max_retries, max_retry_time): dropped");
                        outbox.pop_front();
                        outbox_points -= points;
                    } else {
                        SinkCounters::add(&counters.retried, 1);
                    }
                    if backoff == batching.retry_backoff {
                        tracing::warn!(sink = %name, "cannot write to {receiver} ({why}); retrying with backoff");
                    }
                    retry_at = Some(Instant::now() + backoff);
                    backoff = backoff
                        .saturating_mul(batching.backoff_base)
                        .min(batching.max_retry_backoff);
                }
            }
            continue;
        }
        if closed && outbox.is_empty() && pending_points == 0 {
            return;
        }
        let flush_at = pending_since.map(|t| t + batching.flush_delay);
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

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Sends `request` and sorts the answer: 2xx is sent; 429, 5xx, timeouts and connection
/// errors are retried; `retry_status` may keep other statuses for another try (a token that
/// can change); any other 4xx is refused for good.
pub(crate) async fn send(
    request: reqwest::RequestBuilder,
    retry_status: impl Fn(StatusCode) -> Option<String>,
) -> Outcome {
    match request.send().await {
        Ok(response) => {
            let status = response.status();
            if status.is_success() {
                Outcome::Sent
            } else if let Some(why) = retry_status(status) {
                Outcome::Retry(why)
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

/// `url` as health reports show it: scheme, host, port and path only (no user information,
/// no query).
pub(crate) fn shown_url(url: &reqwest::Url) -> String {
    let mut url = url.clone();
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    url.set_fragment(None);
    url.to_string()
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
}
