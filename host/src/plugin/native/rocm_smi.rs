//! The ROCm SMI grant (`capabilities.rocm-smi`): AMD GPUs read through the ROCm SMI library
//! on behalf of plugins, for the `rocm_smi` collector (`cc:fleet/rocm-smi`, WIT 0.3.3).
//!
//! ROCm SMI (`librocm_smi64.so`) is a native library, which a WebAssembly plugin cannot call.
//! The agent loads it with `dlopen` at the first call of a granted plugin, checks its version
//! (`rsmi_version_get`: the metrics table is read with the layout of ROCm SMI 5, see
//! [`SUPPORTED_MAJORS`]), resolves only the functions read here, calls `rsmi_init` once and
//! keeps the library for the life of the process. An agent on a node without AMD GPUs starts
//! as usual: `rsmi_init` fails there (no `/sys/class/drm`, no `amdgpu` driver), and the
//! grant's calls return `ROCm SMI is not available on this host: rsmi_init failed: ...`,
//! which the plugin reports as its error; where it succeeds but finds no GPU the list of GPUs
//! is empty.
//!
//! What the plugin gets is read-only and narrow: the list of GPUs with their PCI address and
//! serial number, and one GPU's `rsmi_gpu_metrics_t` record. The library is trusted no
//! further than it must be: every return code is checked and its text taken from
//! `rsmi_status_string`; no device function is called before `rsmi_init` succeeded or with an
//! index the library did not report (ROCm SMI 5 dereferences a device it does not have);
//! output buffers start zeroed, the metrics table is read into a buffer larger than the
//! layout read (so a library writing a longer table writes into spare room), strings are read
//! only up to their buffer's size, and the reported GPU count is capped. Calls are made one at
//! a time, and a call that does not return within [`CALL_TIMEOUT`] fails, so a plugin never
//! waits forever on a stuck driver.
//!
//! The library is the file named by the grant's `rocm-smi-library`, else by the environment
//! variable [`LIBRARY_ENV`] (tests point it at a stand-in library), else the first of
//! [`DEFAULT_LIBRARIES`] the loader finds.

use std::collections::HashMap;
use std::ffi::{CStr, c_char};
use std::mem::offset_of;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use ccfleet::untrusted::Untrusted;

use super::{Library, LibraryError, MAX_REASON};
use crate::plugin::bindings::cc::fleet::rocm_smi::{Device, GpuMetrics, PciAddress};

/// The libraries tried, in order, when neither the grant nor the environment names one:
/// Debian's and Ubuntu's package, then AMD's ROCm 5 packages.
pub const DEFAULT_LIBRARIES: [&str; 2] = ["librocm_smi64.so.1", "librocm_smi64.so.5"];

/// The environment variable naming the library to load instead of [`DEFAULT_LIBRARIES`].
pub const LIBRARY_ENV: &str = "CCFLEET_ROCM_SMI_LIBRARY";

/// The major versions `rsmi_version_get` may report: ROCm SMI 5 as AMD builds it (5.x), and
/// as Debian builds it (1.x: the version comes from git tags, which a release tarball lacks).
/// Both lay `rsmi_gpu_metrics_t` out as read here; later versions extended the table.
pub const SUPPORTED_MAJORS: [u32; 2] = [1, 5];

/// How long a call may take, or wait for the call before it, before it fails.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The most GPUs looked at, whatever count the library reports.
const MAX_DEVICES: u32 = 256;

/// The size of the buffer handed to `rsmi_dev_serial_number_get`.
const SERIAL_BUFFER: usize = 256;

/// `rsmi_status_t` (an enum of C's `unsigned int` size, with `0xFFFFFFFF` among its values).
type Status = u32;

const SUCCESS: Status = 0;

/// `rsmi_version_t`.
#[repr(C)]
struct Version {
    major: u32,
    minor: u32,
    patch: u32,
    build: *const c_char,
}

