//! What a plugin may reach beyond the `cc:fleet/host` interface, and the one place where
//! those grants become a WASI context.
//!
//! Host files reach collectors through `cc:fleet/files` ([`super::files`]), which resolves
//! every path on the host and never hands out the agent's own process. WASI directories are
//! for plain data only: a directory that is, lies in or contains a kernel pseudo-filesystem
//! (`/proc`, `/sys`, `/dev`, ...) is refused, since inside a preopened `/proc` the plugin
//! could read `/proc/self/environ` and `/proc/self/mem`, the agent's secrets.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use super::commands::{self, RunGrant};
use super::files::Pattern;

/// File systems that are views of the kernel and its processes, never preopened for WASI.
const PSEUDO_FILESYSTEMS: [&str; 12] = [
    "proc",
    "sysfs",
    "devtmpfs",
    "devpts",
    "debugfs",
    "tracefs",
    "securityfs",
    "efivarfs",
    "bpf",
    "configfs",
    "binfmt_misc",
    "fusectl",
];

/// Capabilities granted to a plugin. Nothing is granted by default: the plugin sees only
/// the `cc:fleet/host` interface, and `cc:fleet/files` refuses every path.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Capabilities {
    /// Links WASI (clocks, random, stdio discarded; no network, no environment). A component
    /// importing WASI without this grant is refused at load.
    #[serde(default)]
    pub wasi: bool,
    /// Host directories the plugin may read through WASI, each visible under the same path.
    /// Needs `wasi`. `/proc`, `/sys`, `/dev` and any directory holding such a file system
    /// are refused: grant their files with `read-files` instead.
    #[serde(default)]
    pub read_dirs: Vec<PathBuf>,
    /// Host files the plugin may read through `cc:fleet/files`: absolute paths or patterns
    /// (`*` within a name, `**` as a whole component for any depth), e.g. `/proc/loadavg`,
    /// `/sys/class/hwmon/**`. Needs no WASI.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_files: Vec<String>,
    /// The directory `read-files` paths are looked up in (default `/`), e.g. a directory of
    /// fixtures holding `proc/stat`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_root: Option<PathBuf>,
    /// The mount table and per-mount statistics (`/proc/self/mounts`, `mountinfo`,
    /// `mountstats`, served by the agent itself) and `statvfs` of the mount points it
    /// lists, for `diskstat` and `nfsiostat`; nothing else of the agent's process
    /// ([`super::mounts`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mount_info: bool,
    /// Commands the plugin may run through `cc:fleet/commands`, by name: each an absolute
    /// executable with fixed arguments, run without a shell under a timeout and an output
    /// cap ([`super::commands`]). Needs no WASI.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub run: BTreeMap<String, RunGrant>,
    /// NVIDIA GPUs through the NVML library, which the agent loads for the plugin
    /// (`cc:fleet/nvml`, for the `nvidia` collector): read-only device readings, nothing
    /// else of the library ([`super::nvml`]). On a node without the library the grant's
    /// calls fail with `NVML is not available on this host`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nvml: bool,
    /// The NVML library to load instead of `libnvidia-ml.so.1` from the loader's search path
    /// (or the file `CCFLEET_NVML_LIBRARY` names), e.g. for a driver installed elsewhere.
    /// Needs `nvml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvml_library: Option<PathBuf>,
    /// Hardware performance counters through the LIKWID library, which the agent loads for
    /// the plugin (`cc:fleet/likwid`, for the `likwid` collector): measurements of the event
    /// sets the plugin names, nothing else of the library ([`super::native::likwid`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub likwid: bool,
    /// The LIKWID library to load instead of `liblikwid.so.5` from the loader's search path
    /// (or the file `CCFLEET_LIKWID_LIBRARY` names), cc-metric-collector's `liblikwid_path`.
    /// Needs `likwid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub likwid_library: Option<PathBuf>,
    /// AMD GPUs through the ROCm SMI library, which the agent loads for the plugin
    /// (`cc:fleet/rocm-smi`, for the `rocm_smi` collector): the list of GPUs and their
    /// metrics tables, nothing else of the library ([`super::native::rocm_smi`]). On a node
    /// without AMD GPUs the grant's calls fail with `ROCm SMI is not available on this host`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rocm_smi: bool,
    /// The ROCm SMI library to load instead of `librocm_smi64.so.1` (or `.so.5`) from the
    /// loader's search path (or the file `CCFLEET_ROCM_SMI_LIBRARY` names), e.g.
    /// `/opt/rocm/lib/librocm_smi64.so.5`. Needs `rocm-smi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rocm_smi_library: Option<PathBuf>,
}

/// A grant of a native library the agent loads for a plugin: its flag and the library the
/// node names for it.
pub struct NativeLibrary<'a> {
    /// The library key (`nvml-library`, ...).
    pub key: &'static str,
    /// Whether the grant's flag is set.
    pub granted: bool,
    /// The library path the grant names.
    pub library: Option<&'a Path>,
}

