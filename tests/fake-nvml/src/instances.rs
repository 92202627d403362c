//! MIG GPU instances and compute instances, as NVIDIA's go-nvlib walks them to name a MIG
//! device's profile (`GetProfile` in its pkg/nvlib/device/mig_device.go: the device's GPU and
//! compute instance IDs, the instances by ID, their info, then the profile whose ID matches).
//!
//! The model: each distinct `gpuInstanceId` among a GPU's MIG devices is one GPU instance of
//! the first such device's `sliceCount`, placed after the instances before it; each MIG device
//! is one compute instance in it, of `N` slices for a `Nc.` profile (`1c.3g.40gb`) and of the
//! whole instance otherwise. Profiles are nvml.h's `<N>_SLICE` ones of a 7-slice GPU.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::{
    nvmlComputeInstanceInfo_t, nvmlComputeInstancePlacement_t, nvmlComputeInstanceProfileInfo_t,
    nvmlComputeInstance_t, nvmlDevice_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlGpuInstanceProfileInfo_t, nvmlGpuInstance_t, nvmlReturn_t,
};

use super::{
    compute_slices, find, first_of_instance, handle_of, profile_id, profile_slices, put, record,
    record_of, with_state, Gpu, Kind, Record, State, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED,
};

/// nvml.h's `NVML_GPU_INSTANCE_PROFILE_COUNT` and `NVML_COMPUTE_INSTANCE_PROFILE_COUNT`:
/// profile numbers at or past these are invalid arguments, below them unsupported ones.
const GPU_INSTANCE_PROFILE_COUNT: c_uint = 0x12;
const COMPUTE_INSTANCE_PROFILE_COUNT: c_uint = 0x9;

/// Streaming multiprocessors per slice (an H100's 132 SMs over 7 slices, rounded down);
/// `nvmlDeviceGetAttributes_v2` reports the same.
const SMS_PER_SLICE: u32 = 16;

/// The GPU of a MIG-enabled physical GPU handle.
fn mig_gpu(s: &State, device: nvmlDevice_t) -> Result<(usize, &Gpu), nvmlReturn_t> {
    let r = record(s, device).ok_or(INVALID_ARGUMENT)?;
    let g = &s.topology.gpus[r.gpu];
    if r.mig.is_some() || g.mig_enabled != Some(true) {
        return Err(NOT_SUPPORTED);
    }
    Ok((r.gpu, g))
}

/// A GPU instance handle's record and its first MIG device index.
fn gpu_instance(s: &State, gi: nvmlGpuInstance_t) -> Option<(&'static Record, usize)> {
    let r = record_of(s, gi as *const u8, Kind::GpuInstance)?;
    Some((r, r.mig?))
}

fn gi_slices(g: &Gpu, first: usize) -> u32 {
    g.mig_devices[first].slice_count.max(1)
}

/// The GPU instance profile's memory: that of a MIG device of the same slices, else the
/// eighths of the GPU's an A100's or H100's profile of those slices has (1g 1/8, 2g 2/8, 3g
/// and 4g 4/8, 7g all: their `1g.10gb` ... `7g.80gb`).
fn profile_memory_mb(g: &Gpu, slices: u32) -> u64 {
    let eighths = match slices {
        1 | 2 => u64::from(slices),
        3 | 4 => 4,
        _ => 8,
    };
    let bytes = g
        .mig_devices
        .iter()
        .find(|m| m.slice_count == slices)
        .map_or(g.memory_total / 8 * eighths, |m| m.memory_total);
    bytes / (1024 * 1024)
}

fn gi_info(s: &State, gpu: usize, first: usize) -> nvmlGpuInstanceInfo_t {
    let g = &s.topology.gpus[gpu];
    let start = (0..first)
        .filter(|&i| first_of_instance(g, i) == i)
        .map(|i| gi_slices(g, i))
        .sum();
    let size = gi_slices(g, first);
    nvmlGpuInstanceInfo_t {
        device: find(s, Kind::Device, gpu, None).map_or(std::ptr::null_mut(), handle_of),
        id: g.mig_devices[first].gpu_instance_id,
        profileId: profile_id(size).unwrap_or(c_uint::MAX),
        placement: nvmlGpuInstancePlacement_t { start, size },
    }
}

