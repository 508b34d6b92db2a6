//! Where native libraries may come from: the node's own configuration or environment,
//! never a directory of the agent's state.
//!
//! A library the agent `dlopen`s runs its constructors as the agent's user (root on most
//! nodes) before any check of the plugin applies. The fleet can put files into the agent's
//! download directory, so a library path resolving into it, or into the compile cache, is
//! refused whatever configuration names it.

use std::path::{Path, PathBuf};

/// Refuses the library a grant would load (`configured`, else the file the environment
/// variable `env` names) when it resolves into one of `state_dirs`. A library that does not
/// exist is left to fail at its load, with the loader's own reason.
pub fn check(configured: Option<&Path>, env: &str, state_dirs: &[PathBuf]) -> Result<(), String> {
    let library = match configured {
        Some(path) => path.to_path_buf(),
        None => match std::env::var_os(env).filter(|v| !v.is_empty()) {
            Some(path) => PathBuf::from(path),
            None => return Ok(()),
        },
    };
    let real = std::fs::canonicalize(&library).unwrap_or_else(|_| library.clone());
    for dir in state_dirs {
        let dir_real = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone());
        if real.starts_with(&dir_real) || library.starts_with(dir) {
            return Err(format!(
                "the native library {} lies in the agent's state directory {}; libraries are \
                 loaded only from the node's own directories",
                library.display(),
                dir.display()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_in_a_state_directory_is_refused_also_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("fleet-plugins");
        std::fs::create_dir_all(&state).unwrap();
        let evil = state.join("evil.so");
        std::fs::write(&evil, b"\x7fELF").unwrap();
        let link = dir.path().join("innocent.so");
        std::os::unix::fs::symlink(&evil, &link).unwrap();
        let dirs = vec![state.clone()];
        let unset = "CCFLEET_TEST_UNSET_LIBRARY_VARIABLE";
        assert!(
            check(Some(&evil), unset, &dirs)
                .unwrap_err()
                .contains("state directory")
        );
        assert!(check(Some(&link), unset, &dirs).is_err());
        check(Some(Path::new("/usr/lib/libnvidia-ml.so.1")), unset, &dirs).unwrap();
        check(None, unset, &dirs).unwrap();
    }
}
