//! What NVIDIA's device plugin, DRA driver and GPU feature discovery read besides the devices:
//! events (a health check that waits on an event set: none ever fires, so a wait answers
//! `NVML_ERROR_TIMEOUT` after its timeout, as on a healthy GPU), running processes (none),
//! PCI topology and NVLink, and clocks, power and temperature as constants (an H100 SXM's
//! maximum clocks and power limit, idle). Physical GPUs only: a MIG device handle answers
//! `NVML_ERROR_NOT_SUPPORTED`, as NVML does for these.

use std::ffi::{c_uint, c_ulonglong, c_void};
use std::time::Duration;

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlEnableState_t, nvmlEventData_t, nvmlEventSet_t, nvmlGpuTopologyLevel_t,
    nvmlGpuVirtualizationMode_t, nvmlReturn_enum_NVML_ERROR_TIMEOUT as TIMEOUT, nvmlReturn_t,
};

use super::{
    bus_parts, put, record, with_device, with_state, Gpu, INVALID_ARGUMENT, NOT_SUPPORTED,
    NVML_FEATURE_DISABLED, SUCCESS,
};

/// The one event set every `nvmlEventSetCreate` hands out: nothing is ever delivered to it.
static EVENT_SET: u8 = 0;

fn event_set() -> nvmlEventSet_t {
    std::ptr::addr_of!(EVENT_SET) as nvmlEventSet_t
}

/// nvml.h's `nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError |
/// nvmlEventTypeXidCriticalError`: what the device plugin's health check registers.
const SUPPORTED_EVENTS: c_ulonglong = 0x1 | 0x2 | 0x8;

/// Runs `f` on a physical GPU handle's GPU; a MIG device answers `NVML_ERROR_NOT_SUPPORTED`.
fn with_gpu(device: nvmlDevice_t, f: impl FnOnce(&Gpu) -> nvmlReturn_t) -> nvmlReturn_t {
    with_device(device, |g, mig| match mig {
        Some(_) => NOT_SUPPORTED,
        None => f(g),
    })
}

/// `nvmlEventSetCreate`.
///
/// # Safety
/// `set` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    with_state(|_| unsafe { put(set, event_set()) })
}

/// `nvmlEventSetFree`.
#[no_mangle]
pub extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    if set != event_set() {
        return INVALID_ARGUMENT;
    }
    with_state(|_| SUCCESS)
}

/// `nvmlDeviceGetSupportedEventTypes`.
///
/// # Safety
/// `types` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    with_gpu(device, |_| unsafe { put(types, SUPPORTED_EVENTS) })
}

/// `nvmlDeviceRegisterEvents`.
#[no_mangle]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    if set != event_set() {
        return INVALID_ARGUMENT;
    }
    with_gpu(device, |_| {
        if types & !SUPPORTED_EVENTS != 0 {
            NOT_SUPPORTED
        } else {
            SUCCESS
        }
    })
}

/// `nvmlEventSetWait_v2`: `NVML_ERROR_TIMEOUT` after `timeout_ms`; `data` is not written.
#[no_mangle]
pub extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    _data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    if set != event_set() {
        return INVALID_ARGUMENT;
    }
    match with_state(|_| SUCCESS) {
        SUCCESS => {
            std::thread::sleep(Duration::from_millis(timeout_ms.into()));
            TIMEOUT
        }
        e => e,
    }
}

/// `nvmlEventSetWait` (v1): the same; `data` is not written.
#[no_mangle]
pub extern "C" fn nvmlEventSetWait(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    nvmlEventSetWait_v2(set, data, timeout_ms)
}

/// The `nvmlDevice*RunningProcesses*` calls: no process, whichever `nvmlProcessInfo*_t` the
/// version writes (none is written).
macro_rules! no_processes {
    ($($name:ident),* $(,)?) => {$(
        /// No process runs on the GPU.
        ///
        /// # Safety
        /// `count` must be valid for a write.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            device: nvmlDevice_t,
            count: *mut c_uint,
            _infos: *mut c_void,
        ) -> nvmlReturn_t {
            // SAFETY: forwarded caller contract.
            with_device(device, |_, _| unsafe { put(count, 0) })
        }
    )*};
}

no_processes!(
    nvmlDeviceGetComputeRunningProcesses,
    nvmlDeviceGetComputeRunningProcesses_v2,
    nvmlDeviceGetComputeRunningProcesses_v3,
    nvmlDeviceGetGraphicsRunningProcesses,
    nvmlDeviceGetGraphicsRunningProcesses_v2,
    nvmlDeviceGetGraphicsRunningProcesses_v3,
    nvmlDeviceGetMPSComputeRunningProcesses,
    nvmlDeviceGetMPSComputeRunningProcesses_v2,
    nvmlDeviceGetMPSComputeRunningProcesses_v3,
);

