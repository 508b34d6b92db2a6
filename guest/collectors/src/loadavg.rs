//! `loadavg`: `load_one`, `load_five`, `load_fifteen` (floats) and `proc_run`, `proc_total`
//! (integers) for the node, from `/proc/loadavg`.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::{Collector, Files, Sample, Value, parse_u64};

/// The file read.
pub const PATH: &str = "/proc/loadavg";

const LOADS: [&str; 3] = ["load_one", "load_five", "load_fifteen"];

/// The `loadavg` collector.
#[derive(Debug, Default)]
pub struct Loadavg;

impl Collector for Loadavg {
    fn name(&self) -> &'static str {
        "loadavg"
    }

    fn collect(
        &mut self,
        files: &mut dyn Files,
        _now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        let text = files.read(PATH)?;
        let mut fields = text.split_ascii_whitespace();
        let node = [("type", "node")];
        for name in LOADS {
            let raw = fields
                .next()
                .ok_or_else(|| format!("{PATH}: missing {name} in {text:?}"))?;
            let value: f64 = raw
                .parse()
                .map_err(|_| format!("{PATH}: {name} is not a number: {raw:?}"))?;
            out.push(Sample::new(name, &node, Value::Float(value)));
        }
        let procs = fields
            .next()
            .ok_or_else(|| format!("{PATH}: missing the running/total processes"))?;
        let (run, total) = procs
            .split_once('/')
            .ok_or_else(|| format!("{PATH}: expected running/total, got {procs:?}"))?;
        for (name, raw) in [("proc_run", run), ("proc_total", total)] {
            let value = parse_u64(raw, name, PATH)?;
            out.push(Sample::new(name, &node, Value::Int(value as i64)));
        }
        Ok(())
    }
}
