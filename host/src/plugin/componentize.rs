//! Turns a core WebAssembly module built by wit-bindgen into a component, as
//! `ccfleet plugin componentize` and scripts/build-guests.sh do.
//!
//! The module carries its component type in a custom section (wit-bindgen puts it there). A
//! module built for `wasm32-wasip1` imports `wasi_snapshot_preview1`; the WASI preview 1
//! reactor adapter of the matching wasmtime release turns those imports into WASI 0.2 ones.
//! A module without such imports gets no adapter and imports only its WIT world.

use std::path::Path;

use wasi_preview1_component_adapter_provider::{
    WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME, WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
};

use crate::plugin::HostError;

const MAGIC: &[u8; 4] = b"\0asm";
const CORE_VERSION: [u8; 4] = [0x01, 0x00, 0x00, 0x00];
const COMPONENT_VERSION: [u8; 4] = [0x0d, 0x00, 0x01, 0x00];

/// Whether `bytes` starts like a core WebAssembly module.
pub fn is_core_module(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && &bytes[..4] == MAGIC && bytes[4..8] == CORE_VERSION
}

/// Whether `bytes` starts like a WebAssembly component.
pub fn is_component(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && &bytes[..4] == MAGIC && bytes[4..8] == COMPONENT_VERSION
}

/// Componentizes a core module; a component is returned unchanged.
pub fn componentize(bytes: &[u8]) -> Result<Vec<u8>, String> {
    if is_component(bytes) {
        return Ok(bytes.to_vec());
    }
    if !is_core_module(bytes) {
        return Err("not a WebAssembly module or component".to_owned());
    }
    // wit-component only includes an adapter whose module is actually imported, so passing
    // it always is harmless for modules without WASI.
    wit_component::ComponentEncoder::default()
        .module(bytes)
        .and_then(|encoder| {
            encoder.adapter(
                WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME,
                WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
            )
        })
        .and_then(|encoder| encoder.validate(true).encode())
        .map_err(|e| format!("{e:#}"))
}

/// Componentizes `input` into `output`, writing through a temporary file and a rename so a
/// reader never sees a partial component.
pub fn componentize_file(input: &Path, output: &Path) -> Result<(), HostError> {
    let fail = |reason: String| HostError::Componentize {
        path: input.to_path_buf(),
        reason,
    };
    let bytes = std::fs::read(input).map_err(|e| fail(e.to_string()))?;
    let component = componentize(&bytes).map_err(fail)?;
    let dir = output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        output
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    std::fs::write(&tmp, component).map_err(|e| fail(format!("{}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, output).map_err(|e| fail(format!("{}: {e}", output.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_modules_from_components() {
        let module = b"\0asm\x01\0\0\0";
        let component = b"\0asm\x0d\0\x01\0";
        assert!(is_core_module(module) && !is_component(module));
        assert!(is_component(component) && !is_core_module(component));
        assert!(!is_core_module(b"\0as") && !is_component(b"garbage!"));
    }

    #[test]
    fn rejects_garbage_and_modules_without_a_world() {
        assert!(componentize(b"hello world").is_err());
        // A valid, empty core module has no component-type section to build from... but
        // wit-component accepts it as a component with no imports or exports.
        let empty = componentize(b"\0asm\x01\0\0\0").unwrap();
        assert!(is_component(&empty));
    }
}
