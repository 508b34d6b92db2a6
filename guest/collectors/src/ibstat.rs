//! `ibstat`: InfiniBand port counters from `/sys/class/infiniband/<device>/ports/<port>/`,
//! as cc-metric-collector reports them. Ports whose `lid` reads `0x0` (not connected) and
//! devices in `exclude_devices` are skipped; devices and ports are looked up every round,
//! so ones that appear are reported and ones that disappear are forgotten.
//!
//! Per port (tags `type=node`, `device=<device>`, `port=<port>`, `lid=<lid>`):
//! `ib_recv`, `ib_xmit` (the `port_rcv_data`/`port_xmit_data` counters times 4, as the
//! kernel counts data in units of 4 bytes, unit `bytes`), `ib_recv_pkts`, `ib_xmit_pkts`
//! (unit `packets`), all unsigned as Go's `uint64` (`send_abs_values`, default true); with
//! `send_derived_values` (default false) the rates since the previous round, `<name>_bw`
//! (floats, `bytes/sec` or `packets/sec`; the 64-bit counters wrap modulo 2^64 as Go's
//! unsigned subtraction does); with `send_total_values` (default false) `ib_total` and
//! `ib_total_pkts` (received plus sent) and, with rates, `ib_total_bw` and
//! `ib_total_pkts_bw`.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::{Collector, Files, Sample, Value, parse_u64, seconds_between};

/// Where the devices are.
pub const BASE: &str = "/sys/class/infiniband";

/// The counters: metric name, file under `counters/`, whether data (scaled by 4, bytes)
/// rather than packets.
pub const COUNTERS: [(&str, &str, bool); 4] = [
    ("ib_recv", "port_rcv_data", true),
    ("ib_xmit", "port_xmit_data", true),
    ("ib_recv_pkts", "port_rcv_packets", false),
    ("ib_xmit_pkts", "port_xmit_packets", false),
];

/// Settings (cc-metric-collector's keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `exclude_devices`: devices not reported, e.g. `mlx5_0`.
    pub exclude_devices: Vec<String>,
    /// `send_abs_values` (default true).
    pub send_abs_values: bool,
    /// `send_derived_values` (default false).
    pub send_derived_values: bool,
    /// `send_total_values` (default false).
    pub send_total_values: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            exclude_devices: Vec::new(),
            send_abs_values: true,
            send_derived_values: false,
            send_total_values: false,
        }
    }
}

/// The `ibstat` collector.
#[derive(Debug, Default)]
pub struct Ibstat {
    config: Config,
    /// Raw counters by `device/port`.
    previous: BTreeMap<String, [u64; 4]>,
    previous_ns: Option<i64>,
}

impl Ibstat {
    /// A collector with these settings and no baseline yet.
    pub fn new(config: Config) -> Ibstat {
        Ibstat {
            config,
            previous: BTreeMap::new(),
            previous_ns: None,
        }
    }

    /// One round's samples and counters.
    fn round(
        &self,
        files: &mut dyn Files,
        seconds: Option<f64>,
        current: &mut BTreeMap<String, [u64; 4]>,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        for device in files.list_dir(BASE)? {
            if self.config.exclude_devices.contains(&device) {
                continue;
            }
            let ports_dir = format!("{BASE}/{device}/ports");
            let Ok(ports) = files.list_dir(&ports_dir) else {
                continue;
            };
            for port in ports {
                let dir = format!("{ports_dir}/{port}");
                // A port without a LID file is not an InfiniBand port to report.
                let Ok(lid) = files.read(&format!("{dir}/lid")) else {
                    continue;
                };
                let lid = lid.trim();
                if lid == "0x0" {
                    continue;
                }
                let mut raw = [0u64; 4];
                for (slot, (_, file, _)) in raw.iter_mut().zip(COUNTERS) {
                    let path = format!("{dir}/counters/{file}");
                    *slot = parse_u64(files.read(&path)?.trim(), "the counter", &path)?;
                }
                let tags = [
                    ("type", "node"),
                    ("device", device.as_str()),
                    ("port", port.as_str()),
                    ("lid", lid),
                ];
                let key = format!("{device}/{port}");
                let old = self.previous.get(&key);
                let (mut total, mut total_pkts) = (0u64, 0u64);
                let (mut total_bw, mut total_pkts_bw) = (0f64, 0f64);
                for (i, (name, _, data)) in COUNTERS.iter().enumerate() {
                    let scale = if *data { 4 } else { 1 };
                    let value = raw[i].wrapping_mul(scale);
                    let (unit, rate_unit) = if *data {
                        ("bytes", "bytes/sec")
                    } else {
                        ("packets", "packets/sec")
                    };
                    if self.config.send_abs_values {
                        out.push(Sample::new(*name, &tags, Value::Uint(value)).unit(unit));
                    }
                    let rate = match (seconds, old) {
                        (Some(seconds), Some(old)) if self.config.send_derived_values => {
                            let rate = raw[i].wrapping_sub(old[i]) as f64 / seconds * scale as f64;
                            out.push(
                                Sample::new(format!("{name}_bw"), &tags, Value::Float(rate))
                                    .unit(rate_unit),
                            );
                            Some(rate)
                        }
                        _ => None,
                    };
                    if *data {
                        total = total.wrapping_add(value);
                        total_bw += rate.unwrap_or(0.0);
                    } else {
                        total_pkts = total_pkts.wrapping_add(value);
                        total_pkts_bw += rate.unwrap_or(0.0);
                    }
                }
                if self.config.send_total_values {
                    out.push(Sample::new("ib_total", &tags, Value::Uint(total)).unit("bytes"));
                    out.push(
                        Sample::new("ib_total_pkts", &tags, Value::Uint(total_pkts))
                            .unit("packets"),
                    );
                    if self.config.send_derived_values && seconds.is_some() && old.is_some() {
                        out.push(
                            Sample::new("ib_total_bw", &tags, Value::Float(total_bw))
                                .unit("bytes/sec"),
                        );
                        out.push(
                            Sample::new("ib_total_pkts_bw", &tags, Value::Float(total_pkts_bw))
                                .unit("packets/sec"),
                        );
                    }
                }
                current.insert(key.to_string(), raw);
            }
        }
        Ok(())
    }
}

impl Collector for Ibstat {
    fn name(&self) -> &'static str {
        "ibstat"
    }

    fn collect(
        &mut self,
        files: &mut dyn Files,
        now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        let seconds = self
            .previous_ns
            .and_then(|old| seconds_between(old, now_ns));
        let mut current = BTreeMap::new();
        // A round that fails keeps the previous baseline: the next one counts from it.
        self.round(files, seconds, &mut current, out)?;
        self.previous = current;
        self.previous_ns = Some(now_ns);
        Ok(())
    }
}
