//! A hostile test plugin: on every `collect` it emits one batch whose size its own
//! configuration sets, `{"points": N, "text-bytes": M}` (a string field of M bytes per point),
//! as line protocol (`emit-lines`), or with `"typed": 1` through the typed `emit` of 0.2.
#![no_std]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;
use ccfleet_guest::{FieldValue, Level, Plugin, Point, emit, log};

struct OversizedEmit {
    points: usize,
    text_bytes: usize,
    typed: bool,
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

impl Plugin for OversizedEmit {
    fn init(config: &str) -> Result<Self, String> {
        Ok(OversizedEmit {
            points: number(config, "points").unwrap_or(100_000),
            text_bytes: number(config, "text-bytes").unwrap_or(0),
            typed: number(config, "typed").unwrap_or(0) != 0,
        })
    }

    fn collect(&mut self, now_ns: i64) -> Result<(), String> {
        let text = "x".repeat(self.text_bytes);
        let batch: Vec<Point> = (0..self.points)
            .map(|i| {
                let point = Point::new("flood")
                    .tag("hostname", "hostile")
                    .field("value", FieldValue::Uint(i as u64))
                    .at(now_ns);
                if text.is_empty() {
                    point
                } else {
                    point.field("text", FieldValue::Text(text.clone()))
                }
            })
            .collect();
        let emitted = if self.typed {
            ccfleet_guest::bindings::cc::fleet::host::emit(&batch)
        } else {
            emit(&batch)
        };
        if let Err(refused) = emitted {
            log!(
                Level::Warn,
                "emit of {} points refused: {}",
                batch.len(),
                refused
            );
            return Err(refused);
        }
        Ok(())
    }
}

ccfleet_guest::export_plugin!(OversizedEmit);
