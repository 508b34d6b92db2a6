//! The NVML grant (`capabilities.nvml`): NVIDIA GPUs read through the NVML library on
//! behalf of plugins, for the `nvidia` collector (`cc:fleet/nvml`, WIT 0.3.1).
//!
//! NVML is a native library (`libnvidia-ml.so.1`, installed with the driver), which a
//! WebAssembly plugin cannot call. The agent loads it with `dlopen` at the first call of a
//! granted plugin, resolves only the functions read here, calls `nvmlInit_v2` once and keeps
//! the library for the life of the process (NVML's device handles point into it, and it is
//! not meant to be unloaded while other plugins may use it). An agent without the library
//! (a node without NVIDIA GPUs) starts as usual: the grant's calls return
//! `NVML is not available on this host: ...`, which the plugin reports as its error.
//!
//! What the plugin gets is read-only and narrow: the list of GPUs and their MIG devices, and
//! one record of readings per GPU or MIG device. Every NVML function's error is taken as
//! "not supported" for the values it gives, which are then absent, as cc-metric-collector
//! skips them. The library is trusted no further than it must be: every return code is
//! checked, output values start zeroed, string buffers are read only up to their size, and
//! counts it reports (GPUs, MIG devices) are capped before they are iterated.
//!
//! The library is `libnvidia-ml.so.1` on the loader's search path, or the file named by the
//! grant's `nvml-library` or, failing that, by the environment variable
//! [`LIBRARY_ENV`] (tests point it at a stand-in library).

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ccfleet::untrusted::Untrusted;

use super::{Library, LibraryError, MAX_REASON, library_path};
use crate::plugin::bindings::cc::fleet::nvml::{
    Clocks, Device as GpuDevice, EccMode, Memory, MigDevice, Nvlink, PciLocation, Readings,
    RemappedRows, Utilization, Violations,
};

/// The library loaded when neither the grant nor the environment names one.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// The environment variable naming the library to load instead of [`DEFAULT_LIBRARY`].
pub const LIBRARY_ENV: &str = "CCFLEET_NVML_LIBRARY";

/// The most GPUs looked at, whatever count the library reports.
const MAX_DEVICES: u32 = 256;

/// The most MIG devices looked at per GPU (NVML's GPUs have at most 7).
const MAX_MIG_DEVICES: u32 = 64;

/// NVLinks probed per GPU (`NVML_NVLINK_MAX_LINKS`).
const NVLINK_MAX_LINKS: c_uint = 36;

/// The size of the string buffers handed to NVML (its largest, the name and UUID, are 96).
const STRING_BUFFER: usize = 128;

type Handle = *mut c_void;
type Return = c_int;

const SUCCESS: Return = 0;
const ERROR_NOT_SUPPORTED: Return = 3;
const ERROR_INSUFFICIENT_SIZE: Return = 7;
const FEATURE_ENABLED: c_uint = 1;
const FEATURE_DISABLED: c_uint = 0;

const CLOCK_GRAPHICS: c_int = 0;
const CLOCK_SM: c_int = 1;
const CLOCK_MEM: c_int = 2;
const CLOCK_VIDEO: c_int = 3;
const TEMPERATURE_GPU: c_int = 0;
const MEMORY_ERROR_CORRECTED: c_int = 0;
const MEMORY_ERROR_UNCORRECTED: c_int = 1;
const AGGREGATE_ECC: c_int = 1;
const NVLINK_ERROR_DL_REPLAY: c_int = 0;
const NVLINK_ERROR_DL_RECOVERY: c_int = 1;
const NVLINK_ERROR_DL_CRC_FLIT: c_int = 2;
const NVLINK_ERROR_DL_CRC_DATA: c_int = 3;
const NVLINK_ERROR_DL_ECC_DATA: c_int = 4;
/// `nvmlPerfPolicyType_t`, in the order of [`Violations`]' fields.
const PERF_POLICIES: [c_int; 8] = [0, 1, 2, 3, 4, 5, 10, 11];

/// `nvmlPciInfo_t`.
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

