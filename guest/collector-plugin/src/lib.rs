//! The plugin side of the collectors: [`CollectorPlugin`] runs a collector of
//! `ccfleet-collectors` inside a ccfleet plugin, and [`export_collector!`] exports it.
//!
//! The plugin's `init` configuration holds cc-metric-collector's keys for the collector plus
//! `hostname`, `cluster`, `exclude_metrics` and `meta_as_tags` (default `["unit"]`); the
//! service configuration may add tags under `{"<collector>": {"tags": {...}}}`, applied live.
//! Files are read through the agent's `cc:fleet/files`, which maps them under the plugin's
//! `capabilities.files-root` when one is set (fixtures), so the collector always asks for
//! `/proc/...` and `/sys/...`.
//!
//! Collectors of what commands report ([`CommandCollector`]) run the commands of the
//! plugin's `capabilities.run` through the agent's `cc:fleet/commands` ([`HostCommands`]),
//! exported with [`export_command_collector!`]. The GPU collector (`nvidia`) reads NVML
//! through the agent's `cc:fleet/nvml` ([`HostGpus`]), exported with
//! [`export_gpu_collector!`]; the AMD GPU collector (`rocm_smi`) reads ROCm SMI through the
//! agent's `cc:fleet/rocm-smi` ([`HostAmdGpus`]), exported with
//! [`export_amd_gpu_collector!`]. The performance counter collector (`likwid`) measures through
//! the agent's `cc:fleet/likwid` ([`HostCounters`]), exported with
//! [`export_counter_collector!`].
#![no_std]
#![warn(missing_docs)]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

use ccfleet_collectors::config::{FromOptions, Options, common, extra_tags};
use ccfleet_collectors::likwid::{self as lw, CounterCollector, Counters};
use ccfleet_collectors::nvidia::{self as nv, GpuCollector, Gpus};
use ccfleet_collectors::rocm_smi::{self as amd, AmdGpuCollector, AmdGpus};
use ccfleet_collectors::{
    Collector, CommandCollector, CommandOutput, Commands, Files, FsStats, Runner, Sample, Value,
};
use ccfleet_guest::lineproto::FieldRef;
use ccfleet_guest::{ConfigUpdate, Level, Lines, likwid, log, nvml, rocm_smi};

pub use ccfleet_guest;

/// [`Files`] through the agent's `cc:fleet/files`.
pub struct HostFiles;

impl Files for HostFiles {
    fn read(&mut self, path: &str) -> Result<String, String> {
        ccfleet_guest::read_to_string(path).map_err(|e| alloc::format!("cannot read {path}: {e}"))
    }

    fn list_dir(&mut self, path: &str) -> Result<Vec<String>, String> {
        ccfleet_guest::list_dir(path).map_err(|e| alloc::format!("cannot list {path}: {e}"))
    }

    fn statvfs(&mut self, path: &str) -> Result<FsStats, String> {
        let s = ccfleet_guest::statvfs(path)?;
        Ok(FsStats {
            block_size: s.block_size,
            blocks: s.blocks,
            blocks_free: s.blocks_free,
            blocks_available: s.blocks_available,
        })
    }
}

/// [`Commands`] through the agent's `cc:fleet/commands`.
pub struct HostCommands;

impl Commands for HostCommands {
    fn run(&mut self, name: &str) -> Result<CommandOutput, String> {
        let output = ccfleet_guest::commands::run(name)?;
        Ok(CommandOutput {
            status: output.status,
            stdout: output.stdout,
            stderr: output.stderr,
        })
    }
}

/// [`Gpus`] through the agent's `cc:fleet/nvml`.
pub struct HostGpus;

fn clocks(c: nvml::Clocks) -> nv::Clocks {
    nv::Clocks {
        graphics: c.graphics,
        sm: c.sm,
        memory: c.memory,
        video: c.video,
    }
}

fn memory(m: nvml::Memory) -> nv::Memory {
    nv::Memory {
        total: m.total,
        used: m.used,
    }
}