/// `rsmi_gpu_metrics_t` of ROCm SMI 5's `rocm_smi.h` (its `metrics_table_header_t` first,
/// then format 1's fields), field for field. The offsets are checked below against the
/// header's, and the tests read a stand-in library compiled against the header itself.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RawMetrics {
    #[allow(dead_code, reason = "part of the layout, not sent")]
    structure_size: u16,
    format_revision: u8,
    content_revision: u8,
    temperature_edge: u16,
    temperature_hotspot: u16,
    temperature_mem: u16,
    temperature_vrgfx: u16,
    temperature_vrsoc: u16,
    temperature_vrmem: u16,
    average_gfx_activity: u16,
    average_umc_activity: u16,
    average_mm_activity: u16,
    average_socket_power: u16,
    energy_accumulator: u64,
    system_clock_counter: u64,
    average_gfxclk_frequency: u16,
    average_socclk_frequency: u16,
    average_uclk_frequency: u16,
    average_vclk0_frequency: u16,
    average_dclk0_frequency: u16,
    average_vclk1_frequency: u16,
    average_dclk1_frequency: u16,
    current_gfxclk: u16,
    current_socclk: u16,
    current_uclk: u16,
    current_vclk0: u16,
    current_dclk0: u16,
    current_vclk1: u16,
    current_dclk1: u16,
    throttle_status: u32,
    current_fan_speed: u16,
    pcie_link_width: u16,
    pcie_link_speed: u16,
    #[allow(dead_code, reason = "part of the layout")]
    padding: u16,
    gfx_activity_acc: u32,
    mem_actvity_acc: u32,
    temperature_hbm: [u16; 4],
}

// The layout of `rocm_smi.h` (ROCm SMI 5.2): size 96, alignment 8, and these offsets.
const _: () = {
    assert!(size_of::<RawMetrics>() == 96);
    assert!(align_of::<RawMetrics>() == 8);
    assert!(offset_of!(RawMetrics, temperature_edge) == 4);
    assert!(offset_of!(RawMetrics, temperature_vrmem) == 14);
    assert!(offset_of!(RawMetrics, average_gfx_activity) == 16);
    assert!(offset_of!(RawMetrics, average_socket_power) == 22);
    assert!(offset_of!(RawMetrics, energy_accumulator) == 24);
    assert!(offset_of!(RawMetrics, system_clock_counter) == 32);
    assert!(offset_of!(RawMetrics, average_gfxclk_frequency) == 40);
    assert!(offset_of!(RawMetrics, average_dclk1_frequency) == 52);
    assert!(offset_of!(RawMetrics, current_gfxclk) == 54);
    assert!(offset_of!(RawMetrics, current_dclk1) == 66);
    assert!(offset_of!(RawMetrics, throttle_status) == 68);
    assert!(offset_of!(RawMetrics, current_fan_speed) == 72);
    assert!(offset_of!(RawMetrics, pcie_link_speed) == 76);
    assert!(offset_of!(RawMetrics, gfx_activity_acc) == 80);
    assert!(offset_of!(RawMetrics, mem_actvity_acc) == 84);
    assert!(offset_of!(RawMetrics, temperature_hbm) == 88);
};

/// Room for a longer table than [`RawMetrics`], which the library writes into instead of
/// past the end of the record read.
#[repr(C)]
#[derive(Clone, Copy)]
struct MetricsBuffer {
    table: RawMetrics,
    spare: [u8; 1024],
}

type FnInit = unsafe extern "C" fn(u64) -> Status;
type FnCount = unsafe extern "C" fn(*mut u32) -> Status;
type FnMetrics = unsafe extern "C" fn(u32, *mut RawMetrics) -> Status;
type FnPciId = unsafe extern "C" fn(u32, *mut u64) -> Status;
type FnSerial = unsafe extern "C" fn(u32, *mut c_char, u32) -> Status;
type FnVersion = unsafe extern "C" fn(*mut Version) -> Status;
type FnStatusString = unsafe extern "C" fn(Status, *mut *const c_char) -> Status;

