//! A test plugin: on every `collect` it hands the bytes of the granted file `/batch` to
//! `host.emit-lines` as they are, line protocol or not, and fails the call with the agent's
//! answer when the batch is refused. The tests write whatever batch they check into the
//! file (under `capabilities.files-root`).
#![no_std]

extern crate alloc;

use alloc::string::String;
use ccfleet_guest::{Plugin, read_file};

struct RawLines;

impl Plugin for RawLines {
    fn init(_config: &str) -> Result<Self, String> {
        Ok(RawLines)
    }

    fn collect(&mut self, _now_ns: i64) -> Result<(), String> {
        let batch = read_file("/batch")?;
        ccfleet_guest::bindings::cc::fleet::host::emit_lines(&batch)
    }
}

ccfleet_guest::export_plugin!(RawLines);