/// `nvmlDeviceGetTopologyCommonAncestor`. The topology file has no PCI tree: a GPU with itself
/// is `NVML_TOPOLOGY_INTERNAL`, GPUs of one PCI domain meet at `NVML_TOPOLOGY_NODE` (one NUMA
/// node), of two domains at `NVML_TOPOLOGY_SYSTEM`.
///
/// # Safety
/// `level` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    device1: nvmlDevice_t,
    device2: nvmlDevice_t,
    level: *mut nvmlGpuTopologyLevel_t,
) -> nvmlReturn_t {
    with_state(|s| {
        let (Some(a), Some(b)) = (record(s, device1), record(s, device2)) else {
            return INVALID_ARGUMENT;
        };
        if a.mig.is_some() || b.mig.is_some() {
            return NOT_SUPPORTED;
        }
        let domain = |gpu: usize| bus_parts(&s.topology.gpus[gpu].bus_id).map(|p| p.0);
        let value = if a.gpu == b.gpu {
            0
        } else if domain(a.gpu) == domain(b.gpu) {
            40
        } else {
            50
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(level, value) }
    })
}

/// nvml.h's `NVML_NVLINK_MAX_LINKS`.
const NVLINK_MAX_LINKS: c_uint = 36;

/// `nvmlDeviceGetNvLinkState`: every link down (the GPUs of the topology file are not linked).
///
/// # Safety
/// `active` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    active: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    with_gpu(device, |_| {
        if link >= NVLINK_MAX_LINKS {
            return INVALID_ARGUMENT;
        }
        // SAFETY: forwarded caller contract.
        unsafe { put(active, NVML_FEATURE_DISABLED) }
    })
}

/// `nvmlDeviceGetVirtualizationMode`: `NVML_GPU_VIRTUALIZATION_MODE_NONE` (bare metal).
///
/// # Safety
/// `mode` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetVirtualizationMode(
    device: nvmlDevice_t,
    mode: *mut nvmlGpuVirtualizationMode_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    with_gpu(device, |_| unsafe { put(mode, 0) })
}

/// MHz by nvml.h's `nvmlClockType_t` (graphics, SM, memory, video): an H100 SXM's maximum
/// clocks, reported as current too.
const CLOCKS_MHZ: [c_uint; 4] = [1980, 1980, 2619, 1755];

/// `nvmlDeviceGetClockInfo`.
///
/// # Safety
/// `clock` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    kind: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |_| match CLOCKS_MHZ.get(kind as usize) {
        // SAFETY: forwarded caller contract.
        Some(mhz) => unsafe { put(clock, *mhz) },
        None => INVALID_ARGUMENT,
    })
}

/// `nvmlDeviceGetMaxClockInfo`.
///
/// # Safety
/// `clock` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: nvmlDevice_t,
    kind: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    unsafe { nvmlDeviceGetClockInfo(device, kind, clock) }
}

/// `nvmlDeviceGetTemperature`: `NVML_TEMPERATURE_GPU` (0) only, in °C.
///
/// # Safety
/// `temp` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: c_uint,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |_| match sensor {
        // SAFETY: forwarded caller contract.
        0 => unsafe { put(temp, 35) },
        _ => INVALID_ARGUMENT,
    })
}

/// Milliwatts: an idle GPU's draw and an H100 SXM's limit.
const POWER_USAGE_MW: c_uint = 70_000;
const POWER_LIMIT_MW: c_uint = 700_000;

macro_rules! power {
    ($($name:ident => $value:expr),* $(,)?) => {$(
        /// A constant in milliwatts.
        ///
        /// # Safety
        /// `mw` must be valid for a write.
        #[no_mangle]
        pub unsafe extern "C" fn $name(device: nvmlDevice_t, mw: *mut c_uint) -> nvmlReturn_t {
            // SAFETY: forwarded caller contract.
            with_gpu(device, |_| unsafe { put(mw, $value) })
        }
    )*};
}

power!(
    nvmlDeviceGetPowerUsage => POWER_USAGE_MW,
    nvmlDeviceGetPowerManagementLimit => POWER_LIMIT_MW,
    nvmlDeviceGetPowerManagementDefaultLimit => POWER_LIMIT_MW,
    nvmlDeviceGetEnforcedPowerLimit => POWER_LIMIT_MW,
);