/// `nvmlMemory_t` and `nvmlBAR1Memory_t`, which have the same layout.
#[repr(C)]
#[derive(Default)]
struct MemoryInfo {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Default)]
struct UtilizationInfo {
    gpu: c_uint,
    memory: c_uint,
}

/// `nvmlViolationTime_t`.
#[repr(C)]
#[derive(Default)]
struct ViolationTime {
    reference_time: c_ulonglong,
    violation_time: c_ulonglong,
}

type FnInit = unsafe extern "C" fn() -> Return;
type FnCount = unsafe extern "C" fn(*mut c_uint) -> Return;
type FnHandleByIndex = unsafe extern "C" fn(c_uint, *mut Handle) -> Return;
type FnErrorString = unsafe extern "C" fn(Return) -> *const c_char;
type FnString = unsafe extern "C" fn(Handle, *mut c_char, c_uint) -> Return;
type FnPci = unsafe extern "C" fn(Handle, *mut PciInfo) -> Return;
type FnU32 = unsafe extern "C" fn(Handle, *mut c_uint) -> Return;
type FnU64 = unsafe extern "C" fn(Handle, *mut c_ulonglong) -> Return;
type FnTwoU32 = unsafe extern "C" fn(Handle, *mut c_uint, *mut c_uint) -> Return;
type FnKindU32 = unsafe extern "C" fn(Handle, c_int, *mut c_uint) -> Return;
type FnMemory = unsafe extern "C" fn(Handle, *mut MemoryInfo) -> Return;
type FnUtilization = unsafe extern "C" fn(Handle, *mut UtilizationInfo) -> Return;
type FnEccErrors = unsafe extern "C" fn(Handle, c_int, c_int, *mut c_ulonglong) -> Return;
type FnRemapped =
    unsafe extern "C" fn(Handle, *mut c_uint, *mut c_uint, *mut c_uint, *mut c_uint) -> Return;
type FnProcesses = unsafe extern "C" fn(Handle, *mut c_uint, *mut c_void) -> Return;
type FnViolation = unsafe extern "C" fn(Handle, c_int, *mut ViolationTime) -> Return;
type FnLinkState = unsafe extern "C" fn(Handle, c_uint, *mut c_uint) -> Return;
type FnLinkCounter = unsafe extern "C" fn(Handle, c_uint, c_int, *mut c_ulonglong) -> Return;
type FnMigHandle = unsafe extern "C" fn(Handle, c_uint, *mut Handle) -> Return;

/// The functions used. All but the first three may be missing (older drivers): their
/// values are then absent.
struct Functions {
    count: FnCount,
    handle_by_index: FnHandleByIndex,
    error_string: Option<FnErrorString>,
    name: Option<FnString>,
    uuid: Option<FnString>,
    serial: Option<FnString>,
    board_part_number: Option<FnString>,
    pci_info: Option<FnPci>,
    mig_mode: Option<FnTwoU32>,
    max_mig_devices: Option<FnU32>,
    mig_handle: Option<FnMigHandle>,
    memory: Option<FnMemory>,
    bar1_memory: Option<FnMemory>,
    utilization: Option<FnUtilization>,
    temperature: Option<FnKindU32>,
    fan_speed: Option<FnU32>,
    ecc_mode: Option<FnTwoU32>,
    performance_state: Option<FnU32>,
    power_management_mode: Option<FnU32>,
    power_usage: Option<FnU32>,
    total_energy: Option<FnU64>,
    clock: Option<FnKindU32>,
    max_clock: Option<FnKindU32>,
    total_ecc_errors: Option<FnEccErrors>,
    power_limit: Option<FnU32>,
    encoder_utilization: Option<FnTwoU32>,
    decoder_utilization: Option<FnTwoU32>,
    remapped_rows: Option<FnRemapped>,
    compute_processes: Option<FnProcesses>,
    graphics_processes: Option<FnProcesses>,
    violation: Option<FnViolation>,
    nvlink_state: Option<FnLinkState>,
    nvlink_counter: Option<FnLinkCounter>,
}

