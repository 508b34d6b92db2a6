//! `nvidia`: NVIDIA GPUs and their MIG devices through NVML, as cc-metric-collector's
//! `nvidia` collector sends them: `type=accelerator`, `type-id` the NVML index (or the PCI
//! address with `use_pci_info_as_type_id`), MIG devices with `stype=mig` and `stype-id` their
//! index (or UUID, or slice name), NVLink counters with `stype=nvlink`.
//!
//! A plugin cannot call NVML (a native library): the agent reads it on the plugin's behalf
//! through `cc:fleet/nvml` when the plugin's configuration grants `capabilities.nvml`, and
//! this collector gets the readings through [`Gpus`]. Natively (tests, benchmarks) any
//! [`Gpus`] will do.
//!
//! Every value NVML does not give is left out, as cc-metric-collector leaves it out; the
//! round fails only when NVML itself cannot be reached (not granted, no library on the
//! node). Differences from cc-metric-collector:
//!
//! - `nv_remapped_rows_uncorrected` carries the uncorrected rows (cc-metric-collector sends
//!   them under the name `nv_remapped_rows_corrected`, a second point of that name);
//! - `exclude_metrics` leaves out each of `nv_energy`, `nv_energy_abs` and
//!   `nv_average_power` alone (cc-metric-collector sends none of the three when one is
//!   excluded), and `nv_average_power` is left out for a round shorter than a second
//!   (where cc-metric-collector divides by zero);
//! - an energy counter that went backwards (a driver reload) starts a new baseline instead
//!   of sending a wrapped difference;
//! - the `nv_nvlink_*_sum` points are sent for GPUs, not for MIG devices (NVML has no
//!   NVLinks for those, and cc-metric-collector's `stype=nvlink` overwrote their `stype=mig`);
//! - the meta values `add_uuid_meta`, `add_board_number_meta` and `add_serial_meta` add
//!   (`uuid`, `board_number`, `serial`) are sent as tags when `meta_as_tags` names them, as
//!   a cc-metric-collector sink with that setting does; otherwise they go nowhere, as in
//!   cc-metric-collector's default sinks;
//! - GPUs and MIG devices are listed every round rather than once at start, so a GPU whose
//!   MIG layout changed is measured as it is now.

use alloc::borrow::ToOwned;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::{Sample, Value};

/// The PCI location of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PciLocation {
    /// The PCI domain.
    pub domain: u32,
    /// The bus.
    pub bus: u32,
    /// The device on the bus.
    pub device: u32,
}

impl PciLocation {
    /// The address as NVML writes it (`NVML_DEVICE_PCI_BUS_ID_FMT`), e.g. `00000000:1B:00.0`.
    pub fn bus_id(&self) -> String {
        format!("{:08X}:{:02X}:{:02X}.0", self.domain, self.bus, self.device)
    }
}

/// A MIG device of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MigDevice {
    /// Its index on its GPU.
    pub index: u32,
    /// Its name, e.g. `NVIDIA A100-SXM4-40GB MIG 1g.5gb`.
    pub name: Option<String>,
    /// Its UUID.
    pub uuid: Option<String>,
}

/// One GPU.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuDevice {
    /// Its NVML index.
    pub index: u32,
    /// Its name.
    pub name: Option<String>,
    /// Its UUID.
    pub uuid: Option<String>,
    /// Its serial number.
    pub serial: Option<String>,
    /// Its board part number.
    pub board_part_number: Option<String>,
    /// Its PCI location; a GPU without one is not measured (as in cc-metric-collector).
    pub pci: Option<PciLocation>,
    /// Whether MIG mode is enabled.
    pub mig_enabled: Option<bool>,
    /// Its MIG devices, when asked for and MIG is enabled.
    pub mig_devices: Vec<MigDevice>,
}

/// Total and used bytes of a memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Memory {
    /// All of it.
    pub total: u64,
    /// What is used.
    pub used: u64,
}

