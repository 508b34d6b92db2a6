//! Logs roster changes and configuration revisions. Built without `std` and without WASI:
//! its component imports nothing but the `cc:fleet/host` interface.
#![no_std]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;
use ccfleet_guest::{ConfigUpdate, Instance, Level, Plugin, Provider, log};

struct RosterLogger {
    revision: Option<String>,
    /// Sorted `type/hostname` keys with their state, from the previous roster.
    roster: Vec<(String, String)>,
    seen_roster: bool,
}

fn key(provider: &Provider) -> String {
    let mut key = String::with_capacity(provider.service_type.len() + provider.hostname.len() + 1);
    key.push_str(&provider.service_type);
    key.push('/');
    key.push_str(&provider.hostname);
    key
}

fn join(names: &[&str]) -> String {
    let mut out = String::new();
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(name);
    }
    out
}

impl Plugin for RosterLogger {
    fn init(_config: &str) -> Result<Self, String> {
        log!(Level::Info, "roster-logger ready");
        Ok(RosterLogger {
            revision: None,
            roster: Vec::new(),
            seen_roster: false,
        })
    }

    fn on_config(&mut self, update: ConfigUpdate) -> Result<(), String> {
        if self.revision.as_deref() == Some(update.revision.as_str()) {
            return Ok(());
        }
        let bytes = update.config.as_ref().map_or(0, String::len);
        log!(
            Level::Info,
            "config revision {} from {} ({} bytes)",
            update.revision,
            update.source.as_str(),
            bytes
        );
        self.revision = Some(update.revision);
        Ok(())
    }

    fn on_roster(&mut self, providers: Vec<Provider>) -> Result<(), String> {
        let mut roster: Vec<(String, String)> = providers
            .iter()
            .map(|p| (key(p), p.state.clone()))
            .collect();
        roster.sort();
        roster.dedup_by(|a, b| a.0 == b.0);
        let joined: Vec<&str> = roster
            .iter()
            .filter(|(k, _)| self.roster.binary_search_by(|(o, _)| o.cmp(k)).is_err())
            .map(|(k, _)| k.as_str())
            .collect();
        let left: Vec<&str> = self
            .roster
            .iter()
            .filter(|(k, _)| roster.binary_search_by(|(o, _)| o.cmp(k)).is_err())
            .map(|(k, _)| k.as_str())
            .collect();
        // Rosters are re-published periodically; only a change (or the first one) is news.
        if joined.is_empty() && left.is_empty() && self.seen_roster {
            return Ok(());
        }
        self.seen_roster = true;
        log!(
            Level::Info,
            "roster: {} providers; joined: [{}]; left: [{}]",
            roster.len(),
            join(&joined),
            join(&left)
        );
        self.roster = roster;
        Ok(())
    }

    fn on_instances(&mut self, instances: Vec<Instance>) -> Result<(), String> {
        log!(Level::Info, "instances: {}", instances.len());
        Ok(())
    }
}

ccfleet_guest::export_plugin!(RosterLogger);
