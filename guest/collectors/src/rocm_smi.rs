//! `rocm_smi`: AMD GPUs through ROCm SMI, as cc-metric-collector's `rocm_smi` collector sends
//! them: one metrics table (`rsmi_gpu_metrics_t`) per GPU and round, 18 `rocm_*` metrics with
//! `type=accelerator` and `type-id` the ROCm SMI index (or the PCI address with
//! `use_pci_info_as_type_id`), the HBM temperatures with `stype=device` and `stype-id` the
//! HBM stack.
//!
//! A plugin cannot call ROCm SMI (a native library): the agent reads it on the plugin's
//! behalf through `cc:fleet/rocm-smi` when the plugin's configuration grants
//! `capabilities.rocm-smi`, and this collector gets the tables through [`AmdGpus`]. Natively
//! (tests) any [`AmdGpus`] will do.
//!
//! Values are sent as the table holds them, as cc-metric-collector sends them (temperatures
//! in degrees Celsius, activities in percent, power in watts, clocks in MHz; no `unit` meta).
//! Differences from cc-metric-collector:
//!
//! - GPUs are listed every round rather than once at start, so a GPU that is reset or comes
//!   back is measured as it is now; a GPU without a PCI address fails the round (where
//!   cc-metric-collector refuses to start the collector);
//! - a GPU whose table cannot be read this round is left out of it with a warning in the
//!   agent's log, as cc-metric-collector logs it;
//! - the meta values `source`, `group` and (with `add_serial_meta`) `serial` are sent as tags
//!   when `meta_as_tags` names them, as a cc-metric-collector sink with that setting does;
//!   otherwise they go nowhere, as in cc-metric-collector's default sinks.

use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::{Sample, Value};

/// The PCI address of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PciAddress {
    /// The PCI domain.
    pub domain: u32,
    /// The bus.
    pub bus: u8,
    /// The device on the bus.
    pub device: u8,
    /// The function.
    pub function: u8,
}

impl PciAddress {
    /// The address as cc-metric-collector writes it, e.g. `00000000:C1:00.0`.
    pub fn id(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// One GPU.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AmdGpu {
    /// Its ROCm SMI index.
    pub index: u32,
    /// Its PCI address.
    pub pci: Option<PciAddress>,
    /// Its serial number.
    pub serial: Option<String>,
}

/// The fields of a GPU's metrics table this collector sends.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuMetrics {
    /// Edge temperature.
    pub temperature_edge: u16,
    /// Hotspot temperature.
    pub temperature_hotspot: u16,
    /// Memory temperature.
    pub temperature_mem: u16,
    /// Graphics voltage regulator temperature.
    pub temperature_vrgfx: u16,
    /// SoC voltage regulator temperature.
    pub temperature_vrsoc: u16,
    /// Memory voltage regulator temperature.
    pub temperature_vrmem: u16,
    /// Graphics activity.
    pub average_gfx_activity: u16,
    /// Memory controller activity.
    pub average_umc_activity: u16,
    /// Multimedia activity.
    pub average_mm_activity: u16,
    /// Socket power.
    pub average_socket_power: u16,
    /// Average graphics clock.
    pub average_gfxclk_frequency: u16,
    /// Average SoC clock.
    pub average_socclk_frequency: u16,
    /// Average memory clock.
    pub average_uclk_frequency: u16,
    /// Average video clock 0.
    pub average_vclk0_frequency: u16,
    /// Average video clock 1.
    pub average_vclk1_frequency: u16,
    /// Average decoder clock 0.
    pub average_dclk0_frequency: u16,
    /// Average decoder clock 1.
    pub average_dclk1_frequency: u16,
    /// HBM stack temperatures.
    pub temperature_hbm: Vec<u16>,
}

/// Where the GPUs are read from: the agent's `cc:fleet/rocm-smi` in a plugin, recorded
/// values natively.
pub trait AmdGpus {
    /// The GPUs.
    fn devices(&mut self) -> Result<Vec<AmdGpu>, String>;
    /// The metrics table of GPU `device`.
    fn read(&mut self, device: u32) -> Result<GpuMetrics, String>;
}

/// A collector of what [`AmdGpus`] report.
pub trait AmdGpuCollector {
    /// The collector's name as cc-metric-collector spells it.
    fn name(&self) -> &'static str;

    /// One collection round; `warn` reports a GPU left out of it.
    fn collect(
        &mut self,
        gpus: &mut dyn AmdGpus,
        out: &mut Vec<Sample>,
        warn: &mut dyn FnMut(&str),
    ) -> Result<(), String>;
}

