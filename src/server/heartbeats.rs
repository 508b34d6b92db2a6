//! The NATS heartbeat consumer: cc-backend's `nats_fleet.go` pipeline.
//!
//! ```text
//! queue subscription ("cc-backend-fleet") -> reader -> N decoder tasks -> flusher -> registry
//! ```
//!
//! Decoders classify every line exactly as cc-backend does (see
//! [`crate::wire::scan_heartbeats`]) and stamp accepted heartbeats with the server clock.
//! The flusher coalesces them per instance id (last wins) and applies them in one
//! transaction each second or once 512 distinct ids are pending. Queues between the stages
//! are bounded and apply back-pressure; when the consumer falls behind, async-nats drops
//! messages at the subscription and reports each drop through its event queue, which is
//! counted as `dropped`. That queue is bounded too and sheds reports in a large burst, so
//! the count is a lower bound: a sign of overload, not an exact loss figure (the opt-in
//! heartbeat stream loses nothing instead). Drops are grouped into episodes
//! ([`SlowConsumer`](super::slow_consumer::SlowConsumer)): each is logged when it starts (with the setting to raise) and when
//! it ends (with its count), counted in `/metrics` and reported by `/healthz` as
//! `degraded` while it lasts.
//! Subscriptions are re-established by async-nats after a reconnect, so the consumer
//! outlives nats-server restarts.
//!
//! Defence in depth: a panic while decoding one message, or while applying one batch, is
//! caught, counted (`ccfleet_message_panics_total{source="nats"}`) and logged (the first one
//! in full, later ones in the periodic summary); the stage goes on with the next message, so
//! a decoder bug triggered by one message cannot silently stop every later heartbeat.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::error::ServerError;
use super::metrics::Metrics;
use super::registry::{Registry, parse_instance_id, unix_seconds};
use super::roster::RosterNotify;
use super::stopped;
use crate::untrusted::Untrusted;
use crate::wire::{HeartbeatLine, scan_heartbeats};

/// The queue group shared by every fleet server, so several servers split the load.
pub const QUEUE_GROUP: &str = "cc-backend-fleet";
/// Pending heartbeats are flushed at least this often.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// Pending heartbeats are flushed as soon as this many distinct ids wait.
pub const MAX_BATCH: usize = 512;
/// Period of the summary log lines.
pub const REPORT_INTERVAL: Duration = Duration::from_secs(60);

/// Upper bound of distinct ids gathered from already queued batches into one flush.
const MAX_COALESCED: usize = 16 * MAX_BATCH;
const DECODER_QUEUE: usize = 64;
const FLUSH_QUEUE: usize = 64;

/// Accepted heartbeats of one message, all received at `at` (Unix seconds).
pub(super) struct Beats {
    pub(super) ids: Vec<u128>,
    pub(super) at: i64,
}

/// Everything the consumer needs from the server.
pub(crate) struct ConsumerContext {
    pub registry: Registry,
    pub metrics: Arc<Metrics>,
    pub roster: RosterNotify,
    pub shutdown: watch::Receiver<bool>,
}

/// Subscribes and spawns the pipeline. The returned task ends after a shutdown signal
/// once every received message has been decoded and every pending heartbeat flushed.
pub(crate) async fn spawn(
    client: &async_nats::Client,
    subject: &str,
    workers: usize,
    ctx: ConsumerContext,
) -> Result<JoinHandle<()>, ServerError> {
    spawn_with(client, subject, workers, ctx, decode_message).await
}

/// [`spawn`] with the per-message decoder given: the pipeline around it, panic isolation
/// included, is the production one.
async fn spawn_with<D>(
    client: &async_nats::Client,
    subject: &str,
    workers: usize,
    ctx: ConsumerContext,
    decode: D,
) -> Result<JoinHandle<()>, ServerError>
where
    D: Fn(&[u8], &Metrics) -> Vec<u128> + Clone + Send + Sync + 'static,
{
    let subscriber = client
        .queue_subscribe(subject.to_owned(), QUEUE_GROUP.to_owned())
        .await
        .map_err(|e| {
            ServerError::Nats(format!(
                "subscribing to the heartbeat subject: {}",
                crate::nats::scrub(&e, &[])
            ))
        })?;
    tracing::info!(
        "NATS fleet heartbeat subscription started on subject {subject:?} (queue group {QUEUE_GROUP:?}) — \
         restrict publish permissions on it: a heartbeat keeps any known instance active"
    );

    let panics = PanicLog::default();
    let (flush_tx, flush_rx) = mpsc::channel::<Beats>(FLUSH_QUEUE);
    let mut decoder_txs = Vec::with_capacity(workers);
    let mut decoders = Vec::with_capacity(workers);
    for _ in 0..workers.max(1) {
        let (tx, rx) = mpsc::channel::<async_nats::Message>(DECODER_QUEUE);
        decoder_txs.push(tx);
        decoders.push(tokio::spawn(decode_loop(
            rx,
            flush_tx.clone(),
            ctx.metrics.clone(),
            panics.clone(),
            decode.clone(),
        )));
    }
    drop(flush_tx);
    let flusher = tokio::spawn(flush_loop(
        flush_rx,
        ctx.registry,
        ctx.metrics.clone(),
        ctx.roster,
        panics,
    ));
    let reader = tokio::spawn(read_loop(
        subscriber,
        decoder_txs,
        ctx.metrics,
        ctx.shutdown,
    ));
    Ok(tokio::spawn(async move {
        let _ = reader.await;
        for decoder in decoders {
            let _ = decoder.await;
        }
        let _ = flusher.await;
    }))
}

