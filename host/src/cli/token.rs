//! `ccfleet token`: an API token signed with `JWT_PRIVATE_KEY`.
//!
//! A lifetime is required (`--ttl`): a token that never expires has to be asked for by
//! name (`--no-expiry`), since a leaked one stays valid until the key pair is replaced.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use ccfleet::server::auth::Keypair;

/// Flags of `ccfleet token`.
#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("lifetime").required(true).args(["ttl", "no_expiry"]))]
pub struct Args {
    /// The token's subject (user name); not empty.
    #[arg(long, value_parser = parse_sub)]
    sub: String,
    /// A role to grant (repeatable). The fleet API needs exactly `api`, or `admin` and `api`;
    /// the fleet status views (`ccfleet fleet status`, the web page) need `admin` or
    /// `support`.
    #[arg(long = "role", value_name = "ROLE", default_values_t = vec!["api".to_owned()])]
    roles: Vec<String>,
    /// Lifetime as a Go duration (e.g. 720h); required unless --no-expiry is given.
    #[arg(long, value_parser = parse_ttl)]
    ttl: Option<Duration>,
    /// Mint a token that never expires (only the key pair's replacement revokes it).
    #[arg(long)]
    no_expiry: bool,
    /// The signing key: the JWT_PRIVATE_KEY line of `ccfleet keygen` (standard base64 of
    /// the 64-byte Ed25519 private key). Read from the environment variable JWT_PRIVATE_KEY
    /// unless given here (a flag shows in process listings).
    #[arg(long, env = "JWT_PRIVATE_KEY", hide_env_values = true)]
    private_key: Option<String>,
}

fn parse_sub(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("the subject must not be empty (it names who the token is for)".to_owned());
    }
    Ok(s.to_owned())
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
    let Some(private_key) = args.private_key.as_deref().filter(|k| !k.trim().is_empty()) else {
        anyhow::bail!(
            "no signing key: set JWT_PRIVATE_KEY to the JWT_PRIVATE_KEY= line of `ccfleet keygen` (e.g. `set -a; . keys.env; set +a`), or pass --private-key"
        );
    };
    let keypair = check_private_key(private_key)?;
    if let Ok(public) = std::env::var("JWT_PUBLIC_KEY")
        && !public.trim().is_empty()
        && public.trim() != keypair.public_key_base64()
    {
        tracing::warn!(
            "JWT_PUBLIC_KEY in this environment does not belong to JWT_PRIVATE_KEY: a server using it will reject this token"
        );
    }
    let roles: Vec<&str> = args.roles.iter().map(String::as_str).collect();
    if let Some(warning) = role_warning(&args.roles) {
        tracing::warn!("{warning}");
    }
    writeln!(
        std::io::stdout(),
        "{}",
        keypair.sign_token(&args.sub, &roles, args.ttl)
    )
    .context("writing to standard output")?;
    Ok(ExitCode::SUCCESS)
}

/// What a token with `roles` cannot do, when it can use neither the fleet API nor the
/// status views (a status reader's token, `admin` or `support`, is meant for the views).
fn role_warning(roles: &[String]) -> Option<String> {
    if ccfleet::server::auth::roles_grant_api(roles)
        || ccfleet::server::status::access::roles_grant_status(roles)
    {
        return None;
    }
    Some(format!(
        "the roles {roles:?} grant neither the fleet API (it needs exactly \"api\", or \"admin\" and \"api\") nor the fleet status (it needs \"admin\" or \"support\")"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_roles_that_grant_nothing_are_warned_about() {
        let roles = |r: &[&str]| r.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(role_warning(&roles(&["api"])), None);
        assert_eq!(
            role_warning(&roles(&["admin"])),
            None,
            "the status views need it"
        );
        assert_eq!(role_warning(&roles(&["support"])), None);
        let warning = role_warning(&roles(&["user"])).unwrap();
        assert!(warning.contains("neither the fleet API") && warning.contains("\"support\""));
    }

    #[test]
    fn a_public_key_given_as_the_private_key_is_refused() {
        let pair = Keypair::generate();
        let err = check_private_key(&pair.public_key_base64()).unwrap_err();
        assert!(err.to_string().contains("JWT_PUBLIC_KEY"), "{err}");
        let accepted = check_private_key(&pair.private_key_base64()).unwrap();
        assert_eq!(accepted.public_key_base64(), pair.public_key_base64());
    }
}
