//! The authored config tree under `config-dir`, as cc-backend's config store reads it.
//!
//! ```text
//! defaults.json                          every member
//! <type>/defaults.json                   all instances of a service type
//! <type>/<cluster>/defaults.json         cluster scope only
//! <type>/<cluster>/<hostname>.json       cluster scope leaf
//! <type>/<hostname>.json                 infra scope leaf
//! ```
//!
//! Layers deep-merge (objects recursively, arrays and scalars replace). The served body is
//! the merged object as Go's `json.Marshal` writes it, and the revision is derived from
//! those bytes, so cosmetic edits keep the revision. A generation is scanned off the
//! request path and swapped in whole; a broken tree keeps the previous generation.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use serde_json::{Map, Value};

use super::error::TreeError;
use super::layer;
use crate::wire::{Scope, ServiceType};

/// One resolved configuration: the merged object and its revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The merged object, serialized as Go's `json.Marshal` does.
    pub blob: axum::body::Bytes,
    /// `fnv64a(blob) >> 1`, as a non-negative `i64`.
    pub revision: i64,
}

type Layers = HashMap<String, Arc<Map<String, Value>>>;

struct Generation {
    signature: String,
    layers: Layers,
    /// The deepest nesting of any layer; deep layers are merged, served and dropped on a
    /// grown stack.
    depth: usize,
    cache: Mutex<HashMap<String, Option<Arc<Resolved>>>>,
}

impl Drop for Generation {
    fn drop(&mut self) {
        // Dropping a `Value` recurses once per nesting level.
        let layers = std::mem::take(&mut self.layers);
        layer::with_stack_for(self.depth, move || drop(layers));
    }
}

/// The current generation of the config tree, shared by every request.
pub struct ConfigTree {
    root: PathBuf,
    current: RwLock<Arc<Generation>>,
}

/// What a reload did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// No file changed since the last scan.
    Unchanged,
    /// A new generation replaced the previous one.
    Replaced,
}

impl ConfigTree {
    /// Loads the tree synchronously; an error here must stop start-up.
    pub fn load(root: &Path) -> Result<ConfigTree, TreeError> {
        let generation = scan_deep(root, None)?.expect("a first scan always yields a generation");
        Ok(ConfigTree {
            root: root.to_owned(),
            current: RwLock::new(Arc::new(generation)),
        })
    }

