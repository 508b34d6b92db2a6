//! `ipmistat`: the BMC's sensors, from `ipmi-sensors --comma-separated-output` (FreeIPMI,
//! preferred as cc-metric-collector prefers it) or `ipmitool sensor`, as cc-metric-collector
//! reports them: one float per sensor with a reading, named after the sensor in lower case
//! with spaces as `_` (`cpu_temp`, `fan1`, `ps1_input_power`), tag `type=node`, unit from the
//! tool (`ipmitool`'s `degrees C`/`degrees F` become `degC`/`degF`).
//!
//! Grants the operator configures (`capabilities.run`), by default named
//!
//! ```json
//! {"ipmi-sensors": {"path": "/usr/sbin/ipmi-sensors",
//!                   "args": ["--comma-separated-output", "--sdr-cache-recreate"]},
//!  "ipmitool-sensor": {"path": "/usr/bin/ipmitool", "args": ["sensor"]}}
//! ```
//!
//! (one of them is enough; `ipmisensors_command` and `ipmitool_command` name others, `""`
//! leaves one out). The first round tries `ipmi-sensors`, then `ipmitool`, and keeps the
//! first that works; a later failure of it fails that round. `include_metrics` keeps only
//! the named sensors (after renaming). Sensors without a reading (`N/A`, `na`, discrete
//! states such as `0x0`) are skipped; a line that is neither a sensor nor the CSV header,
//! or a reading that is not a number, fails the round with the line quoted, so garbage or
//! cut output never passes for a sensor.

use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::{CommandCollector, Commands, Files, Sample, Value, quoted, run_text};

/// The default grant of `ipmi-sensors`.
pub const IPMISENSORS_GRANT: &str = "ipmi-sensors";

/// The default grant of `ipmitool sensor`.
pub const IPMITOOL_GRANT: &str = "ipmitool-sensor";

/// Settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `ipmisensors_command`: the grant running `ipmi-sensors --comma-separated-output`;
    /// empty for none.
    pub ipmisensors_command: String,
    /// `ipmitool_command`: the grant running `ipmitool sensor`; empty for none.
    pub ipmitool_command: String,
    /// `include_metrics`: only these sensors (lower case, `_` for spaces); all when empty.
    pub include_metrics: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            ipmisensors_command: IPMISENSORS_GRANT.to_owned(),
            ipmitool_command: IPMITOOL_GRANT.to_owned(),
            include_metrics: Vec::new(),
        }
    }
}

/// Which tool's output a grant prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// FreeIPMI's `ipmi-sensors --comma-separated-output`.
    IpmiSensors,
    /// `ipmitool sensor`.
    Ipmitool,
}

/// One sensor reading.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// The metric name (lower case, `_` for spaces).
    pub name: String,
    /// The reading.
    pub value: f64,
    /// The unit, if the tool gives one.
    pub unit: Option<String>,
}

fn metric_name(sensor: &str) -> String {
    sensor.trim().replace(' ', "_").to_lowercase()
}

fn number(raw: &str, line: &str) -> Result<f64, String> {
    let ok = !raw.is_empty()
        && raw
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+' | b'e' | b'E'));
    ok.then(|| raw.parse::<f64>().ok())
        .flatten()
        .ok_or_else(|| {
            format!(
                "the reading {} is not a number: {}",
                quoted(raw, 40),
                quoted(line, 120)
            )
        })
}

/// The readings of `ipmi-sensors --comma-separated-output`: `ID,Name,Type,Reading,Units,Event`
/// after a header line.
pub fn parse_ipmi_sensors(text: &str) -> Result<Vec<Reading>, String> {
    crate::whole_lines(text)?;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() < 5 {
            return Err(format!("not an ipmi-sensors line: {}", quoted(line, 120)));
        }
        let reading = fields[3].trim();
        if reading == "Reading" || reading == "N/A" {
            continue;
        }
        let unit = fields[4].trim();
        out.push(Reading {
            name: metric_name(fields[1]),
            value: number(reading, line)?,
            unit: (!unit.is_empty() && unit != "N/A").then(|| unit.to_owned()),
        });
    }
    Ok(out)
}

/// The readings of `ipmitool sensor`: `name | reading | unit | status | thresholds...`.
pub fn parse_ipmitool(text: &str) -> Result<Vec<Reading>, String> {
    crate::whole_lines(text)?;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split('|').collect();
        if fields.len() < 4 {
            return Err(format!(
                "not an ipmitool sensor line: {}",
                quoted(line, 120)
            ));
        }
        let reading = fields[1].trim();
        let unit = fields[2].trim();
        if reading == "na" || unit == "discrete" || reading.starts_with("0x") {
            continue;
        }
        let unit = match unit {
            "degrees C" => "degC",
            "degrees F" => "degF",
            other => other,
        };
        out.push(Reading {
            name: metric_name(fields[0]),
            value: number(reading, line)?,
            unit: (!unit.is_empty()).then(|| unit.to_owned()),
        });
    }
    Ok(out)
}

