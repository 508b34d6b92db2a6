//! The `self` collector: the agent's own figures as metric points, next to the plugins'.
//!
//! cc-metric-collector's `self` collector reports its Go process (`runtime.MemStats`,
//! goroutines, cgo calls, `getrusage`). This agent is not a Go program, so each switch of
//! its configuration (the agent's `"self"` section, cc-metric-collector's keys) sends the
//! figures that mean the same here:
//!
//! - `read_rusage`: `getrusage(RUSAGE_SELF)` under cc-metric-collector's names:
//!   `rusage_user_time` and `rusage_system_time` (floats, unit `seconds`),
//!   `rusage_vol_ctx_switch`, `rusage_invol_ctx_switch`, `rusage_signals`,
//!   `rusage_major_pgfaults`, `rusage_minor_pgfaults` (integers);
//! - `read_goroutines`: `num_goroutines`, the agent's live asynchronous tasks (its unit of
//!   concurrency, as goroutines are Go's), an integer;
//! - `read_cgo_calls`: `num_cgo_calls`, the calls the agent made into plugins (its calls
//!   across a foreign boundary, as cgo calls are Go's), an integer;
//! - `read_mem_stats`: Go's heap statistics describe its garbage collector, which this agent
//!   does not have; it sends the memory the kernel accounts to the process instead, from
//!   `/proc/self/status`: `mem_rss`, `mem_rss_peak`, `mem_anon`, `mem_file` (unsigned, unit
//!   `Bytes`);
//! - `read_agent_stats` (this agent's own): `points_emitted` (points the plugins handed to
//!   the sinks), `points_dropped` (points refused, dropped on a full or closed queue, or lost
//!   by a sink), `points_sent` (points the sinks wrote), `sink_queue` (batches waiting
//!   between the plugins and the sinks), integers.
//!
//! Every point has the tags `hostname` (the fleet hostname), `type=node` and, with a
//! cluster, `cluster`; a unit goes in a `unit` tag, as the collector plugins send theirs.

use std::sync::Arc;
use std::time::Duration;

use ccfleet::duration::serde_go;
use ccfleet::lineproto::{Encoder, FieldRef};
use serde::Deserialize;
use tokio::task::JoinHandle;

use super::observe::ObservedPlugin;
use super::sinks::SinkInfo;
use crate::plugin::sink::{Batch, SinkHandle};

/// The agent's `"self"` section: its own figures sent as metrics beside the plugins'
/// (cc-metric-collector's `self` keys, each enabling a group, plus `read_agent_stats`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SelfConfig {
    /// How often the figures are sent (Go syntax, default `10s`).
    #[serde(default = "default_interval", with = "serde_go")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub interval: Duration,
    /// Process memory (`mem_*`).
    #[serde(default)]
    pub read_mem_stats: bool,
    /// Live tasks (`num_goroutines`).
    #[serde(default)]
    pub read_goroutines: bool,
    /// Plugin calls (`num_cgo_calls`).
    #[serde(default)]
    pub read_cgo_calls: bool,
    /// `getrusage` (`rusage_*`).
    #[serde(default)]
    pub read_rusage: bool,
    /// Points emitted, dropped, sent and queued.
    #[serde(default)]
    pub read_agent_stats: bool,
}

fn default_interval() -> Duration {
    Duration::from_secs(10)
}

/// A figure's value, typed as cc-metric-collector types it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Figure {
    /// A float.
    Float(f64),
    /// A signed integer.
    Int(i64),
    /// An unsigned integer.
    Uint(u64),
}

/// One figure: name, unit, value.
pub type Named = (&'static str, Option<&'static str>, Figure);

