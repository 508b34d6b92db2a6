//! The checked-in inputs of a fuzz target whose check lives in this crate (`fuzz/seeds/<target>`
//! and `fuzz/regressions/<target>`), for the unit tests that replay them.

use std::path::{Path, PathBuf};

/// The fuzz crate's directory.
pub(crate) fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// Every seed and past failure of `target`, with its path.
pub(crate) fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for dir in ["seeds", "regressions"] {
        let Ok(entries) = std::fs::read_dir(fuzz_dir().join(dir).join(target)) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            out.push((path, data));
        }
    }
    out
}
