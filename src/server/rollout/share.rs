//! Agents' reports shared among the servers of a JetStream registry.
//!
//! Each agent polls whichever server answers, so each server hears only some of the
//! fleet's reports, while the lease holder judges every member's. The servers already
//! share a NATS connection (the registry's), so a server passes on what it hears:
//!
//! - A report that differs from the member's previous one (or whose member is new) is
//!   queued for publishing on [`report_subject`] (`ccfleet.registry.<bucket>.reports`, next
//!   to the registry's last-seen digests). Every [`FLUSH`] the queue goes out in as few
//!   messages as NATS's payload limit allows; a member queued twice in that time goes once,
//!   with its latest report.
//! - Every server subscribes and records the others' reports in the same bounded map as its
//!   own ([`super::MAX_REPORTS`]). A report carries the unix milliseconds the server received
//!   it; an older one than the map holds (a member that moved from one server to another
//!   while messages crossed) is ignored, so every server keeps the member's latest change.
//! - An unchanged report, what nearly every poll sends, publishes nothing. At 100,000 agents
//!   the traffic is the reports that *change*: when a stage reaches members, each of them
//!   sends one or two (starting, then running), a few hundred bytes each, batched.
//! - Core NATS keeps nothing for a server that was not listening, and a message may be
//!   lost in a reconnect. So a server that starts asks the others once ([`hello_subject`]),
//!   and each answers with the reports it received from agents itself; and a member's
//!   report that nobody shared for [`REFRESH`] is published again by the server that receives
//!   it next (receiving someone else's copy counts as shared, so each member goes out once
//!   per [`REFRESH`] whatever the number of servers: 100,000 agents make about 170 reports a
//!   second, a few batched messages).
//! - A message names the member by its key (cluster, type and host name) and carries the
//!   report's header text; never an instance id or a token. The sender is a random number
//!   chosen at start (its own messages come back and are skipped). A malformed message or
//!   entry is counted (`ccfleet_rollout_shared_reports_refused_total`), logged once, and
//!   the rest of the message is taken.
//!
//! Reports stay soft state: a lease holder that has not heard a member yet counts it as
//! without a report (never failed), and a stage's `min-time` covers the moments after a
//! start.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Rollouts;
use crate::server::stopped;
use crate::untrusted::Untrusted;
use crate::wire::{AgentReport, MAX_REPORT_LEN, ServiceType};

/// How often queued reports are published.
pub const FLUSH: Duration = Duration::from_millis(200);
/// An unchanged report is published again when nobody shared it for this long.
pub const REFRESH: Duration = Duration::from_secs(600);
/// The longest member key accepted from another server (cluster, type and host name).
const MAX_MEMBER_LEN: usize = 512;
/// The largest message published, whatever NATS allows: a burst is several messages rather
/// than one that holds up the connection.
const MAX_MESSAGE: usize = 256 * 1024;

/// The subject of a bucket's shared reports.
pub fn report_subject(bucket: &str) -> String {
    format!("ccfleet.registry.{bucket}.reports")
}

/// The subject a starting server asks the others on for the reports they received.
pub fn hello_subject(bucket: &str) -> String {
    format!("ccfleet.registry.{bucket}.reports.hello")
}

/// One shared report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedReport {
    /// The member: `cluster|type|hostname`.
    #[serde(rename = "m")]
    pub member: String,
    /// Unix milliseconds the sending server received it.
    #[serde(rename = "t")]
    pub at: i64,
    /// The report (its header text).
    #[serde(rename = "r")]
    pub report: String,
}

#[derive(Serialize, Deserialize)]
struct Message {
    /// The sending server (a random number).
    #[serde(rename = "s")]
    sender: u64,
    #[serde(rename = "e")]
    entries: Vec<SharedReport>,
}

/// Encodes reports into messages of at most `max_payload` bytes (an entry too large for
/// any message is left out: a report is at most [`MAX_REPORT_LEN`] bytes, far below NATS's
/// limits).
pub fn encode(sender: u64, entries: &[SharedReport], max_payload: usize) -> Vec<Bytes> {
    let limit = max_payload.min(MAX_MESSAGE);
    let mut messages = Vec::new();
    let mut current: Vec<&SharedReport> = Vec::new();
    // The envelope `{"s":<u64>,"e":[]}` and a comma per entry.
    let envelope = 32;
    let mut size = envelope;
    let finish = |current: &mut Vec<&SharedReport>, messages: &mut Vec<Bytes>| {
        if !current.is_empty() {
            let body = serde_json::json!({"s": sender, "e": current});
            messages.push(Bytes::from(
                serde_json::to_vec(&body).expect("shared reports serialize"),
            ));
            current.clear();
        }
    };
    for entry in entries {
        let len = serde_json::to_vec(entry).map_or(usize::MAX, |v| v.len()) + 1;
        if len.saturating_add(envelope) > limit {
            continue;
        }
        if size + len > limit {
            finish(&mut current, &mut messages);
            size = envelope;
        }
        current.push(entry);
        size += len;
    }
    finish(&mut current, &mut messages);
    messages
}

