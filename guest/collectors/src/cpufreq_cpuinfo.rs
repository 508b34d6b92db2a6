//! `cpufreq_cpuinfo`: the clock of every core from `/proc/cpuinfo`'s `cpu MHz`, as
//! cc-metric-collector's collector of that name sends it: `cpufreq` in `MHz` (a float),
//! `type=hwthread`, `type-id=<processor>`, `package_id=<physical id>`, for the first
//! hwthread of each core only (its hyper-threading siblings share the core's clock).
//!
//! A processor entry without `cpu MHz`, `core id` or `physical id` (some virtual machines
//! and architectures leave them out) is skipped; a file without any frequency fails the
//! round, as cc-metric-collector's collector fails to start. The cores are read anew each
//! round rather than once at start, so a hwthread brought online later is measured too.

use alloc::collections::BTreeSet;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::{Collector, Files, Sample, Value};

/// The file read.
pub const CPUINFO: &str = "/proc/cpuinfo";

/// The `cpufreq_cpuinfo` collector.
#[derive(Debug, Default)]
pub struct CpufreqCpuinfo;

/// What one processor entry says.
#[derive(Default)]
struct Entry<'a> {
    processor: Option<&'a str>,
    mhz: Option<&'a str>,
    core: Option<&'a str>,
    package: Option<&'a str>,
}

impl Collector for CpufreqCpuinfo {
    fn name(&self) -> &'static str {
        "cpufreq_cpuinfo"
    }

    fn collect(
        &mut self,
        files: &mut dyn Files,
        _now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        let text = files.read(CPUINFO)?;
        let mut seen_cores = BTreeSet::new();
        let mut sent = 0usize;
        // Entries are separated by empty lines; a last one may lack its separator.
        for block in text.split("\n\n") {
            let mut entry = Entry::default();
            for line in block.lines() {
                let Some((key, value)) = line.split_once(':') else {
                    continue;
                };
                let value = value.trim();
                match key.trim() {
                    "processor" => entry.processor = Some(value),
                    "cpu MHz" => entry.mhz = Some(value),
                    "core id" => entry.core = Some(value),
                    "physical id" => entry.package = Some(value),
                    _ => {}
                }
            }
            let (Some(processor), Some(mhz), Some(core), Some(package)) =
                (entry.processor, entry.mhz, entry.core, entry.package)
            else {
                continue;
            };
            if !seen_cores.insert((package, core)) {
                continue;
            }
            let value: f64 = mhz.parse().map_err(|_| {
                format!("{CPUINFO}: processor {processor}: `cpu MHz` is not a number: {mhz:?}")
            })?;
            if !value.is_finite() {
                return Err(format!(
                    "{CPUINFO}: processor {processor}: `cpu MHz` is not finite: {mhz:?}"
                ));
            }
            out.push(
                Sample::new(
                    "cpufreq",
                    &[
                        ("type", "hwthread"),
                        ("type-id", processor),
                        ("package_id", package),
                    ],
                    Value::Float(value),
                )
                .unit("MHz"),
            );
            sent += 1;
        }
        if sent == 0 {
            return Err(format!(
                "{CPUINFO}: no processor with `cpu MHz`, `core id` and `physical id`"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use alloc::collections::BTreeMap;
    use alloc::string::ToString;

    use super::*;
    use crate::FsStats;

    struct One(String);

    impl Files for One {
        fn read(&mut self, path: &str) -> Result<String, String> {
            assert_eq!(path, CPUINFO);
            Ok(self.0.clone())
        }
        fn list_dir(&mut self, path: &str) -> Result<Vec<String>, String> {
            Err(path.to_string())
        }
        fn statvfs(&mut self, path: &str) -> Result<FsStats, String> {
            Err(path.to_string())
        }
    }

    fn entry(processor: u32, package: u32, core: u32, mhz: &str) -> String {
        format!(
            "processor\t: {processor}\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon\n\
             cpu MHz\t\t: {mhz}\ncache size\t: 36608 KB\nphysical id\t: {package}\n\
             siblings\t: 4\ncore id\t\t: {core}\ncpu cores\t: 2\nflags\t\t: fpu vme\n\n"
        )
    }

    fn run(text: &str) -> Result<BTreeMap<String, (String, f64)>, String> {
        let mut out = Vec::new();
        CpufreqCpuinfo.collect(&mut One(text.to_string()), 0, &mut out)?;
        Ok(out
            .into_iter()
            .map(|s| {
                let tag = |k: &str| {
                    s.tags
                        .iter()
                        .find(|(key, _)| key == k)
                        .map(|(_, v)| v.clone())
                        .unwrap()
                };
                let Value::Float(v) = s.value else {
                    panic!("a float")
                };
                assert_eq!(s.name, "cpufreq");
                assert_eq!(tag("type"), "hwthread");
                (tag("type-id"), (tag("package_id"), v))
            })
            .collect())
    }

    #[test]
    fn only_the_first_hwthread_of_each_core_is_sent() {
        let text = [
            entry(0, 0, 0, "2100.000"),
            entry(1, 0, 1, "2200.500"),
            entry(2, 1, 0, "3000.000"),
            entry(3, 0, 0, "2100.100"),
            entry(4, 0, 1, "2200.600"),
        ]
        .concat();
        let got = run(&text).unwrap();
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got["0"], ("0".into(), 2100.0));
        assert_eq!(got["1"], ("0".into(), 2200.5));
        assert_eq!(got["2"], ("1".into(), 3000.0), "core 0 of another package");
    }

    #[test]
    fn incomplete_entries_are_skipped_and_a_file_without_any_fails() {
        let partial = entry(0, 0, 0, "1000").replace("core id", "cpu id");
        assert!(run(&partial).unwrap_err().contains("no processor"));
        let mixed = partial + &entry(1, 0, 1, "1500");
        assert_eq!(run(&mixed).unwrap().len(), 1);
        assert!(run("").is_err());
        // No separator after the last entry.
        assert_eq!(run(entry(0, 0, 0, "800").trim_end()).unwrap().len(), 1);
    }

    #[test]
    fn a_frequency_that_is_not_a_number_fails_the_round_naming_it() {
        let e = run(&entry(7, 0, 0, "fast")).unwrap_err();
        assert!(e.contains("processor 7") && e.contains("\"fast\""), "{e}");
        assert!(run(&entry(7, 0, 0, "NaN")).is_err());
    }
}