    /// The tree's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Rescans the tree; on error the previous generation stays in place.
    pub fn reload(&self) -> Result<Reload, TreeError> {
        let previous = self.snapshot().signature.clone();
        match scan_deep(&self.root, Some(&previous))? {
            None => Ok(Reload::Unchanged),
            Some(generation) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(generation);
                Ok(Reload::Replaced)
            }
        }
    }

    /// Every plugin a layer names by content: `(layer, plugin name, sha256)` for each entry
    /// of a layer's `plugins` list that has a `sha256` string, in layer order. The
    /// configuration check holds them against `fleet.plugin-dir`.
    pub fn named_plugins(&self) -> Vec<(String, String, String)> {
        let generation = self.snapshot();
        let mut layers: Vec<(&String, &Arc<Map<String, Value>>)> =
            generation.layers.iter().collect();
        layers.sort_by(|a, b| a.0.cmp(b.0));
        let mut named = Vec::new();
        for (path, layer) in layers {
            let Some(Value::Array(plugins)) = layer.get("plugins") else {
                continue;
            };
            for entry in plugins {
                if let Some(Value::String(sha256)) = entry.get("sha256") {
                    let name = entry.get("name").and_then(Value::as_str).unwrap_or("");
                    named.push((path.clone(), name.to_owned(), sha256.clone()));
                }
            }
        }
        named
    }

    fn snapshot(&self) -> Arc<Generation> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The layers under `rollouts/` (`rollouts/<name>.json`), which no member's
    /// configuration includes: each defines a staged rollout (see `super::rollout`).
    pub fn rollout_layers(&self) -> Vec<(String, Arc<Map<String, Value>>)> {
        let generation = self.snapshot();
        let mut found: Vec<(String, Arc<Map<String, Value>>)> = generation
            .layers
            .iter()
            .filter_map(|(path, layer)| {
                let name = path.strip_prefix("rollouts/")?.strip_suffix(".json")?;
                (!name.contains('/')).then(|| (name.to_owned(), layer.clone()))
            })
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        found
    }

    /// The merged configuration of one member, or `None` when no layer applies.
    pub fn resolve(
        &self,
        scope: Scope,
        cluster: &str,
        service_type: ServiceType,
        hostname: &str,
    ) -> Option<Arc<Resolved>> {
        self.resolve_with(scope, cluster, service_type, hostname, None)
    }

    /// [`resolve`](ConfigTree::resolve) with one more layer merged last: a staged
    /// rollout's change, named by `key` (which identifies its content) for the cache.
    pub fn resolve_with(
        &self,
        scope: Scope,
        cluster: &str,
        service_type: ServiceType,
        hostname: &str,
        overlay: Option<(&str, &Map<String, Value>)>,
    ) -> Option<Arc<Resolved>> {
        let generation = self.snapshot();
        let ty = service_type.code();
        let mut key = format!("{}|{cluster}|{ty}|{hostname}", scope.as_str());
        if let Some((name, _)) = overlay {
            key.push('|');
            key.push_str(name);
        }
        let mut cache = generation.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(hit) = cache.get(&key) {
            return hit.clone();
        }
        let paths = match scope {
            Scope::Cluster => vec![
                "defaults.json".to_owned(),
                format!("{ty}/defaults.json"),
                format!("{ty}/{cluster}/defaults.json"),
                format!("{ty}/{cluster}/{hostname}.json"),
            ],
            Scope::Infra => vec![
                "defaults.json".to_owned(),
                format!("{ty}/defaults.json"),
                format!("{ty}/{hostname}.json"),
            ],
        };
        let resolved = layer::with_stack_for(generation.depth, || {
            let mut merged: Option<Map<String, Value>> = None;
            for path in &paths {
                if let Some(layer) = generation.layers.get(path) {
                    let base = merged.get_or_insert_with(Map::new);
                    merge_into(base, layer);
                }
            }
            if let Some((_, layer)) = overlay {
                merge_into(merged.get_or_insert_with(Map::new), layer);
            }
            merged.map(|m| {
                let mut blob = Vec::with_capacity(256);
                write_go_object(&mut blob, &m);
                Arc::new(Resolved {
                    revision: revision_of(&blob),
                    blob: axum::body::Bytes::from(blob),
                })
            })
        });
        cache.insert(key, resolved.clone());
        resolved
    }
}

