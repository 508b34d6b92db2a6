//! Builds the guest plugins from source, once per test binary, with the project's own script.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The repository root.
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ has a parent")
}

/// The directory of freshly built components (guest/target/components).
pub fn components() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = repo_root();
        let out = root.join("guest").join("target").join("components");
        let status = Command::new("bash")
            .arg(root.join("scripts").join("build-guests.sh"))
            .arg(&out)
            .env("CCFLEET_BIN", env!("CARGO_BIN_EXE_ccfleet"))
            .status()
            .expect("running scripts/build-guests.sh");
        assert!(status.success(), "scripts/build-guests.sh failed: {status}");
        out
    })
}

/// The path of one built component, e.g. `component("roster-logger")`.
pub fn component(name: &str) -> PathBuf {
    let path = components().join(format!("{name}.wasm"));
    assert!(path.is_file(), "{} was not built", path.display());
    path
}