/// The functions used; the serial number may be missing (its value is then absent).
struct Functions {
    count: FnCount,
    metrics: FnMetrics,
    pci_id: FnPciId,
    serial: Option<FnSerial>,
    status_string: Option<FnStatusString>,
}

/// A loaded and initialised ROCm SMI library.
pub struct RocmSmi {
    functions: Functions,
    /// Held for each call: the library's calls are made one at a time.
    calls: Mutex<()>,
    /// The version `rsmi_version_get` reported.
    version: (u32, u32, u32),
    /// The library; never closed.
    _library: Arc<Library>,
}

// SAFETY: the function pointers are plain addresses into a library that is never unloaded,
// and every call is made under `calls`, one at a time.
unsafe impl Send for RocmSmi {}
// SAFETY: as above.
unsafe impl Sync for RocmSmi {}

/// How long a failed load or initialisation is answered with its error before it is tried
/// again: ROCm SMI writes its own complaint to the agent's output at every failed
/// `rsmi_init`, which would otherwise repeat every round on a node without AMD GPUs.
pub const RETRY_AFTER: Duration = Duration::from_secs(60);

/// A library loaded and initialised, or why not and when that was found.
enum Loaded {
    Ready(Arc<RocmSmi>),
    Failed(String, Instant),
}

/// The libraries tried so far, by the name they were loaded by.
static LOADED: Mutex<Option<HashMap<PathBuf, Loaded>>> = Mutex::new(None);

