//! The system's secrets, refused to every plugin on every path (`cc:fleet/files` and WASI
//! directories) unless a `read-files` entry names one outright, and the check that keeps
//! WASI directories clear of every secret.
//!
//! The system's secrets are the password and group shadow files, the SSH host keys, the
//! users' `.ssh` directories and `/root`. A pattern with a wildcard never lifts one (a
//! grant of `/**` still cannot read `/etc/shadow`); a literal entry naming the file or a
//! path below the directory does, for that plugin. The agent's own secrets (its token,
//! configuration, credentials: [`crate::RuntimeOptions::secret_files`]) are never lifted.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The system's secret files and directories; a `*` matches within one name.
const SYSTEM_SECRETS: [&str; 7] = [
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/ssh/ssh_host_*key",
    "/root",
    "/home/*/.ssh",
];

/// The components of a plain absolute path.
fn names(path: &str) -> Vec<&str> {
    path.split('/').filter(|n| !n.is_empty()).collect()
}

/// Whether the secret pattern `secret` is `path` or holds it.
fn holds(secret: &str, path: &[&str]) -> bool {
    let secret = names(secret);
    secret.len() <= path.len()
        && secret
            .iter()
            .zip(path)
            .all(|(s, p)| super::files::glob(s, p))
}

/// Whether a `read-files` entry names a system secret outright (no wildcard): such an entry
/// lifts the secret for its plugin, so the fleet may send it only where the node's ceiling
/// names the same.
pub fn names_system_secret(entry: &str) -> bool {
    if entry.contains('*') {
        return false;
    }
    let path = names(entry);
    SYSTEM_SECRETS.iter().any(|secret| holds(secret, &path))
}

/// The system secrets on this host that a plugin's `read-files` entries do not lift.
fn system_secrets(read_files: &[String]) -> Vec<PathBuf> {
    let lifted: Vec<Vec<&str>> = read_files
        .iter()
        .filter(|e| !e.contains('*'))
        .map(|e| names(e))
        .collect();
    let mut out = Vec::new();
    for secret in SYSTEM_SECRETS {
        for path in expand(secret) {
            let text = path.to_string_lossy();
            let parts = names(&text);
            let lift = lifted
                .iter()
                .any(|entry| entry.len() >= parts.len() && entry[..parts.len()] == parts[..]);
            if !lift && !out.contains(&path) {
                out.push(path);
            }
        }
    }
    out
}

/// The paths of this host a secret pattern names (its `*` expanded against the directory
/// listing); a path without `*` is kept whether it exists or not.
fn expand(secret: &str) -> Vec<PathBuf> {
    let mut found = vec![PathBuf::from("/")];
    for name in names(secret) {
        let mut next = Vec::new();
        for dir in &found {
            if !name.contains('*') {
                next.push(dir.join(name));
                continue;
            }
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let file = entry.file_name();
                if let Some(file) = file.to_str()
                    && super::files::glob(name, file)
                {
                    next.push(dir.join(file));
                }
            }
        }
        found = next;
    }
    found
}

/// The secrets refused to a plugin granted `read_files` (its capabilities' `read-files`):
/// the agent's own and the system's it does not lift. It takes the entries rather than the
/// capabilities, which check their directories against these secrets in turn.
pub(crate) fn for_plugin(agent: &Arc<[PathBuf]>, read_files: &[String]) -> Arc<[PathBuf]> {
    let mut all: Vec<PathBuf> = agent.to_vec();
    all.extend(system_secrets(read_files));
    Arc::from(all)
}

/// The secret a WASI directory (`real`, resolved) would expose: one lying in it, or one it
/// lies in. Secrets are compared resolved, so a link does not hide one.
pub(crate) fn exposed_by(real: &Path, secrets: &[PathBuf]) -> Option<PathBuf> {
    secrets.iter().find_map(|secret| {
        let resolved = std::fs::canonicalize(secret).unwrap_or_else(|_| secret.clone());
        (resolved.starts_with(real) || real.starts_with(&resolved)).then(|| secret.clone())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_secrets_are_named_outright_or_not_at_all() {
        assert!(names_system_secret("/etc/shadow"));
        assert!(names_system_secret("/root/.bashrc"));
        assert!(names_system_secret("/home/alice/.ssh/id_ed25519"));
        assert!(names_system_secret("/etc/ssh/ssh_host_ed25519_key"));
        assert!(!names_system_secret("/etc/ssh/ssh_host_ed25519_key.pub"));
        assert!(!names_system_secret("/etc/**"));
        assert!(!names_system_secret("/proc/loadavg"));
    }

    #[test]
    fn a_literal_grant_lifts_only_its_secret() {
        let secrets = system_secrets(&["/etc/shadow".into(), "/**".into()]);
        assert!(!secrets.contains(&PathBuf::from("/etc/shadow")));
        assert!(secrets.contains(&PathBuf::from("/etc/gshadow")));
        assert!(secrets.contains(&PathBuf::from("/root")));
        let none = system_secrets(&[]);
        assert!(none.contains(&PathBuf::from("/etc/shadow")));
    }

    #[test]
    fn a_directory_holding_or_in_a_secret_is_exposing() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("agent").join("token");
        std::fs::create_dir_all(token.parent().unwrap()).unwrap();
        std::fs::write(&token, "t").unwrap();
        let secrets = vec![token.clone()];
        let real = std::fs::canonicalize(dir.path()).unwrap();
        assert_eq!(exposed_by(&real, &secrets), Some(token.clone()));
        assert_eq!(
            exposed_by(Path::new("/var/empty-elsewhere"), &secrets),
            None
        );
        assert_eq!(
            exposed_by(Path::new("/root/data"), &[PathBuf::from("/root")]),
            Some(PathBuf::from("/root"))
        );
    }
}