impl Capabilities {
    /// The native-library grants, each with the library it names: these paths come only
    /// from the node's own configuration and never from a state directory of the agent's.
    pub fn native_libraries(&self) -> [NativeLibrary<'_>; 3] {
        [
            NativeLibrary {
                key: "nvml-library",
                granted: self.nvml,
                library: self.nvml_library.as_deref(),
            },
            NativeLibrary {
                key: "likwid-library",
                granted: self.likwid,
                library: self.likwid_library.as_deref(),
            },
            NativeLibrary {
                key: "rocm-smi-library",
                granted: self.rocm_smi,
                library: self.rocm_smi_library.as_deref(),
            },
        ]
    }

    /// Checks the grants without touching the file system.
    pub fn validate(&self) -> Result<(), String> {
        if !self.read_dirs.is_empty() && !self.wasi {
            return Err("capabilities.read-dirs needs capabilities.wasi = true".to_owned());
        }
        for dir in &self.read_dirs {
            if !dir.is_absolute() {
                return Err(format!(
                    "capabilities.read-dirs entry {} must be an absolute path",
                    dir.display()
                ));
            }
            if let Some(why) = lexically_kernel(dir) {
                return Err(format!(
                    "capabilities.read-dirs entry {}: {why}; grant the files a collector \
                     needs with capabilities.read-files instead",
                    dir.display()
                ));
            }
        }
        for pattern in &self.read_files {
            Pattern::parse(pattern).map_err(|e| format!("capabilities.{e}"))?;
        }
        if let Some(root) = &self.files_root
            && !root.is_absolute()
        {
            return Err(format!(
                "capabilities.files-root {} must be an absolute path",
                root.display()
            ));
        }
        commands::validate(&self.run)?;
        for native in self.native_libraries() {
            let Some(library) = native.library else {
                continue;
            };
            let key = native.key;
            if !native.granted {
                let flag = key.trim_end_matches("-library");
                return Err(format!(
                    "capabilities.{key} needs capabilities.{flag} = true"
                ));
            }
            if !library.is_absolute() {
                return Err(format!(
                    "capabilities.{key} {} must be an absolute path",
                    library.display()
                ));
            }
        }
        Ok(())
    }

    /// Adds the grants to a WASI context. A fresh `WasiCtxBuilder` grants nothing: stdin is
    /// closed, stdout and stderr are discarded, no directory is preopened, no environment
    /// variable or argument is set, and every network address is denied. Only the lines
    /// below widen that: each of `read-dirs`, read-only, once it is shown to hold no kernel
    /// file system (after resolving links, against the mount table) and to hold and lie in
    /// none of `secrets` (the agent's and the system's, [`super::secrets`]).
    pub fn configure(
        &self,
        builder: &mut WasiCtxBuilder,
        secrets: &[PathBuf],
    ) -> Result<(), GrantError> {
        for dir in &self.read_dirs {
            let fail = |reason: String| GrantError {
                path: dir.clone(),
                reason,
            };
            let real = std::fs::canonicalize(dir).map_err(|e| fail(e.to_string()))?;
            if let Some(why) = lexically_kernel(&real) {
                return Err(fail(format!("it resolves to {}: {why}", real.display())));
            }
            if let Some(mount) = kernel_mount_touching(&real).map_err(fail)? {
                return Err(fail(format!(
                    "it overlaps the kernel file system mounted at {}",
                    mount.display()
                )));
            }
            if let Some(secret) = super::secrets::exposed_by(&real, secrets) {
                return Err(fail(format!(
                    "it would expose {}, which plugins never read",
                    secret.display()
                )));
            }
            let guest = dir.to_string_lossy();
            builder
                .preopened_dir(&real, guest.as_ref(), FsPerms::ReadOnly)
                .map_err(|e| fail(format!("{e:#}")))?;
        }
        Ok(())
    }
}

/// A grant that could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantError {
    /// The path that was to be granted.
    pub path: PathBuf,
    /// Why it could not be.
    pub reason: String,
}

/// Why a directory is refused by its name alone: `/`, anything with `..`, or `/proc`,
/// `/sys`, `/dev` and what lies below them.
fn lexically_kernel(dir: &Path) -> Option<&'static str> {
    let mut normal = dir
        .components()
        .filter(|c| !matches!(c, Component::RootDir));
    match normal.next() {
        None => Some("it holds /proc, /sys and /dev"),
        Some(Component::Normal(top)) if top == "proc" || top == "sys" || top == "dev" => {
            Some("kernel file systems are never preopened")
        }
        _ if dir
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir)) =>
        {
            Some("`.` and `..` are not allowed")
        }
        _ => None,
    }
}