/// The `ipmistat` collector.
#[derive(Debug, Default)]
pub struct Ipmistat {
    config: Config,
    /// The tool that worked, once one has.
    chosen: Option<Tool>,
}

impl Ipmistat {
    /// A collector with these settings.
    pub fn new(config: Config) -> Ipmistat {
        Ipmistat {
            config,
            chosen: None,
        }
    }

    /// The tool in use, once a round has found one.
    pub fn tool(&self) -> Option<Tool> {
        self.chosen
    }

    fn read(&self, commands: &mut dyn Commands, tool: Tool) -> Result<Vec<Reading>, String> {
        match tool {
            Tool::IpmiSensors => {
                let grant = &self.config.ipmisensors_command;
                parse_ipmi_sensors(&run_text(commands, grant)?)
                    .map_err(|e| format!("command {grant}: {e}"))
            }
            Tool::Ipmitool => {
                let grant = &self.config.ipmitool_command;
                parse_ipmitool(&run_text(commands, grant)?)
                    .map_err(|e| format!("command {grant}: {e}"))
            }
        }
    }
}

impl CommandCollector for Ipmistat {
    fn name(&self) -> &'static str {
        "ipmistat"
    }

    fn collect(
        &mut self,
        commands: &mut dyn Commands,
        _files: &mut dyn Files,
        _now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        let readings = match self.chosen {
            Some(tool) => self.read(commands, tool)?,
            None => {
                let mut errors = Vec::new();
                let mut found = None;
                for (tool, grant) in [
                    (Tool::IpmiSensors, &self.config.ipmisensors_command),
                    (Tool::Ipmitool, &self.config.ipmitool_command),
                ] {
                    if grant.is_empty() {
                        continue;
                    }
                    match self.read(commands, tool) {
                        Ok(readings) => {
                            found = Some((tool, readings));
                            break;
                        }
                        Err(e) => errors.push(e),
                    }
                }
                let Some((tool, readings)) = found else {
                    return Err(format!("no IPMI tool worked: {}", errors.join("; ")));
                };
                self.chosen = Some(tool);
                readings
            }
        };
        for reading in readings {
            if !self.config.include_metrics.is_empty()
                && !self.config.include_metrics.contains(&reading.name)
            {
                continue;
            }
            let mut sample = Sample::new(
                reading.name,
                &[("type", "node")],
                Value::Float(reading.value),
            );
            sample.unit = reading.unit;
            out.push(sample);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipmitool_rows_become_readings_and_discrete_ones_are_skipped() {
        let text = "CPU Temp         | 36.000     | degrees C  | ok    | 0.000     | 0.000     | 0.000     | 95.000    | 100.000   | 100.000   \n\
                    FAN1             | 3200.000   | RPM        | ok    | 300.000   | 500.000   | 700.000   | 25300.000 | 25400.000 | 25500.000 \n\
                    Chassis Intru    | 0x0        | discrete   | 0x0000| na        | na        | na        | na        | na        | na        \n\
                    PS2 Input Power  | na         | Watts      | na    | na        | na        | na        | na        | na        | na        \n";
        let got = parse_ipmitool(text).unwrap();
        assert_eq!(
            got,
            [
                Reading {
                    name: "cpu_temp".into(),
                    value: 36.0,
                    unit: Some("degC".into())
                },
                Reading {
                    name: "fan1".into(),
                    value: 3200.0,
                    unit: Some("RPM".into())
                },
            ]
        );
        let err = parse_ipmitool("CPU Temp | 36.0\n").unwrap_err();
        assert!(err.contains("not an ipmitool sensor line"), "{err}");
        let err = parse_ipmitool("CPU Temp | hot | degrees C | ok\n").unwrap_err();
        assert!(err.contains("\"hot\" is not a number"), "{err}");
    }

    #[test]
    fn ipmi_sensors_csv_skips_the_header_and_missing_readings() {
        let text = "ID,Name,Type,Reading,Units,Event\n\
                    4,CPU Temp,Temperature,36.00,C,'OK'\n\
                    61,PS1 Status,Power Supply,N/A,N/A,'Presence detected'\n\
                    70,+3.3V,Voltage,3.31,V,'OK'\n";
        let got = parse_ipmi_sensors(text).unwrap();
        assert_eq!(
            got,
            [
                Reading {
                    name: "cpu_temp".into(),
                    value: 36.0,
                    unit: Some("C".into())
                },
                Reading {
                    name: "+3.3v".into(),
                    value: 3.31,
                    unit: Some("V".into())
                },
            ]
        );
        assert!(parse_ipmi_sensors("4,CPU Temp,Temp\n").is_err());
        assert!(parse_ipmi_sensors("4,CPU Temp,Temperature,NaN,C,'OK'\n").is_err());
    }
}