/// `mutex`, locked within `timeout`; `None` when another holder kept it that long (a call
/// that hangs in the library).
fn lock_within<T>(mutex: &Mutex<T>, timeout: Duration) -> Option<MutexGuard<'_, T>> {
    let until = Instant::now() + timeout;
    loop {
        match mutex.try_lock() {
            Ok(guard) => return Some(guard),
            Err(TryLockError::Poisoned(e)) => return Some(e.into_inner()),
            Err(TryLockError::WouldBlock) if Instant::now() >= until => return None,
            Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// The message of a call that found the library busy for [`CALL_TIMEOUT`].
fn busy() -> String {
    format!(
        "ROCm SMI did not answer an earlier call within {} s (a stuck driver?)",
        CALL_TIMEOUT.as_secs()
    )
}

/// The PCI address packed in the identifier `rsmi_dev_pci_id_get` gives: domain in bits
/// 32-63, bus in 8-15, device in 3-7, function in 0-2.
fn pci_address(id: u64) -> PciAddress {
    PciAddress {
        domain: (id >> 32) as u32,
        bus: ((id >> 8) & 0xff) as u8,
        device: ((id >> 3) & 0x1f) as u8,
        function: (id & 0x7) as u8,
    }
}

impl RocmSmi {
    /// The library at `path` (a file, or a bare name the loader looks up), loaded, checked
    /// and initialised once per process; a failure is its answer for [`RETRY_AFTER`], then
    /// it is tried again (a driver loaded after the agent started is found).
    pub fn get(path: &Path) -> Result<Arc<RocmSmi>, String> {
        let mut loaded = lock_within(&LOADED, CALL_TIMEOUT).ok_or_else(busy)?;
        let loaded = loaded.get_or_insert_with(HashMap::new);
        match loaded.get(path) {
            Some(Loaded::Ready(smi)) => return Ok(smi.clone()),
            Some(Loaded::Failed(why, when)) if when.elapsed() < RETRY_AFTER => {
                return Err(why.clone());
            }
            _ => {}
        }
        match RocmSmi::load(path) {
            Ok(smi) => {
                let smi = Arc::new(smi);
                loaded.insert(path.to_path_buf(), Loaded::Ready(smi.clone()));
                Ok(smi)
            }
            Err(why) => {
                loaded.insert(
                    path.to_path_buf(),
                    Loaded::Failed(why.clone(), Instant::now()),
                );
                Err(why)
            }
        }
    }

    fn load(path: &Path) -> Result<RocmSmi, String> {
        let library = Library::open(path).map_err(|e| e.to_string())?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: each name is resolved as the type of its declaration in rocm_smi.h.
                unsafe { library.symbol($name) }
            };
        }
        let version: Option<FnVersion> = sym!(c"rsmi_version_get");
        let init: Option<FnInit> = sym!(c"rsmi_init");
        let count: Option<FnCount> = sym!(c"rsmi_num_monitor_devices");
        let metrics: Option<FnMetrics> = sym!(c"rsmi_dev_gpu_metrics_info_get");
        let pci_id: Option<FnPciId> = sym!(c"rsmi_dev_pci_id_get");
        let (Some(version), Some(init), Some(count), Some(metrics), Some(pci_id)) =
            (version, init, count, metrics, pci_id)
        else {
            return Err(LibraryError::SymbolMissing {
                library: library.path().display().to_string(),
                reason: "the library lacks rsmi_version_get, rsmi_init, \
                         rsmi_num_monitor_devices, rsmi_dev_gpu_metrics_info_get or \
                         rsmi_dev_pci_id_get (not ROCm SMI, or older than ROCm 4)"
                    .to_owned(),
            }
            .to_string());
        };
        let functions = Functions {
            count,
            metrics,
            pci_id,
            serial: sym!(c"rsmi_dev_serial_number_get"),
            status_string: sym!(c"rsmi_status_string"),
        };
        let mut v = Version {
            major: 0,
            minor: 0,
            patch: 0,
            build: std::ptr::null(),
        };
        // SAFETY: a pointer to an rsmi_version_t, as declared.
        let rc = unsafe { version(&mut v) };
        let smi = RocmSmi {
            functions,
            calls: Mutex::new(()),
            version: (v.major, v.minor, v.patch),
            _library: library,
        };
        if rc != SUCCESS {
            return Err(format!("rsmi_version_get failed: {}", smi.status_text(rc)));
        }
        if !SUPPORTED_MAJORS.contains(&v.major) {
            return Err(LibraryError::SymbolMissing {
                library: path.display().to_string(),
                reason: format!(
                    "ROCm SMI library version {}.{}.{} is not supported: the agent reads \
                     rsmi_gpu_metrics_t as ROCm SMI 5 lays it out (library versions 5.x, \
                     and 1.x as Debian and Ubuntu build it)",
                    v.major, v.minor, v.patch
                ),
            }
            .to_string());
        }
        // SAFETY: rsmi_init takes a flags word; 0 asks for AMD GPUs only.
        let rc = unsafe { init(0) };
        if rc != SUCCESS {
            return Err(LibraryError::InitFailed {
                function: "rsmi_init".to_owned(),
                reason: format!(
                    "{} (is this a node with AMD GPUs and the amdgpu driver?)",
                    smi.status_text(rc)
                ),
            }
            .to_string());
        }
        Ok(smi)
    }

    /// The version the library reported.
    pub fn version(&self) -> (u32, u32, u32) {
        self.version
    }

    /// ROCm SMI's text for a status, or the number.
    fn status_text(&self, rc: Status) -> String {
        if let Some(f) = self.functions.status_string {
            let mut text: *const c_char = std::ptr::null();
            // SAFETY: a status and a pointer to a string pointer, as declared; the library
            // points it at a static NUL-terminated string.
            let ok = unsafe { f(rc, &mut text) };
            if ok == SUCCESS && !text.is_null() {
                // SAFETY: not null, NUL-terminated by the library.
                let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
                return Untrusted(&text).capped(MAX_REASON).to_string();
            }
        }
        format!("ROCm SMI status {rc}")
    }

    fn lock(&self) -> Result<MutexGuard<'_, ()>, String> {
        lock_within(&self.calls, CALL_TIMEOUT).ok_or_else(busy)
    }

    /// The number of GPUs, capped; called with the lock held.
    fn count(&self) -> Result<u32, String> {
        let mut count: u32 = 0;
        // SAFETY: a pointer to a count, as declared.
        let rc = unsafe { (self.functions.count)(&mut count) };
        if rc != SUCCESS {
            return Err(format!(
                "rsmi_num_monitor_devices failed: {}",
                self.status_text(rc)
            ));
        }
        Ok(count.min(MAX_DEVICES))
    }

    /// The GPUs, each with its PCI address and serial number where the library gives them.
    pub fn devices(&self) -> Result<Vec<Device>, String> {
        let _one_at_a_time = self.lock()?;
        let count = self.count()?;
        Ok((0..count)
            .map(|index| Device {
                index,
                pci: self.pci(index),
                serial: self.serial(index),
            })
            .collect())
    }

    fn pci(&self, index: u32) -> Option<PciAddress> {
        let mut id: u64 = 0;
        // SAFETY: an index the library reported and a pointer to a u64, as declared.
        let rc = unsafe { (self.functions.pci_id)(index, &mut id) };
        (rc == SUCCESS).then(|| pci_address(id))
    }

    fn serial(&self, index: u32) -> Option<String> {
        let f = self.functions.serial?;
        let mut buffer = [0 as c_char; SERIAL_BUFFER];
        // SAFETY: an index the library reported and a buffer of the length passed.
        let rc = unsafe { f(index, buffer.as_mut_ptr(), SERIAL_BUFFER as u32) };
        if rc != SUCCESS {
            return None;
        }
        // Read up to the first NUL within the buffer, whatever the library wrote.
        let bytes: Vec<u8> = buffer
            .iter()
            .map(|&c| c as u8)
            .take_while(|&b| b != 0)
            .collect();
        let text = String::from_utf8_lossy(&bytes);
        Some(Untrusted(&text).capped(MAX_REASON).to_string())
    }

    /// The metrics table of GPU `device`.
    pub fn read(&self, device: u32) -> Result<GpuMetrics, String> {
        let _one_at_a_time = self.lock()?;
        let count = self.count()?;
        if device >= count {
            return Err(format!(
                "there is no GPU {device} (ROCm SMI reports {count})"
            ));
        }
        let mut buffer = MetricsBuffer {
            table: RawMetrics::default(),
            spare: [0; 1024],
        };
        // SAFETY: an index the library reported and a pointer to a zeroed table with spare
        // room behind it.
        let rc = unsafe { (self.functions.metrics)(device, &mut buffer.table) };
        if rc != SUCCESS {
            return Err(format!(
                "GPU {device}: rsmi_dev_gpu_metrics_info_get failed: {}",
                self.status_text(rc)
            ));
        }
        Ok(metrics(&buffer.table))
    }
}

