//! A hostile test plugin: on every `collect` it writes `{"lines": N}` log lines of
//! `{"line-bytes": M}` bytes each (with a newline and an escape sequence that would forge log
//! lines if written raw), then fails with an error of `{"error-bytes": E}` bytes.
#![no_std]

extern crate alloc;

use alloc::string::String;
use ccfleet_guest::{Level, Plugin, log};

struct Flood {
    lines: usize,
    line_bytes: usize,
    error_bytes: usize,
}

/// Reads the unsigned number after `"key":` in a flat JSON object; `None` when absent.
fn number(config: &str, key: &str) -> Option<usize> {
    let mut pattern = String::from("\"");
    pattern.push_str(key);
    pattern.push('"');
    let rest = &config[config.find(&pattern)? + pattern.len()..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

impl Plugin for Flood {
    fn init(config: &str) -> Result<Self, String> {
        Ok(Flood {
            lines: number(config, "lines").unwrap_or(100_000),
            line_bytes: number(config, "line-bytes").unwrap_or(1024),
            error_bytes: number(config, "error-bytes").unwrap_or(7 << 20),
        })
    }

    fn collect(&mut self, _now_ns: i64) -> Result<(), String> {
        let mut line = String::from("flood\nERROR forged line\x1b[2J ");
        while line.len() < self.line_bytes {
            line.push('x');
        }
        for _ in 0..self.lines {
            log(Level::Error, &line);
        }
        let mut error = String::from("flood error ");
        while error.len() < self.error_bytes {
            error.push('e');
        }
        Err(error)
    }
}

ccfleet_guest::export_plugin!(Flood);