/// `nvmlDeviceGetGpuInstanceProfileInfo`.
///
/// # Safety
/// `info` must be valid for a write of `nvmlGpuInstanceProfileInfo_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    with_state(|s| {
        let (_, g) = match mig_gpu(s, device) {
            Ok(g) => g,
            Err(e) => return e,
        };
        if profile >= GPU_INSTANCE_PROFILE_COUNT {
            return INVALID_ARGUMENT;
        }
        let Some(slices) = profile_slices(profile) else {
            return NOT_SUPPORTED;
        };
        let value = nvmlGpuInstanceProfileInfo_t {
            id: profile,
            isP2pSupported: 0,
            sliceCount: slices,
            instanceCount: 7 / slices,
            multiprocessorCount: SMS_PER_SLICE * slices,
            copyEngineCount: slices,
            decoderCount: 0,
            encoderCount: 0,
            jpegCount: 0,
            ofaCount: 0,
            memorySizeMB: profile_memory_mb(g, slices),
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(info, value) }
    })
}

/// `nvmlDeviceGetGpuInstances`: the GPU instances of `profile`.
///
/// # Safety
/// `instances` must be valid for writes of the profile's `instanceCount` handles and `count`
/// for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profile: c_uint,
    instances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    with_state(|s| {
        let (gpu, g) = match mig_gpu(s, device) {
            Ok(g) => g,
            Err(e) => return e,
        };
        let Some(slices) = profile_slices(profile) else {
            return INVALID_ARGUMENT;
        };
        if instances.is_null() {
            return INVALID_ARGUMENT;
        }
        let found = s
            .records
            .iter()
            .filter(|r| r.kind == Kind::GpuInstance && r.gpu == gpu)
            .filter(|r| r.mig.is_some_and(|m| gi_slices(g, m) == slices))
            .take((7 / slices) as usize);
        let mut n = 0;
        for r in found {
            // SAFETY: the caller's buffer holds the profile's instanceCount (7 / slices)
            // handles, and `take` stops there.
            unsafe { instances.add(n).write(handle_of(r).cast()) };
            n += 1;
        }
        // SAFETY: forwarded caller contract.
        unsafe { put(count, n as c_uint) }
    })
}

/// `nvmlDeviceGetGpuInstanceById`.
///
/// # Safety
/// `gi` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    gi: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    with_state(|s| {
        let (gpu, g) = match mig_gpu(s, device) {
            Ok(g) => g,
            Err(e) => return e,
        };
        let first = g.mig_devices.iter().position(|m| m.gpu_instance_id == id);
        match first.and_then(|m| find(s, Kind::GpuInstance, gpu, Some(m))) {
            // SAFETY: forwarded caller contract.
            Some(r) => unsafe { put(gi, handle_of(r).cast()) },
            None => NOT_FOUND,
        }
    })
}

/// `nvmlGpuInstanceGetInfo`.
///
/// # Safety
/// `info` must be valid for a write of `nvmlGpuInstanceInfo_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gi: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    with_state(|s| match gpu_instance(s, gi) {
        // SAFETY: forwarded caller contract.
        Some((r, first)) => unsafe { put(info, gi_info(s, r.gpu, first)) },
        None => INVALID_ARGUMENT,
    })
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfo`: the shared engine profile only
/// (`NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`, the only one nvml.h defines).
///
/// # Safety
/// `info` must be valid for a write of `nvmlComputeInstanceProfileInfo_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gi: nvmlGpuInstance_t,
    profile: c_uint,
    engine_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    with_state(|s| {
        let Some((r, first)) = gpu_instance(s, gi) else {
            return INVALID_ARGUMENT;
        };
        if profile >= COMPUTE_INSTANCE_PROFILE_COUNT || engine_profile != 0 {
            return INVALID_ARGUMENT;
        }
        let whole = gi_slices(&s.topology.gpus[r.gpu], first);
        let Some(slices) = profile_slices(profile).filter(|n| *n <= whole) else {
            return NOT_SUPPORTED;
        };
        let value = nvmlComputeInstanceProfileInfo_t {
            id: profile,
            sliceCount: slices,
            instanceCount: whole / slices,
            multiprocessorCount: SMS_PER_SLICE * slices,
            sharedCopyEngineCount: whole,
            sharedDecoderCount: 0,
            sharedEncoderCount: 0,
            sharedJpegCount: 0,
            sharedOfaCount: 0,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(info, value) }
    })
}

