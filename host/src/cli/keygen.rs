//! `ccfleet keygen`: a fresh Ed25519 key pair in cc-backend's environment convention.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Context as _;
use ccfleet::server::auth::Keypair;

/// Flags of `ccfleet keygen` (none).
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Prints `JWT_PUBLIC_KEY=` (for the server) and `JWT_PRIVATE_KEY=` (for `ccfleet token`)
/// lines, ready to be sourced by a shell or read as an environment file.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    let keypair = Keypair::generate();
    let mut out = std::io::stdout().lock();
    writeln!(out, "JWT_PUBLIC_KEY={}", keypair.public_key_base64())
        .and_then(|()| writeln!(out, "JWT_PRIVATE_KEY={}", keypair.private_key_base64()))
        .context("writing to standard output")?;
    Ok(ExitCode::SUCCESS)
}