/// The table as the WIT record.
fn metrics(m: &RawMetrics) -> GpuMetrics {
    GpuMetrics {
        format_revision: m.format_revision,
        content_revision: m.content_revision,
        temperature_edge: m.temperature_edge,
        temperature_hotspot: m.temperature_hotspot,
        temperature_mem: m.temperature_mem,
        temperature_vrgfx: m.temperature_vrgfx,
        temperature_vrsoc: m.temperature_vrsoc,
        temperature_vrmem: m.temperature_vrmem,
        average_gfx_activity: m.average_gfx_activity,
        average_umc_activity: m.average_umc_activity,
        average_mm_activity: m.average_mm_activity,
        average_socket_power: m.average_socket_power,
        energy_accumulator: m.energy_accumulator,
        system_clock_counter: m.system_clock_counter,
        average_gfxclk_frequency: m.average_gfxclk_frequency,
        average_socclk_frequency: m.average_socclk_frequency,
        average_uclk_frequency: m.average_uclk_frequency,
        average_vclk0_frequency: m.average_vclk0_frequency,
        average_dclk0_frequency: m.average_dclk0_frequency,
        average_vclk1_frequency: m.average_vclk1_frequency,
        average_dclk1_frequency: m.average_dclk1_frequency,
        current_gfxclk: m.current_gfxclk,
        current_socclk: m.current_socclk,
        current_uclk: m.current_uclk,
        current_vclk0: m.current_vclk0,
        current_dclk0: m.current_dclk0,
        current_vclk1: m.current_vclk1,
        current_dclk1: m.current_dclk1,
        throttle_status: m.throttle_status,
        current_fan_speed: m.current_fan_speed,
        pcie_link_width: m.pcie_link_width,
        pcie_link_speed: m.pcie_link_speed,
        gfx_activity_acc: m.gfx_activity_acc,
        mem_activity_acc: m.mem_actvity_acc,
        temperature_hbm: m.temperature_hbm.to_vec(),
    }
}

