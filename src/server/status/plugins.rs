//! What each served configuration revision names as plugins, so the status view can count
//! how many instances were served each component of a rollout.
//!
//! A revision is derived from the bytes of the merged configuration, so the plugins a
//! revision names never change: the list is parsed once per revision (at the configuration
//! pull that served it, or when the status view finds the current tree still resolving to
//! an instance's revision) and kept in a bounded map. What the agents report running is
//! counted beside it ([`super::snapshot::rollouts`]): "served" is what the server sent.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::super::configtree::Resolved;
use super::super::plugins::is_sha256;

/// Revisions whose plugin lists are kept; the oldest recorded is forgotten first. A fleet
/// serves a handful of revisions at a time, so this covers many rollouts of history.
pub const REMEMBERED_REVISIONS: usize = 4096;

/// One plugin entry of a configuration: its name and the SHA-256 of its component.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PluginRef {
    /// The entry's `name`.
    pub name: String,
    /// The entry's `sha256`.
    pub sha256: String,
}

/// The plugin entries named by a merged configuration: every element of its `plugins`
/// list with a string `name` and a well-formed `sha256` (entries that name a local `path`
/// are the agent's own business and not part of a rollout).
pub fn plugins_named(blob: &[u8]) -> Vec<PluginRef> {
    let Ok(Value::Object(config)) = serde_json::from_slice::<Value>(blob) else {
        return Vec::new();
    };
    let Some(Value::Array(entries)) = config.get("plugins") else {
        return Vec::new();
    };
    let mut named: Vec<PluginRef> = entries
        .iter()
        .filter_map(|entry| {
            let name = entry.get("name")?.as_str()?;
            let sha256 = entry.get("sha256")?.as_str()?;
            is_sha256(sha256).then(|| PluginRef {
                name: name.to_owned(),
                sha256: sha256.to_owned(),
            })
        })
        .collect();
    named.sort();
    named.dedup();
    named
}

#[derive(Default)]
struct Known {
    lists: HashMap<i64, Arc<[PluginRef]>>,
    order: VecDeque<i64>,
}

/// The plugin lists of the revisions this server served or resolved, by revision.
#[derive(Default)]
pub struct RevisionPlugins {
    known: Mutex<Known>,
}

impl RevisionPlugins {
    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers what `resolved` names; a revision already known costs one map lookup.
    pub fn record(&self, resolved: &Resolved) -> Arc<[PluginRef]> {
        if let Some(list) = self.get(resolved.revision) {
            return list;
        }
        // Parsed outside the lock: a large configuration must not hold up other pulls.
        let list: Arc<[PluginRef]> = plugins_named(&resolved.blob).into();
        let mut known = self.known();
        if !known.lists.contains_key(&resolved.revision) {
            if known.order.len() >= REMEMBERED_REVISIONS
                && let Some(oldest) = known.order.pop_front()
            {
                known.lists.remove(&oldest);
            }
            known.order.push_back(resolved.revision);
            known.lists.insert(resolved.revision, list.clone());
        }
        list
    }

    /// The plugins revision `revision` names, if it was recorded.
    pub fn get(&self, revision: i64) -> Option<Arc<[PluginRef]>> {
        self.known().lists.get(&revision).cloned()
    }

    /// How many revisions are remembered.
    pub fn len(&self) -> usize {
        self.known().lists.len()
    }

    /// Whether no revision is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved(revision: i64, blob: &str) -> Resolved {
        Resolved {
            blob: axum::body::Bytes::from(blob.to_owned()),
            revision,
        }
    }

    const SHA_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    #[test]
    fn only_entries_with_a_name_and_a_sha256_count() {
        let blob = format!(
            r#"{{"plugins":[{{"name":"b","sha256":"{SHA_A}"}},{{"name":"a","path":"/x.wasm"}},
                {{"name":"c","sha256":"short"}},{{"sha256":"{SHA_A}"}},{{"name":"b","sha256":"{SHA_A}"}},7]}}"#
        );
        assert_eq!(
            plugins_named(blob.as_bytes()),
            [PluginRef {
                name: "b".into(),
                sha256: SHA_A.into()
            }]
        );
        assert!(plugins_named(b"not json").is_empty());
        assert!(plugins_named(br#"{"plugins":{}}"#).is_empty());
        assert!(plugins_named(b"[1]").is_empty());
    }

    #[test]
    fn revisions_are_remembered_within_a_bound() {
        let known = RevisionPlugins::default();
        let blob = format!(r#"{{"plugins":[{{"name":"p","sha256":"{SHA_A}"}}]}}"#);
        assert_eq!(known.record(&resolved(1, &blob)).len(), 1);
        // The same revision is never parsed again: a different body under it changes nothing.
        assert_eq!(known.record(&resolved(1, "{}")).len(), 1);
        for revision in 2..(REMEMBERED_REVISIONS as i64 + 10) {
            known.record(&resolved(revision, "{}"));
        }
        assert_eq!(known.len(), REMEMBERED_REVISIONS);
        assert!(known.get(1).is_none(), "the oldest revision went first");
        assert!(known.get(REMEMBERED_REVISIONS as i64 + 9).is_some());
    }
}