impl Gpus for HostGpus {
    fn devices(&mut self, mig: bool) -> Result<Vec<nv::GpuDevice>, String> {
        let devices = nvml::devices(mig)?;
        Ok(devices
            .into_iter()
            .map(|d| nv::GpuDevice {
                index: d.index,
                name: d.name,
                uuid: d.uuid,
                serial: d.serial,
                board_part_number: d.board_part_number,
                pci: d.pci.map(|p| nv::PciLocation {
                    domain: p.domain,
                    bus: p.bus,
                    device: p.device,
                }),
                mig_enabled: d.mig_enabled,
                mig_devices: d
                    .mig_devices
                    .into_iter()
                    .map(|m| nv::MigDevice {
                        index: m.index,
                        name: m.name,
                        uuid: m.uuid,
                    })
                    .collect(),
            })
            .collect())
    }

    fn read(&mut self, device: u32, mig: Option<u32>) -> Result<nv::Readings, String> {
        let r = nvml::read(device, mig)?;
        let v = r.violations;
        Ok(nv::Readings {
            memory: r.memory.map(memory),
            bar1_memory: r.bar1_memory.map(memory),
            utilization: r.utilization.map(|u| (u.gpu, u.memory)),
            temperature: r.temperature,
            fan_speed: r.fan_speed,
            ecc_mode: r.ecc_mode.map(|m| match m {
                nvml::EccMode::Enabled => nv::EccMode::Enabled,
                nvml::EccMode::Disabled => nv::EccMode::Disabled,
                nvml::EccMode::Unknown => nv::EccMode::Unknown,
                nvml::EccMode::NotSupported => nv::EccMode::NotSupported,
            }),
            performance_state: r.performance_state,
            power_management: r.power_management,
            power_usage: r.power_usage,
            total_energy: r.total_energy,
            clocks: clocks(r.clocks),
            max_clocks: clocks(r.max_clocks),
            ecc_uncorrected: r.ecc_uncorrected,
            ecc_corrected: r.ecc_corrected,
            power_limit: r.power_limit,
            encoder_utilization: r.encoder_utilization,
            decoder_utilization: r.decoder_utilization,
            remapped_rows: r.remapped_rows.map(|x| nv::RemappedRows {
                corrected: x.corrected,
                uncorrected: x.uncorrected,
                pending: x.pending,
                failure: x.failure,
            }),
            compute_processes: r.compute_processes,
            graphics_processes: r.graphics_processes,
            violations: nv::Violations {
                power: v.power,
                thermal: v.thermal,
                sync_boost: v.sync_boost,
                board_limit: v.board_limit,
                low_utilization: v.low_utilization,
                reliability: v.reliability,
                below_app_clocks: v.below_app_clocks,
                below_base_clocks: v.below_base_clocks,
            },
            nvlinks: r
                .nvlinks
                .into_iter()
                .map(|l| nv::Nvlink {
                    link: l.link,
                    crc_data: l.crc_data,
                    ecc_data: l.ecc_data,
                    replay: l.replay,
                    recovery: l.recovery,
                    crc_flit: l.crc_flit,
                })
                .collect(),
        })
    }
}

/// A collector as a plugin.
pub struct CollectorPlugin<C> {
    runner: Runner<C>,
    /// The round's points as line protocol, kept (empty) for the next round.
    lines: Lines,
}

/// Encodes a sample at `now_ns` into `lines`.
pub fn encode(lines: &mut Lines, sample: &Sample, now_ns: i64) -> Result<(), String> {
    let value = match &sample.value {
        Value::Float(v) => FieldRef::Float(*v),
        Value::Int(v) => FieldRef::Int(*v),
        Value::Uint(v) => FieldRef::Uint(*v),
        Value::Str(v) => FieldRef::Str(v),
    };
    lines.point(
        &sample.name,
        &sample.tags,
        &[("value", value)],
        Some(now_ns),
    )
}

