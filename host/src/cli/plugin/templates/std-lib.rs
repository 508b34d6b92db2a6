//! {name}: a ccfleet plugin linking std (built for WASI; run it with `--wasi`).
//!
//! Build it with `ccfleet plugin build`, try it with
//! `ccfleet plugin run --wasi target/components/{name}.wasm --config '{"greeting": "hi"}'`.

use ccfleet_guest::{FieldValue, Level, Plugin, Point, emit, log};

struct {type_name} {
    collections: u64,
}

impl Plugin for {type_name} {
    /// Called once with this plugin's section of the agent configuration (JSON text).
    fn init(config: &str) -> Result<Self, String> {
        log!(Level::Info, "{name} ready, configuration {config}");
        Ok({type_name} { collections: 0 })
    }

    /// Called on the plugin's collect interval: read what you measure
    /// (`ccfleet_guest::read_to_string("/proc/loadavg")`, granted by
    /// `capabilities.read-files`) and emit points.
    fn collect(&mut self, now_ns: i64) -> Result<(), String> {
        self.collections += 1;
        let point = Point::new("{name}_collections")
            .tag("type", "node")
            .field("value", FieldValue::Uint(self.collections))
            .at(now_ns);
        emit(&[point])
    }
}

ccfleet_guest::export_plugin!({type_name});