/// A decoded message: its sender, the entries that hold up (their reports parsed) and how
/// many did not.
#[derive(Debug)]
pub struct Decoded {
    /// The sending server.
    pub sender: u64,
    /// `(member key, received at, report)`.
    pub reports: Vec<(String, i64, AgentReport)>,
    /// Entries refused.
    pub refused: usize,
}

/// Decodes a message; `Err` names why the whole message is refused.
pub fn decode(bytes: &[u8]) -> Result<Decoded, String> {
    let message: Message =
        serde_json::from_slice(bytes).map_err(|e| format!("not a report message: {e}"))?;
    let mut decoded = Decoded {
        sender: message.sender,
        reports: Vec::with_capacity(message.entries.len()),
        refused: 0,
    };
    for entry in message.entries {
        if valid_member(&entry.member)
            && entry.report.len() <= MAX_REPORT_LEN
            && let Ok(report) = AgentReport::parse(&entry.report)
        {
            decoded.reports.push((entry.member, entry.at, report));
        } else {
            decoded.refused += 1;
        }
    }
    Ok(decoded)
}

/// Whether a member key from another server has the form this server makes:
/// `cluster|type|hostname` with a known type and no control characters.
fn valid_member(key: &str) -> bool {
    if key.len() > MAX_MEMBER_LEN || key.chars().any(char::is_control) {
        return false;
    }
    let mut parts = key.splitn(3, '|');
    let (Some(_cluster), Some(kind), Some(host)) = (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    !host.is_empty() && kind.parse::<ServiceType>().is_ok()
}

/// Starts sharing `rollouts`' reports over `client` with the other servers of `bucket`:
/// the subscriptions are in place when this returns, and the others have been asked for
/// what they hold.
pub async fn spawn(
    rollouts: Arc<Rollouts>,
    client: async_nats::Client,
    bucket: &str,
    shutdown: watch::Receiver<bool>,
) -> Result<Vec<JoinHandle<()>>, async_nats::SubscribeError> {
    let sender = u64::from_be_bytes(rand::random());
    let subject = report_subject(bucket);
    let hello = hello_subject(bucket);
    let reports = client.subscribe(subject.clone()).await?;
    let hellos = client.subscribe(hello.clone()).await?;
    rollouts.start_sharing();
    // Ask the others for what they received: a best effort (a NATS that is not reachable yet
    // leaves it to the refresh).
    if let Err(e) = client.publish(hello, Bytes::from(sender.to_string())).await {
        tracing::warn!("fleet: cannot ask the other servers for agents' reports: {e}");
    }
    Ok(vec![
        tokio::spawn(publish_task(
            rollouts.clone(),
            client,
            subject,
            sender,
            shutdown.clone(),
        )),
        tokio::spawn(receive_task(
            rollouts.clone(),
            reports,
            sender,
            shutdown.clone(),
        )),
        tokio::spawn(hello_task(rollouts, hellos, sender, shutdown)),
    ])
}

async fn publish_task(
    rollouts: Arc<Rollouts>,
    client: async_nats::Client,
    subject: String,
    sender: u64,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(FLUSH);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = stopped(&mut shutdown) => return,
            _ = ticker.tick() => {}
        }
        let queued = rollouts.take_outbox();
        if queued.is_empty() {
            continue;
        }
        let max_payload = client.server_info().max_payload;
        let max_payload = if max_payload == 0 {
            MAX_MESSAGE
        } else {
            max_payload
        };
        let mut sent = 0;
        for message in encode(sender, &queued, max_payload) {
            match client.publish(subject.clone(), message).await {
                Ok(()) => sent += 1,
                Err(e) => {
                    if !failing {
                        tracing::warn!(
                            "fleet: cannot share agents' reports with the other servers ({e}); \
                             they are shared again within {}",
                            crate::duration::format(REFRESH)
                        );
                        failing = true;
                    }
                }
            }
        }
        if sent > 0 {
            failing = false;
            rollouts
                .counters
                .reports_shared
                .fetch_add(queued.len() as u64, Ordering::Relaxed);
        }
    }
}