/// The pending ECC mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EccMode {
    /// On.
    Enabled,
    /// Off.
    Disabled,
    /// Another state.
    Unknown,
    /// No ECC on the device.
    NotSupported,
}

/// Clocks in MHz.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Clocks {
    /// Graphics.
    pub graphics: Option<u32>,
    /// Streaming multiprocessors.
    pub sm: Option<u32>,
    /// Memory.
    pub memory: Option<u32>,
    /// Video encoder/decoder.
    pub video: Option<u32>,
}

/// Remapped rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemappedRows {
    /// For correctable errors.
    pub corrected: u32,
    /// For uncorrectable errors.
    pub uncorrected: u32,
    /// A remapping waits for a reset.
    pub pending: bool,
    /// A remapping failed.
    pub failure: bool,
}

/// Clock throttling times in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Violations {
    /// Power.
    pub power: Option<u64>,
    /// Temperature.
    pub thermal: Option<u64>,
    /// Sync boost.
    pub sync_boost: Option<u64>,
    /// The board limit.
    pub board_limit: Option<u64>,
    /// Low utilization.
    pub low_utilization: Option<u64>,
    /// Board reliability.
    pub reliability: Option<u64>,
    /// Below application clocks.
    pub below_app_clocks: Option<u64>,
    /// Below base clocks.
    pub below_base_clocks: Option<u64>,
}

/// Error counters of one active NVLink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Nvlink {
    /// The link number.
    pub link: u32,
    /// Data CRC errors.
    pub crc_data: Option<u64>,
    /// Data ECC errors.
    pub ecc_data: Option<u64>,
    /// Replays.
    pub replay: Option<u64>,
    /// Recoveries.
    pub recovery: Option<u64>,
    /// Flow control digit CRC errors.
    pub crc_flit: Option<u64>,
}

/// Everything read from one GPU or MIG device; what NVML did not give is `None`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Readings {
    /// Frame buffer memory.
    pub memory: Option<Memory>,
    /// BAR1 memory.
    pub bar1_memory: Option<Memory>,
    /// GPU and memory utilization in percent.
    pub utilization: Option<(u32, u32)>,
    /// Degrees Celsius.
    pub temperature: Option<u32>,
    /// Percent.
    pub fan_speed: Option<u32>,
    /// The pending ECC mode.
    pub ecc_mode: Option<EccMode>,
    /// The performance state.
    pub performance_state: Option<u32>,
    /// Whether power management is enabled.
    pub power_management: Option<bool>,
    /// Milliwatts.
    pub power_usage: Option<u32>,
    /// Millijoules since the driver was loaded.
    pub total_energy: Option<u64>,
    /// Current clocks.
    pub clocks: Clocks,
    /// Maximum clocks.
    pub max_clocks: Clocks,
    /// Uncorrected ECC errors.
    pub ecc_uncorrected: Option<u64>,
    /// Corrected ECC errors.
    pub ecc_corrected: Option<u64>,
    /// Milliwatts.
    pub power_limit: Option<u32>,
    /// Percent.
    pub encoder_utilization: Option<u32>,
    /// Percent.
    pub decoder_utilization: Option<u32>,
    /// Remapped rows.
    pub remapped_rows: Option<RemappedRows>,
    /// Processes with a compute context.
    pub compute_processes: Option<u32>,
    /// Processes with a graphics context.
    pub graphics_processes: Option<u32>,
    /// Throttling times.
    pub violations: Violations,
    /// Active NVLinks.
    pub nvlinks: Vec<Nvlink>,
}

/// Where the GPUs are read from: the agent's `cc:fleet/nvml` in a plugin, recorded values
/// natively.
pub trait Gpus {
    /// The GPUs, with their MIG devices when `mig` is true.
    fn devices(&mut self, mig: bool) -> Result<Vec<GpuDevice>, String>;
    /// The readings of GPU `device`, or of its MIG device `mig`.
    fn read(&mut self, device: u32, mig: Option<u32>) -> Result<Readings, String>;
}

