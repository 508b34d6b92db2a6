//! Log set-up: `RUST_LOG` filters, text or JSON lines on standard error.
//!
//! Colour only when standard error is a terminal (and `NO_COLOR` is unset), so journald and
//! log files get plain text. `--log-format json` (or `CCFLEET_LOG_FORMAT=json`) writes one
//! JSON object per event for log shippers, and the error that ends the command is such an
//! object too ([`fatal_line`]), so a shipper never meets a line it cannot parse. Fields that
//! hold revisions are written as strings: a JSON number above 2^53 loses digits in most
//! readers. An invalid `RUST_LOG` is an error: a typo would otherwise silently log at the
//! default level.

use std::io::IsTerminal as _;

use anyhow::Context as _;
use tracing_subscriber::EnvFilter;

/// Environment variable that selects the log format.
pub const ENV_FORMAT: &str = "CCFLEET_LOG_FORMAT";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per event (timestamp, level, target, fields).
    Json,
}

/// Logging flags, shared by every subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Log format on standard error.
    #[arg(
        long,
        global = true,
        value_enum,
        env = ENV_FORMAT,
        default_value_t = Format::Text,
        value_name = "FORMAT"
    )]
    pub log_format: Format,
}

/// Builds the filter from `RUST_LOG`, or `default` when it is unset or empty.
pub fn filter(rust_log: Option<&str>, default: &str) -> anyhow::Result<EnvFilter> {
    match rust_log.map(str::trim).filter(|s| !s.is_empty()) {
        Some(directives) => EnvFilter::try_new(directives).with_context(|| {
            format!(
                "RUST_LOG={directives:?} is not a valid filter (e.g. RUST_LOG=info,ccfleet=debug)"
            )
        }),
        // async-nats logs every reconnect attempt at info level; the programs' own NATS
        // event handlers say what matters (RUST_LOG=async_nats=debug shows it all).
        None => Ok(EnvFilter::new(format!("{default},async_nats=off"))),
    }
}

/// Installs the global subscriber.
pub fn init(args: &Args, default_filter: &str) -> anyhow::Result<()> {
    let rust_log = match std::env::var("RUST_LOG") {
        Ok(value) => Some(value),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => anyhow::bail!("RUST_LOG is not valid UTF-8"),
    };
    let filter = filter(rust_log.as_deref(), default_filter)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = match args.log_format {
        Format::Text => builder
            .with_ansi(colour(
                std::io::stderr().is_terminal(),
                std::env::var_os("NO_COLOR").as_deref(),
            ))
            .try_init(),
        Format::Json => builder
            .json()
            .with_ansi(false)
            .flatten_event(true)
            .try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!("installing the logger: {e}"))
}

/// The line that reports the error ending the command (without its newline): `ccfleet:
/// {message}` as text, or with `--log-format json` an event as the logger writes them
/// (`timestamp`, `level` `ERROR`, `message`, `target` `ccfleet`) marked `"fatal": true`.
pub fn fatal_line(format: Format, message: &str) -> String {
    match format {
        Format::Text => format!("ccfleet: {message}"),
        Format::Json => {
            use tracing_subscriber::fmt::time::FormatTime as _;
            let mut timestamp = String::new();
            // The logger's own clock and format, so the fatal line sorts with the others.
            let _ = tracing_subscriber::fmt::time::SystemTime.format_time(
                &mut tracing_subscriber::fmt::format::Writer::new(&mut timestamp),
            );
            serde_json::json!({
                "timestamp": timestamp,
                "level": "ERROR",
                "message": message,
                "target": "ccfleet",
                "fatal": true,
            })
            .to_string()
        }
    }
}

/// Whether to colour: only on a terminal, and never when `NO_COLOR` is set non-empty.
fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalid_rust_log_is_an_error_naming_it() {
        let err = filter(Some("info,ccfleet=loud"), "info").unwrap_err();
        assert!(format!("{err:#}").contains("ccfleet=loud"), "{err:#}");
    }

    #[test]
    fn a_valid_or_empty_rust_log_is_accepted() {
        assert!(filter(Some("warn,ccfleet::server=debug"), "info").is_ok());
        assert!(filter(Some("  "), "info").is_ok());
        assert!(filter(None, "error").is_ok());
    }

    #[test]
    fn a_fatal_line_is_json_when_the_logs_are() {
        assert_eq!(
            fatal_line(Format::Text, "no such file"),
            "ccfleet: no such file"
        );
        let line = fatal_line(Format::Json, "reading \"x\"\nsecond");
        assert!(!line.contains('\n'), "{line}");
        let event: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(event["level"], "ERROR");
        assert_eq!(event["message"], "reading \"x\"\nsecond");
        assert_eq!(event["fatal"], true);
        assert!(
            event["timestamp"].as_str().is_some_and(|t| t.len() > 10),
            "{line}"
        );
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(!colour(false, None));
        assert!(!colour(true, Some("1".as_ref())));
        assert!(colour(true, Some("".as_ref())));
    }
}
