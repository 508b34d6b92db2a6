//! A test plugin for granted commands (`cc:fleet/commands`). Its configuration names the
//! grants to run, as a JSON string (`"ipmitool-sdr"`) or an array of them
//! (`["report", "missing"]`; grant names hold no quotes or commas). On every `collect` it
//! runs each of them through the agent, in order, and
//!
//! - emits one point per command that ran, `command,name=<name>` with the fields `status`
//!   (-1 when a signal ended it), `stdout` and `stderr` (the texts);
//! - logs one line per name: `run <name>: status <s>: <first line of standard output>`
//!   (`status signal` when a signal ended it), or `run <name>: error <why>`;
//! - fails the call with the first error the agent gave, after running the rest.
#![no_std]

extern crate alloc;

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use ccfleet_guest::lineproto::FieldRef;
use ccfleet_guest::{Level, Lines, Plugin, commands, log};

struct RunCommand {
    names: Vec<String>,
    lines: Lines,
}

/// The grant names of the configuration: a JSON string or an array of plain strings.
fn names(config: &str) -> Result<Vec<String>, String> {
    let config = config.trim();
    let list = match config.strip_prefix('[') {
        Some(rest) => rest
            .strip_suffix(']')
            .ok_or_else(|| String::from("the configuration's array is not closed"))?,
        None => config,
    };
    let mut names = Vec::new();
    for item in list
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        let name = item
            .strip_prefix('"')
            .and_then(|rest| rest.strip_suffix('"'))
            .ok_or_else(|| {
                String::from(
                    "the configuration must be a command name as a JSON string, or an array of them",
                )
            })?;
        names.push(name.to_string());
    }
    Ok(names)
}

impl Plugin for RunCommand {
    fn init(config: &str) -> Result<Self, String> {
        Ok(RunCommand {
            names: names(config)?,
            lines: Lines::new(),
        })
    }

    fn collect(&mut self, now_ns: i64) -> Result<(), String> {
        let mut first_error = None;
        for name in &self.names {
            let output = match commands::run(name) {
                Ok(output) => output,
                Err(why) => {
                    log!(Level::Info, "run {name}: error {why}");
                    first_error.get_or_insert(why);
                    continue;
                }
            };
            let stdout = output.stdout_text();
            let stderr = String::from_utf8_lossy(&output.stderr);
            let shown = match output.status {
                Some(code) => format!("{code}"),
                None => String::from("signal"),
            };
            log!(
                Level::Info,
                "run {name}: status {shown}: {}",
                stdout.lines().next().unwrap_or("")
            );
            let status = i64::from(output.status.unwrap_or(-1));
            self.lines.point(
                "command",
                &[("name", name.as_str())],
                &[
                    ("status", FieldRef::Int(status)),
                    ("stdout", FieldRef::Str(&stdout)),
                    ("stderr", FieldRef::Str(&stderr)),
                ],
                Some(now_ns),
            )?;
        }
        self.lines.emit()?;
        match first_error {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }
}

ccfleet_guest::export_plugin!(RunCommand);