/// A loaded and initialised NVML library.
pub struct Nvml {
    functions: Functions,
    /// The library; never closed (see the module documentation).
    _library: Arc<Library>,
}

// SAFETY: NVML is thread-safe once initialised (its documentation: "all NVML calls are
// thread-safe"); the handle and function pointers are plain addresses.
unsafe impl Send for Nvml {}
// SAFETY: as above.
unsafe impl Sync for Nvml {}

/// The initialised libraries, by the name they were loaded by.
static LOADED: Mutex<Option<HashMap<PathBuf, Arc<Nvml>>>> = Mutex::new(None);

impl Nvml {
    /// The library at `path` (a file, or a bare name the loader looks up), loaded and
    /// initialised once per process.
    pub fn get(path: &Path) -> Result<Arc<Nvml>, String> {
        let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
        let loaded = loaded.get_or_insert_with(HashMap::new);
        if let Some(nvml) = loaded.get(path) {
            return Ok(nvml.clone());
        }
        let nvml = Arc::new(Nvml::load(path)?);
        loaded.insert(path.to_path_buf(), nvml.clone());
        Ok(nvml)
    }

    fn load(path: &Path) -> Result<Nvml, String> {
        let library = Library::open(path).map_err(|e| e.to_string())?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: each name is resolved as the type of NVML's declaration in nvml.h.
                unsafe { library.symbol($name) }
            };
        }
        let init: Option<FnInit> = sym!(c"nvmlInit_v2");
        let count: Option<FnCount> = sym!(c"nvmlDeviceGetCount_v2");
        let handle_by_index: Option<FnHandleByIndex> = sym!(c"nvmlDeviceGetHandleByIndex_v2");
        let (Some(init), Some(count), Some(handle_by_index)) = (init, count, handle_by_index)
        else {
            return Err(LibraryError::SymbolMissing {
                library: library.path().display().to_string(),
                reason: "the library lacks nvmlInit_v2, nvmlDeviceGetCount_v2 or \
                         nvmlDeviceGetHandleByIndex_v2 (not NVML, or older than driver 325)"
                    .to_owned(),
            }
            .to_string());
        };
        let functions = Functions {
            count,
            handle_by_index,
            error_string: sym!(c"nvmlErrorString"),
            name: sym!(c"nvmlDeviceGetName"),
            uuid: sym!(c"nvmlDeviceGetUUID"),
            serial: sym!(c"nvmlDeviceGetSerial"),
            board_part_number: sym!(c"nvmlDeviceGetBoardPartNumber"),
            pci_info: sym!(c"nvmlDeviceGetPciInfo_v3"),
            mig_mode: sym!(c"nvmlDeviceGetMigMode"),
            max_mig_devices: sym!(c"nvmlDeviceGetMaxMigDeviceCount"),
            mig_handle: sym!(c"nvmlDeviceGetMigDeviceHandleByIndex"),
            memory: sym!(c"nvmlDeviceGetMemoryInfo"),
            bar1_memory: sym!(c"nvmlDeviceGetBAR1MemoryInfo"),
            utilization: sym!(c"nvmlDeviceGetUtilizationRates"),
            temperature: sym!(c"nvmlDeviceGetTemperature"),
            fan_speed: sym!(c"nvmlDeviceGetFanSpeed"),
            ecc_mode: sym!(c"nvmlDeviceGetEccMode"),
            performance_state: sym!(c"nvmlDeviceGetPerformanceState"),
            power_management_mode: sym!(c"nvmlDeviceGetPowerManagementMode"),
            power_usage: sym!(c"nvmlDeviceGetPowerUsage"),
            total_energy: sym!(c"nvmlDeviceGetTotalEnergyConsumption"),
            clock: sym!(c"nvmlDeviceGetClockInfo"),
            max_clock: sym!(c"nvmlDeviceGetMaxClockInfo"),
            total_ecc_errors: sym!(c"nvmlDeviceGetTotalEccErrors"),
            power_limit: sym!(c"nvmlDeviceGetPowerManagementLimit"),
            encoder_utilization: sym!(c"nvmlDeviceGetEncoderUtilization"),
            decoder_utilization: sym!(c"nvmlDeviceGetDecoderUtilization"),
            remapped_rows: sym!(c"nvmlDeviceGetRemappedRows"),
            compute_processes: sym!(c"nvmlDeviceGetComputeRunningProcesses_v3"),
            graphics_processes: sym!(c"nvmlDeviceGetGraphicsRunningProcesses_v3"),
            violation: sym!(c"nvmlDeviceGetViolationStatus"),
            nvlink_state: sym!(c"nvmlDeviceGetNvLinkState"),
            nvlink_counter: sym!(c"nvmlDeviceGetNvLinkErrorCounter"),
        };
        let nvml = Nvml {
            functions,
            _library: library,
        };
        // SAFETY: nvmlInit_v2 takes no arguments.
        let rc = unsafe { init() };
        if rc != SUCCESS {
            return Err(LibraryError::InitFailed {
                function: "nvmlInit_v2".to_owned(),
                reason: nvml.error_text(rc),
            }
            .to_string());
        }
        Ok(nvml)
    }

    /// NVML's text for a return code, or the code.
    fn error_text(&self, rc: Return) -> String {
        if let Some(f) = self.functions.error_string {
            // SAFETY: nvmlErrorString returns a static NUL-terminated string or null.
            let text = unsafe { f(rc) };
            if !text.is_null() {
                // SAFETY: not null, NUL-terminated by NVML.
                let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
                return Untrusted(&text).capped(MAX_REASON).to_string();
            }
        }
        format!("NVML error {rc}")
    }

    /// The handle of GPU `index`.
    fn handle(&self, index: u32) -> Result<Handle, Return> {
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: an index and a pointer to a handle, as declared.
        let rc = unsafe { (self.functions.handle_by_index)(index, &mut handle) };
        if rc == SUCCESS { Ok(handle) } else { Err(rc) }
    }

    /// The handle of MIG device `index` of GPU `gpu`.
    fn mig_handle(&self, gpu: Handle, index: u32) -> Result<Handle, Return> {
        let f = self.functions.mig_handle.ok_or(ERROR_NOT_SUPPORTED)?;
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: a handle from NVML, an index and a pointer to a handle, as declared.
        let rc = unsafe { f(gpu, index, &mut handle) };
        if rc == SUCCESS { Ok(handle) } else { Err(rc) }
    }

    /// The GPUs, each with its MIG devices when `mig` is true and MIG is enabled.
    pub fn devices(&self, mig: bool) -> Result<Vec<GpuDevice>, String> {
        let mut count: c_uint = 0;
        // SAFETY: a pointer to a count, as declared.
        let rc = unsafe { (self.functions.count)(&mut count) };
        if rc != SUCCESS {
            return Err(format!(
                "nvmlDeviceGetCount_v2 failed: {}",
                self.error_text(rc)
            ));
        }
        let mut devices = Vec::new();
        for index in 0..count.min(MAX_DEVICES) {
            // A GPU without a handle is left out, as cc-metric-collector leaves it out.
            let Ok(handle) = self.handle(index) else {
                continue;
            };
            let mig_enabled = self
                .two_u32(self.functions.mig_mode, handle)
                .map(|(current, _)| current == FEATURE_ENABLED);
            let mut mig_devices = Vec::new();
            if mig && mig_enabled == Some(true) {
                let max = self
                    .u32(self.functions.max_mig_devices, handle)
                    .unwrap_or(0)
                    .min(MAX_MIG_DEVICES);
                for j in 0..max {
                    if let Ok(m) = self.mig_handle(handle, j) {
                        mig_devices.push(MigDevice {
                            index: j,
                            name: self.string(self.functions.name, m),
                            uuid: self.string(self.functions.uuid, m),
                        });
                    }
                }
            }
            devices.push(GpuDevice {
                index,
                name: self.string(self.functions.name, handle),
                uuid: self.string(self.functions.uuid, handle),
                serial: self.string(self.functions.serial, handle),
                board_part_number: self.string(self.functions.board_part_number, handle),
                pci: self.pci(handle),
                mig_enabled,
                mig_devices,
            });
        }
        Ok(devices)
    }

    /// Everything the `nvidia` collector sends of GPU `device` or its MIG device `mig`.
    pub fn read(&self, device: u32, mig: Option<u32>) -> Result<Readings, String> {
        if device >= MAX_DEVICES {
            return Err(format!("there is no GPU {device}"));
        }
        let gpu = self
            .handle(device)
            .map_err(|rc| format!("GPU {device}: {}", self.error_text(rc)))?;
        let handle = match mig {
            None => gpu,
            Some(j) if j >= MAX_MIG_DEVICES => {
                return Err(format!("GPU {device} has no MIG device {j}"));
            }
            Some(j) => self
                .mig_handle(gpu, j)
                .map_err(|rc| format!("GPU {device} MIG device {j}: {}", self.error_text(rc)))?,
        };
        Ok(self.readings(handle, mig.is_some()))
    }

    fn readings(&self, h: Handle, is_mig: bool) -> Readings {
        let f = &self.functions;
        let clocks = |which: Option<FnKindU32>| Clocks {
            graphics: self.kind_u32(which, h, CLOCK_GRAPHICS),
            sm: self.kind_u32(which, h, CLOCK_SM),
            memory: self.kind_u32(which, h, CLOCK_MEM),
            video: self.kind_u32(which, h, CLOCK_VIDEO),
        };
        let violations = PERF_POLICIES.map(|policy| self.violation(h, policy));
        // NVML refuses utilization and NVLinks for MIG devices: they are not asked for.
        let physical = !is_mig;
        Readings {
            memory: self.memory(f.memory, h),
            bar1_memory: self.memory(f.bar1_memory, h),
            utilization: physical.then(|| self.utilization(h)).flatten(),
            temperature: self.kind_u32(f.temperature, h, TEMPERATURE_GPU),
            fan_speed: self.u32(f.fan_speed, h),
            ecc_mode: self.ecc_mode(h),
            performance_state: self.u32(f.performance_state, h),
            power_management: self
                .u32(f.power_management_mode, h)
                .map(|mode| mode == FEATURE_ENABLED),
            power_usage: self.u32(f.power_usage, h),
            total_energy: self.u64(f.total_energy, h),
            clocks: clocks(f.clock),
            max_clocks: clocks(f.max_clock),
            ecc_uncorrected: self.ecc_errors(h, MEMORY_ERROR_UNCORRECTED),
            ecc_corrected: self.ecc_errors(h, MEMORY_ERROR_CORRECTED),
            power_limit: self.u32(f.power_limit, h),
            encoder_utilization: physical
                .then(|| self.two_u32(f.encoder_utilization, h).map(|(u, _)| u))
                .flatten(),
            decoder_utilization: physical
                .then(|| self.two_u32(f.decoder_utilization, h).map(|(u, _)| u))
                .flatten(),
            remapped_rows: self.remapped_rows(h),
            compute_processes: self.processes(f.compute_processes, h),
            graphics_processes: self.processes(f.graphics_processes, h),
            violations: Violations {
                power: violations[0],
                thermal: violations[1],
                sync_boost: violations[2],
                board_limit: violations[3],
                low_utilization: violations[4],
                reliability: violations[5],
                below_app_clocks: violations[6],
                below_base_clocks: violations[7],
            },
            nvlinks: if physical {
                self.nvlinks(h)
            } else {
                Vec::new()
            },
        }
    }

    fn string(&self, f: Option<FnString>, h: Handle) -> Option<String> {
        let f = f?;
        let mut buffer = [0 as c_char; STRING_BUFFER];
        // SAFETY: the buffer holds STRING_BUFFER bytes, the length passed.
        let rc = unsafe { f(h, buffer.as_mut_ptr(), STRING_BUFFER as c_uint) };
        if rc != SUCCESS {
            return None;
        }
        // Read up to the first NUL within the buffer, whatever the library wrote.
        let bytes: Vec<u8> = buffer
            .iter()
            .map(|&c| c as u8)
            .take_while(|&b| b != 0)
            .collect();
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn pci(&self, h: Handle) -> Option<PciLocation> {
        let f = self.functions.pci_info?;
        let mut info = PciInfo {
            bus_id_legacy: [0; 16],
            domain: 0,
            bus: 0,
            device: 0,
            pci_device_id: 0,
            pci_sub_system_id: 0,
            bus_id: [0; 32],
        };
        // SAFETY: a pointer to an nvmlPciInfo_t, as declared.
        let rc = unsafe { f(h, &mut info) };
        (rc == SUCCESS).then_some(PciLocation {
            domain: info.domain,
            bus: info.bus,
            device: info.device,
        })
    }

    fn u32(&self, f: Option<FnU32>, h: Handle) -> Option<u32> {
        let f = f?;
        let mut value: c_uint = 0;
        // SAFETY: a pointer to an unsigned int, as declared.
        let rc = unsafe { f(h, &mut value) };
        (rc == SUCCESS).then_some(value)
    }

    fn u64(&self, f: Option<FnU64>, h: Handle) -> Option<u64> {
        let f = f?;
        let mut value: c_ulonglong = 0;
        // SAFETY: a pointer to an unsigned long long, as declared.
        let rc = unsafe { f(h, &mut value) };
        (rc == SUCCESS).then_some(value)
    }

    fn two_u32(&self, f: Option<FnTwoU32>, h: Handle) -> Option<(u32, u32)> {
        let f = f?;
        let (mut a, mut b): (c_uint, c_uint) = (0, 0);
        // SAFETY: two pointers to unsigned ints (or enums of that size), as declared.
        let rc = unsafe { f(h, &mut a, &mut b) };
        (rc == SUCCESS).then_some((a, b))
    }

    fn kind_u32(&self, f: Option<FnKindU32>, h: Handle, kind: c_int) -> Option<u32> {
        let f = f?;
        let mut value: c_uint = 0;
        // SAFETY: an enum value and a pointer to an unsigned int, as declared.
        let rc = unsafe { f(h, kind, &mut value) };
        (rc == SUCCESS).then_some(value)
    }

    fn memory(&self, f: Option<FnMemory>, h: Handle) -> Option<Memory> {
        let f = f?;
        let mut info = MemoryInfo::default();
        // SAFETY: a pointer to the struct, as declared.
        let rc = unsafe { f(h, &mut info) };
        (rc == SUCCESS).then_some(Memory {
            total: info.total,
            used: info.used,
        })
    }

    fn utilization(&self, h: Handle) -> Option<Utilization> {
        let f = self.functions.utilization?;
        let mut info = UtilizationInfo::default();
        // SAFETY: a pointer to an nvmlUtilization_t, as declared.
        let rc = unsafe { f(h, &mut info) };
        (rc == SUCCESS).then_some(Utilization {
            gpu: info.gpu,
            memory: info.memory,
        })
    }

    fn ecc_mode(&self, h: Handle) -> Option<EccMode> {
        let f = self.functions.ecc_mode?;
        let (mut current, mut pending): (c_uint, c_uint) = (0, 0);
        // SAFETY: two pointers to nvmlEnableState_t (an int-sized enum), as declared.
        let rc = unsafe { f(h, &mut current, &mut pending) };
        match rc {
            SUCCESS => Some(match pending {
                FEATURE_ENABLED => EccMode::Enabled,
                FEATURE_DISABLED => EccMode::Disabled,
                _ => EccMode::Unknown,
            }),
            ERROR_NOT_SUPPORTED => Some(EccMode::NotSupported),
            _ => None,
        }
    }

    fn ecc_errors(&self, h: Handle, error_type: c_int) -> Option<u64> {
        let f = self.functions.total_ecc_errors?;
        let mut value: c_ulonglong = 0;
        // SAFETY: two enum values and a pointer to an unsigned long long, as declared.
        let rc = unsafe { f(h, error_type, AGGREGATE_ECC, &mut value) };
        (rc == SUCCESS).then_some(value)
    }

    fn remapped_rows(&self, h: Handle) -> Option<RemappedRows> {
        let f = self.functions.remapped_rows?;
        let (mut corrected, mut uncorrected, mut pending, mut failure): (
            c_uint,
            c_uint,
            c_uint,
            c_uint,
        ) = (0, 0, 0, 0);
        // SAFETY: four pointers to unsigned ints, as declared.
        let rc = unsafe {
            f(
                h,
                &mut corrected,
                &mut uncorrected,
                &mut pending,
                &mut failure,
            )
        };
        (rc == SUCCESS).then_some(RemappedRows {
            corrected,
            uncorrected,
            pending: pending != 0,
            failure: failure != 0,
        })
    }

    /// The number of processes: asked with room for none, NVML answers with the count
    /// (`NVML_ERROR_INSUFFICIENT_SIZE`), or success when there are none. No process record
    /// is ever written, so their layout (which changed between versions) does not matter.
    fn processes(&self, f: Option<FnProcesses>, h: Handle) -> Option<u32> {
        let f = f?;
        let mut count: c_uint = 0;
        // SAFETY: a count of 0 and no buffer, which NVML documents as the way to ask.
        let rc = unsafe { f(h, &mut count, std::ptr::null_mut()) };
        match rc {
            SUCCESS => Some(0),
            ERROR_INSUFFICIENT_SIZE => Some(count),
            _ => None,
        }
    }

    fn violation(&self, h: Handle, policy: c_int) -> Option<u64> {
        let f = self.functions.violation?;
        let mut time = ViolationTime::default();
        // SAFETY: an enum value and a pointer to an nvmlViolationTime_t, as declared.
        let rc = unsafe { f(h, policy, &mut time) };
        (rc == SUCCESS).then_some(time.violation_time)
    }

    fn nvlinks(&self, h: Handle) -> Vec<Nvlink> {
        let (Some(state), counter) = (self.functions.nvlink_state, self.functions.nvlink_counter)
        else {
            return Vec::new();
        };
        let count = |link: c_uint, which: c_int| -> Option<u64> {
            let f = counter?;
            let mut value: c_ulonglong = 0;
            // SAFETY: a link, an enum value and a pointer to an unsigned long long.
            let rc = unsafe { f(h, link, which, &mut value) };
            (rc == SUCCESS).then_some(value)
        };
        let mut links = Vec::new();
        for link in 0..NVLINK_MAX_LINKS {
            let mut active: c_uint = 0;
            // SAFETY: a link and a pointer to nvmlEnableState_t, as declared.
            let rc = unsafe { state(h, link, &mut active) };
            if rc != SUCCESS || active != FEATURE_ENABLED {
                continue;
            }
            links.push(Nvlink {
                link,
                crc_data: count(link, NVLINK_ERROR_DL_CRC_DATA),
                ecc_data: count(link, NVLINK_ERROR_DL_ECC_DATA),
                replay: count(link, NVLINK_ERROR_DL_REPLAY),
                recovery: count(link, NVLINK_ERROR_DL_RECOVERY),
                crc_flit: count(link, NVLINK_ERROR_DL_CRC_FLIT),
            });
        }
        links
    }
}

/// One plugin's NVML grant: not granted, or the library to use.
#[derive(Debug, Clone, Default)]
pub(crate) struct NvmlGrant {
    library: Option<PathBuf>,
}

impl NvmlGrant {
    /// The grant of a plugin whose `capabilities.nvml` is `granted`, loading `library` (or
    /// [`LIBRARY_ENV`]'s file, or [`DEFAULT_LIBRARY`]).
    pub fn new(granted: bool, library: Option<&Path>) -> NvmlGrant {
        if !granted {
            return NvmlGrant::default();
        }
        NvmlGrant {
            library: Some(library_path(library, LIBRARY_ENV, DEFAULT_LIBRARY)),
        }
    }

    /// The loaded library, or why there is none.
    pub fn nvml(&self) -> Result<Arc<Nvml>, String> {
        let Some(library) = &self.library else {
            return Err("NVML is not granted to this plugin (capabilities.nvml)".to_owned());
        };
        Nvml::get(library).map_err(|reason| format!("NVML is not available on this host: {reason}"))
    }
}
