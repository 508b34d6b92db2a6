//! A sink's own `meta_as_tags`, as cc-lib's sinks have it.
//!
//! In cc-lib a point carries its meta information (`unit`, ...) beside its tags, and each
//! sink writes as tags the meta keys its `meta_as_tags` names. In the agent, plugins write
//! line protocol, which has no meta: a collector writes the meta keys its own
//! `meta_as_tags` names (default `["unit"]`) as tags. So the plugins write the union of
//! what the sinks want, and a sink with `meta_as_tags` removes from each point the tags that
//! are meta keys of the plugins (the union of their `meta_as_tags`) but not in its list.

use std::collections::BTreeSet;

use crate::plugin::spec::PluginSpec;

/// The meta keys `plugins` write as tags: each one's `config.meta_as_tags` (a collector's
/// default: `["unit"]`).
pub fn of_plugins(plugins: &[PluginSpec]) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for plugin in plugins {
        match plugin.config.get("meta_as_tags").and_then(|v| v.as_array()) {
            Some(list) => keys.extend(list.iter().filter_map(|v| v.as_str()).map(str::to_owned)),
            None => {
                keys.insert("unit".to_owned());
            }
        }
    }
    keys
}

/// The tags one sink removes: meta keys the plugins write as tags that its `meta_as_tags`
/// does not name; `None` when there are none.
pub fn removed(plugin_meta: &BTreeSet<String>, sink_meta: &[String]) -> Option<Vec<Vec<u8>>> {
    let removed: Vec<Vec<u8>> = plugin_meta
        .iter()
        .filter(|k| !sink_meta.contains(k))
        .map(|k| escape_key(k))
        .collect();
    (!removed.is_empty()).then_some(removed)
}

/// A tag key as line protocol writes it (commas, equals signs and spaces escaped).
fn escape_key(key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len());
    for &b in key.as_bytes() {
        if matches!(b, b',' | b'=' | b' ') {
            out.push(b'\\');
        }
        out.push(b);
    }
    out
}

/// The end of the measurement-and-tags part of `line`: its first unescaped space.
fn series_end(line: &[u8]) -> usize {
    let mut i = 0;
    while i < line.len() {
        match line[i] {
            b'\\' => i += 2,
            b' ' => return i,
            _ => i += 1,
        }
    }
    line.len()
}

/// The unescaped commas of `series` (the separators of measurement and tags).
fn commas(series: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < series.len() {
        match series[i] {
            b'\\' => i += 2,
            b',' => {
                out.push(i);
                i += 1
            }
            _ => i += 1,
        }
    }
    out
}

/// The key of one `key=value` tag: up to its first unescaped equals sign.
fn tag_key(tag: &[u8]) -> &[u8] {
    let mut i = 0;
    while i < tag.len() {
        match tag[i] {
            b'\\' => i += 2,
            b'=' => return &tag[..i],
            _ => i += 1,
        }
    }
    tag
}

/// `lines` without the tags whose keys are in `keys`; everything else as it was.
pub fn strip(lines: &[u8], keys: &[Vec<u8>]) -> (Vec<u8>, bool) {
    let mut out = Vec::with_capacity(lines.len());
    let mut changed = false;
    for line in lines.split_inclusive(|&b| b == b'\n') {
        let end = series_end(line);
        let series = &line[..end];
        let cuts = commas(series);
        if cuts.is_empty() {
            out.extend_from_slice(line);
            continue;
        }
        out.extend_from_slice(&series[..cuts[0]]);
        for (n, &start) in cuts.iter().enumerate() {
            let stop = cuts.get(n + 1).copied().unwrap_or(series.len());
            let tag = &series[start + 1..stop];
            if keys.iter().any(|k| k.as_slice() == tag_key(tag)) {
                changed = true;
            } else {
                out.extend_from_slice(&series[start..stop]);
            }
        }
        out.extend_from_slice(&line[end..]);
    }
    (out, changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_tags_go_and_escapes_are_respected() {
        let keys = removed(
            &BTreeSet::from(["unit".to_owned(), "uuid".to_owned()]),
            &["uuid".to_owned()],
        )
        .unwrap();
        let lines = b"cpu_load,hostname=n1,unit=load,type=node value=1 5\n\
                      m\\,unit=x,units=a,a\\=unit=unit value=2\n\
                      bare value=3\n\
                      last,unit=C value=\"unit=x, y\" 7";
        let (out, changed) = strip(lines, &keys);
        assert!(changed);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "cpu_load,hostname=n1,type=node value=1 5\n\
             m\\,unit=x,units=a,a\\=unit=unit value=2\n\
             bare value=3\n\
             last value=\"unit=x, y\" 7"
        );
        assert_eq!(
            removed(&BTreeSet::from(["unit".to_owned()]), &["unit".to_owned()]),
            None
        );
    }
}