/// The mount point of a kernel pseudo-filesystem that `dir` lies in or contains, if any.
fn kernel_mount_touching(dir: &Path) -> Result<Option<PathBuf>, String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read the mount table to check the grant: {e}"))?;
    Ok(kernel_mounts(&table)
        .into_iter()
        .find(|mount| mount.starts_with(dir) || dir.starts_with(mount)))
}

/// The mount points of kernel pseudo-filesystems in a `/proc/self/mountinfo` text.
fn kernel_mounts(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split(' ').nth(4)?;
            let fs_type = right.split(' ').next()?;
            PSEUDO_FILESYSTEMS
                .contains(&fs_type)
                .then(|| PathBuf::from(super::mounts::unescape(mount_point)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_directories_are_refused_by_name() {
        for dir in [
            "/",
            "/proc",
            "/proc/self",
            "/sys/class",
            "/dev",
            "/data/../proc",
        ] {
            let caps = Capabilities {
                wasi: true,
                read_dirs: vec![dir.into()],
                ..Capabilities::default()
            };
            let err = caps.validate().unwrap_err();
            assert!(err.contains("read-files instead"), "{dir}: {err}");
        }
        let fine = Capabilities {
            wasi: true,
            read_dirs: vec!["/var/lib/data".into()],
            read_files: vec!["/proc/loadavg".into()],
            files_root: None,
            mount_info: false,
            run: BTreeMap::new(),
            nvml: true,
            nvml_library: Some("/opt/nvidia/libnvidia-ml.so.1".into()),
            likwid: true,
            likwid_library: Some("/apps/likwid/lib/liblikwid.so.5".into()),
            rocm_smi: true,
            rocm_smi_library: Some("/opt/rocm/lib/librocm_smi64.so.5".into()),
        };
        fine.validate().unwrap();
        let ungranted = Capabilities {
            rocm_smi_library: Some("/opt/rocm/lib/librocm_smi64.so.5".into()),
            ..Capabilities::default()
        };
        let err = ungranted.validate().unwrap_err();
        assert_eq!(
            err,
            "capabilities.rocm-smi-library needs capabilities.rocm-smi = true"
        );
        let relative = Capabilities {
            rocm_smi: true,
            rocm_smi_library: Some("librocm_smi64.so.1".into()),
            ..Capabilities::default()
        };
        let err = relative.validate().unwrap_err();
        assert!(
            err.contains("rocm-smi-library") && err.contains("absolute"),
            "{err}"
        );
        let ungranted = Capabilities {
            likwid_library: Some("/apps/likwid/lib/liblikwid.so.5".into()),
            ..Capabilities::default()
        };
        let err = ungranted.validate().unwrap_err();
        assert!(err.contains("needs capabilities.likwid"), "{err}");
        let relative = Capabilities {
            likwid: true,
            likwid_library: Some("liblikwid.so.5".into()),
            ..Capabilities::default()
        };
        let err = relative.validate().unwrap_err();
        assert!(err.contains("absolute"), "{err}");
    }

    #[test]
    fn mountinfo_names_kernel_mounts_with_escapes() {
        let table = "22 1 0:21 / /proc rw,nosuid - proc proc rw\n\
                     23 1 0:22 / /sys rw - sysfs sysfs rw\n\
                     24 1 8:1 / / rw - ext4 /dev/sda1 rw\n\
                     25 24 0:23 / /srv/my\\040proc rw - proc proc rw\n";
        assert_eq!(
            kernel_mounts(table),
            [
                PathBuf::from("/proc"),
                PathBuf::from("/sys"),
                PathBuf::from("/srv/my proc")
            ]
        );
    }

    #[test]
    fn a_link_to_proc_is_refused_when_the_store_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("innocent");
        std::os::unix::fs::symlink("/proc", &link).unwrap();
        let caps = Capabilities {
            wasi: true,
            read_dirs: vec![link.clone()],
            ..Capabilities::default()
        };
        caps.validate().unwrap();
        let err = caps
            .configure(&mut wasmtime_wasi::WasiCtx::builder(), &[])
            .unwrap_err();
        assert_eq!(err.path, link);
        assert!(err.reason.contains("resolves to /proc"), "{}", err.reason);
        // A plain directory is granted.
        let plain = Capabilities {
            wasi: true,
            read_dirs: vec![dir.path().to_path_buf()],
            ..Capabilities::default()
        };
        plain
            .configure(&mut wasmtime_wasi::WasiCtx::builder(), &[])
            .unwrap();
        // A directory holding a secret of the agent's is refused.
        let token = dir.path().join("token");
        std::fs::write(&token, "t").unwrap();
        let err = plain
            .configure(&mut wasmtime_wasi::WasiCtx::builder(), &[token])
            .unwrap_err();
        assert!(err.reason.contains("would expose"), "{}", err.reason);
    }
}
