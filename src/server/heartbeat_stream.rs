//! The opt-in JetStream heartbeat consumer (`fleet.heartbeat-stream`).
//!
//! ```text
//! agents --plain publish--> heartbeat subject --captured by--> stream (file storage)
//!   stream --durable pull consumer (shared by every server)--> decode -> batch -> registry
//!                                                   ack <-- applied | nak(delay) <-- failed
//! ```
//!
//! Agents keep publishing plain NATS messages; JetStream stores whatever the subject
//! receives, so heartbeats published while every server is down, restarting or slow wait in
//! the stream instead of being dropped at a subscription. Each server pulls from the same
//! durable consumer, so a message goes to one of them. A message is acknowledged only after
//! the batch holding its heartbeats has been applied to the registry (revivals committed to
//! the store); a batch the registry refuses is handed back (`nak` with a delay) and applied
//! on redelivery, by this server or another one. Delivery is at least once: a heartbeat
//! applied twice (an acknowledgement lost with a connection) only sets the same last-seen
//! time again.
//!
//! Heartbeats carry the time JetStream stored them, not the time they are consumed, so a
//! backlog replayed after an outage does not make silent instances look alive now.
//!
//! A message whose decoding panics is logged, counted and terminated (never redelivered):
//! it would panic again. Messages that are not heartbeats are counted as rejected or ignored,
//! as on the plain subscription, and acknowledged.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer, stream};
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::config::HeartbeatStreamConfig;
use super::error::ServerError;
use super::heartbeats::{
    Beats, ConsumerContext, FLUSH_INTERVAL, MAX_BATCH, PanicLog, decode_message, flush, merge,
};
use super::metrics::Metrics;
use super::registry::jetstream::OPEN_WAIT;
use super::registry::unix_seconds;
use super::stopped;
use crate::untrusted::Untrusted;

/// Messages held unacknowledged by one server before their batch is applied.
const MAX_HELD_MESSAGES: usize = 1024;
/// Distinct ids gathered into one batch at most.
const MAX_BATCH_IDS: usize = 16 * MAX_BATCH;
/// Unacknowledged messages JetStream hands out across all servers sharing the consumer.
const MAX_ACK_PENDING: i64 = 16 * MAX_HELD_MESSAGES as i64;
/// Delay before a batch the registry refused is delivered again.
pub const REDELIVERY_DELAY: Duration = Duration::from_secs(2);
/// Pause before the consumer is set up again after it failed.
const RETRY_DELAY: Duration = Duration::from_secs(1);
/// Time a JetStream API request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Makes sure the stream and the durable consumer exist, then spawns the consumer. The
/// returned task ends after a shutdown signal once the batch in hand is applied and
/// acknowledged; messages fetched but not yet batched are redelivered after `ack-wait`.
pub(crate) async fn spawn(
    client: &async_nats::Client,
    subject: &str,
    settings: &HeartbeatStreamConfig,
    pull_batch: usize,
    ctx: ConsumerContext,
) -> Result<JoinHandle<()>, ServerError> {
    let mut js = jetstream::new(client.clone());
    js.set_timeout(REQUEST_TIMEOUT);
    let consumer = ensure_when_available(&js, subject, settings).await?;
    tracing::info!(
        "NATS fleet: heartbeats from subject {subject:?} through JetStream stream {:?}, durable consumer {:?} \
         (ack-wait {}, max-age {}, max-bytes {})",
        settings.name,
        settings.consumer,
        crate::duration::format(settings.ack_wait),
        crate::duration::format(settings.max_age),
        settings.max_bytes,
    );
    let settings = settings.clone();
    let subject = subject.to_owned();
    Ok(tokio::spawn(run(
        js,
        consumer,
        subject,
        settings,
        pull_batch.clamp(1, MAX_HELD_MESSAGES),
        ctx,
    )))
}

