//! `ccfleet plugin build`: every plugin crate of a cargo workspace (or one crate) to a
//! component.
//!
//! A plugin is a package with a `cdylib` target. It is built for `wasm32-unknown-unknown`
//! (no_std), or for WASI when its `ccfleet-guest` dependency enables the `std` feature or its
//! manifest says `[package.metadata.ccfleet] std = true`. Toolchains, in order of preference:
//!
//! - rustup's wasm targets (`wasm32-unknown-unknown`, `wasm32-wasip2`);
//! - Debian's Rust (`rustc-web` with its std sources for `-Zbuild-std`), `wasm-ld` from lld
//!   and, for std plugins, wasi-libc (`wasm32-wasip1` plus the preview 1 adapter).
//!
//! Core modules are then turned into components in-process (`plugin componentize`).

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context as _, bail};
use serde_json::Value;

/// Debian packages of the fallback toolchain.
pub const APT_PACKAGES: &str = "rustc-web rust-web-src lld-22 wasi-libc";

/// Exit status when no toolchain can build the plugins (as `scripts/build-guests.sh` had).
const NO_TOOLCHAIN: u8 = 3;

/// Settings of an outer cargo (e.g. when run from a test or a build script) that must not
/// leak into the guest build.
const CLEARED_ENV: [&str; 8] = [
    "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "CARGO_BUILD_TARGET",
    "RUSTC",
    "RUSTDOC",
    "CARGO_TARGET_DIR",
];

/// Flags of `ccfleet plugin build`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The workspace or plugin crate (a directory with a `Cargo.toml`).
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// Where to write the components (default: `components` in the target directory).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Cargo's target directory (default: the workspace's `target`).
    #[arg(long, value_name = "DIR")]
    target_dir: Option<PathBuf>,
    /// Build only this package (repeatable); all plugins by default.
    #[arg(long = "package", short = 'p', value_name = "NAME")]
    packages: Vec<String>,
}

/// One plugin crate.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PluginCrate {
    /// The package name (the component is `<package>.wasm`).
    package: String,
    /// The library target's name, as cargo names the module (`-` becomes `_`).
    lib: String,
    /// Whether it links std (built for WASI).
    std: bool,
}

/// Which toolchain builds a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Toolchain {
    Rustup,
    Debian,
}

/// Runs `ccfleet plugin build`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let manifest = args.dir.join("Cargo.toml");
    if !manifest.is_file() {
        bail!("{} has no Cargo.toml", args.dir.display());
    }
    let metadata = metadata(&manifest)?;
    let mut plugins = plugin_crates(&metadata)?;
    if !args.packages.is_empty() {
        for name in &args.packages {
            if !plugins.iter().any(|p| &p.package == name) {
                bail!(
                    "{name} is not a plugin crate (a cdylib) of {}",
                    args.dir.display()
                );
            }
        }
        plugins.retain(|p| args.packages.contains(&p.package));
    }
    if plugins.is_empty() {
        bail!(
            "{} holds no plugin crate (a package with crate-type = [\"cdylib\"])",
            args.dir.display()
        );
    }
    let target_dir = match &args.target_dir {
        Some(dir) => absolute(dir)?,
        None => PathBuf::from(
            metadata["target_directory"]
                .as_str()
                .context("cargo metadata names no target directory")?,
        ),
    };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| target_dir.join("components"));

    let (nostd, with_std): (Vec<_>, Vec<_>) = plugins.iter().partition(|p| !p.std);
    let wasm_ld = wasm_ld();
    let nostd_chain = if nostd.is_empty() {
        None
    } else {
        match select(&wasm_ld, "wasm32-unknown-unknown", false) {
            Some(chain) => Some(chain),
            None => return Ok(no_toolchain("wasm32-unknown-unknown", "the no_std plugins")),
        }
    };
    let std_chain = if with_std.is_empty() {
        None
    } else {
        match select(&wasm_ld, "wasm32-wasip2", true) {
            Some(chain) => Some(chain),
            None => return Ok(no_toolchain("wasm32-wasip2", "the std plugins")),
        }
    };

    let mut built = Vec::new();
    if let Some(chain) = nostd_chain {
        let target = "wasm32-unknown-unknown";
        eprintln!("==> no_std plugins ({target}, {chain:?} toolchain)");
        cargo_build(chain, target, &manifest, &target_dir, &nostd, &wasm_ld)?;
        built.extend(nostd.iter().map(|p| (*p, target)));
    }
    if let Some(chain) = std_chain {
        let target = match chain {
            Toolchain::Rustup => "wasm32-wasip2",
            Toolchain::Debian => "wasm32-wasip1",
        };
        eprintln!("==> std plugins ({target}, {chain:?} toolchain)");
        cargo_build(chain, target, &manifest, &target_dir, &with_std, &wasm_ld)?;
        built.extend(with_std.iter().map(|p| (*p, target)));
    }

    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut stdout = std::io::stdout().lock();
    for (plugin, target) in built {
        let module = target_dir
            .join(target)
            .join("release")
            .join(format!("{}.wasm", plugin.lib));
        let component = out.join(format!("{}.wasm", plugin.package));
        ccfleet_host::componentize::componentize_file(&module, &component)?;
        writeln!(stdout, "{}", component.display()).context("writing to standard output")?;
    }
    Ok(ExitCode::SUCCESS)
}

fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))
}

/// `cargo metadata --no-deps` of the workspace (needs no network).
fn metadata(manifest: &Path) -> anyhow::Result<Value> {
    let output = cargo(None)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--manifest-path",
        ])
        .arg(manifest)
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata failed for {}: {}",
            manifest.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    serde_json::from_slice(&output.stdout).context("reading cargo metadata's output")
}

/// The plugin crates among the workspace's packages, sorted by name.
fn plugin_crates(metadata: &Value) -> anyhow::Result<Vec<PluginCrate>> {
    let packages = metadata["packages"]
        .as_array()
        .context("cargo metadata lists no packages")?;
    let mut plugins = Vec::new();
    for package in packages {
        let Some(name) = package["name"].as_str() else {
            continue;
        };
        let cdylib = package["targets"].as_array().and_then(|targets| {
            targets.iter().find(|t| {
                t["crate_types"]
                    .as_array()
                    .is_some_and(|types| types.iter().any(|k| k == "cdylib"))
            })
        });
        let Some(lib) = cdylib.and_then(|t| t["name"].as_str()) else {
            continue;
        };
        let sdk_std = package["dependencies"].as_array().is_some_and(|deps| {
            deps.iter().any(|d| {
                d["name"] == "ccfleet-guest"
                    && d["features"]
                        .as_array()
                        .is_some_and(|f| f.iter().any(|f| f == "std"))
            })
        });
        let std = sdk_std || package["metadata"]["ccfleet"]["std"] == Value::Bool(true);
        plugins.push(PluginCrate {
            package: name.to_owned(),
            lib: lib.replace('-', "_"),
            std,
        });
    }
    plugins.sort_by(|a, b| a.package.cmp(&b.package));
    Ok(plugins)
}

fn no_toolchain(target: &str, what: &str) -> ExitCode {
    eprintln!(
        "error: no toolchain to build {what} (a {target} toolchain is missing).\n\
         Install one of:\n  \
         rustup target add wasm32-unknown-unknown wasm32-wasip2\n  \
         apt-get install -y {APT_PACKAGES}"
    );
    ExitCode::from(NO_TOOLCHAIN)
}