/// A collector of what [`Gpus`] report.
pub trait GpuCollector {
    /// The collector's name as cc-metric-collector spells it.
    fn name(&self) -> &'static str;

    /// One collection round at `now_ns` (Unix nanoseconds).
    fn collect(
        &mut self,
        gpus: &mut dyn Gpus,
        now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String>;
}

/// Settings, by cc-metric-collector's names.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Config {
    /// `exclude_devices`: NVML indexes (`"0"`) or PCI addresses (`00000000:1B:00.0`).
    pub exclude_devices: Vec<String>,
    /// `exclude_metrics` (from the shared settings): besides leaving the metric out, an
    /// excluded `nv_nvlink_*` also leaves out its `_sum`.
    pub exclude_metrics: Vec<String>,
    /// `process_mig_devices`: measure MIG devices too.
    pub process_mig_devices: bool,
    /// `use_pci_info_as_type_id`: the PCI address as `type-id`.
    pub use_pci_info_as_type_id: bool,
    /// `add_pci_info_tag`: the PCI address as tag `pci_identifier` (unless it is the
    /// `type-id` already).
    pub add_pci_info_tag: bool,
    /// `add_uuid_meta`: the `uuid` meta.
    pub add_uuid_meta: bool,
    /// `add_board_number_meta`: the `board_number` meta.
    pub add_board_number_meta: bool,
    /// `add_serial_meta`: the `serial` meta.
    pub add_serial_meta: bool,
    /// `use_uuid_for_mig_device`: a MIG device's UUID as its `stype-id`.
    pub use_uuid_for_mig_device: bool,
    /// `use_slice_for_mig_device`: a MIG device's slice name (`1g.5gb`) as its `stype-id`.
    pub use_slice_for_mig_device: bool,
    /// Meta keys sent as tags (from the shared `meta_as_tags`).
    pub meta_as_tags: Vec<String>,
}

/// The collector.
#[derive(Debug, Clone, Default)]
pub struct Nvidia {
    config: Config,
    /// The last energy reading (mJ) and when, by GPU and MIG device.
    energy: BTreeMap<(u32, Option<u32>), (u64, i64)>,
}

/// A device being measured: its tags, meta and readings.
struct Target<'a> {
    tags: Vec<(String, String)>,
    meta: Vec<(&'static str, String)>,
    readings: &'a Readings,
    is_mig: bool,
}

impl Nvidia {
    /// A collector with `config`.
    pub fn new(config: Config) -> Nvidia {
        Nvidia {
            config,
            energy: BTreeMap::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Sets the shared settings this collector reads itself.
    pub fn set_common(&mut self, exclude_metrics: &[String], meta_as_tags: &[String]) {
        self.config.exclude_metrics = exclude_metrics.to_vec();
        self.config.meta_as_tags = meta_as_tags.to_vec();
    }

    fn excluded(&self, metric: &str) -> bool {
        self.config.exclude_metrics.iter().any(|m| m == metric)
    }

    /// A GPU's tags and meta.
    fn gpu_tags<'a>(&self, gpu: &GpuDevice, pci_id: &str, readings: &'a Readings) -> Target<'a> {
        let c = &self.config;
        let type_id = if c.use_pci_info_as_type_id {
            pci_id.to_owned()
        } else {
            gpu.index.to_string()
        };
        let mut tags = alloc::vec![
            ("type".to_owned(), "accelerator".to_owned()),
            ("type-id".to_owned(), type_id),
        ];
        if c.add_pci_info_tag && !c.use_pci_info_as_type_id {
            tags.push(("pci_identifier".to_owned(), pci_id.to_owned()));
        }
        let mut meta = Vec::new();
        if c.add_board_number_meta
            && let Some(board) = &gpu.board_part_number
        {
            meta.push(("board_number", board.clone()));
        }
        if c.add_serial_meta
            && let Some(serial) = &gpu.serial
        {
            meta.push(("serial", serial.clone()));
        }
        if c.add_uuid_meta
            && let Some(uuid) = &gpu.uuid
        {
            meta.push(("uuid", uuid.clone()));
        }
        Target {
            tags,
            meta,
            readings,
            is_mig: false,
        }
    }