impl<C: Collector + FromOptions> ccfleet_guest::Plugin for CollectorPlugin<C> {
    fn init(config: &str) -> Result<Self, String> {
        Ok(CollectorPlugin {
            runner: runner(config)?,
            lines: Lines::new(),
        })
    }

    fn on_config(&mut self, update: ConfigUpdate) -> Result<(), String> {
        apply_config(&mut self.runner, update)
    }

    fn collect(&mut self, now_ns: i64) -> Result<(), String> {
        let samples = self.runner.collect(&mut HostFiles, now_ns)?;
        emit(&mut self.lines, &samples, now_ns)
    }
}

/// The runner of a collector built from the plugin's `init` configuration.
fn runner<C: FromOptions>(config: &str) -> Result<Runner<C>, String> {
    let mut options = Options::parse(C::NAME, config)?;
    let shared = common(&mut options)?;
    let collector = C::from_options(&mut options)?.with_common(&shared);
    options.finish()?;
    let mut runner = Runner::wrap(shared, collector);
    let hostname = runner.hostname(&mut HostFiles)?;
    log!(Level::Info, "{} ready as host {hostname}", C::NAME);
    Ok(runner)
}

/// Applies a service configuration's extra tags to `runner`.
fn apply_config<C: FromOptions>(
    runner: &mut Runner<C>,
    update: ConfigUpdate,
) -> Result<(), String> {
    let Some(text) = update.config else {
        return Ok(());
    };
    let tags = extra_tags(C::NAME, &text)?;
    if tags != runner.common.extra_tags {
        let shown: Vec<String> = tags
            .iter()
            .map(|(k, v)| alloc::format!("{k}={v}"))
            .collect();
        log!(
            Level::Info,
            "config revision {}: extra tags [{}]",
            update.revision,
            shown.join(", ")
        );
        runner.common.extra_tags = tags;
    }
    Ok(())
}

/// Encodes a round's samples into `lines` and emits them; nothing is emitted when one
/// cannot be encoded.
fn emit(lines: &mut Lines, samples: &[Sample], now_ns: i64) -> Result<(), String> {
    for sample in samples {
        if let Err(reason) = encode(lines, sample, now_ns) {
            lines.clear();
            return Err(reason);
        }
    }
    lines.emit()
}

/// A command collector as a plugin.
pub struct CommandCollectorPlugin<C> {
    runner: Runner<C>,
    /// The round's points as line protocol, kept (empty) for the next round.
    lines: Lines,
}

impl<C: CommandCollector + FromOptions> ccfleet_guest::Plugin for CommandCollectorPlugin<C> {
    fn init(config: &str) -> Result<Self, String> {
        Ok(CommandCollectorPlugin {
            runner: runner(config)?,
            lines: Lines::new(),
        })
    }

    fn on_config(&mut self, update: ConfigUpdate) -> Result<(), String> {
        apply_config(&mut self.runner, update)
    }

    fn collect(&mut self, now_ns: i64) -> Result<(), String> {
        let samples = self
            .runner
            .collect_commands(&mut HostCommands, &mut HostFiles, now_ns)?;
        emit(&mut self.lines, &samples, now_ns)
    }
}

/// A GPU collector as a plugin.
pub struct GpuCollectorPlugin<C> {
    runner: Runner<C>,
    /// The round's points as line protocol, kept (empty) for the next round.
    lines: Lines,
}

impl<C: GpuCollector + FromOptions> ccfleet_guest::Plugin for GpuCollectorPlugin<C> {
    fn init(config: &str) -> Result<Self, String> {
        Ok(GpuCollectorPlugin {
            runner: runner(config)?,
            lines: Lines::new(),
        })
    }

    fn on_config(&mut self, update: ConfigUpdate) -> Result<(), String> {
        apply_config(&mut self.runner, update)
    }

