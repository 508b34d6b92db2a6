//! A test plugin: on every `collect` it runs the command its configuration names (the
//! configuration is that name as a JSON string, e.g. `"ipmitool-sdr"`) through
//! `cc:fleet/commands` and emits one point, `command,name=<name>` with the fields `status`
//! (-1 when ended by a signal), `stdout` and `stderr` (the texts); a refusal fails the call
//! with the agent's message.
#![no_std]

extern crate alloc;

use alloc::string::String;
use ccfleet_guest::lineproto::FieldRef;
use ccfleet_guest::{Lines, Plugin, commands};

struct RunCommand {
    name: String,
    lines: Lines,
}

impl Plugin for RunCommand {
    fn init(config: &str) -> Result<Self, String> {
        let name = config
            .trim()
            .strip_prefix('"')
            .and_then(|rest| rest.strip_suffix('"'))
            .ok_or_else(|| {
                String::from("the configuration must be a command name as a JSON string")
            })?;
        Ok(RunCommand {
            name: String::from(name),
            lines: Lines::new(),
        })
    }

    fn collect(&mut self, now_ns: i64) -> Result<(), String> {
        let output = commands::run(&self.name)?;
        let stdout = output.stdout_text();
        let stderr = String::from_utf8_lossy(&output.stderr);
        let status = i64::from(output.status.unwrap_or(-1));
        self.lines.point(
            "command",
            &[("name", self.name.as_str())],
            &[
                ("status", FieldRef::Int(status)),
                ("stdout", FieldRef::Str(&stdout)),
                ("stderr", FieldRef::Str(&stderr)),
            ],
            Some(now_ns),
        )?;
        self.lines.emit()
    }
}

ccfleet_guest::export_plugin!(RunCommand);