/// Objects merge key by key; anything else in `layer` replaces what `base` holds.
fn merge_into(base: &mut Map<String, Value>, layer: &Map<String, Value>) {
    for (key, value) in layer {
        match (base.get_mut(key), value) {
            (Some(Value::Object(existing)), Value::Object(incoming)) => {
                merge_into(existing, incoming);
            }
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

/// `int64(fnv64a(blob) >> 1)`.
pub fn revision_of(blob: &[u8]) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in blob {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash >> 1) as i64
}

/// Writes a value exactly as Go's `json.Marshal` writes what `json.Unmarshal` produced
/// into `any`: sorted keys, no spaces, `<>&` and U+2028/9 escaped, numbers as float64.
pub fn write_go_json(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_go_float(out, n.as_f64().unwrap_or(0.0)),
        Value::String(s) => write_go_string(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_go_json(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => write_go_object(out, map),
    }
}

fn write_go_object(out: &mut Vec<u8>, map: &Map<String, Value>) {
    // serde_json may be built with `preserve_order`; Go sorts keys bytewise.
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    out.push(b'{');
    for (i, (key, value)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_go_string(out, key);
        out.push(b':');
        write_go_json(out, value);
    }
    out.push(b'}');
}

fn write_go_float(out: &mut Vec<u8>, f: f64) {
    use std::io::Write;
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        // Go: strconv 'e' format with the shortest digits, then "e-07" shortened to "e-7";
        // positive exponents keep their sign ("1e+21").
        let s = format!("{f:e}");
        let (mantissa, exp) = s.split_once('e').expect("exponent present");
        out.extend_from_slice(mantissa.as_bytes());
        out.push(b'e');
        if !exp.starts_with('-') {
            out.push(b'+');
        }
        out.extend_from_slice(exp.as_bytes());
    } else {
        // Shortest round-trip digits in plain notation, which is what Go's 'f', -1 gives.
        let _ = write!(out, "{f}");
    }
}

fn write_go_string(out: &mut Vec<u8>, s: &str) {
    // The fleet's wire JSON already escapes strings exactly as Go does.
    crate::wire::gojson::to_writer(&mut *out, s).expect("writing to a Vec cannot fail");
}

struct FileStat {
    rel: String,
    path: PathBuf,
    mtime_ns: i128,
    size: u64,
}

/// The largest layer file read, in bytes. Layers are a few kilobytes of JSON; the cap keeps
/// a stray large file from being read whole on every rescan.
pub const MAX_LAYER_BYTES: u64 = 4 << 20;

fn stat_of(path: &Path) -> Result<(i128, u64), TreeError> {
    let meta = std::fs::metadata(path).map_err(|source| TreeError::Io {
        path: path.to_owned(),
        source,
    })?;
    stamp_of(path, &meta)
}

/// The change stamp (modification time, size) of a layer, which must be a regular file
/// within [`MAX_LAYER_BYTES`].
fn stamp_of(path: &Path, meta: &std::fs::Metadata) -> Result<(i128, u64), TreeError> {
    if !meta.is_file() {
        return Err(TreeError::NotAFile {
            path: path.to_owned(),
        });
    }
    if meta.len() > MAX_LAYER_BYTES {
        return Err(TreeError::TooLarge {
            path: path.to_owned(),
            size: meta.len(),
            limit: MAX_LAYER_BYTES,
        });
    }
    let mtime = meta.modified().map_err(|source| TreeError::Io {
        path: path.to_owned(),
        source,
    })?;
    let mtime_ns = match mtime.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    };
    Ok((mtime_ns, meta.len()))
}

fn walk(root: &Path, dir: &Path, rel: &str, out: &mut Vec<FileStat>) -> Result<(), TreeError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        // An absent root is a valid, empty tree.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && dir == root => return Ok(()),
        Err(source) => {
            return Err(TreeError::Io {
                path: dir.to_owned(),
                source,
            });
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| TreeError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let file_type = entry.file_type().map_err(|source| TreeError::Io {
            path: entry.path(),
            source,
        })?;
        names.push((entry.file_name().to_string_lossy().into_owned(), file_type));
    }
    names.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, file_type) in names {
        let child_rel = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        let path = dir.join(&name);
        if file_type.is_dir() {
            walk(root, &path, &child_rel, out)?;
        } else if name.ends_with(".json") {
            let (mtime_ns, size) = stat_of(&path)?;
            out.push(FileStat {
                rel: child_rel,
                path,
                mtime_ns,
                size,
            });
        }
    }
    Ok(())
}

/// Reads a layer file and its stamp as of the read. It is opened without blocking, so an
/// entry swapped for a FIFO after the walk cannot stall the scan (and with it every later
/// reload and the server's shutdown); the opened file is checked again, and never more than
/// the cap is read.
fn read_layer(path: &Path) -> Result<(Vec<u8>, (i128, u64)), TreeError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| TreeError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io)?;
    let stamp = stamp_of(path, &file.metadata().map_err(io)?)?;
    let mut data = Vec::with_capacity(stamp.1 as usize);
    file.take(MAX_LAYER_BYTES + 1)
        .read_to_end(&mut data)
        .map_err(io)?;
    Ok((data, stamp))
}

