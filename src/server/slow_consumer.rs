//! The heartbeat subscription's slow-consumer drops, grouped into episodes for the log and
//! `/healthz`. Kept apart from the heartbeat pipeline so that the server's counters
//! ([`super::metrics::Metrics`]), which hold it, need nothing of the pipeline that feeds them.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Drops further apart than this start a new slow-consumer episode; an episode ends (and
/// `/healthz` stops reporting it) once this long passed without a drop.
pub const SLOW_CONSUMER_QUIET: Duration = Duration::from_secs(30);

/// The heartbeat subscription's slow-consumer drops, grouped into episodes: a burst that
/// overflows the subscription costs two log lines (its start, naming the setting to raise,
/// and its end, with the count), not one per dropped message or per minute.
#[derive(Debug, Default)]
pub struct SlowConsumer {
    /// `fleet.heartbeat-pending-messages`, named in the log.
    pending_messages: std::sync::atomic::AtomicUsize,
    episode: std::sync::Mutex<Option<Episode>>,
    /// Episodes started so far.
    episodes: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Clone, Copy)]
struct Episode {
    started: Instant,
    last: Instant,
    dropped: u64,
}

impl SlowConsumer {
    /// Sets the subscription's capacity (`fleet.heartbeat-pending-messages`) the log names.
    pub fn set_pending_messages(&self, n: usize) {
        self.pending_messages.store(n, Ordering::Relaxed);
    }

    /// Records one message NATS dropped at the subscription.
    pub fn dropped(&self) {
        self.dropped_at(Instant::now());
    }

    fn dropped_at(&self, now: Instant) {
        let mut episode = self.episode.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(current) = episode.as_mut() {
            if now.saturating_duration_since(current.last) < SLOW_CONSUMER_QUIET {
                current.last = now;
                current.dropped += 1;
                return;
            }
            Self::ended(current);
        }
        *episode = Some(Episode {
            started: now,
            last: now,
            dropped: 1,
        });
        self.episodes.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            "NATS fleet: heartbeat messages are dropped: the subscription's buffer of {} messages \
             (fleet.heartbeat-pending-messages) overflowed because the consumer cannot keep up \
             (slow consumer; core NATS delivers at most once). Raise \
             fleet.heartbeat-pending-messages or fleet.heartbeat-concurrency, add servers, or \
             use fleet.heartbeat-stream, which loses none",
            self.pending_messages.load(Ordering::Relaxed)
        );
    }

    fn ended(episode: &Episode) {
        tracing::warn!(
            "NATS fleet: slow-consumer episode over: at least {} heartbeat message(s) dropped in {} \
             (raise fleet.heartbeat-pending-messages or use fleet.heartbeat-stream)",
            episode.dropped,
            crate::duration::format(Duration::from_secs(
                episode.last.duration_since(episode.started).as_secs()
            ))
        );
    }

    /// Ends an episode that has been quiet for [`SLOW_CONSUMER_QUIET`] (logging it).
    pub fn tick(&self) {
        self.tick_at(Instant::now());
    }

    fn tick_at(&self, now: Instant) {
        let mut episode = self.episode.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(current) = episode.as_ref()
            && now.saturating_duration_since(current.last) >= SLOW_CONSUMER_QUIET
        {
            Self::ended(current);
            *episode = None;
        }
    }

    /// The episode under way, for `/healthz`: what was dropped since when.
    pub fn status(&self) -> Option<String> {
        self.status_at(Instant::now())
    }

    fn status_at(&self, now: Instant) -> Option<String> {
        self.tick_at(now);
        let episode = (*self.episode.lock().unwrap_or_else(|e| e.into_inner()))?;
        Some(format!(
            "dropping: at least {} heartbeat message(s) dropped by NATS in the last {} (slow \
             consumer); raise fleet.heartbeat-pending-messages or use fleet.heartbeat-stream",
            episode.dropped,
            crate::duration::format(Duration::from_secs(
                now.saturating_duration_since(episode.started)
                    .as_secs()
                    .max(1)
            ))
        ))
    }

    /// Episodes started so far.
    pub fn episodes(&self) -> u64 {
        self.episodes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_consumer_drops_are_one_episode_until_quiet_and_reported_while_it_lasts() {
        let slow = SlowConsumer::default();
        slow.set_pending_messages(1024);
        let t0 = Instant::now();
        assert_eq!(slow.status_at(t0), None);
        for i in 0..114 {
            slow.dropped_at(t0 + Duration::from_millis(i * 100));
        }
        assert_eq!(slow.episodes(), 1);
        let during = slow.status_at(t0 + Duration::from_secs(12)).unwrap();
        assert!(
            during.contains("at least 114 heartbeat message(s)"),
            "{during}"
        );
        assert!(
            during.contains("fleet.heartbeat-pending-messages"),
            "{during}"
        );
        let last = t0 + Duration::from_millis(11_300);
        assert!(slow.status_at(last + SLOW_CONSUMER_QUIET).is_none());
        slow.dropped_at(last + SLOW_CONSUMER_QUIET + Duration::from_secs(1));
        assert_eq!(slow.episodes(), 2);
        let again = slow
            .status_at(last + SLOW_CONSUMER_QUIET + Duration::from_secs(2))
            .unwrap();
        assert!(again.contains("at least 1 heartbeat"), "{again}");
    }
}
