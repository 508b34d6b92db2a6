//! `ccfleet keygen`: a fresh Ed25519 key pair in cc-backend's environment convention.
//!
//! `--out FILE` writes the pair into a file only its owner can read (mode 0600): a shell
//! redirect creates the file with the umask's mode, usually readable by every user, and the
//! private key in it mints tokens for the whole fleet.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use ccfleet::server::auth::Keypair;

/// Flags of `ccfleet keygen`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Write the two lines into FILE (created or replaced with mode 0600) instead of
    /// printing them.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

/// Prints `JWT_PUBLIC_KEY=` (for the server) and `JWT_PRIVATE_KEY=` (for `ccfleet token`)
/// lines, ready to be sourced by a shell or read as an environment file, or writes them
/// into `--out FILE`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let keypair = Keypair::generate();
    let text = format!(
        "JWT_PUBLIC_KEY={}\nJWT_PRIVATE_KEY={}\n",
        keypair.public_key_base64(),
        keypair.private_key_base64()
    );
    match args.out {
        Some(path) => write_private(&path, text.as_bytes())
            .with_context(|| format!("writing the key pair to {}", path.display()))?,
        None => std::io::stdout()
            .lock()
            .write_all(text.as_bytes())
            .context("writing to standard output")?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes `bytes` into `path` through a temporary file of mode 0600 beside it, renamed over
/// the target: an existing file keeps neither its contents nor its (maybe wider) mode, and
/// no reader ever sees half a key.
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    // tempfile creates its files with mode 0600 on Unix.
    let mut file = tempfile::Builder::new()
        .prefix(".ccfleet-keygen")
        .tempfile_in(dir)
        .with_context(|| format!("creating a file in {}", dir.display()))?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn an_existing_readable_file_is_replaced_by_a_private_one() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.env");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&path, b"JWT_PRIVATE_KEY=x\n").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read(&path).unwrap(), b"JWT_PRIVATE_KEY=x\n");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file is left behind");
    }
}