    /// A MIG device's tags and meta, from its GPU's.
    fn mig_tags<'a>(
        &self,
        gpu: &GpuDevice,
        parent: &Target<'_>,
        mig: &MigDevice,
        readings: &'a Readings,
    ) -> Target<'a> {
        let c = &self.config;
        let mut tags = parent.tags.clone();
        tags.push(("stype".to_owned(), "mig".to_owned()));
        let mut stype_id = None;
        if c.use_uuid_for_mig_device {
            stype_id = mig.uuid.clone();
        } else if c.use_slice_for_mig_device
            && let (Some(gpu_name), Some(mig_name)) = (&gpu.name, &mig.name)
        {
            stype_id = Some(
                mig_name
                    .replace(gpu_name.as_str(), "")
                    .replace("MIG", "")
                    .trim()
                    .to_owned(),
            );
        }
        tags.push((
            "stype-id".to_owned(),
            stype_id.unwrap_or_else(|| mig.index.to_string()),
        ));
        let mut meta = parent.meta.clone();
        if !c.use_uuid_for_mig_device
            && let Some(uuid) = &mig.uuid
            && let Some(slot) = meta.iter_mut().find(|(k, _)| *k == "uuid")
        {
            slot.1 = uuid.clone();
        }
        Target {
            tags,
            meta,
            readings,
            is_mig: true,
        }
    }

    /// Appends the samples of one device.
    fn samples(
        &mut self,
        key: (u32, Option<u32>),
        t: &Target<'_>,
        now_ns: i64,
        out: &mut Vec<Sample>,
    ) {
        let mut tags = t.tags.clone();
        for (k, v) in &t.meta {
            if self.config.meta_as_tags.iter().any(|m| m == k) {
                tags.push(((*k).to_owned(), v.clone()));
            }
        }
        let sample = |name: &str, value: Value, unit: Option<&str>| Sample {
            name: name.to_owned(),
            tags: tags.clone(),
            unit: unit.map(str::to_owned),
            value,
        };
        let r = t.readings;
        let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
        let float = |v: u32| Value::Float(f64::from(v));
        if let Some(m) = r.memory {
            out.push(sample(
                "nv_fb_mem_total",
                Value::Float(mib(m.total)),
                Some("MByte"),
            ));
            out.push(sample(
                "nv_fb_mem_used",
                Value::Float(mib(m.used)),
                Some("MByte"),
            ));
        }
        if !t.is_mig
            && let Some((gpu, memory)) = r.utilization
        {
            out.push(sample("nv_util", float(gpu), Some("%")));
            out.push(sample("nv_mem_util", float(memory), Some("%")));
        }
        if let Some(v) = r.temperature {
            out.push(sample("nv_temp", float(v), Some("degC")));
        }
        if let Some(v) = r.fan_speed {
            out.push(sample("nv_fan", float(v), Some("%")));
        }
        if let Some(mode) = r.ecc_mode {
            let text = match mode {
                EccMode::Enabled => "ON",
                EccMode::Disabled => "OFF",
                EccMode::Unknown => "UNKNOWN",
                EccMode::NotSupported => "N/A",
            };
            out.push(sample("nv_ecc_mode", Value::Str(text.to_owned()), None));
        }
        if let Some(p) = r.performance_state {
            out.push(sample("nv_perf_state", Value::Str(format!("P{p}")), None));
        }
        let power_managed = r.power_management == Some(true);
        if power_managed && let Some(mw) = r.power_usage {
            out.push(sample(
                "nv_power_usage",
                Value::Float(f64::from(mw) / 1000.0),
                Some("watts"),
            ));
        }
        if power_managed && let Some(energy) = r.total_energy {
            if let Some((last, last_ns)) = self.energy.get(&key).copied()
                && let Some(diff) = energy.checked_sub(last)
            {
                let joules = diff / 1000;
                out.push(sample("nv_energy", Value::Uint(joules), Some("Joules")));
                // Whole seconds, as cc-metric-collector divides (a shorter round has none).
                let seconds =
                    u64::try_from(now_ns.saturating_sub(last_ns)).unwrap_or(0) / 1_000_000_000;
                if let Some(watts) = joules.checked_div(seconds) {
                    out.push(sample(
                        "nv_average_power",
                        Value::Uint(watts),
                        Some("watts"),
                    ));
                }
            }
            out.push(sample(
                "nv_energy_abs",
                Value::Uint(energy / 1000),
                Some("Joules"),
            ));
            self.energy.insert(key, (energy, now_ns));
        }
        let clocks = [
            ("nv_graphics_clock", r.clocks.graphics),
            ("nv_sm_clock", r.clocks.sm),
            ("nv_mem_clock", r.clocks.memory),
            ("nv_video_clock", r.clocks.video),
            ("nv_max_graphics_clock", r.max_clocks.graphics),
            ("nv_max_sm_clock", r.max_clocks.sm),
            ("nv_max_mem_clock", r.max_clocks.memory),
            ("nv_max_video_clock", r.max_clocks.video),
        ];
        for (name, value) in clocks {
            if let Some(v) = value {
                out.push(sample(name, float(v), Some("MHz")));
            }
        }
        if let Some(v) = r.ecc_uncorrected {
            out.push(sample(
                "nv_ecc_uncorrected_error",
                Value::Float(v as f64),
                None,
            ));
        }
        if let Some(v) = r.ecc_corrected {
            out.push(sample(
                "nv_ecc_corrected_error",
                Value::Float(v as f64),
                None,
            ));
        }
        if let Some(mw) = r.power_limit {
            out.push(sample(
                "nv_power_max_limit",
                Value::Float(f64::from(mw) / 1000.0),
                Some("watts"),
            ));
        }
        if !t.is_mig {
            if let Some(v) = r.encoder_utilization {
                out.push(sample("nv_encoder_util", float(v), Some("%")));
            }
            if let Some(v) = r.decoder_utilization {
                out.push(sample("nv_decoder_util", float(v), Some("%")));
            }
        }
        if let Some(rows) = r.remapped_rows {
            out.push(sample(
                "nv_remapped_rows_corrected",
                float(rows.corrected),
                None,
            ));
            out.push(sample(
                "nv_remapped_rows_uncorrected",
                float(rows.uncorrected),
                None,
            ));
            out.push(sample(
                "nv_remapped_rows_pending",
                Value::Int(i64::from(rows.pending)),
                None,
            ));
            out.push(sample(
                "nv_remapped_rows_failure",
                Value::Int(i64::from(rows.failure)),
                None,
            ));
        }
        if let Some(m) = r.bar1_memory {
            out.push(sample(
                "nv_bar1_mem_total",
                Value::Float(mib(m.total)),
                Some("MByte"),
            ));
            out.push(sample(
                "nv_bar1_mem_used",
                Value::Float(mib(m.used)),
                Some("MByte"),
            ));
        }
        if let Some(n) = r.compute_processes {
            out.push(sample(
                "nv_compute_processes",
                Value::Int(i64::from(n)),
                None,
            ));
        }
        if let Some(n) = r.graphics_processes {
            out.push(sample(
                "nv_graphics_processes",
                Value::Int(i64::from(n)),
                None,
            ));
        }
        let v = &r.violations;
        let violations = [
            ("nv_violation_power", v.power),
            ("nv_violation_thermal", v.thermal),
            ("nv_violation_sync_boost", v.sync_boost),
            ("nv_violation_board_limit", v.board_limit),
            ("nv_violation_low_util", v.low_utilization),
            ("nv_violation_reliability", v.reliability),
            ("nv_violation_below_app_clock", v.below_app_clocks),
            ("nv_violation_below_base_clock", v.below_base_clocks),
        ];
        for (name, value) in violations {
            if let Some(ns) = value {
                out.push(sample(name, Value::Float(ns as f64 * 1e-9), Some("sec")));
            }
        }
        if !t.is_mig {
            type Counter = fn(&Nvlink) -> Option<u64>;
            let counters: [(&str, Counter); 5] = [
                ("nv_nvlink_crc_errors", |l| l.crc_data),
                ("nv_nvlink_ecc_errors", |l| l.ecc_data),
                ("nv_nvlink_replay_errors", |l| l.replay),
                ("nv_nvlink_recovery_errors", |l| l.recovery),
                ("nv_nvlink_crc_flit_errors", |l| l.crc_flit),
            ];
            let mut sums = [0u64; 5];
            for link in &r.nvlinks {
                let id = link.link.to_string();
                for (i, (name, get)) in counters.iter().enumerate() {
                    if let Some(count) = get(link) {
                        sums[i] = sums[i].wrapping_add(count);
                        let mut s = sample(name, Value::Uint(count), None);
                        s.tags.push(("stype".to_owned(), "nvlink".to_owned()));
                        s.tags.push(("stype-id".to_owned(), id.clone()));
                        out.push(s);
                    }
                }
            }
            for (i, (name, _)) in counters.iter().enumerate() {
                if !self.excluded(name) {
                    let mut s = sample(&format!("{name}_sum"), Value::Uint(sums[i]), None);
                    s.tags.push(("stype".to_owned(), "nvlink".to_owned()));
                    out.push(s);
                }
            }
        }
    }
}

