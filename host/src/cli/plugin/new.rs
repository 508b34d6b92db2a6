//! `ccfleet plugin new`: a plugin crate that builds anywhere, offline.
//!
//! The SDK is not on a registry: its sources (with the WIT of the `cc:fleet` world) are
//! compiled into this binary and written beside the plugin as a path dependency, so the
//! crate needs nothing from this repository. Its registry dependencies (wit-bindgen,
//! dlmalloc) come from cargo's cache or crates.io; the `Cargo.lock` written with it pins the
//! versions this SDK was built and tested with.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};

/// The SDK's files, as they are in this repository.
const SDK_LIB: &str = include_str!("../../../../guest/sdk/src/lib.rs");
const SDK_PANIC: &str = include_str!("../../../../guest/sdk/src/panic.rs");
const SDK_ALLOC: &str = include_str!("../../../../guest/sdk/src/alloc_classes.rs");
const SDK_COMMANDS: &str = include_str!("../../../../guest/sdk/src/commands.rs");
const SDK_NVML: &str = include_str!("../../../../guest/sdk/src/nvml.rs");
const SDK_LIKWID: &str = include_str!("../../../../guest/sdk/src/likwid.rs");
const SDK_ROCM_SMI: &str = include_str!("../../../../guest/sdk/src/rocm_smi.rs");
const SDK_LINES: &str = include_str!("../../../../guest/sdk/src/lines.rs");
const SDK_LINEPROTO: &str = include_str!("../../../../guest/sdk/src/lineproto.rs");
/// The encoder's files, which the SDK compiles from the host crate's sources (`#[path]`);
/// a scaffold gets them as the SDK's own `lineproto/` module files.
const SHARED_ENCODER: [(&str, &str); 4] = [
    (
        "encoder.rs",
        include_str!("../../../../src/lineproto/encoder.rs"),
    ),
    (
        "format.rs",
        include_str!("../../../../src/lineproto/format.rs"),
    ),
    (
        "precision.rs",
        include_str!("../../../../src/lineproto/precision.rs"),
    ),
    (
        "table.rs",
        include_str!("../../../../src/lineproto/table.rs"),
    ),
];
const SDK_WIT: &str = include_str!("../../../../wit/fleet.wit");
/// The guest workspace's lock file: the versions the SDK is tested with.
const LOCK: &str = include_str!("../../../../guest/Cargo.lock");

const PLUGIN_MANIFEST: &str = include_str!("templates/plugin-Cargo.toml");
const SDK_MANIFEST: &str = include_str!("templates/sdk-Cargo.toml");
const NOSTD_LIB: &str = include_str!("templates/nostd-lib.rs");
const STD_LIB: &str = include_str!("templates/std-lib.rs");
const README: &str = include_str!("templates/README.md");
const GITIGNORE: &str = include_str!("templates/gitignore");

/// Flags of `ccfleet plugin new`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The new crate's directory; its last component is the package name (letters, digits,
    /// `-` and `_`, starting with a letter).
    path: PathBuf,
    /// A plugin that links std (built for WASI and run with WASI granted) instead of a
    /// no_std one without WASI.
    #[arg(long)]
    std: bool,
}

/// Runs `ccfleet plugin new`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let name = args
        .path
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} names no directory", args.path.display()))?;
    check_name(name)?;
    if args.path.exists() {
        bail!("{} already exists", args.path.display());
    }
    for (file, text) in files(name, args.std) {
        let path = args.path.join(file);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    eprintln!(
        "created {} (package `{name}`); next: ccfleet plugin build {}",
        args.path.display(),
        args.path.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The package name must be a cargo package name and give a Rust type name.
fn check_name(name: &str) -> anyhow::Result<()> {
    let valid = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid {
        bail!(
            "{} is not a plugin name: use letters, digits, `-` and `_`, starting with a letter, \
             at most 64 characters",
            ccfleet::untrusted::Untrusted(name)
        );
    }
    if name == "ccfleet-guest" || name == "ccfleet_guest" {
        bail!("{name} is the SDK's own name; choose another");
    }
    Ok(())
}

/// `my-plugin` → `MyPlugin`.
fn type_name(name: &str) -> String {
    name.split(['-', '_'])
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            let first = chars.next().map(|c| c.to_ascii_uppercase());
            first.into_iter().chain(chars).collect::<String>()
        })
        .collect()
}