fn wasm_ld() -> Option<PathBuf> {
    [
        "wasm-ld-22",
        "wasm-ld-21",
        "wasm-ld-20",
        "wasm-ld-19",
        "wasm-ld-18",
        "wasm-ld",
    ]
    .into_iter()
    .find_map(which)
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// rustup's target when installed, else Debian's toolchain when complete.
fn select(wasm_ld: &Option<PathBuf>, rustup_target: &str, wasi: bool) -> Option<Toolchain> {
    if rustup_has(rustup_target) {
        return Some(Toolchain::Rustup);
    }
    let debian = Path::new("/usr/bin/cargo").is_file()
        && Path::new("/usr/bin/rustc").is_file()
        && wasm_ld.is_some()
        && debian_sysroot().is_some_and(|root| root.join("lib/rustlib/src/rust/library").is_dir())
        && (!wasi || Path::new("/usr/lib/wasm32-wasi/libc.a").is_file());
    debian.then_some(Toolchain::Debian)
}

fn rustup_has(target: &str) -> bool {
    Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .is_ok_and(|out| {
            out.status.success()
                && String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .any(|l| l == target)
        })
}

fn debian_sysroot() -> Option<PathBuf> {
    let out = Command::new("/usr/bin/rustc")
        .args(["--print", "sysroot"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// A cargo command without the outer build's settings.
fn cargo(chain: Option<Toolchain>) -> Command {
    let program = match chain {
        Some(Toolchain::Debian) => OsString::from("/usr/bin/cargo"),
        _ => OsString::from("cargo"),
    };
    let mut command = Command::new(program);
    for name in CLEARED_ENV {
        command.env_remove(name);
    }
    command
}

fn cargo_build(
    chain: Toolchain,
    target: &str,
    manifest: &Path,
    target_dir: &Path,
    plugins: &[&PluginCrate],
    wasm_ld: &Option<PathBuf>,
) -> anyhow::Result<()> {
    let mut command = cargo(Some(chain));
    command
        .args(["build", "--release", "--target", target, "--manifest-path"])
        .arg(manifest)
        .arg("--target-dir")
        .arg(target_dir);
    for plugin in plugins {
        command.args(["-p", &plugin.package]);
    }
    if chain == Toolchain::Debian {
        let linker = wasm_ld.as_ref().context("no wasm-ld")?;
        let env_target = target.to_uppercase().replace('-', "_");
        command
            .env("RUSTC", "/usr/bin/rustc")
            .env("RUSTDOC", "/usr/bin/rustdoc")
            // Debian's rustc is stable; -Zbuild-std needs this to build core for wasm.
            .env("RUSTC_BOOTSTRAP", "1")
            .env(format!("CARGO_TARGET_{env_target}_LINKER"), linker);
        if target == "wasm32-wasip1" {
            command
                .env(
                    "CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS",
                    "-L /usr/lib/wasm32-wasi -C link-self-contained=no",
                )
                .arg("-Zbuild-std=std,panic_abort");
        } else {
            command.arg("-Zbuild-std=core,alloc");
        }
    }
    let status = command
        .status()
        .with_context(|| format!("running cargo build for {target}"))?;
    if !status.success() {
        bail!("cargo build for {target} failed ({status})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_crates_are_the_cdylibs_and_std_follows_the_sdk_feature_or_metadata() {
        let metadata = serde_json::json!({"packages": [
            {"name": "ccfleet-guest", "targets": [{"name": "ccfleet_guest", "crate_types": ["lib"]}],
             "dependencies": [], "metadata": null},
            {"name": "my-probe", "targets": [{"name": "my-probe", "crate_types": ["cdylib"]}],
             "dependencies": [{"name": "ccfleet-guest", "features": ["std"]}], "metadata": null},
            {"name": "bare", "targets": [{"name": "bare", "crate_types": ["cdylib", "rlib"]}],
             "dependencies": [], "metadata": {"ccfleet": {"std": true}}},
            {"name": "loadavg", "targets": [{"name": "loadavg", "crate_types": ["cdylib"]}],
             "dependencies": [{"name": "ccfleet-guest", "features": ["rt"]}], "metadata": null}
        ]});
        let plugins = plugin_crates(&metadata).unwrap();
        let summary: Vec<(&str, &str, bool)> = plugins
            .iter()
            .map(|p| (p.package.as_str(), p.lib.as_str(), p.std))
            .collect();
        assert_eq!(
            summary,
            [
                ("bare", "bare", true),
                ("loadavg", "loadavg", false),
                ("my-probe", "my_probe", true)
            ]
        );
    }
}
