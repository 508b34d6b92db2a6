//! A hostile test plugin (std + WASI): on `init` it tries every path its configuration lists
//! and logs what it got, one line per attempt, then `probe done`:
//!
//! - `{"files": [...]}` through `cc:fleet/files` `read`,
//! - `{"dirs": [...]}` through `cc:fleet/files` `list-dir`,
//! - `{"wasi": [...]}` through WASI (`std::fs::read`, inside whatever directories are
//!   preopened).
//!
//! Each line is `probe <how> <path>: read <n> bytes`, `probe <how> <path>: listed [...]` or
//! `probe <how> <path>: refused <why>`.

use ccfleet_guest::{Level, Plugin, list_dir, log, read_file};
use serde_json::Value;

struct Probe;

fn paths<'a>(config: &'a Value, key: &str) -> impl Iterator<Item = &'a str> {
    config
        .get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

impl Plugin for Probe {
    fn init(config: &str) -> Result<Self, String> {
        let config: Value = serde_json::from_str(config).map_err(|e| e.to_string())?;
        for path in paths(&config, "files") {
            match read_file(path) {
                Ok(bytes) => log!(
                    Level::Info,
                    "probe files {path}: read {} bytes",
                    bytes.len()
                ),
                Err(why) => log!(Level::Info, "probe files {path}: refused {why}"),
            }
        }
        for path in paths(&config, "dirs") {
            match list_dir(path) {
                Ok(names) => log!(
                    Level::Info,
                    "probe dirs {path}: listed [{}]",
                    names.join(",")
                ),
                Err(why) => log!(Level::Info, "probe dirs {path}: refused {why}"),
            }
        }
        for path in paths(&config, "wasi") {
            match std::fs::read(path) {
                Ok(bytes) => log!(Level::Info, "probe wasi {path}: read {} bytes", bytes.len()),
                Err(why) => log!(Level::Info, "probe wasi {path}: refused {why}"),
            }
        }
        log!(Level::Info, "probe done");
        Ok(Probe)
    }
}

ccfleet_guest::export_plugin!(Probe);