/// Settings, by cc-metric-collector's names (`exclude_metrics` is the shared key, applied
/// to the samples by the runner).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Config {
    /// `exclude_devices`: ROCm SMI indexes (`"0"`) or PCI addresses (`00000000:C1:00.0`).
    pub exclude_devices: Vec<String>,
    /// `use_pci_info_as_type_id`: the PCI address as `type-id`.
    pub use_pci_info_as_type_id: bool,
    /// `add_pci_info_tag`: the PCI address as tag `pci_identifier` (unless it is the
    /// `type-id` already).
    pub add_pci_info_tag: bool,
    /// `add_serial_meta`: the `serial` meta.
    pub add_serial_meta: bool,
    /// Meta keys sent as tags (from the shared `meta_as_tags`).
    pub meta_as_tags: Vec<String>,
}

/// The collector.
#[derive(Debug, Clone, Default)]
pub struct RocmSmi {
    config: Config,
}

/// The name cc-metric-collector gives the collector in its `source` meta.
const SOURCE: &str = "RocmSmiCollector";

impl RocmSmi {
    /// A collector with `config`.
    pub fn new(config: Config) -> RocmSmi {
        RocmSmi { config }
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Sets the shared `meta_as_tags`, which may name the GPU's meta.
    pub fn set_meta_as_tags(&mut self, meta_as_tags: &[String]) {
        self.config.meta_as_tags = meta_as_tags.to_vec();
    }

    /// A GPU's tags, with its meta where `meta_as_tags` names it.
    fn tags(&self, gpu: &AmdGpu, pci_id: &str) -> Vec<(String, String)> {
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
        let mut meta = alloc::vec![("source", SOURCE.to_owned()), ("group", "AMD".to_owned())];
        if c.add_serial_meta
            && let Some(serial) = &gpu.serial
        {
            meta.push(("serial", serial.clone()));
        }
        for (key, value) in meta {
            if c.meta_as_tags.iter().any(|m| m == key) {
                tags.push((key.to_owned(), value));
            }
        }
        tags
    }
}

/// The metrics sent from one table, in cc-metric-collector's order.
fn values(m: &GpuMetrics) -> [(&'static str, u16); 17] {
    [
        ("rocm_gfx_util", m.average_gfx_activity),
        ("rocm_umc_util", m.average_umc_activity),
        ("rocm_mm_util", m.average_mm_activity),
        ("rocm_avg_power", m.average_socket_power),
        ("rocm_temp_mem", m.temperature_mem),
        ("rocm_temp_hotspot", m.temperature_hotspot),
        ("rocm_temp_edge", m.temperature_edge),
        ("rocm_temp_vrgfx", m.temperature_vrgfx),
        ("rocm_temp_vrsoc", m.temperature_vrsoc),
        ("rocm_temp_vrmem", m.temperature_vrmem),
        ("rocm_gfx_clock", m.average_gfxclk_frequency),
        ("rocm_soc_clock", m.average_socclk_frequency),
        ("rocm_u_clock", m.average_uclk_frequency),
        ("rocm_v0_clock", m.average_vclk0_frequency),
        ("rocm_v1_clock", m.average_vclk1_frequency),
        ("rocm_d0_clock", m.average_dclk0_frequency),
        ("rocm_d1_clock", m.average_dclk1_frequency),
    ]
}

impl AmdGpuCollector for RocmSmi {
    fn name(&self) -> &'static str {
        "rocm_smi"
    }

    fn collect(
        &mut self,
        gpus: &mut dyn AmdGpus,
        out: &mut Vec<Sample>,
        warn: &mut dyn FnMut(&str),
    ) -> Result<(), String> {
        for gpu in gpus.devices()? {
            let index = gpu.index.to_string();
            if self.config.exclude_devices.contains(&index) {
                continue;
            }
            let Some(pci) = gpu.pci else {
                return Err(format!("GPU {index}: ROCm SMI gives no PCI address"));
            };
            let pci_id = pci.id();
            if self.config.exclude_devices.contains(&pci_id) {
                continue;
            }
            let metrics = match gpus.read(gpu.index) {
                Ok(metrics) => metrics,
                Err(e) => {
                    warn(&format!(
                        "rocm_smi: GPU {index} left out of this round: {e}"
                    ));
                    continue;
                }
            };
            let tags = self.tags(&gpu, &pci_id);
            let sample = |name: &str, value: u16, tags: Vec<(String, String)>| Sample {
                name: name.to_owned(),
                tags,
                unit: None,
                value: Value::Float(f64::from(value)),
            };
            for (name, value) in values(&metrics) {
                out.push(sample(name, value, tags.clone()));
            }
            for (stack, &value) in metrics.temperature_hbm.iter().enumerate() {
                let mut tags = tags.clone();
                tags.push(("stype".to_owned(), "device".to_owned()));
                tags.push(("stype-id".to_owned(), stack.to_string()));
                out.push(sample("rocm_temp_hbm", value, tags));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeMap;

    struct Recorded {
        gpus: Vec<AmdGpu>,
        tables: BTreeMap<u32, GpuMetrics>,
    }

    impl AmdGpus for Recorded {
        fn devices(&mut self) -> Result<Vec<AmdGpu>, String> {
            Ok(self.gpus.clone())
        }

        fn read(&mut self, device: u32) -> Result<GpuMetrics, String> {
            self.tables
                .get(&device)
                .cloned()
                .ok_or_else(|| "RSMI_STATUS_NOT_SUPPORTED".to_owned())
        }
    }

    fn recorded() -> Recorded {
        let gpu = |index: u32, bus: u8, serial: &str| AmdGpu {
            index,
            pci: Some(PciAddress {
                domain: 0,
                bus,
                device: 0,
                function: 0,
            }),
            serial: Some(serial.to_owned()),
        };
        let mut tables = BTreeMap::new();
        tables.insert(
            0,
            GpuMetrics {
                temperature_edge: 41,
                average_socket_power: 288,
                temperature_hbm: alloc::vec![50, 51, 52, 53],
                ..GpuMetrics::default()
            },
        );
        Recorded {
            gpus: alloc::vec![gpu(0, 0xc1, "S0"), gpu(1, 0xc5, "S1")],
            tables,
        }
    }

    fn collect(config: Config) -> (Vec<Sample>, Vec<String>) {
        let mut out = Vec::new();
        let mut warnings = Vec::new();
        RocmSmi::new(config)
            .collect(&mut recorded(), &mut out, &mut |w| {
                warnings.push(w.to_owned())
            })
            .unwrap();
        (out, warnings)
    }

    #[test]
    fn the_pci_address_is_written_as_cc_metric_collector_writes_it() {
        let pci = PciAddress {
            domain: 0,
            bus: 0xc1,
            device: 0x1f,
            function: 7,
        };
        assert_eq!(pci.id(), "00000000:C1:1F.7");
    }

    #[test]
    fn a_gpu_that_cannot_be_read_is_left_out_with_a_warning() {
        let (out, warnings) = collect(Config::default());
        assert_eq!(out.len(), 21, "{out:?}");
        assert!(out.iter().all(|s| s.tags[1].1 == "0"));
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("GPU 1"), "{warnings:?}");
        let hbm: Vec<&Sample> = out.iter().filter(|s| s.name == "rocm_temp_hbm").collect();
        assert_eq!(hbm.len(), 4);
        assert!(
            hbm[2]
                .tags
                .contains(&("stype-id".to_owned(), "2".to_owned()))
        );
        assert_eq!(hbm[2].value, Value::Float(52.0));
    }

    #[test]
    fn excluded_devices_by_index_or_pci_address_are_not_read() {
        for excluded in ["0", "00000000:C1:00.0"] {
            let (out, _) = collect(Config {
                exclude_devices: alloc::vec![excluded.to_owned()],
                ..Config::default()
            });
            assert!(out.is_empty(), "{excluded}: {out:?}");
        }
    }

    #[test]
    fn serial_and_group_become_tags_only_when_meta_as_tags_names_them() {
        let (out, _) = collect(Config {
            add_serial_meta: true,
            add_pci_info_tag: true,
            meta_as_tags: alloc::vec!["serial".to_owned(), "group".to_owned()],
            ..Config::default()
        });
        let tags = &out[0].tags;
        assert!(
            tags.contains(&("serial".to_owned(), "S0".to_owned())),
            "{tags:?}"
        );
        assert!(
            tags.contains(&("group".to_owned(), "AMD".to_owned())),
            "{tags:?}"
        );
        assert!(tags.contains(&("pci_identifier".to_owned(), "00000000:C1:00.0".to_owned())));
        let (out, _) = collect(Config {
            meta_as_tags: alloc::vec!["serial".to_owned()],
            ..Config::default()
        });
        assert_eq!(out[0].tags.len(), 2, "{:?}", out[0].tags);
    }

    #[test]
    fn a_gpu_without_a_pci_address_fails_the_round() {
        let mut gpus = recorded();
        gpus.gpus[1].pci = None;
        let err = RocmSmi::new(Config::default())
            .collect(&mut gpus, &mut Vec::new(), &mut |_| {})
            .unwrap_err();
        assert!(err.contains("GPU 1") && err.contains("PCI"), "{err}");
    }
}
