//! `customcmd`: metrics a site's own commands print and files hold, in InfluxDB line
//! protocol, as cc-metric-collector forwards them.
//!
//! `commands` names grants of the plugin's `capabilities.run` (a plugin cannot name an
//! executable; the operator grants each one with its fixed arguments), e.g.
//!
//! ```json
//! {"getmetrics": {"path": "/usr/local/bin/getmetrics.pl"}}
//! ```
//!
//! with `"commands": ["getmetrics"]`; `files` names files read through the agent's file
//! access, which must be in `capabilities.read-files`. Every line's measurement and tags
//! are kept, its `value` field is the sample's value (float, integer, unsigned or string, as
//! written; cc-metric-collector's metrics carry their value in that field), and a `unit` tag
//! becomes the sample's unit (sent as a tag unless `meta_as_tags` leaves it out). The
//! points carry the round's time rather than a timestamp of their own, and `hostname` and
//! `cluster` tags of a line are replaced by the agent's. Lines without a `value` field, or
//! a boolean one, are skipped: they are not metrics. A source that cannot be run or read, or
//! whose text is not line protocol, fails the round, naming the source and the line, after
//! the rest were tried: nothing of a half-understood source is sent. A file's text is never
//! quoted in the error (a command's line is).

use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::lineproto::{self, Field};
use crate::{CommandCollector, Commands, Files, Sample, Value, run_text};

/// Settings (cc-metric-collector's keys; `commands` are grant names here).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Config {
    /// `commands`: grants of `capabilities.run` whose output is read.
    pub commands: Vec<String>,
    /// `files`: files read through the file access.
    pub files: Vec<String>,
}

/// The samples of one source's line protocol.
pub fn samples(text: &str, out: &mut Vec<Sample>) -> Result<(), String> {
    for line in lineproto::parse(text)? {
        let Some((_, field)) = line.fields.iter().find(|(k, _)| k == "value") else {
            continue;
        };
        let value = match field {
            Field::Float(v) => Value::Float(*v),
            Field::Int(v) => Value::Int(*v),
            Field::Uint(v) => Value::Uint(*v),
            Field::Str(v) => Value::Str(v.clone()),
            Field::Bool(_) => continue,
        };
        let mut unit = None;
        let mut tags = Vec::with_capacity(line.tags.len());
        for (key, tag) in line.tags {
            match key.as_str() {
                "hostname" | "cluster" => {}
                "unit" => unit = Some(tag),
                _ => tags.push((key, tag)),
            }
        }
        out.push(Sample {
            name: line.measurement,
            tags,
            unit,
            value,
        });
    }
    Ok(())
}

/// The `customcmd` collector.
#[derive(Debug, Default)]
pub struct Customcmd {
    config: Config,
}

impl Customcmd {
    /// A collector of these sources; an error when there is none.
    pub fn new(config: Config) -> Result<Customcmd, String> {
        if config.commands.is_empty() && config.files.is_empty() {
            return Err("customcmd: no `commands` and no `files`: nothing to collect".to_owned());
        }
        Ok(Customcmd { config })
    }
}

impl CommandCollector for Customcmd {
    fn name(&self) -> &'static str {
        "customcmd"
    }

    fn collect(
        &mut self,
        commands: &mut dyn Commands,
        files: &mut dyn Files,
        _now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        let mut round = Vec::new();
        let mut errors: Vec<String> = Vec::new();
        for grant in &self.config.commands {
            let result = run_text(commands, grant).and_then(|text| {
                samples(&text, &mut round).map_err(|e| format!("command {grant}: {e}"))
            });
            if let Err(e) = result {
                errors.push(e);
            }
        }
        for path in &self.config.files {
            let result = files.read(path).and_then(|text| {
                samples(&text, &mut round).map_err(|e| format!("{path}: {}", unquoted(&e)))
            });
            if let Err(e) = result {
                errors.push(e);
            }
        }
        if !errors.is_empty() {
            return Err(errors.join("; "));
        }
        out.append(&mut round);
        Ok(())
    }
}

/// A parse error of a file's text without the text: `line N is not line protocol`. A file
/// may hold what its reader must never pass on (a password file granted by mistake), and the
/// error goes to the agent's log.
fn unquoted(error: &str) -> String {
    match error.split_once(':') {
        Some((line, _)) if line.starts_with("line ") => {
            format!("{line} is not line protocol (its text is not shown)")
        }
        _ => "the text is not line protocol (it is not shown)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_error_never_quotes_the_file() {
        let err = samples(
            "root:$6$secretsalt$hash:19000:0:99999:7:::\n",
            &mut Vec::new(),
        )
        .unwrap_err();
        assert!(err.contains("secretsalt"), "{err}");
        let shown = unquoted(&err);
        assert_eq!(shown, "line 1 is not line protocol (its text is not shown)");
    }

    #[test]
    fn the_value_field_becomes_the_sample_and_host_tags_are_the_agents() {
        let mut out = Vec::new();
        samples(
            "app_queue,type=node,unit=jobs,hostname=other value=12i\n\
             app_state,type=node value=\"draining\"\n\
             app_flags,type=node ok=true\n\
             app_up,type=node value=t\n\
             app_load,type=socket,type-id=1 value=0.5,other=2 1700000000000000000\n",
            &mut out,
        )
        .unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].name, "app_queue");
        assert_eq!(out[0].tags, [("type".to_owned(), "node".to_owned())]);
        assert_eq!(out[0].unit.as_deref(), Some("jobs"));
        assert_eq!(out[0].value, Value::Int(12));
        assert_eq!(out[1].value, Value::Str("draining".to_owned()));
        assert_eq!(out[2].value, Value::Float(0.5));
        assert_eq!(out[2].tags.len(), 2);
    }

    #[test]
    fn no_source_is_refused() {
        assert!(Customcmd::new(Config::default()).is_err());
    }
}