async fn read_loop(
    mut subscriber: async_nats::Subscriber,
    decoders: Vec<mpsc::Sender<async_nats::Message>>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut next = 0usize;
    let mut dispatch = async |message: async_nats::Message| {
        Metrics::add(&metrics.heartbeat_messages, 1);
        // Round robin keeps the decoders evenly loaded; awaiting the send makes a slow
        // pipeline push back into the subscription buffer.
        let target = &decoders[next % decoders.len()];
        next = next.wrapping_add(1);
        let _ = target.send(message).await;
    };
    loop {
        tokio::select! {
            _ = stopped(&mut shutdown) => break,
            message = subscriber.next() => match message {
                Some(message) => dispatch(message).await,
                None => {
                    tracing::error!("NATS fleet: heartbeat subscription closed");
                    return;
                }
            },
        }
    }
    // Graceful stop: no new deliveries, but what was already received is processed.
    if let Err(e) = subscriber.unsubscribe().await {
        tracing::warn!("NATS fleet: unsubscribing from heartbeats: {e}");
    }
    while let Some(message) = subscriber.next().await {
        dispatch(message).await;
    }
}

/// Logs the first caught panic in full; later ones are counted and summarised, so a message
/// that panics repeatedly cannot flood the log.
#[derive(Clone, Default)]
pub(super) struct PanicLog(Arc<AtomicBool>);

impl PanicLog {
    pub(super) fn caught(&self, metrics: &Metrics, what: &str, panic: &(dyn std::any::Any + Send)) {
        Metrics::add(&metrics.nats_message_panics, 1);
        let message = panic
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(no message)");
        if !self.0.swap(true, Ordering::Relaxed) {
            tracing::error!(
                "NATS fleet: BUG: {what} panicked: {}; skipped it and carrying on (further panics are \
                 counted in ccfleet_message_panics_total and summarised)",
                Untrusted(message)
            );
        } else {
            tracing::debug!("NATS fleet: {what} panicked: {}", Untrusted(message));
        }
    }
}

/// Decodes one message the way cc-backend does, counts its lines by outcome and returns the
/// ids of its accepted heartbeats.
pub(super) fn decode_message(payload: &[u8], metrics: &Metrics) -> Vec<u128> {
    let started = Instant::now();
    let mut ids = Vec::new();
    let (mut malformed, mut rejected, mut ignored) = (0u64, 0u64, 0u64);
    let result = scan_heartbeats(payload, |line| match line {
        HeartbeatLine::Accepted(id) => match parse_instance_id(id) {
            Some(id) => ids.push(id),
            // Well-formed heartbeats for ids that cannot exist: unknown, not rejected.
            None => malformed += 1,
        },
        HeartbeatLine::Ignored(reason) => {
            tracing::debug!(
                "NATS fleet: skipping line: {}",
                Untrusted(&format!("{reason:?}"))
            );
            ignored += 1;
        }
        HeartbeatLine::Rejected(e) => {
            tracing::debug!(
                "NATS fleet: rejected heartbeat: {}",
                Untrusted(&e.to_string())
            );
            rejected += 1;
        }
    });
    if let Err(e) = result {
        // As in cc-backend, a decode error abandons the rest of the message.
        tracing::debug!(
            "NATS fleet: undecodable heartbeat message: {}",
            Untrusted(&e.to_string())
        );
        rejected += 1;
    }
    Metrics::add(
        &metrics.decode_nanos,
        u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX),
    );
    Metrics::add(&metrics.heartbeats_accepted, ids.len() as u64 + malformed);
    Metrics::add(&metrics.heartbeats_unknown, malformed);
    Metrics::add(&metrics.heartbeats_rejected, rejected);
    Metrics::add(&metrics.heartbeats_ignored, ignored);
    ids
}

