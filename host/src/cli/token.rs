//! `ccfleet token`: an API token signed with `JWT_PRIVATE_KEY`.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use ccfleet::server::auth::Keypair;

/// Flags of `ccfleet token`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The token's subject (user name).
    #[arg(long)]
    sub: String,
    /// A role to grant (repeatable). The fleet API needs exactly `api`, or `admin` and `api`.
    #[arg(long = "role", value_name = "ROLE", default_values_t = vec!["api".to_owned()])]
    roles: Vec<String>,
    /// Lifetime as a Go duration (e.g. 24h); without it the token never expires.
    #[arg(long, value_parser = parse_ttl)]
    ttl: Option<Duration>,
    /// The signing key: the JWT_PRIVATE_KEY line of `ccfleet keygen` (standard base64 of
    /// the 64-byte Ed25519 private key).
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

/// Length of an Ed25519 public key, and of the bare seed the library also accepts.
const PUBLIC_KEY_LEN: usize = 32;

/// Refuses a value that is the length of a public key: `ccfleet keygen` prints 64-byte
/// private keys, and a `JWT_PUBLIC_KEY` value pasted here would be taken as a seed and sign
/// tokens the server rejects.
fn check_private_key(value: &str) -> anyhow::Result<Keypair> {
    use base64::Engine as _;
    if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(value.trim())
        && bytes.len() == PUBLIC_KEY_LEN
    {
        anyhow::bail!(
            "JWT_PRIVATE_KEY holds 32 bytes, the length of a public key: it looks like the JWT_PUBLIC_KEY value; use the JWT_PRIVATE_KEY line of `ccfleet keygen` (64 bytes)"
        );
    }
    Keypair::from_private_base64(value)
        .context("JWT_PRIVATE_KEY is not a usable Ed25519 private key")
}

/// Prints a token signed with `JWT_PRIVATE_KEY`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let keypair = check_private_key(&args.private_key)?;
    if let Ok(public) = std::env::var("JWT_PUBLIC_KEY")
        && !public.trim().is_empty()
        && public.trim() != keypair.public_key_base64()
    {
        tracing::warn!(
            "JWT_PUBLIC_KEY in this environment does not belong to JWT_PRIVATE_KEY: a server using it will reject this token"
        );
    }
    let roles: Vec<&str> = args.roles.iter().map(String::as_str).collect();
    if !ccfleet::server::auth::roles_grant_api(&args.roles) {
        tracing::warn!(
            "the roles {roles:?} do not grant access to the fleet API (it needs exactly \"api\", or \"admin\" and \"api\")"
        );
    }
    writeln!(
        std::io::stdout(),
        "{}",
        keypair.sign_token(&args.sub, &roles, args.ttl)
    )
    .context("writing to standard output")?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_public_key_given_as_the_private_key_is_refused() {
        let pair = Keypair::generate();
        let err = check_private_key(&pair.public_key_base64()).unwrap_err();
        assert!(err.to_string().contains("JWT_PUBLIC_KEY"), "{err}");
        let accepted = check_private_key(&pair.private_key_base64()).unwrap();
        assert_eq!(accepted.public_key_base64(), pair.public_key_base64());
    }
}
