//! `ccfleet agent`: runs the agent from a configuration file until SIGINT or SIGTERM, or only
//! checks the configuration (`--check-config`).

use std::path::PathBuf;
use std::process::ExitCode;

use ccfleet_host::agent::{self, AgentConfig};

/// Flags of `ccfleet agent`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The agent configuration (JSON: fleet, nats, discovery, metrics, plugins). Relative
    /// paths in it are resolved against the file's directory.
    #[arg(long, short, value_name = "FILE")]
    config: PathBuf,
    /// Validate the configuration (keys, fleet section, token, NATS files, metric sink,
    /// plugins compile) and exit without starting: status 0 when usable, 1 when not.
    #[arg(long)]
    check_config: bool,
}

impl Args {
    /// Whether only the configuration is checked (its report is the output, not the logs).
    pub fn checks_only(&self) -> bool {
        self.check_config
    }
}

/// Runs `ccfleet agent`.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.check_config {
        return super::check_config::agent(&args.config).await;
    }
    let config = AgentConfig::load(&args.config)?;
    agent::run(config).await?;
    Ok(ExitCode::SUCCESS)
}
