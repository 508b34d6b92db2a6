//! What a plugin may write to the agent's log: a token bucket per plugin, shared by all its
//! instantiations (a restart does not refill it), and caps on every message.
//!
//! A line over the rate is dropped and counted; the count is reported by the host itself,
//! at most once a second while lines are being dropped and before the next line that gets
//! through, so the log says how much is missing without the plugin controlling its volume.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::spec::Limits;

/// The longest log message kept from a plugin, in bytes.
pub const MAX_LOG_MESSAGE: usize = 2048;

/// The longest error message kept from a plugin (a call's `Err`, a refused `init`), in bytes.
pub const MAX_ERROR_MESSAGE: usize = 1024;

/// How often dropped lines are reported while a plugin keeps flooding.
const REPORT_EVERY: Duration = Duration::from_secs(1);

/// The per-plugin log budget. Cheap to clone; clones share the bucket.
#[derive(Debug, Clone)]
pub struct LogGate {
    inner: Arc<Mutex<Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    refilled: Instant,
    dropped: u64,
    reported: Instant,
}

/// The gate's answer for one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// Whether the line may be written.
    pub admit: bool,
    /// Lines dropped since the last report that are to be reported now (0: nothing to
    /// report).
    pub report_dropped: u64,
}

impl LogGate {
    /// A full bucket sized by the plugin's limits.
    pub fn new(limits: &Limits) -> LogGate {
        LogGate::with_rate(
            limits.log_lines_per_second,
            limits.log_burst,
            Instant::now(),
        )
    }

    fn with_rate(per_second: u32, burst: u32, now: Instant) -> LogGate {
        let burst = f64::from(burst.max(1));
        LogGate {
            inner: Arc::new(Mutex::new(Bucket {
                rate: f64::from(per_second),
                burst,
                tokens: burst,
                refilled: now,
                dropped: 0,
                reported: now,
            })),
        }
    }

    /// Takes a token for one line, if there is one.
    pub fn admit(&self) -> Admission {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Admission {
        // A poisoned lock only means another thread panicked mid-update; the numbers are
        // still usable.
        let mut b = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let elapsed = now.saturating_duration_since(b.refilled).as_secs_f64();
        b.tokens = (b.tokens + elapsed * b.rate).min(b.burst);
        b.refilled = now;
        let admit = b.tokens >= 1.0;
        if admit {
            b.tokens -= 1.0;
        } else {
            b.dropped += 1;
        }
        let due = admit || now.saturating_duration_since(b.reported) >= REPORT_EVERY;
        let report_dropped = if due && b.dropped > 0 {
            b.reported = now;
            std::mem::take(&mut b.dropped)
        } else {
            0
        };
        Admission {
            admit,
            report_dropped,
        }
    }
}

/// Cuts `text` to at most `max` bytes at a character boundary, marking the cut.
pub fn cap(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} more bytes)", &text[..cut], text.len() - cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_the_rate_holds_and_drops_are_counted() {
        let t0 = Instant::now();
        let gate = LogGate::with_rate(10, 5, t0);
        let admitted = (0..5).filter(|_| gate.admit_at(t0).admit).count();
        assert_eq!(admitted, 5);
        // Over the burst: dropped, and not yet reported (the last report was just now).
        for _ in 0..7 {
            assert_eq!(
                gate.admit_at(t0),
                Admission {
                    admit: false,
                    report_dropped: 0
                }
            );
        }
        // A tenth of a second refills one token: the next line passes and carries the count.
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(
            gate.admit_at(t1),
            Admission {
                admit: true,
                report_dropped: 7
            }
        );
        assert!(!gate.admit_at(t1).admit);
        // A plugin that only floods still gets its drops reported once a second.
        let t2 = t1 + Duration::from_millis(50);
        assert_eq!(gate.admit_at(t2).report_dropped, 0);
        let t3 = t1 + REPORT_EVERY;
        let a = gate.admit_at(t3);
        assert!(a.report_dropped >= 2, "{a:?}");
    }

    #[test]
    fn messages_are_capped_at_a_character_boundary() {
        assert_eq!(cap("short", 10), "short");
        assert_eq!(cap("ééé", 3), "é… (4 more bytes)");
        assert_eq!(cap(&"x".repeat(10), 4), "xxxx… (6 more bytes)");
    }
}