/// [`ensure`], retried while JetStream is briefly unavailable (it answers 503 or times out
/// while a cluster elects leaders, as when a node restarts alongside this server): with a
/// growing pause for up to [`OPEN_WAIT`], logged when the waiting starts and when it ends.
/// A refusal (a stream that does not capture the subject, a bad name) ends start-up at once.
async fn ensure_when_available(
    js: &jetstream::Context,
    subject: &str,
    settings: &HeartbeatStreamConfig,
) -> Result<consumer::PullConsumer, ServerError> {
    let deadline = tokio::time::Instant::now() + OPEN_WAIT;
    let mut pause = Duration::from_millis(250);
    let mut failed = 0u32;
    loop {
        match ensure(js, subject, settings).await {
            Ok(consumer) => {
                if failed > 0 {
                    tracing::info!(
                        "fleet.heartbeat-stream: JetStream answered after {failed} failed attempt(s)"
                    );
                }
                return Ok(consumer);
            }
            Err(Ensure::Transient(e)) if tokio::time::Instant::now() + pause < deadline => {
                failed += 1;
                if failed == 1 {
                    tracing::warn!(
                        "{e}; retrying for up to {}",
                        crate::duration::format(OPEN_WAIT)
                    );
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(4));
            }
            Err(Ensure::Transient(e) | Ensure::Refused(e)) => return Err(e),
        }
    }
}

/// Why [`ensure`] failed.
enum Ensure {
    /// JetStream did not answer, or answered that it is unavailable for now.
    Transient(ServerError),
    /// JetStream refused, or the stream found cannot be used.
    Refused(ServerError),
}

/// Whether a JetStream API error means "not now" rather than "no".
fn transient_api_error(e: &jetstream::Error) -> bool {
    e.code() == 503
}

/// The stream capturing `subject` (created if missing) and the shared durable consumer.
async fn ensure(
    js: &jetstream::Context,
    subject: &str,
    settings: &HeartbeatStreamConfig,
) -> Result<consumer::PullConsumer, Ensure> {
    let failed = |what: String, e: &dyn std::fmt::Display| {
        ServerError::Nats(format!(
            "fleet.heartbeat-stream: {what}: {}",
            crate::nats::scrub(e, &[])
        ))
    };
    let mut stream = js
        .get_or_create_stream(stream::Config {
            name: settings.name.clone(),
            description: Some("ccfleet heartbeats".to_owned()),
            subjects: vec![subject.to_owned()],
            // Acknowledged heartbeats are removed: the stream only holds the backlog.
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            num_replicas: settings.replicas,
            max_age: settings.max_age,
            max_bytes: settings.max_bytes,
            // Newer heartbeats are worth more than older ones.
            discard: stream::DiscardPolicy::Old,
            ..Default::default()
        })
        .await
        .map_err(|e| {
            use jetstream::context::CreateStreamErrorKind as Kind;
            let error = failed(format!("creating stream {:?}", settings.name), &e);
            match e.kind() {
                // No responders (`JetStreamUnavailable`) means JetStream is not enabled on
                // the server: no reason to wait. A cluster electing its leaders answers 503.
                Kind::TimedOut | Kind::Response => Ensure::Transient(error),
                Kind::JetStream(api) if transient_api_error(&api) => Ensure::Transient(error),
                _ => Ensure::Refused(error),
            }
        })?;
    let info = stream.info().await.map_err(|e| {
        Ensure::Transient(failed(format!("reading stream {:?}", settings.name), &e))
    })?;
    // An existing stream is used as it is; one that does not capture the subject would
    // leave the consumer waiting forever while heartbeats pass by.
    if !info.config.subjects.iter().any(|s| s == subject) {
        return Err(Ensure::Refused(ServerError::Nats(format!(
            "fleet.heartbeat-stream: stream {:?} exists but does not capture the heartbeat subject {:?} \
             (it captures {:?}); choose another name or add the subject to the stream",
            settings.name, subject, info.config.subjects
        ))));
    }
    // The consumer is ccfleet's own: a changed `ack-wait` is applied to it (create-or-update),
    // where an existing stream, which operators may manage themselves, is left as it is.
    if let Ok(mut existing) = stream
        .get_consumer::<consumer::pull::Config>(&settings.consumer)
        .await
        && let Ok(info) = existing.info().await
        && info.config.ack_wait != settings.ack_wait
    {
        tracing::info!(
            "fleet.heartbeat-stream: consumer {:?} changes ack-wait from {} to {}",
            settings.consumer,
            crate::duration::format(info.config.ack_wait),
            crate::duration::format(settings.ack_wait),
        );
    }
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some(settings.consumer.clone()),
            description: Some("ccfleet servers".to_owned()),
            deliver_policy: consumer::DeliverPolicy::All,
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: settings.ack_wait,
            // A batch keeps being redelivered while the registry fails: the heartbeats
            // are kept until they are applied or age out of the stream.
            max_deliver: -1,
            max_ack_pending: MAX_ACK_PENDING,
            filter_subject: subject.to_owned(),
            ..Default::default()
        })
        .await
        .map_err(|e| {
            use jetstream::stream::ConsumerErrorKind as Kind;
            let error = failed(
                format!("creating or updating consumer {:?}", settings.consumer),
                &e,
            );
            match e.kind() {
                Kind::TimedOut | Kind::Request => Ensure::Transient(error),
                Kind::JetStream(api) if transient_api_error(&api) => Ensure::Transient(error),
                _ => Ensure::Refused(error),
            }
        })
}

