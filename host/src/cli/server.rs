//! `ccfleet server`, `ccfleet keygen` and `ccfleet token`: run a fleet server and mint the
//! credentials its members need.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use ccfleet::server::{ServerConfig, auth::Keypair};

/// Arguments of `ccfleet server`.
#[derive(Debug, clap::Args)]
pub struct ServerArgs {
    /// The JSON config file (addr, db, api-allowed-ips, jwt-public-key, nats, fleet).
    #[arg(long, short = 'c', value_name = "FILE")]
    config: PathBuf,
}

/// Arguments of `ccfleet keygen`.
#[derive(Debug, clap::Args)]
pub struct KeygenArgs {}

/// Arguments of `ccfleet token`.
#[derive(Debug, clap::Args)]
pub struct TokenArgs {
    /// The token's subject (user name).
    #[arg(long)]
    sub: String,
    /// A role to grant (repeatable). The fleet API needs exactly `api`, or `admin` and `api`.
    #[arg(long = "role", value_name = "ROLE", default_values_t = vec!["api".to_owned()])]
    roles: Vec<String>,
    /// Lifetime as a Go duration (e.g. 24h); without it the token never expires.
    #[arg(long, value_parser = parse_ttl)]
    ttl: Option<Duration>,
    /// The signing key: standard base64 of the 64-byte Ed25519 private key.
    #[arg(long, env = "JWT_PRIVATE_KEY", hide_env_values = true)]
    private_key: String,
}

fn parse_ttl(s: &str) -> Result<Duration, String> {
    match ccfleet::duration::parse(s) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err("the ttl must be positive".to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

/// Runs the server until SIGINT or SIGTERM, then shuts it down gracefully.
pub async fn run_server(args: ServerArgs) -> anyhow::Result<()> {
    let text = tokio::fs::read_to_string(&args.config)
        .await
        .with_context(|| format!("reading {}", args.config.display()))?;
    let config = ServerConfig::from_json(&text)
        .with_context(|| format!("parsing {}", args.config.display()))?;
    let server = ccfleet::server::start(config).await?;
    wait_for_signal().await?;
    tracing::info!("fleet: shutting down");
    server.shutdown().await?;
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT")?,
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    Ok(())
}

/// Prints a fresh key pair as `JWT_PUBLIC_KEY=` and `JWT_PRIVATE_KEY=` lines, the
/// environment convention of cc-backend.
pub fn run_keygen(_args: KeygenArgs) -> anyhow::Result<()> {
    let keypair = Keypair::generate();
    println!("JWT_PUBLIC_KEY={}", keypair.public_key_base64());
    println!("JWT_PRIVATE_KEY={}", keypair.private_key_base64());
    Ok(())
}

/// Prints a token signed with `JWT_PRIVATE_KEY`.
pub fn run_token(args: TokenArgs) -> anyhow::Result<()> {
    let keypair = Keypair::from_private_base64(&args.private_key)
        .context("JWT_PRIVATE_KEY is not a usable Ed25519 private key")?;
    let roles: Vec<&str> = args.roles.iter().map(String::as_str).collect();
    if !ccfleet::server::auth::roles_grant_api(&args.roles) {
        tracing::warn!(
            "the roles {roles:?} do not grant access to the fleet API (it needs exactly \"api\", or \"admin\" and \"api\")"
        );
    }
    println!("{}", keypair.sign_token(&args.sub, &roles, args.ttl));
    Ok(())
}