    fn collect(&mut self, now_ns: i64) -> Result<(), String> {
        let samples = self
            .runner
            .collect_gpus(&mut HostGpus, &mut HostFiles, now_ns)?;
        emit(&mut self.lines, &samples, now_ns)
    }
}

/// Exports a GPU collector type of `ccfleet-collectors` as this component's plugin:
/// `ccfleet_collector_plugin::export_gpu_collector!(ccfleet_collectors::nvidia::Nvidia);`.
#[macro_export]
macro_rules! export_gpu_collector {
    ($collector:ty) => {
        type __Exported = $crate::GpuCollectorPlugin<$collector>;
        $crate::ccfleet_guest::export_plugin!(__Exported);
    };
}

/// [`AmdGpus`] through the agent's `cc:fleet/rocm-smi`.
pub struct HostAmdGpus;

impl AmdGpus for HostAmdGpus {
    fn devices(&mut self) -> Result<Vec<amd::AmdGpu>, String> {
        Ok(rocm_smi::devices()?
            .into_iter()
            .map(|d| amd::AmdGpu {
                index: d.index,
                pci: d.pci.map(|p| amd::PciAddress {
                    domain: p.domain,
                    bus: p.bus,
                    device: p.device,
                    function: p.function,
                }),
                serial: d.serial,
            })
            .collect())
    }

    fn read(&mut self, device: u32) -> Result<amd::GpuMetrics, String> {
        let m = rocm_smi::read(device)?;
        Ok(amd::GpuMetrics {
            temperature_edge: m.temperature_edge,
            temperature_hotspot: m.temperature_hotspot,
            temperature_mem: m.temperature_mem,
            temperature_vrgfx: m.temperature_vrgfx,
            temperature_vrsoc: m.temperature_vrsoc,
            temperature_vrmem: m.temperature_vrmem,
            average_gfx_activity: m.average_gfx_activity,
            average_umc_activity: m.average_umc_activity,
            average_mm_activity: m.average_mm_activity,
            average_socket_power: m.average_socket_power,
            average_gfxclk_frequency: m.average_gfxclk_frequency,
            average_socclk_frequency: m.average_socclk_frequency,
            average_uclk_frequency: m.average_uclk_frequency,
            average_vclk0_frequency: m.average_vclk0_frequency,
            average_vclk1_frequency: m.average_vclk1_frequency,
            average_dclk0_frequency: m.average_dclk0_frequency,
            average_dclk1_frequency: m.average_dclk1_frequency,
            temperature_hbm: m.temperature_hbm,
        })
    }
}

/// An AMD GPU collector as a plugin.
pub struct AmdGpuCollectorPlugin<C> {
    runner: Runner<C>,
    /// The round's points as line protocol, kept (empty) for the next round.
    lines: Lines,
}

impl<C: AmdGpuCollector + FromOptions> ccfleet_guest::Plugin for AmdGpuCollectorPlugin<C> {
    fn init(config: &str) -> Result<Self, String> {
        Ok(AmdGpuCollectorPlugin {
            runner: runner(config)?,
            lines: Lines::new(),
        })
    }

    fn on_config(&mut self, update: ConfigUpdate) -> Result<(), String> {
        apply_config(&mut self.runner, update)
    }

    fn collect(&mut self, now_ns: i64) -> Result<(), String> {
        let samples =
            self.runner
                .collect_amd_gpus(&mut HostAmdGpus, &mut HostFiles, &mut |message| {
                    log!(Level::Warn, "{message}")
                })?;
        emit(&mut self.lines, &samples, now_ns)
    }
}

/// Exports an AMD GPU collector type of `ccfleet-collectors` as this component's plugin:
/// `ccfleet_collector_plugin::export_amd_gpu_collector!(ccfleet_collectors::rocm_smi::RocmSmi);`.
#[macro_export]
macro_rules! export_amd_gpu_collector {
    ($collector:ty) => {
        type __Exported = $crate::AmdGpuCollectorPlugin<$collector>;
        $crate::ccfleet_guest::export_plugin!(__Exported);
    };
}