/// The compute instance records of the GPU instance whose first MIG device is `first`.
fn compute_instances(
    s: &State,
    gpu: usize,
    first: usize,
) -> impl Iterator<Item = &'static Record> + '_ {
    let g = &s.topology.gpus[gpu];
    s.records.iter().filter(move |r| {
        r.kind == Kind::ComputeInstance
            && r.gpu == gpu
            && r.mig.is_some_and(|m| first_of_instance(g, m) == first)
    })
}

/// `nvmlGpuInstanceGetComputeInstances`: the compute instances of `profile`.
///
/// # Safety
/// `instances` must be valid for writes of the profile's `instanceCount` handles and `count`
/// for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gi: nvmlGpuInstance_t,
    profile: c_uint,
    instances: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    with_state(|s| {
        let Some((r, first)) = gpu_instance(s, gi) else {
            return INVALID_ARGUMENT;
        };
        let (Some(slices), false) = (profile_slices(profile), instances.is_null()) else {
            return INVALID_ARGUMENT;
        };
        let g = &s.topology.gpus[r.gpu];
        let whole = gi_slices(g, first);
        let found = compute_instances(s, r.gpu, first)
            .filter(|c| {
                c.mig
                    .is_some_and(|m| compute_slices(&g.mig_devices[m]) == slices)
            })
            .take((whole / slices) as usize);
        let mut n = 0;
        for c in found {
            // SAFETY: the caller's buffer holds the profile's instanceCount (whole / slices)
            // handles, and `take` stops there.
            unsafe { instances.add(n).write(handle_of(c).cast()) };
            n += 1;
        }
        // SAFETY: forwarded caller contract.
        unsafe { put(count, n as c_uint) }
    })
}

/// `nvmlGpuInstanceGetComputeInstanceById`.
///
/// # Safety
/// `ci` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gi: nvmlGpuInstance_t,
    id: c_uint,
    ci: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    with_state(|s| {
        let Some((r, first)) = gpu_instance(s, gi) else {
            return INVALID_ARGUMENT;
        };
        let g = &s.topology.gpus[r.gpu];
        let found = compute_instances(s, r.gpu, first).find(|c| {
            c.mig
                .is_some_and(|m| g.mig_devices[m].compute_instance_id == id)
        });
        match found {
            // SAFETY: forwarded caller contract.
            Some(c) => unsafe { put(ci, handle_of(c).cast()) },
            None => NOT_FOUND,
        }
    })
}

/// `nvmlComputeInstanceGetInfo_v2`: `device` is the GPU, as NVML fills it.
///
/// # Safety
/// `info` must be valid for a write of `nvmlComputeInstanceInfo_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    ci: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    with_state(|s| {
        let Some((r, m)) =
            record_of(s, ci as *const u8, Kind::ComputeInstance).and_then(|r| Some((r, r.mig?)))
        else {
            return INVALID_ARGUMENT;
        };
        let g = &s.topology.gpus[r.gpu];
        let first = first_of_instance(g, m);
        let start = compute_instances(s, r.gpu, first)
            .filter_map(|c| c.mig)
            .take_while(|&o| o != m)
            .map(|o| compute_slices(&g.mig_devices[o]))
            .sum();
        let size = compute_slices(&g.mig_devices[m]);
        let value = nvmlComputeInstanceInfo_t {
            device: find(s, Kind::Device, r.gpu, None).map_or(std::ptr::null_mut(), handle_of),
            gpuInstance: find(s, Kind::GpuInstance, r.gpu, Some(first))
                .map_or(std::ptr::null_mut(), |gi| handle_of(gi).cast()),
            id: g.mig_devices[m].compute_instance_id,
            profileId: profile_id(size).unwrap_or(c_uint::MAX),
            placement: nvmlComputeInstancePlacement_t { start, size },
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(info, value) }
    })
}

/// `nvmlComputeInstanceGetInfo` (v1): the same structure as v2.
///
/// # Safety
/// `info` must be valid for a write of `nvmlComputeInstanceInfo_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo(
    ci: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    unsafe { nvmlComputeInstanceGetInfo_v2(ci, info) }
}