/// Messages of the batch in hand and their heartbeats.
#[derive(Default)]
struct Batch {
    ackers: Vec<jetstream::message::Acker>,
    pending: HashMap<u128, (i64, u64)>,
}

struct Stage {
    ctx: ConsumerContext,
    panics: PanicLog,
}

impl Stage {
    fn metrics(&self) -> &Metrics {
        &self.ctx.metrics
    }

    /// Decodes one message into the batch (or terminates it if decoding panics).
    async fn take(&self, batch: &mut Batch, message: jetstream::Message) {
        let metrics = self.metrics();
        Metrics::add(&metrics.heartbeat_messages, 1);
        let now = unix_seconds();
        let at = match message.info() {
            Ok(info) => {
                if info.delivered > 1 {
                    Metrics::add(&metrics.stream_redelivered, 1);
                }
                metrics
                    .stream_pending
                    .store(info.pending, Ordering::Relaxed);
                // The time JetStream stored it; never later than now (clock skew).
                info.published.unix_timestamp().min(now)
            }
            Err(_) => now,
        };
        let (message, acker) = message.split();
        let decoded = std::panic::catch_unwind(AssertUnwindSafe(|| {
            decode_message(&message.payload, metrics)
        }));
        match decoded {
            Ok(ids) => {
                merge(&mut batch.pending, Beats { ids, at });
                batch.ackers.push(acker);
            }
            Err(panic) => {
                self.panics
                    .caught(metrics, "decoding a heartbeat stream message", &*panic);
                Metrics::add(&metrics.stream_terminated, 1);
                if let Err(e) = acker.ack_with(AckKind::Term).await {
                    tracing::debug!(
                        "NATS fleet: terminating a heartbeat stream message: {}",
                        Untrusted(&e.to_string())
                    );
                }
            }
        }
    }

    /// Applies the batch; acknowledges its messages when the registry took it, hands them
    /// back for redelivery otherwise.
    async fn apply(&self, batch: &mut Batch) {
        if batch.ackers.is_empty() {
            return;
        }
        let ctx = &self.ctx;
        let applied = AssertUnwindSafe(flush(
            &mut batch.pending,
            &ctx.registry,
            &ctx.metrics,
            &ctx.roster,
        ))
        .catch_unwind()
        .await;
        batch.pending.clear();
        let kind = match applied {
            Ok(true) => AckKind::Ack,
            Ok(false) => {
                Metrics::add(&ctx.metrics.stream_failed_batches, 1);
                tracing::warn!(
                    "NATS fleet: {} heartbeat stream message(s) not acknowledged; JetStream delivers them again in {}",
                    batch.ackers.len(),
                    crate::duration::format(REDELIVERY_DELAY)
                );
                AckKind::Nak(Some(REDELIVERY_DELAY))
            }
            Err(panic) => {
                Metrics::add(&ctx.metrics.stream_failed_batches, 1);
                self.panics
                    .caught(&ctx.metrics, "applying stream heartbeats", &*panic);
                AckKind::Nak(Some(REDELIVERY_DELAY))
            }
        };
        let mut unsent = 0usize;
        for acker in batch.ackers.drain(..) {
            // An acknowledgement that does not arrive only means a redelivery after
            // ack-wait, and heartbeats are idempotent.
            if acker.ack_with(kind).await.is_err() {
                unsent += 1;
            }
        }
        if unsent > 0 {
            tracing::debug!(
                "NATS fleet: {unsent} heartbeat stream acknowledgement(s) not sent; redelivered after ack-wait"
            );
        }
    }
}