/// Exports a command collector type of `ccfleet-collectors` as this component's plugin:
/// `ccfleet_collector_plugin::export_command_collector!(ccfleet_collectors::ipmistat::Ipmistat);`.
#[macro_export]
macro_rules! export_command_collector {
    ($collector:ty) => {
        type __Exported = $crate::CommandCollectorPlugin<$collector>;
        $crate::ccfleet_guest::export_plugin!(__Exported);
    };
}

/// Exports a collector type of `ccfleet-collectors` as this component's plugin:
/// `ccfleet_collector_plugin::export_collector!(ccfleet_collectors::cpustat::Cpustat);`.
#[macro_export]
macro_rules! export_collector {
    ($collector:ty) => {
        type __Exported = $crate::CollectorPlugin<$collector>;
        $crate::ccfleet_guest::export_plugin!(__Exported);
    };
}

/// [`Counters`] through the agent's `cc:fleet/likwid`.
pub struct HostCounters;

fn likwid_metric(m: &lw::Metric) -> likwid::Metric {
    likwid::Metric {
        name: m.name.clone(),
        calc: m.calc.clone(),
        scope: m.scope.clone(),
    }
}

impl Counters for HostCounters {
    fn measure(&mut self, config: &lw::Config) -> Result<lw::Round, String> {
        let setup = likwid::Setup {
            event_sets: config
                .event_sets
                .iter()
                .map(|s| likwid::EventSet {
                    events: s.events.clone(),
                    metrics: s.metrics.iter().map(likwid_metric).collect(),
                })
                .collect(),
            global_metrics: config.global_metrics.iter().map(likwid_metric).collect(),
            access_mode: match config.access_mode {
                lw::AccessMode::Direct => likwid::AccessMode::Direct,
                lw::AccessMode::AccessDaemon => likwid::AccessMode::Accessdaemon,
                lw::AccessMode::PerfEvent => likwid::AccessMode::PerfEvent,
            },
            lockfile_path: config.lockfile_path.clone(),
            force_overwrite: config.force_overwrite,
            invalid_to_zero: config.invalid_to_zero,
            duration_ns: config.duration_ns,
            keep_counting: config.keep_counting,
        };
        let round = likwid::measure(&setup)?;
        Ok(lw::Round {
            values: round
                .values
                .into_iter()
                .map(|v| lw::MetricValue {
                    metric: v.metric,
                    scope: v.scope,
                    scope_id: v.scope_id,
                    value: v.value,
                })
                .collect(),
            skipped: round.skipped,
        })
    }
}

/// A performance counter collector as a plugin.
pub struct CounterCollectorPlugin<C> {
    runner: Runner<C>,
    /// The round's points as line protocol, kept (empty) for the next round.
    lines: Lines,
}

impl<C: CounterCollector + FromOptions> ccfleet_guest::Plugin for CounterCollectorPlugin<C> {
    fn init(config: &str) -> Result<Self, String> {
        Ok(CounterCollectorPlugin {
            runner: runner(config)?,
            lines: Lines::new(),
        })
    }

    fn on_config(&mut self, update: ConfigUpdate) -> Result<(), String> {
        apply_config(&mut self.runner, update)
    }

    fn collect(&mut self, now_ns: i64) -> Result<(), String> {
        let samples =
            self.runner
                .collect_counters(&mut HostCounters, &mut HostFiles, &mut |message| {
                    log!(Level::Warn, "{message}")
                })?;
        emit(&mut self.lines, &samples, now_ns)
    }
}

/// Exports a performance counter collector type of `ccfleet-collectors` as this
/// component's plugin:
/// `ccfleet_collector_plugin::export_counter_collector!(ccfleet_collectors::likwid::Likwid);`.
#[macro_export]
macro_rules! export_counter_collector {
    ($collector:ty) => {
        type __Exported = $crate::CounterCollectorPlugin<$collector>;
        $crate::ccfleet_guest::export_plugin!(__Exported);
    };
}