impl GpuCollector for Nvidia {
    fn name(&self) -> &'static str {
        "nvidia"
    }

    fn collect(
        &mut self,
        gpus: &mut dyn Gpus,
        now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        let mig = self.config.process_mig_devices;
        let devices = gpus.devices(mig)?;
        let mut seen = Vec::new();
        for gpu in &devices {
            let index = gpu.index.to_string();
            if self.config.exclude_devices.contains(&index) {
                continue;
            }
            // A GPU without its PCI address is left out, as cc-metric-collector leaves it.
            let Some(pci) = gpu.pci else {
                continue;
            };
            let pci_id = pci.bus_id();
            if self.config.exclude_devices.contains(&pci_id) {
                continue;
            }
            // A GPU that cannot be read this round is left out of it, as are its values
            // NVML does not give; the others are still measured.
            let Ok(readings) = gpus.read(gpu.index, None) else {
                continue;
            };
            let target = self.gpu_tags(gpu, &pci_id, &readings);
            seen.push((gpu.index, None));
            self.samples((gpu.index, None), &target, now_ns, out);
            if !mig || gpu.mig_enabled != Some(true) {
                continue;
            }
            for m in &gpu.mig_devices {
                let Ok(mig_readings) = gpus.read(gpu.index, Some(m.index)) else {
                    continue;
                };
                let mig_target = self.mig_tags(gpu, &target, m, &mig_readings);
                seen.push((gpu.index, Some(m.index)));
                self.samples((gpu.index, Some(m.index)), &mig_target, now_ns, out);
            }
        }
        // Devices that are gone lose their energy baseline.
        self.energy.retain(|key, _| seen.contains(key));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Recorded {
        devices: Vec<GpuDevice>,
        readings: BTreeMap<(u32, Option<u32>), Readings>,
    }

    impl Gpus for Recorded {
        fn devices(&mut self, mig: bool) -> Result<Vec<GpuDevice>, String> {
            let mut devices = self.devices.clone();
            if !mig {
                for d in &mut devices {
                    d.mig_devices.clear();
                }
            }
            Ok(devices)
        }

        fn read(&mut self, device: u32, mig: Option<u32>) -> Result<Readings, String> {
            self.readings
                .get(&(device, mig))
                .cloned()
                .ok_or_else(|| "no such device".to_owned())
        }
    }

    fn recorded() -> Recorded {
        let gpu = GpuDevice {
            index: 0,
            name: Some("NVIDIA A100-SXM4-40GB".to_owned()),
            uuid: Some("GPU-1".to_owned()),
            pci: Some(PciLocation {
                domain: 0,
                bus: 0xbd,
                device: 0,
            }),
            mig_enabled: Some(true),
            mig_devices: alloc::vec![MigDevice {
                index: 3,
                name: Some("NVIDIA A100-SXM4-40GB MIG 1g.5gb".to_owned()),
                uuid: Some("MIG-1".to_owned()),
            }],
            ..GpuDevice::default()
        };
        let mut readings = BTreeMap::new();
        readings.insert(
            (0, None),
            Readings {
                power_management: Some(true),
                total_energy: Some(5_000_000),
                utilization: Some((10, 20)),
                ..Readings::default()
            },
        );
        readings.insert(
            (0, Some(3)),
            Readings {
                temperature: Some(40),
                utilization: Some((99, 99)),
                ..Readings::default()
            },
        );
        Recorded {
            devices: alloc::vec![gpu],
            readings,
        }
    }

    fn names(out: &[Sample]) -> Vec<&str> {
        out.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn the_pci_address_is_written_as_nvml_writes_it() {
        let pci = PciLocation {
            domain: 0,
            bus: 0x1b,
            device: 3,
        };
        assert_eq!(pci.bus_id(), "00000000:1B:03.0");
    }

    #[test]
    fn mig_devices_get_their_slice_and_no_utilization() {
        let mut nvidia = Nvidia::new(Config {
            process_mig_devices: true,
            use_slice_for_mig_device: true,
            ..Config::default()
        });
        let mut out = Vec::new();
        nvidia
            .collect(&mut recorded(), 1_000_000_000, &mut out)
            .unwrap();
        let mig: Vec<&Sample> = out
            .iter()
            .filter(|s| s.tags.iter().any(|(k, v)| k == "stype" && v == "mig"))
            .collect();
        assert_eq!(mig.len(), 1, "{out:?}");
        assert_eq!(mig[0].name, "nv_temp");
        assert!(
            mig[0]
                .tags
                .contains(&("stype-id".to_owned(), "1g.5gb".to_owned()))
        );
        assert!(names(&out).contains(&"nv_util"));
    }

    #[test]
    fn energy_gives_a_difference_from_the_second_round_and_a_reset_rebaselines() {
        let mut gpus = recorded();
        let mut nvidia = Nvidia::new(Config::default());
        let mut out = Vec::new();
        nvidia.collect(&mut gpus, 1_000_000_000, &mut out).unwrap();
        assert!(!names(&out).contains(&"nv_energy"));
        assert!(names(&out).contains(&"nv_energy_abs"));
        gpus.readings.get_mut(&(0, None)).unwrap().total_energy = Some(5_600_000);
        out.clear();
        nvidia.collect(&mut gpus, 3_500_000_000, &mut out).unwrap();
        let get =
            |out: &[Sample], n: &str| out.iter().find(|s| s.name == n).map(|s| s.value.clone());
        assert_eq!(get(&out, "nv_energy"), Some(Value::Uint(600)));
        assert_eq!(get(&out, "nv_average_power"), Some(Value::Uint(300)));
        gpus.readings.get_mut(&(0, None)).unwrap().total_energy = Some(100);
        out.clear();
        nvidia.collect(&mut gpus, 5_000_000_000, &mut out).unwrap();
        assert_eq!(get(&out, "nv_energy"), None);
        assert_eq!(get(&out, "nv_energy_abs"), Some(Value::Uint(0)));
    }

    #[test]
    fn excluded_devices_by_index_or_pci_address_are_not_read() {
        for excluded in ["0", "00000000:BD:00.0"] {
            let mut nvidia = Nvidia::new(Config {
                exclude_devices: alloc::vec![excluded.to_owned()],
                ..Config::default()
            });
            let mut out = Vec::new();
            nvidia.collect(&mut recorded(), 1, &mut out).unwrap();
            assert!(out.is_empty(), "{excluded}: {out:?}");
        }
    }
}
