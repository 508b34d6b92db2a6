//! Compiles the stand-in ROCm SMI (`fixtures/rocm-smi-standin/standin.c`) against the
//! system's `rocm_smi.h`, with the recorded values of `recorded.rs` written into C
//! initialisers by field name.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

include!("../fixtures/rocm-smi-standin/recorded.rs");

/// ROCm SMI's header, from Debian's `librocm-smi-dev`.
pub const HEADER: &str = "/usr/include/rocm_smi/rocm_smi.h";

/// Which stand-in to build.
#[derive(Debug, Clone, Copy)]
pub enum Variant {
    /// The recorded GPUs.
    Recorded,
    /// The recorded GPUs behind another major version.
    Major(u32),
    /// `rsmi_init` succeeds, no GPU is found.
    NoGpus,
    /// `rsmi_init` fails.
    InitFails,
}

/// The generated `recorded.h`.
fn recorded_header() -> String {
    let mut h = String::from("/* Generated from recorded.rs by the tests. */\n");
    let (major, minor, patch) = VERSION;
    let _ = writeln!(h, "#define STANDIN_GPUS {}u", GPUS.len());
    let _ = writeln!(h, "#define STANDIN_VERSION_MAJOR {major}u");
    let _ = writeln!(h, "#define STANDIN_VERSION_MINOR {minor}u");
    let _ = writeln!(h, "#define STANDIN_VERSION_PATCH {patch}u");
    let ids: Vec<String> = GPUS.iter().map(|g| format!("{:#x}u", g.bdfid)).collect();
    let _ = writeln!(
        h,
        "static const uint64_t standin_bdfid[] = {{{}}};",
        ids.join(", ")
    );
    let serials: Vec<String> = GPUS.iter().map(|g| format!("{:?}", g.serial)).collect();
    let _ = writeln!(
        h,
        "static const char *const standin_serial[] = {{{}}};",
        serials.join(", ")
    );
    h.push_str("static const rsmi_gpu_metrics_t standin_metrics[] = {\n");
    for gpu in &GPUS {
        h.push_str("    {\n");
        for (field, value) in gpu.fields {
            let _ = writeln!(h, "        .{field} = {value}u,");
        }
        let hbm: Vec<String> = gpu
            .temperature_hbm
            .iter()
            .map(|t| format!("{t}u"))
            .collect();
        let _ = writeln!(h, "        .temperature_hbm = {{{}}},", hbm.join(", "));
        h.push_str("    },\n");
    }
    h.push_str("};\n");
    h
}

/// Builds the stand-in `variant` into `dir` as `file_name` (each test its own file: a
/// library is loaded once per path).
pub fn build(dir: &Path, variant: Variant, file_name: &str) -> PathBuf {
    assert!(
        Path::new(HEADER).is_file(),
        "{HEADER} is missing: install Debian's librocm-smi-dev (scripts/test.sh installs it)"
    );
    let source =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rocm-smi-standin/standin.c");
    let include = dir.join(format!("{file_name}.include"));
    std::fs::create_dir_all(&include).unwrap();
    std::fs::write(include.join("recorded.h"), recorded_header()).unwrap();
    let library = dir.join(file_name);
    let mut cc = Command::new("cc");
    cc.args([
        "-shared", "-fPIC", "-std=c11", "-Wall", "-Wextra", "-Werror", "-I",
    ])
    .arg(&include);
    match variant {
        Variant::Recorded => {}
        Variant::Major(major) => {
            cc.arg(format!("-DSTANDIN_MAJOR={major}u"));
        }
        Variant::NoGpus => {
            cc.arg("-DSTANDIN_NO_GPUS");
        }
        Variant::InitFails => {
            cc.arg("-DSTANDIN_INIT_FAILS");
        }
    }
    let output = cc
        .arg("-o")
        .arg(&library)
        .arg(&source)
        .output()
        .expect("a C compiler (cc) is needed to build the stand-in ROCm SMI");
    assert!(
        output.status.success(),
        "building the stand-in ROCm SMI failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    library
}
