//! `ccfleet plugin keygen`, `sign` and `verify`: the site's signing key and its signatures
//! on components ([`ccfleet_host::plugin::signature`]).
//!
//! The secret key stays offline, where components are built and signed; agents hold only
//! public keys (`plugin-public-keys`). `sign` prints each signed file's SHA-256, the value a
//! fleet plugin entry names.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use ccfleet_host::plugin::signature::{self, PublicKey, PublicKeys, SecretKey};
use sha2::{Digest, Sha256};

/// Flags of `ccfleet plugin keygen`.
#[derive(Debug, clap::Args)]
pub struct KeygenArgs {
    /// Where to write the secret key (created with mode 0600; an existing file is never
    /// replaced: it may be the site's only copy of its key).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

/// Flags of `ccfleet plugin sign`.
#[derive(Debug, clap::Args)]
pub struct SignArgs {
    /// The secret key file (`ccfleet plugin keygen --out`, or a wasmsign2 secret key).
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    /// Write the signed component here instead of replacing the input (one input only).
    #[arg(long, short, value_name = "FILE")]
    out: Option<PathBuf>,
    /// The components to sign; each is replaced by its signed form unless `--out` is given.
    #[arg(required = true)]
    components: Vec<PathBuf>,
}

/// Flags of `ccfleet plugin verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// A public key (standard base64, as `keygen` prints it); repeatable: a signature by
    /// any of them is accepted.
    #[arg(long = "public-key", value_name = "BASE64", required = true)]
    public_keys: Vec<String>,
    /// The components to check.
    #[arg(required = true)]
    components: Vec<PathBuf>,
}

/// Writes a fresh secret key into `--out` and prints its public key.
pub fn keygen(args: KeygenArgs) -> anyhow::Result<ExitCode> {
    let key = SecretKey::generate();
    write_new_private(&args.out, key.to_file_text().as_bytes())
        .with_context(|| format!("writing the secret key to {}", args.out.display()))?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{}\n# The public key: list it in the agents' \"plugin-public-keys\". Keep {} offline.",
        key.public(),
        args.out.display()
    )
    .context("writing to standard output")?;
    Ok(ExitCode::SUCCESS)
}

/// Signs each component; prints `FILE: signed (sha256 HASH)`.
pub fn sign(args: SignArgs) -> anyhow::Result<ExitCode> {
    if args.out.is_some() && args.components.len() > 1 {
        bail!("--out takes one component; without it each component is signed in place");
    }
    let content = std::fs::read(&args.key)
        .with_context(|| format!("reading the secret key {}", args.key.display()))?;
    let key = SecretKey::from_file_bytes(&content)
        .map_err(|why| anyhow::anyhow!("the secret key {}: {why}", args.key.display()))?;
    let mut out = std::io::stdout().lock();
    for input in &args.components {
        let bytes = std::fs::read(input).with_context(|| format!("reading {}", input.display()))?;
        let signed = signature::sign(&bytes, &key)
            .map_err(|e| anyhow::anyhow!("{}: {e}", input.display()))?;
        let target = args.out.as_deref().unwrap_or(input);
        replace(target, &signed).with_context(|| format!("writing {}", target.display()))?;
        let sha = Sha256::digest(&signed)
            .iter()
            .fold(String::with_capacity(64), |mut s, b| {
                use std::fmt::Write as _;
                let _ = write!(s, "{b:02x}");
                s
            });
        writeln!(out, "{}: signed (sha256 {sha})", target.display())
            .context("writing to standard output")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Checks each component; exit status 1 when one does not verify.
pub fn verify(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let keys = args
        .public_keys
        .iter()
        .map(|text| {
            PublicKey::from_base64(text).map_err(|why| anyhow::anyhow!("--public-key: {why}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let keys = PublicKeys(keys);
    let mut status = ExitCode::SUCCESS;
    let mut out = std::io::stdout().lock();
    for path in &args.components {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let line = match signature::verify(&bytes, &keys) {
            Ok(()) => format!("{}: ok", path.display()),
            Err(refusal) => {
                status = ExitCode::from(1);
                format!("{}: error: {refusal}", path.display())
            }
        };
        writeln!(out, "{line}").context("writing to standard output")?;
    }
    Ok(status)
}

/// Writes a new file of mode 0600; fails when `path` exists.
fn write_new_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::fs::OpenOptions;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    options.mode(0o600);
    let mut file = options.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            anyhow::anyhow!(
                "{} exists; it is never replaced (move it away first)",
                path.display()
            )
        } else {
            e.into()
        }
    })?;
    file.write_all(bytes)?;
    file.sync_all()?;
    Ok(())
}

/// Replaces `path` with `bytes` through a temporary file beside it, so a reader never sees
/// half a component.
fn replace(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut file = tempfile::Builder::new()
        .prefix(".ccfleet-sign")
        .tempfile_in(dir)
        .with_context(|| format!("creating a file in {}", dir.display()))?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        // A component is no secret: readable as a build writes it.
        std::fs::set_permissions(file.path(), std::fs::Permissions::from_mode(0o644))?;
    }
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_key_file_is_private_and_never_replaced() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("site.key");
        write_new_private(&path, b"first\n").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let err = write_new_private(&path, b"second\n").unwrap_err();
        assert!(err.to_string().contains("never replaced"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"first\n");
    }
}