/// The crate's files: (path inside the crate, contents).
fn files(name: &str, links_std: bool) -> Vec<(PathBuf, String)> {
    let fill = |template: &str| {
        template
            .replace("{name}", name)
            .replace("{type_name}", &type_name(name))
            .replace("{sdk_feature}", if links_std { "std" } else { "rt" })
            .replace("{run_flags}", if links_std { "--wasi " } else { "" })
    };
    let files: Vec<(&Path, String)> = vec![
        (Path::new("Cargo.toml"), fill(PLUGIN_MANIFEST)),
        (Path::new("Cargo.lock"), LOCK.to_owned()),
        (
            Path::new("src/lib.rs"),
            fill(if links_std { STD_LIB } else { NOSTD_LIB }),
        ),
        (Path::new("README.md"), fill(README)),
        (Path::new(".gitignore"), GITIGNORE.to_owned()),
        (
            Path::new("ccfleet-guest/Cargo.toml"),
            SDK_MANIFEST.to_owned(),
        ),
        (Path::new("ccfleet-guest/src/lib.rs"), SDK_LIB.to_owned()),
        (
            Path::new("ccfleet-guest/src/panic.rs"),
            SDK_PANIC.to_owned(),
        ),
        (
            Path::new("ccfleet-guest/src/alloc_classes.rs"),
            SDK_ALLOC.to_owned(),
        ),
        (
            Path::new("ccfleet-guest/src/commands.rs"),
            SDK_COMMANDS.to_owned(),
        ),
        (
            Path::new("ccfleet-guest/src/lines.rs"),
            SDK_LINES.to_owned(),
        ),
        (Path::new("ccfleet-guest/src/nvml.rs"), SDK_NVML.to_owned()),
        (
            Path::new("ccfleet-guest/src/rocm_smi.rs"),
            SDK_ROCM_SMI.to_owned(),
        ),
        (
            Path::new("ccfleet-guest/src/likwid.rs"),
            SDK_LIKWID.to_owned(),
        ),
        (
            Path::new("ccfleet-guest/src/lineproto.rs"),
            scaffold_lineproto(),
        ),
        (Path::new("ccfleet-guest/wit/fleet.wit"), SDK_WIT.to_owned()),
    ];
    let mut files: Vec<(PathBuf, String)> = files
        .into_iter()
        .map(|(path, text)| (path.to_path_buf(), text))
        .collect();
    for (name, text) in SHARED_ENCODER {
        files.push((
            Path::new("ccfleet-guest/src/lineproto").join(name),
            text.to_owned(),
        ));
    }
    files
}

/// The SDK's `lineproto` module for a scaffold: its files sit beside it in `lineproto/`, so
/// the `#[path]` attributes that point into this repository are dropped.
fn scaffold_lineproto() -> String {
    SDK_LINEPROTO
        .lines()
        .filter(|line| !line.starts_with("#[path = \"../../../src/lineproto/"))
        .map(|line| format!("{line}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_package_names_are_refused() {
        for bad in [
            "",
            "1plugin",
            "my plugin",
            "a/b",
            "ccfleet-guest",
            "é",
            &"a".repeat(65),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["hello", "my-plugin", "gpu_temp2"] {
            check_name(good).unwrap();
        }
        assert_eq!(type_name("my-gpu_temp2"), "MyGpuTemp2");
    }

    #[test]
    fn the_scaffold_carries_every_sdk_source_file_and_no_placeholder() {
        // A module added to the SDK must be written into scaffolds too.
        let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/sdk/src");
        let mut on_disk: Vec<String> = std::fs::read_dir(&sdk)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        // ... and every file the SDK's `lineproto` module compiles from the host crate.
        let lineproto = std::fs::read_to_string(sdk.join("lineproto.rs")).unwrap();
        for line in lineproto.lines() {
            if let Some(path) = line.strip_prefix("#[path = \"../../../src/") {
                on_disk.push(path.trim_end_matches("\"]").to_owned());
            }
        }
        on_disk.sort();
        for std in [false, true] {
            let files = files("my-plugin", std);
            let mut written: Vec<String> = files
                .iter()
                .filter_map(|(p, _)| p.strip_prefix("ccfleet-guest/src").ok())
                .map(|p| p.display().to_string())
                .collect();
            written.sort();
            assert_eq!(written, on_disk);
            for (path, text) in &files {
                for placeholder in ["{name}", "{type_name}", "{sdk_feature}", "{run_flags}"] {
                    assert!(
                        !text.contains(placeholder),
                        "{} holds {placeholder}",
                        path.display()
                    );
                }
            }
        }
    }
}