enum Ended {
    Shutdown,
    /// The message stream failed or ended; set it up again.
    Broken,
}

async fn run(
    js: jetstream::Context,
    first: consumer::PullConsumer,
    subject: String,
    settings: HeartbeatStreamConfig,
    pull_batch: usize,
    ctx: ConsumerContext,
) {
    let mut shutdown = ctx.shutdown.clone();
    let stage = Stage {
        ctx,
        panics: PanicLog::default(),
    };
    let mut consumer = Some(first);
    loop {
        if *shutdown.borrow() {
            return;
        }
        let current = match consumer.take() {
            Some(c) => c,
            // The stream or consumer may have been deleted or lost with a memory-only
            // JetStream: set them up again.
            None => match ensure(&js, &subject, &settings).await {
                Ok(c) => c,
                Err(Ensure::Transient(e) | Ensure::Refused(e)) => {
                    tracing::warn!("NATS fleet: heartbeat stream unavailable: {e}");
                    if pause(&mut shutdown).await {
                        return;
                    }
                    continue;
                }
            },
        };
        let messages = current
            .stream()
            .max_messages_per_batch(pull_batch)
            .heartbeat(Duration::from_secs(5))
            .expires(Duration::from_secs(30))
            .messages()
            .await;
        let messages = match messages {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(
                    "NATS fleet: pulling from the heartbeat stream: {}",
                    crate::nats::scrub(&e, &[])
                );
                if pause(&mut shutdown).await {
                    return;
                }
                continue;
            }
        };
        match consume(&stage, messages, &mut shutdown).await {
            Ended::Shutdown => return,
            Ended::Broken => {
                if pause(&mut shutdown).await {
                    return;
                }
            }
        }
    }
}

/// Waits [`RETRY_DELAY`]; true when shutdown was requested meanwhile.
async fn pause(shutdown: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = stopped(shutdown) => true,
        _ = tokio::time::sleep(RETRY_DELAY) => false,
    }
}

async fn consume(
    stage: &Stage,
    mut messages: consumer::pull::Stream,
    shutdown: &mut watch::Receiver<bool>,
) -> Ended {
    let mut batch = Batch::default();
    let mut flush_tick = tokio::time::interval(FLUSH_INTERVAL);
    flush_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    flush_tick.reset();
    let mut errors_logged = false;
    loop {
        tokio::select! {
            biased;
            _ = stopped(shutdown) => {
                stage.apply(&mut batch).await;
                return Ended::Shutdown;
            }
            next = messages.next() => match next {
                Some(Ok(message)) => {
                    errors_logged = false;
                    stage.take(&mut batch, message).await;
                    // Take what has already arrived into the same batch: one transaction
                    // and one round of acknowledgements for all of it.
                    while batch.ackers.len() < MAX_HELD_MESSAGES
                        && batch.pending.len() < MAX_BATCH_IDS
                    {
                        match messages.next().now_or_never() {
                            Some(Some(Ok(message))) => stage.take(&mut batch, message).await,
                            _ => break,
                        }
                    }
                    if batch.pending.len() >= MAX_BATCH || batch.ackers.len() >= MAX_HELD_MESSAGES {
                        stage.apply(&mut batch).await;
                    }
                }
                Some(Err(e)) => {
                    // Missed heartbeats and the like: async-nats carries on pulling. Log the
                    // first of a run only.
                    if !errors_logged {
                        tracing::warn!(
                            "NATS fleet: heartbeat stream: {}",
                            crate::nats::scrub(&e, &[])
                        );
                        errors_logged = true;
                    }
                    if is_fatal(&e) {
                        stage.apply(&mut batch).await;
                        return Ended::Broken;
                    }
                }
                None => {
                    stage.apply(&mut batch).await;
                    return Ended::Broken;
                }
            },
            _ = flush_tick.tick() => stage.apply(&mut batch).await,
        }
    }
}

/// Whether the pull stream cannot go on (the consumer is gone) and must be set up again.
fn is_fatal(e: &consumer::pull::MessagesError) -> bool {
    use consumer::pull::MessagesErrorKind;
    matches!(
        e.kind(),
        MessagesErrorKind::ConsumerDeleted | MessagesErrorKind::NoResponders
    )
}