async fn decode_loop<D>(
    mut rx: mpsc::Receiver<async_nats::Message>,
    flush: mpsc::Sender<Beats>,
    metrics: Arc<Metrics>,
    panics: PanicLog,
    decode: D,
) where
    D: Fn(&[u8], &Metrics) -> Vec<u128>,
{
    while let Some(message) = rx.recv().await {
        let at = unix_seconds();
        // Only this message's own state is inside the closure, so nothing half-updated
        // survives an unwind.
        let ids =
            match std::panic::catch_unwind(AssertUnwindSafe(|| decode(&message.payload, &metrics)))
            {
                Ok(ids) => ids,
                Err(panic) => {
                    panics.caught(&metrics, "decoding a heartbeat message", &*panic);
                    continue;
                }
            };
        if !ids.is_empty() && flush.send(Beats { ids, at }).await.is_err() {
            return;
        }
    }
}

async fn flush_loop(
    mut rx: mpsc::Receiver<Beats>,
    registry: Registry,
    metrics: Arc<Metrics>,
    roster: RosterNotify,
    panics: PanicLog,
) {
    // A panic while applying one batch loses that batch (logged), never the stage.
    let apply = async |pending: &mut HashMap<u128, (i64, u64)>| {
        let lost: u64 = pending.values().map(|(_, n)| n).sum();
        let applied = AssertUnwindSafe(flush(pending, &registry, &metrics, &roster))
            .catch_unwind()
            .await;
        if let Err(panic) = applied {
            pending.clear();
            panics.caught(&metrics, "applying heartbeats", &*panic);
            tracing::error!("NATS fleet: {lost} heartbeat(s) lost to the panic");
        }
    };
    let mut pending: HashMap<u128, (i64, u64)> = HashMap::with_capacity(MAX_BATCH * 2);
    let mut flush_tick = tokio::time::interval(FLUSH_INTERVAL);
    flush_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut report_tick = tokio::time::interval(REPORT_INTERVAL);
    report_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    report_tick.reset();
    let mut reported = metrics.heartbeat_stats();
    loop {
        tokio::select! {
            beats = rx.recv() => match beats {
                Some(beats) => {
                    merge(&mut pending, beats);
                    // Under load, take what the decoders have already queued into the same
                    // transaction: it costs no latency and saves commits.
                    while pending.len() < MAX_COALESCED {
                        match rx.try_recv() {
                            Ok(beats) => merge(&mut pending, beats),
                            Err(_) => break,
                        }
                    }
                    if pending.len() >= MAX_BATCH {
                        apply(&mut pending).await;
                    }
                }
                None => {
                    apply(&mut pending).await;
                    return;
                }
            },
            _ = flush_tick.tick() => {
                apply(&mut pending).await;
                metrics.slow_consumer.tick();
            }
            _ = report_tick.tick() => {
                let now = metrics.heartbeat_stats();
                let period = crate::duration::format(REPORT_INTERVAL);
                let unknown = now.unknown - reported.unknown;
                let rejected = now.rejected - reported.rejected;
                let panicked = now.panics - reported.panics;
                if panicked > 0 {
                    tracing::error!("NATS fleet: {panicked} message(s) or batch(es) panicked in the last {period} and were skipped (a bug: please report it)");
                }
                if unknown > 0 {
                    tracing::warn!("NATS fleet: {unknown} heartbeat(s) for unknown or deregistered instance ids in the last {period}");
                }
                if rejected > 0 {
                    tracing::warn!("NATS fleet: {rejected} rejected message(s) in the last {period}");
                }
                // Drops are logged per episode by `SlowConsumer`.
                reported = now;
            }
        }
    }
}

pub(super) fn merge(pending: &mut HashMap<u128, (i64, u64)>, beats: Beats) {
    for id in beats.ids {
        let slot = pending.entry(id).or_insert((beats.at, 0));
        slot.0 = slot.0.max(beats.at);
        slot.1 += 1;
    }
}

