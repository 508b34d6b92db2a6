//! The smallest plugin: it logs each configuration revision and emits one `hello` point per
//! `collect`.
#![no_std]
extern crate alloc;

use alloc::string::String;
use ccfleet_guest::{ConfigUpdate, FieldValue, Level, Plugin, Point, emit, log};

struct Hello;

impl Plugin for Hello {
    fn init(_config: &str) -> Result<Self, String> {
        Ok(Hello)
    }

    fn on_config(&mut self, update: ConfigUpdate) -> Result<(), String> {
        log!(Level::Info, "revision {}", update.revision);
        Ok(())
    }

    fn collect(&mut self, now_ns: i64) -> Result<(), String> {
        emit(&[Point::new("hello")
            .tag("type", "node")
            .field("value", FieldValue::Int(1))
            .at(now_ns)])
    }
}

ccfleet_guest::export_plugin!(Hello);