/// The `mem_*` figures from the text of a `/proc/<pid>/status` file; a key the kernel does
/// not report is left out.
pub fn memory(status: &str) -> Vec<Named> {
    const KEYS: [(&str, &str); 4] = [
        ("VmRSS:", "mem_rss"),
        ("VmHWM:", "mem_rss_peak"),
        ("RssAnon:", "mem_anon"),
        ("RssFile:", "mem_file"),
    ];
    let mut out = Vec::new();
    for (key, name) in KEYS {
        let kib = status.lines().find_map(|line| {
            let rest = line.strip_prefix(key)?;
            let mut fields = rest.split_whitespace();
            let number = fields.next()?.parse::<u64>().ok()?;
            (fields.next() == Some("kB")).then_some(number)
        });
        if let Some(kib) = kib {
            out.push((name, Some("Bytes"), Figure::Uint(kib.saturating_mul(1024))));
        }
    }
    out
}

/// The `rusage_*` figures of this process.
pub fn rusage() -> std::io::Result<Vec<Named>> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` is writable memory of the type getrusage fills.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: getrusage succeeded, so it initialized the struct.
    let usage = unsafe { usage.assume_init() };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    #[allow(clippy::unnecessary_cast)]
    let int = |v: libc::c_long| Figure::Int(v as i64);
    Ok(vec![
        (
            "rusage_user_time",
            Some("seconds"),
            Figure::Float(seconds(usage.ru_utime)),
        ),
        (
            "rusage_system_time",
            Some("seconds"),
            Figure::Float(seconds(usage.ru_stime)),
        ),
        ("rusage_vol_ctx_switch", None, int(usage.ru_nvcsw)),
        ("rusage_invol_ctx_switch", None, int(usage.ru_nivcsw)),
        ("rusage_signals", None, int(usage.ru_nsignals)),
        ("rusage_major_pgfaults", None, int(usage.ru_majflt)),
        ("rusage_minor_pgfaults", None, int(usage.ru_minflt)),
    ])
}

/// What the collector reads, shared with the running agent.
pub(crate) struct Sources {
    pub plugins: Arc<std::sync::RwLock<Vec<ObservedPlugin>>>,
    pub sinks: Vec<SinkInfo>,
    /// The plugins' end of the sink channel, for its queue length.
    pub queue: SinkHandle,
}

fn int(v: u64) -> Figure {
    Figure::Int(i64::try_from(v).unwrap_or(i64::MAX))
}

impl Sources {
    /// The figures `config` asks for, now.
    pub(crate) fn figures(&self, config: &SelfConfig) -> Vec<Named> {
        let mut out = Vec::new();
        if config.read_mem_stats {
            match std::fs::read_to_string("/proc/self/status") {
                Ok(status) => out.extend(memory(&status)),
                Err(error) => tracing::warn!(%error, "self: cannot read the process memory"),
            }
        }
        if config.read_goroutines
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let tasks = runtime.metrics().num_alive_tasks();
            out.push(("num_goroutines", None, int(tasks as u64)));
        }
        let snapshots: Vec<_> = {
            let plugins = self.plugins.read().unwrap_or_else(|e| e.into_inner());
            plugins.iter().map(|p| p.stats.snapshot()).collect()
        };
        if config.read_cgo_calls {
            let calls: u64 = snapshots
                .iter()
                .flat_map(|s| s.calls.iter().map(|c| c.count()))
                .sum();
            out.push(("num_cgo_calls", None, int(calls)));
        }
        if config.read_rusage {
            match rusage() {
                Ok(figures) => out.extend(figures),
                Err(error) => tracing::warn!(%error, "self: getrusage failed"),
            }
        }
        if config.read_agent_stats {
            let emitted: u64 = snapshots.iter().map(|s| s.points_emitted).sum();
            let lost_before: u64 = snapshots
                .iter()
                .map(|s| s.points_refused + s.points_sink_full + s.points_sink_closed)
                .sum();
            let lost_after: u64 = self.sinks.iter().map(|s| s.counters.dropped()).sum();
            let sent: u64 = self
                .sinks
                .iter()
                .map(|s| s.counters.sent.load(std::sync::atomic::Ordering::Relaxed))
                .sum();
            out.push(("points_emitted", None, int(emitted)));
            out.push(("points_dropped", None, int(lost_before + lost_after)));
            out.push(("points_sent", None, int(sent)));
            out.push(("sink_queue", None, int(self.queue.queued() as u64)));
        }
        out
    }
}

/// The figures as one batch of line protocol at `now_ns`.
pub fn encode(
    figures: &[Named],
    hostname: &str,
    cluster: Option<&str>,
    now_ns: i64,
) -> Result<Batch, ccfleet::lineproto::EncodeError> {
    let mut enc = Encoder::new();
    for (name, unit, value) in figures {
        enc.start_line(name)?;
        // Tags in key order, as the plugins' points are written.
        if let Some(cluster) = cluster {
            enc.add_tag("cluster", cluster)?;
        }
        enc.add_tag("hostname", hostname)?;
        enc.add_tag("type", "node")?;
        if let Some(unit) = unit {
            enc.add_tag("unit", unit)?;
        }
        let value = match *value {
            Figure::Float(v) => FieldRef::Float(v),
            Figure::Int(v) => FieldRef::Int(v),
            Figure::Uint(v) => FieldRef::Uint(v),
        };
        enc.add_field("value", value)?;
        enc.end_line(Some(now_ns))?;
    }
    Ok(Batch {
        plugin: Arc::from("self"),
        lines: bytes::Bytes::from(enc.take()),
        points: figures.len(),
    })
}

/// Sends the figures every `config.interval` into `sink` until the sink closes.
pub(crate) fn spawn(
    config: SelfConfig,
    sources: Sources,
    sink: SinkHandle,
    hostname: String,
    cluster: Option<String>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(config.interval.max(Duration::from_millis(10)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let figures = sources.figures(&config);
            if figures.is_empty() {
                continue;
            }
            let batch = match encode(
                &figures,
                &hostname,
                cluster.as_deref(),
                ccfleet::wire::now_ns(),
            ) {
                Ok(batch) => batch,
                Err(error) => {
                    tracing::warn!(%error, "self: cannot encode the figures");
                    continue;
                }
            };
            match sink.try_send(batch) {
                Ok(()) => {}
                Err(crate::plugin::sink::SinkError::Closed) => return,
                Err(error) => tracing::warn!(%error, "self: figures dropped"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_comes_from_the_status_file_in_bytes() {
        let status = "Name:\tccfleet\nVmHWM:\t   63080 kB\nVmRSS:\t   61600 kB\n\
                      RssAnon:\t   42600 kB\nRssFile:\t   17200 kB\nThreads:\t4\n";
        assert_eq!(
            memory(status),
            vec![
                ("mem_rss", Some("Bytes"), Figure::Uint(61_600 * 1024)),
                ("mem_rss_peak", Some("Bytes"), Figure::Uint(63_080 * 1024)),
                ("mem_anon", Some("Bytes"), Figure::Uint(42_600 * 1024)),
                ("mem_file", Some("Bytes"), Figure::Uint(17_200 * 1024)),
            ]
        );
        // A kernel without RssAnon (before 4.5) and a cut line leave those out.
        assert_eq!(memory("VmRSS:\t 10 kB\nVmHWM:\t 12").len(), 1);
    }

    #[test]
    fn figures_encode_as_typed_line_protocol() {
        let figures = [
            ("mem_rss", Some("Bytes"), Figure::Uint(4096)),
            ("num_goroutines", None, Figure::Int(7)),
            ("rusage_user_time", Some("seconds"), Figure::Float(0.5)),
        ];
        let batch = encode(&figures, "node01", Some("fritz"), 1_700_000_000_000_000_000).unwrap();
        assert_eq!(batch.points, 3);
        assert_eq!(
            std::str::from_utf8(&batch.lines).unwrap(),
            "mem_rss,cluster=fritz,hostname=node01,type=node,unit=Bytes value=4096u 1700000000000000000\n\
             num_goroutines,cluster=fritz,hostname=node01,type=node value=7i 1700000000000000000\n\
             rusage_user_time,cluster=fritz,hostname=node01,type=node,unit=seconds value=0.5 1700000000000000000\n"
        );
    }

    #[test]
    fn rusage_reads_this_process() {
        let figures = rusage().unwrap();
        assert_eq!(figures.len(), 7);
        let Figure::Float(user) = figures[0].2 else {
            panic!("a float")
        };
        assert!(user >= 0.0);
    }
}
