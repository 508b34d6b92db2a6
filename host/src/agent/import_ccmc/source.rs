//! Reading a cc-metric-collector configuration in any of its forms.
//!
//! - The form of its releases up to 0.6 (and NHR@FAU's published configurations): the main
//!   file names each section's file as a string (`"sinks": "/etc/cc-metric-collector/sinks.json"`)
//!   beside `interval` and `duration`.
//! - The form of cc-lib's `ccConfig` (later releases): `"sinks-file": "./sinks.json"` names a
//!   file, `"sinks": {...}` holds the section inline, and `main` holds `interval` and
//!   `duration`.
//!
//! A configuration copied off a node still names the node's paths (`/etc/...`), so a named
//! file that does not exist is looked up beside the main file: by its own name, then by the
//! section's conventional name (`sinks.json`).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::ImportError;

/// The sections cc-metric-collector reads, by key.
pub const SECTIONS: [&str; 4] = ["collectors", "sinks", "router", "receivers"];

/// Where a section came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Inline in the main file.
    Inline,
    /// A file.
    File(PathBuf),
    /// Not configured.
    Absent,
}

/// A configuration as read: the main settings and each section's JSON.
#[derive(Debug)]
pub struct Source {
    /// The main file.
    pub main_file: PathBuf,
    /// `interval` (Go duration text), if set.
    pub interval: Option<String>,
    /// `duration` (Go duration text), if set.
    pub duration: Option<String>,
    /// `collectors`.
    pub collectors: Map<String, Value>,
    /// `sinks`.
    pub sinks: Map<String, Value>,
    /// `router`, if configured.
    pub router: Option<Map<String, Value>>,
    /// `receivers`.
    pub receivers: Map<String, Value>,
    /// Keys of the main file that are none of the above.
    pub other_keys: Vec<String>,
    /// Where each section came from, in [`SECTIONS`] order.
    pub origins: Vec<(&'static str, Origin)>,
}

fn read_json(path: &Path) -> Result<Value, ImportError> {
    let text = std::fs::read_to_string(path).map_err(|source| ImportError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| ImportError::Json {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

fn object(value: Value, path: &Path, what: &str) -> Result<Map<String, Value>, ImportError> {
    match value {
        Value::Object(map) => Ok(map),
        Value::Null => Ok(Map::new()),
        other => Err(ImportError::Json {
            path: path.to_path_buf(),
            reason: format!(
                "{what} must be a JSON object, not {}",
                super::json_kind(&other)
            ),
        }),
    }
}

/// The main file of `input`: the file itself, or `config.json` in a directory.
pub fn main_file(input: &Path) -> PathBuf {
    if input.is_dir() {
        input.join("config.json")
    } else {
        input.to_path_buf()
    }
}

/// The file a section names: as written (relative to the main file's directory), else the
/// same name beside the main file, else `<section>.json` beside it.
fn locate(dir: &Path, named: &str, section: &str) -> Result<PathBuf, ImportError> {
    let named_path = Path::new(named);
    let mut tried = vec![dir.join(named_path)];
    if let Some(name) = named_path.file_name() {
        tried.push(dir.join(name));
    }
    tried.push(dir.join(format!("{section}.json")));
    tried.dedup();
    if let Some(found) = tried.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    Err(ImportError::Missing {
        section: section.to_owned(),
        tried,
        variants: variants(dir, section),
    })
}

/// `<section>.*.json` files beside the main file: per-node-type variants a site keeps.
fn variants(dir: &Path, section: &str) -> Vec<String> {
    let prefix = format!("{section}.");
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix) && n.ends_with(".json"))
        .collect();
    found.sort();
    found
}

fn duration_text(
    value: Option<&Value>,
    path: &Path,
    key: &str,
) -> Result<Option<String>, ImportError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ImportError::Json {
            path: path.to_path_buf(),
            reason: format!(
                "`{key}` must be a duration such as \"10s\", not {}",
                super::json_kind(other)
            ),
        }),
    }
}

/// Reads the configuration at `input` (a directory holding `config.json`, or the main file);
/// `overrides` replace sections by file (`--collectors FILE`, ...).
pub fn read(input: &Path, overrides: &[(&'static str, PathBuf)]) -> Result<Source, ImportError> {
    let main_file = main_file(input);
    let dir = match main_file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let main = object(read_json(&main_file)?, &main_file, "the main file")?;
    let settings = match main.get("main") {
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            return Err(ImportError::Json {
                path: main_file,
                reason: format!(
                    "`main` must be a JSON object, not {}",
                    super::json_kind(other)
                ),
            });
        }
        None => main.clone(),
    };
    let interval = duration_text(settings.get("interval"), &main_file, "interval")?;
    let duration = duration_text(settings.get("duration"), &main_file, "duration")?;

    let mut sections: Vec<(&'static str, Map<String, Value>, Origin)> = Vec::new();
    for section in SECTIONS {
        let overridden = overrides.iter().find(|(s, _)| *s == section);
        let (value, origin) = if let Some((_, file)) = overridden {
            (read_json(file)?, Origin::File(file.clone()))
        } else {
            let file_key = format!("{section}-file");
            match (main.get(section), main.get(&file_key)) {
                (Some(Value::Object(inline)), _) => (Value::Object(inline.clone()), Origin::Inline),
                (Some(Value::String(named)), _) | (None, Some(Value::String(named))) => {
                    let file = locate(&dir, named, section)?;
                    (read_json(&file)?, Origin::File(file))
                }
                (None, None) => (Value::Null, Origin::Absent),
                (Some(other), _) | (None, Some(other)) => {
                    return Err(ImportError::Json {
                        path: main_file,
                        reason: format!(
                            "`{section}` must name a file or hold the section as an object, not {}",
                            super::json_kind(other)
                        ),
                    });
                }
            }
        };
        let map = match &origin {
            Origin::File(file) => object(value, file, section)?,
            _ => object(value, &main_file, section)?,
        };
        sections.push((section, map, origin));
    }
    let known = |k: &str| {
        k == "main"
            || k == "interval"
            || k == "duration"
            || SECTIONS
                .iter()
                .any(|s| k == *s || k.strip_suffix("-file") == Some(s))
    };
    let other_keys = main.keys().filter(|k| !known(k)).cloned().collect();
    let mut take = |name: &str| {
        let at = sections
            .iter()
            .position(|(s, _, _)| *s == name)
            .unwrap_or(0);
        std::mem::take(&mut sections[at].1)
    };
    let collectors = take("collectors");
    let sinks = take("sinks");
    let router_map = take("router");
    let receivers = take("receivers");
    let router_absent = sections
        .iter()
        .any(|(s, _, o)| *s == "router" && *o == Origin::Absent);
    Ok(Source {
        main_file,
        interval,
        duration,
        collectors,
        sinks,
        router: (!router_absent).then_some(router_map),
        receivers,
        other_keys,
        origins: sections.into_iter().map(|(s, _, o)| (s, o)).collect(),
    })
}
