//! `ccfleet agent`: runs the agent from a configuration file until SIGINT or SIGTERM.

use std::path::PathBuf;

use ccfleet_host::agent::{self, AgentConfig};

/// Flags of `ccfleet agent`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The agent configuration (JSON: fleet, nats, discovery, metrics, plugins).
    #[arg(long, short)]
    config: PathBuf,
}

/// Runs `ccfleet agent`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let config = AgentConfig::load(&args.config)?;
    agent::run(config).await?;
    Ok(())
}