/// Applies and empties `pending`; false when the registry refused the batch (logged).
pub(super) async fn flush(
    pending: &mut HashMap<u128, (i64, u64)>,
    registry: &Registry,
    metrics: &Metrics,
    roster: &RosterNotify,
) -> bool {
    if pending.is_empty() {
        return true;
    }
    let mut beats = Vec::with_capacity(pending.len());
    let mut counts = Vec::with_capacity(pending.len());
    for (id, (at, count)) in pending.drain() {
        beats.push((id, at));
        counts.push(count);
    }
    match registry.heartbeat_batch(beats).await {
        Ok(outcome) => {
            let (mut applied, mut unknown, mut undecided) = (0, 0, 0);
            let mut undecided_at = outcome.undecided.iter().peekable();
            for (i, (ok, count)) in outcome.applied.iter().zip(counts).enumerate() {
                if *ok {
                    applied += count;
                } else if undecided_at.next_if_eq(&&i).is_some() {
                    undecided += count;
                } else {
                    unknown += count;
                }
            }
            Metrics::add(&metrics.heartbeats_applied, applied);
            Metrics::add(&metrics.heartbeats_unknown, unknown);
            if outcome.activated > 0 {
                roster.notify();
            }
            if undecided > 0 {
                // Their instances may have been registered through another server a moment
                // ago: not unknown, but not applied either. The heartbeat stream hands the
                // batch back for redelivery; on the plain subscription they are lost like a
                // dropped message, and the agent's next heartbeat tries again.
                tracing::warn!(
                    "NATS fleet: {undecided} heartbeat(s) for instances this server does not know \
                     yet not applied: the shared registry is not caught up"
                );
                return false;
            }
            true
        }
        Err(e) => {
            let lost: u64 = counts.iter().sum();
            tracing::error!("NATS fleet: applying {lost} heartbeat(s) failed: {e}");
            false
        }
    }
}

// The integration tests' real nats-server (a path inside `mod tests` would resolve below a
// `heartbeats/` directory that does not exist).
#[cfg(test)]
#[path = "../../tests/support/nats.rs"]
mod test_nats;
#[cfg(test)]
#[path = "../../tests/support/wait.rs"]
mod test_wait;

#[cfg(test)]
mod tests {
    use super::test_nats as nats;
    use super::test_wait as wait;
    use super::*;
    use crate::server::registry::{Registration, State};
    use crate::wire::{Scope, ServiceType, encode_heartbeat, now_ns};

    const SUBJECT: &str = "cc.fleet.event";
    /// A message the test's decoder panics on, standing in for any decoder bug.
    const POISON: &[u8] = b"poison";

    async fn register(registry: &Registry, host: &str) -> String {
        registry
            .register(Registration {
                scope: Scope::Infra,
                cluster: String::new(),
                hostname: host.to_owned(),
                service_type: ServiceType::MetricStore,
                meta: Default::default(),
            })
            .await
            .unwrap()
            .instance_id
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_message_that_panics_the_decoder_is_skipped_and_later_heartbeats_are_applied() {
        let server = nats::NatsServer::start();
        let client = async_nats::connect(server.url()).await.unwrap();
        let registry = Registry::open(None).unwrap();
        let (first, second) = (
            register(&registry, "m1").await,
            register(&registry, "m2").await,
        );
        let metrics = Arc::new(Metrics::default());
        let (stop, shutdown) = watch::channel(false);
        // One decoder, so a decoder that died with the first poison message could not hide
        // behind another one.
        let pipeline = spawn_with(
            &client,
            SUBJECT,
            1,
            ConsumerContext {
                registry: registry.clone(),
                metrics: metrics.clone(),
                roster: RosterNotify::default(),
                shutdown,
            },
            |payload: &[u8], metrics: &Metrics| {
                assert_ne!(payload, POISON, "a decoder bug");
                decode_message(payload, metrics)
            },
        )
        .await
        .unwrap();
        client.flush().await.unwrap();

        let publisher = async_nats::connect(server.url()).await.unwrap();
        for payload in [
            POISON.to_vec(),
            encode_heartbeat(now_ns(), &[first.as_str()]).unwrap(),
            POISON.to_vec(),
            encode_heartbeat(now_ns(), &[second.as_str()]).unwrap(),
        ] {
            publisher.publish(SUBJECT, payload.into()).await.unwrap();
        }
        publisher.flush().await.unwrap();

        wait::eventually(
            "the heartbeats after the panics applied",
            Duration::from_secs(10),
            || async {
                // A registered instance is active before any heartbeat, so the registry's
                // state alone says nothing: `applied` is counted once the flush stage (on its
                // own tick, after the decoder counted the messages) has updated the registry.
                let stats = metrics.heartbeat_stats();
                [&first, &second]
                    .iter()
                    .all(|id| registry.lookup(id).unwrap().state == State::Active)
                    && stats.messages == 4
                    && stats.panics == 2
                    && stats.applied == 2
            },
        )
        .await;
        let stats = metrics.heartbeat_stats();
        assert_eq!(stats.panics, 2, "{stats:?}");
        assert_eq!(stats.messages, 4, "{stats:?}");
        assert_eq!(stats.applied, 2, "{stats:?}");
        let _ = stop.send(true);
        pipeline.await.unwrap();
    }
}