async fn receive_task(
    rollouts: Arc<Rollouts>,
    mut messages: async_nats::Subscriber,
    own: u64,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut logged = false;
    loop {
        let message = tokio::select! {
            _ = stopped(&mut shutdown) => return,
            m = messages.next() => match m { Some(m) => m, None => return },
        };
        let problem = match decode(&message.payload) {
            Ok(decoded) if decoded.sender == own => continue,
            Ok(decoded) => {
                let refused = decoded.refused;
                rollouts.record_shared(decoded.reports);
                (refused > 0)
                    .then(|| format!("{refused} malformed entr(y/ies)"))
                    .map(|p| (p, refused))
            }
            Err(e) => Some((e, 1)),
        };
        if let Some((problem, n)) = problem {
            rollouts
                .counters
                .bad_shared_reports
                .fetch_add(n as u64, Ordering::Relaxed);
            if !logged {
                tracing::warn!(
                    "fleet: ignoring shared agents' reports on {}: {} (further ones are counted, not logged)",
                    Untrusted(message.subject.as_str()),
                    Untrusted(&problem).capped(200)
                );
                logged = true;
            }
        }
    }
}

async fn hello_task(
    rollouts: Arc<Rollouts>,
    mut hellos: async_nats::Subscriber,
    own: u64,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let message = tokio::select! {
            _ = stopped(&mut shutdown) => return,
            m = hellos.next() => match m { Some(m) => m, None => return },
        };
        if message.payload.as_ref() == own.to_string().as_bytes() {
            continue;
        }
        let queued = rollouts.queue_received_here();
        tracing::debug!("fleet: a server started; sharing the {queued} report(s) received here");
    }
}

impl Rollouts {
    /// Takes the queued reports, as shared entries.
    fn take_outbox(&self) -> Vec<SharedReport> {
        let outbox = std::mem::take(&mut *self.outbox.lock().unwrap_or_else(|e| e.into_inner()));
        outbox
            .into_iter()
            .map(|(member, (at, report))| SharedReport { member, at, report })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn by_member(entries: &[(String, i64, AgentReport)]) -> HashMap<&str, (i64, String)> {
        entries
            .iter()
            .map(|(m, at, r)| (m.as_str(), (*at, r.to_string())))
            .collect()
    }

    fn entry(host: &str, at: i64, report: &str) -> SharedReport {
        SharedReport {
            member: format!("fritz|ccmc|{host}"),
            at,
            report: report.to_owned(),
        }
    }

    #[test]
    fn reports_round_trip_in_messages_within_the_payload_limit() {
        let report = "applied=42; plugins=loadavg@3f0c5b1e9d2a7c4b:running";
        let entries: Vec<SharedReport> = (0..1000)
            .map(|i| entry(&format!("f{i:04}"), 1_700_000_000_000 + i, report))
            .collect();
        let messages = encode(7, &entries, 16 * 1024);
        assert!(messages.len() > 1, "a burst is split");
        let mut all = Vec::new();
        for m in &messages {
            assert!(m.len() <= 16 * 1024, "{} bytes", m.len());
            let decoded = decode(m).unwrap();
            assert_eq!((decoded.sender, decoded.refused), (7, 0));
            all.extend(decoded.reports);
        }
        assert_eq!(all.len(), 1000);
        let got = by_member(&all);
        assert_eq!(
            got["fritz|ccmc|f0999"],
            (1_700_000_000_999, report.to_owned())
        );
        // Never an instance id or a token: only the member key and the report text travel.
        let text = String::from_utf8(messages[0].to_vec()).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let keys: Vec<_> = value["e"][0].as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["m", "r", "t"]);
    }