/// One plugin's ROCm SMI grant: not granted, or the library to use (`None`: the defaults).
#[derive(Debug, Clone, Default)]
pub(crate) struct RocmSmiGrant {
    granted: bool,
    library: Option<PathBuf>,
}

impl RocmSmiGrant {
    /// The grant of a plugin whose `capabilities.rocm-smi` is `granted`, loading `library`
    /// (or [`LIBRARY_ENV`]'s file, or the first of [`DEFAULT_LIBRARIES`] found).
    pub fn new(granted: bool, library: Option<&Path>) -> RocmSmiGrant {
        RocmSmiGrant {
            granted,
            library: granted
                .then(|| {
                    library
                        .map(Path::to_path_buf)
                        .or_else(|| std::env::var_os(LIBRARY_ENV).map(PathBuf::from))
                })
                .flatten(),
        }
    }

    /// The loaded library, or why there is none.
    pub fn rocm_smi(&self) -> Result<Arc<RocmSmi>, String> {
        if !self.granted {
            return Err(
                "ROCm SMI is not granted to this plugin (capabilities.rocm-smi)".to_owned(),
            );
        }
        let unavailable =
            |reason: String| format!("ROCm SMI is not available on this host: {reason}");
        if let Some(library) = &self.library {
            return RocmSmi::get(library).map_err(unavailable);
        }
        let mut reasons = Vec::new();
        for name in DEFAULT_LIBRARIES {
            match RocmSmi::get(Path::new(name)) {
                Ok(smi) => return Ok(smi),
                // Only a library that is not there sends us on to the next name.
                Err(reason) if reason.starts_with("cannot load ") => reasons.push(reason),
                Err(reason) => return Err(unavailable(reason)),
            }
        }
        Err(unavailable(reasons.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pci_identifier_unpacks_as_rocm_smi_packs_it() {
        // Domain 0, bus 0xc1, device 0, function 0; and a made-up full one.
        let a = pci_address(0xc100);
        assert_eq!((a.domain, a.bus, a.device, a.function), (0, 0xc1, 0, 0));
        let b = pci_address((0x1234_u64 << 32) | (0x8a << 8) | (0x1f << 3) | 0x5);
        assert_eq!(
            (b.domain, b.bus, b.device, b.function),
            (0x1234, 0x8a, 0x1f, 5)
        );
    }

    #[test]
    fn a_lock_held_too_long_is_given_up() {
        let mutex = Mutex::new(());
        let held = mutex.lock().unwrap();
        assert!(lock_within(&mutex, Duration::from_millis(20)).is_none());
        drop(held);
        assert!(lock_within(&mutex, Duration::from_millis(20)).is_some());
    }

    #[test]
    fn without_the_grant_nothing_is_loaded() {
        let err = RocmSmiGrant::new(false, Some(Path::new("/nonexistent/librocm_smi64.so.1")))
            .rocm_smi()
            .err()
            .unwrap();
        assert!(err.contains("capabilities.rocm-smi"), "{err}");
        let err = RocmSmiGrant::new(true, Some(Path::new("/nonexistent/librocm_smi64.so.1")))
            .rocm_smi()
            .err()
            .unwrap();
        assert!(
            err.starts_with("ROCm SMI is not available on this host: cannot load"),
            "{err}"
        );
    }
}
