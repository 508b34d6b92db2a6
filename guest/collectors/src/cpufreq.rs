//! `cpufreq`: the current clock of every hwthread that has a cpufreq policy, from
//! `/sys/devices/system/cpu/cpu<n>/cpufreq/scaling_cur_freq` (which the kernel gives in
//! kHz), sent in Hz (integer, unit `Hz`, `type=hwthread`, `type-id=<n>`, and `package_id`
//! from `topology/physical_package_id` when readable).

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::{Collector, Files, Sample, Value, index_after, parse_u64};

/// Where the hwthreads are listed.
pub const CPU_DIR: &str = "/sys/devices/system/cpu";

/// The `cpufreq` collector.
#[derive(Debug, Default)]
pub struct Cpufreq;

impl Collector for Cpufreq {
    fn name(&self) -> &'static str {
        "cpufreq"
    }

    fn collect(
        &mut self,
        files: &mut dyn Files,
        _now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        for dir in files.list_dir(CPU_DIR)? {
            let Some(id) = index_after(&dir, "cpu") else {
                continue;
            };
            let path = format!("{CPU_DIR}/{dir}/cpufreq/scaling_cur_freq");
            // An offline hwthread or one without a cpufreq driver has no file.
            let Ok(text) = files.read(&path) else {
                continue;
            };
            let khz = parse_u64(text.trim(), "the frequency", &path)?;
            let package = files
                .read(&format!("{CPU_DIR}/{dir}/topology/physical_package_id"))
                .ok();
            let mut tags = alloc::vec![("type", "hwthread"), ("type-id", id)];
            if let Some(package) = package.as_deref() {
                tags.push(("package_id", package.trim()));
            }
            let hz = khz.saturating_mul(1000);
            out.push(Sample::new("cpufreq", &tags, Value::Int(hz as i64)).unit("Hz"));
        }
        Ok(())
    }
}