/// [`scan`] on a stack deep enough for layers nested as deep as Go allows: a layer that
/// fails to parse, or a generation that is discarded, is dropped there too.
fn scan_deep(root: &Path, previous: Option<&str>) -> Result<Option<Generation>, TreeError> {
    stacker::grow(layer::DEEP_STACK, || scan(root, previous))
}

/// Scans the tree. Returns `None` when the signature equals `previous`.
fn scan(root: &Path, previous: Option<&str>) -> Result<Option<Generation>, TreeError> {
    // Files that change between the stats and the read invalidate the scan; a few retries
    // ride out an editor's save, a tree that never settles is an error.
    for _ in 0..5 {
        let mut files = Vec::new();
        walk(root, root, "", &mut files)?;
        let mut signature = String::new();
        for f in &files {
            signature.push_str(&format!("{}:{}:{};", f.rel, f.mtime_ns, f.size));
        }
        if previous == Some(signature.as_str()) {
            return Ok(None);
        }
        let mut layers = Layers::new();
        let mut depth = 0;
        let mut changed = false;
        for f in &files {
            let (data, stamp) = read_layer(&f.path)?;
            if stamp != (f.mtime_ns, f.size) || data.len() as u64 != f.size {
                changed = true;
                break;
            }
            // As cc-backend reads layers: Go's decoder, not serde_json's (see `layer`).
            let parsed = layer::parse(&data).map_err(|source| TreeError::Invalid {
                path: f.rel.clone(),
                source,
            })?;
            depth = depth.max(parsed.depth);
            layers.insert(f.rel.clone(), Arc::new(parsed.map));
        }
        if !changed {
            return Ok(Some(Generation {
                signature,
                layers,
                depth,
                cache: Mutex::new(HashMap::new()),
            }));
        }
    }
    Err(TreeError::Unstable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn go(v: Value) -> String {
        let mut out = Vec::new();
        write_go_json(&mut out, &v);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn go_marshal_compatibility() {
        assert_eq!(
            go(json!({"b": 1, "a": [true, null, "x"], "A": {"z": 1.5, "y": -0.0}})),
            r#"{"A":{"y":-0,"z":1.5},"a":[true,null,"x"],"b":1}"#
        );
        assert_eq!(
            go(json!("<a&b>\u{2028}\"\\\n\u{1}\u{8}")),
            r#""\u003ca\u0026b\u003e\u2028\"\\\n\u0001\b""#
        );
        assert_eq!(go(json!(1e21)), "1e+21");
        assert_eq!(go(json!(1e20)), "100000000000000000000");
        assert_eq!(go(json!(0.000001)), "0.000001");
        assert_eq!(go(json!(0.0000001)), "1e-7");
        assert_eq!(go(json!(1.5e-10)), "1.5e-10");
        assert_eq!(go(json!(12345678901234567890u64)), "12345678901234567000");
        assert_eq!(go(json!(100)), "100");
        assert_eq!(go(json!(0.1)), "0.1");
    }

    #[test]
    fn fnv_revision() {
        // fnv64a("") is the offset basis; "a" is a published test vector (0xaf63dc4c8601ec8c).
        assert_eq!(revision_of(b""), (0xcbf2_9ce4_8422_2325u64 >> 1) as i64);
        assert_eq!(revision_of(b"a"), (0xaf63_dc4c_8601_ec8cu64 >> 1) as i64);
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn a_fifo_in_the_tree_fails_the_scan_at_once_and_the_last_good_tree_stays() {
        // Reading a FIFO blocked the rescan forever: every later reload and the shutdown
        // waited for it.
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "defaults.json", r#"{"interval":"10s"}"#);
        let tree = ConfigTree::load(root).unwrap();
        let status = std::process::Command::new("mkfifo")
            .arg(root.join("x.json"))
            .status()
            .unwrap();
        assert!(status.success());
        let (done, finished) = std::sync::mpsc::channel();
        let root_owned = root.to_owned();
        std::thread::spawn(move || {
            let _ = done.send(ConfigTree::load(&root_owned).map(|_| ()));
        });
        let err = finished
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the scan of a tree holding a FIFO never ended")
            .unwrap_err();
        assert!(matches!(err, TreeError::NotAFile { .. }), "{err}");
        assert!(err.to_string().contains("x.json"), "{err}");
        assert!(tree.reload().is_err());
        let r = tree
            .resolve(Scope::Cluster, "c", ServiceType::MetricCollector, "h")
            .unwrap();
        assert!(String::from_utf8_lossy(&r.blob).contains("10s"));
        // A FIFO swapped in after the walk is opened without blocking and refused too.
        let fifo = root.join("x.json");
        let err = read_layer(&fifo).unwrap_err();
        assert!(matches!(err, TreeError::NotAFile { .. }), "{err}");
    }

    #[test]
    fn a_layer_over_the_size_cap_is_refused_without_being_read() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let file = std::fs::File::create(root.join("big.json")).unwrap();
        // Sparse: the size is what counts, and nothing of it is read.
        file.set_len(MAX_LAYER_BYTES + 1).unwrap();
        let err = ConfigTree::load(root).err().expect("the load fails");
        assert!(matches!(err, TreeError::TooLarge { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("big.json") && text.contains(&MAX_LAYER_BYTES.to_string()),
            "{text}"
        );
        std::fs::write(root.join("big.json"), r#"{"a":1}"#).unwrap();
        assert!(ConfigTree::load(root).is_ok());
    }

    #[test]
    fn readme_example_merges_layers() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(
            root,
            "defaults.json",
            r#"{"log-level":"info","interval":"10s"}"#,
        );
        write(
            root,
            "ccmc/defaults.json",
            r#"{"interval":"5s","collectors":["cpustat","memstat"],"sinks":{"type":"nats","address":"nats://nats01:4222"}}"#,
        );
        write(
            root,
            "ccmc/fritz/defaults.json",
            r#"{"sinks":{"subject":"cc.metric.fritz"},"collectors":["cpustat","memstat","loadavg"]}"#,
        );
        write(
            root,
            "ccmc/fritz/f0101.json",
            r#"{"log-level":"debug","collectors":["cpustat","memstat","loadavg","nvidia"]}"#,
        );
        write(root, "ccms/mgmt01.json", r#"{"retention":"48h"}"#);
        let tree = ConfigTree::load(root).unwrap();
        let r = tree
            .resolve(
                Scope::Cluster,
                "fritz",
                ServiceType::MetricCollector,
                "f0101",
            )
            .unwrap();
        assert_eq!(
            std::str::from_utf8(&r.blob).unwrap(),
            r#"{"collectors":["cpustat","memstat","loadavg","nvidia"],"interval":"5s","log-level":"debug","sinks":{"address":"nats://nats01:4222","subject":"cc.metric.fritz","type":"nats"}}"#
        );
        assert_eq!(r.revision, revision_of(&r.blob));
        let infra = tree
            .resolve(Scope::Infra, "", ServiceType::MetricStore, "mgmt01")
            .unwrap();
        assert_eq!(
            std::str::from_utf8(&infra.blob).unwrap(),
            r#"{"interval":"10s","log-level":"info","retention":"48h"}"#
        );
    }

    #[test]
    fn empty_and_broken_trees() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent");
        let tree = ConfigTree::load(&missing).unwrap();
        assert!(
            tree.resolve(Scope::Infra, "", ServiceType::Backend, "h")
                .is_none()
        );
        write(dir.path(), "t/defaults.json", "[1]");
        assert!(matches!(
            ConfigTree::load(&dir.path().join("t")),
            Err(TreeError::Invalid { .. })
        ));
    }
}