    #[test]
    fn malformed_messages_and_entries_are_refused_without_panicking() {
        for bad in [
            &b""[..],
            b"null",
            b"{}",
            b"{\"s\":1}",
            b"{\"s\":-1,\"e\":[]}",
            b"{\"s\":1,\"e\":{}}",
            b"\xff\xfe",
            b"[1,2,3]",
        ] {
            assert!(decode(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let good = "applied=1; plugins=";
        let entries = vec![
            entry("ok", 1, good),
            entry("bad-report", 1, "applied=x"),
            SharedReport {
                member: "fritz|nope|h".to_owned(),
                at: 1,
                report: good.to_owned(),
            },
            SharedReport {
                member: "fritz|ccmc".to_owned(),
                at: 1,
                report: good.to_owned(),
            },
            SharedReport {
                member: "fritz|ccmc|evil\nline".to_owned(),
                at: 1,
                report: good.to_owned(),
            },
            SharedReport {
                member: format!("fritz|ccmc|{}", "h".repeat(600)),
                at: 1,
                report: good.to_owned(),
            },
        ];
        let messages = encode(3, &entries, 1 << 20);
        assert_eq!(messages.len(), 1);
        let decoded = decode(&messages[0]).unwrap();
        assert_eq!(decoded.refused, 5);
        assert_eq!(decoded.reports.len(), 1);
        assert_eq!(decoded.reports[0].0, "fritz|ccmc|ok");

        // Random bytes and mangled messages never panic.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let text = messages[0].to_vec();
        for _ in 0..20_000 {
            let mut m = text.clone();
            for _ in 0..(seed % 5 + 1) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let at = (seed as usize) % m.len();
                m[at] = (seed >> 32) as u8;
            }
            m.truncate((seed as usize >> 8) % (text.len() + 1));
            let _ = decode(&m);
        }
    }

    #[test]
    fn an_entry_too_large_for_any_message_is_left_out() {
        let entries = vec![entry("big", 1, &"x".repeat(2000)), entry("small", 1, "a")];
        let messages = encode(1, &entries, 1000);
        assert_eq!(messages.len(), 1);
        let text = String::from_utf8(messages[0].to_vec()).unwrap();
        assert!(text.contains("small") && !text.contains("big"), "{text}");
    }

    fn member(host: &str) -> crate::server::registry::Service {
        crate::server::registry::Service {
            scope: crate::wire::Scope::Cluster,
            cluster: "fritz".into(),
            hostname: host.into(),
            service_type: ServiceType::MetricCollector,
            state: crate::server::registry::State::Active,
            registered_at: 1,
            last_heartbeat: None,
            config_revision: 0,
            meta: Arc::default(),
        }
    }

    fn report(applied: i64) -> AgentReport {
        AgentReport {
            applied,
            plugins: Vec::new(),
        }
    }

    #[test]
    fn only_changed_reports_are_queued_and_an_older_change_from_another_server_is_ignored() {
        let rollouts = Rollouts::new();
        rollouts.record_report(&member("a"), report(1));
        assert!(
            rollouts.take_outbox().is_empty(),
            "no sharing: nothing queued"
        );

        rollouts.start_sharing();
        rollouts.record_report(&member("a"), report(1));
        let queued = rollouts.take_outbox();
        assert_eq!(queued.len(), 1, "never shared yet: queued once");
        assert_eq!(queued[0].member, "fritz|ccmc|a");
        assert_eq!(queued[0].report, "applied=1; plugins=");
        rollouts.record_report(&member("a"), report(1));
        assert!(rollouts.take_outbox().is_empty(), "unchanged: nothing");
        rollouts.record_report(&member("a"), report(2));
        let queued = rollouts.take_outbox();
        assert_eq!(queued.len(), 1, "changed: queued");
        let at = queued[0].at;

        // Another server's older change is ignored, a later one taken over.
        rollouts.record_shared(vec![("fritz|ccmc|a".into(), at - 1, report(9))]);
        assert_eq!(rollouts.report(&member("a")).unwrap().applied, 2);
        rollouts.record_shared(vec![("fritz|ccmc|a".into(), at + 1, report(3))]);
        assert_eq!(rollouts.report(&member("a")).unwrap().applied, 3);
        rollouts.record_shared(vec![("fritz|ccmc|b".into(), 5, report(4))]);
        assert_eq!(rollouts.report(&member("b")).unwrap().applied, 4);
        assert!(
            rollouts.take_outbox().is_empty(),
            "others' reports are not passed on"
        );

        // A starting server asks: only what agents sent here goes out again.
        assert_eq!(
            rollouts.queue_received_here(),
            0,
            "a moved on to another server"
        );
        rollouts.record_report(&member("a"), report(3));
        assert!(
            rollouts.take_outbox().is_empty(),
            "just shared by another server"
        );
        assert_eq!(rollouts.queue_received_here(), 1);
        assert_eq!(rollouts.take_outbox()[0].member, "fritz|ccmc|a");
    }
}
