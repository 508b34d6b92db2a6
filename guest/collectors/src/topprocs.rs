//! `topprocs`: the commands of the processes using the most CPU, from `ps -Ao comm
//! --sort=-pcpu`, as cc-metric-collector reports them: `topproc1` ... `topproc<num_procs>`
//! (tag `type=node`), each a string value (the command name), as in cc-metric-collector.
//!
//! Grant the operator configures (`capabilities.run`), by default named
//!
//! ```json
//! {"ps-top": {"path": "/usr/bin/ps", "args": ["-Ao", "comm", "--sort=-pcpu"]}}
//! ```
//!
//! (`ps_command` names another). `num_procs` (1 to 10, default 2) says how many are sent;
//! fewer processes than that send fewer points. The first line must be `ps`'s header
//! (`COMMAND`), so output of another command or a garbled one fails the round instead of
//! reporting its lines as processes.

use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::{CommandCollector, Commands, Files, Sample, Value, quoted, run_text};

/// The default grant.
pub const PS_GRANT: &str = "ps-top";

/// The most processes `num_procs` may ask for.
pub const MAX_NUM_PROCS: u64 = 10;

/// Settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `num_procs` (1 to [`MAX_NUM_PROCS`], default 2).
    pub num_procs: usize,
    /// `ps_command`: the grant running `ps -Ao comm --sort=-pcpu`.
    pub ps_command: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            num_procs: 2,
            ps_command: PS_GRANT.to_owned(),
        }
    }
}

/// The command names of `ps -o comm` output, in its order, after the header.
pub fn parse(text: &str) -> Result<Vec<&str>, String> {
    crate::whole_lines(text)?;
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    if header.trim() != "COMMAND" {
        return Err(format!(
            "the output does not start with ps's COMMAND header: {}",
            quoted(header, 80)
        ));
    }
    Ok(lines.map(str::trim).filter(|l| !l.is_empty()).collect())
}

/// The `topprocs` collector.
#[derive(Debug, Default)]
pub struct Topprocs {
    config: Config,
}

impl Topprocs {
    /// A collector with these settings.
    pub fn new(config: Config) -> Topprocs {
        Topprocs { config }
    }
}

impl CommandCollector for Topprocs {
    fn name(&self) -> &'static str {
        "topprocs"
    }

    fn collect(
        &mut self,
        commands: &mut dyn Commands,
        _files: &mut dyn Files,
        _now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        let grant = &self.config.ps_command;
        let text = run_text(commands, grant)?;
        let procs = parse(&text).map_err(|e| format!("command {grant}: {e}"))?;
        for (i, comm) in procs.iter().take(self.config.num_procs).enumerate() {
            out.push(Sample::new(
                format!("topproc{}", i + 1),
                &[("type", "node")],
                Value::Str((*comm).to_owned()),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_is_required_and_skipped() {
        assert_eq!(
            parse("COMMAND\nstress-ng\nkworker/0:1-events\n\n").unwrap(),
            ["stress-ng", "kworker/0:1-events"]
        );
        assert_eq!(parse("    COMMAND\n").unwrap(), Vec::<&str>::new());
        let err = parse("error: unsupported option\n").unwrap_err();
        assert!(err.contains("COMMAND header"), "{err}");
        assert!(parse("").is_err());
    }
}
