//! The built fake `libnvidia-ml.so.1` as its callers load it: every entry point NVIDIA's
//! Kubernetes components link resolves (tests/fixtures/nvml/go-nvml-symbols.txt, with where
//! the list comes from), init and shutdown are counted, and nvml-wrapper (what
//! `nvshim cdi generate` reads NVML through) reads the topology's values back.

use std::ffi::{c_char, c_uint};
use std::path::{Path, PathBuf};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstanceInfo_t, nvmlComputeInstanceProfileInfo_t, nvmlComputeInstance_t,
    nvmlDevice_t, nvmlGpuInstanceInfo_t, nvmlGpuInstanceProfileInfo_t, nvmlGpuInstance_t,
    nvmlReturn_t,
};
use nvshim_fake_nvml::{topology_file_beside, Gpu, MigDevice, Topology};

const SUCCESS: nvmlReturn_t = 0;
const UNINITIALIZED: nvmlReturn_t = 1;
const NOT_SUPPORTED: nvmlReturn_t = 3;

/// The cdylib cargo built beside this test binary (`target/<profile>/deps/`).
fn built_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.with_file_name("libnvshim_fake_nvml.so");
    assert!(lib.exists(), "{} not built", lib.display());
    lib
}

fn topology() -> Topology {
    Topology {
        driver_version: "580.65.06".into(),
        cuda_driver_version: 13000,
        gpus: vec![
            Gpu {
                name: "NVIDIA H100 80GB HBM3".into(),
                uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
                minor: 0,
                bus_id: "0000:1b:00.0".into(),
                memory_total: 80 << 30,
                compute_capability: Some("9.0".into()),
                ..Gpu::default()
            },
            Gpu {
                name: "NVIDIA H100 80GB HBM3".into(),
                uuid: "GPU-11111111-1111-1111-1111-111111111111".into(),
                minor: 1,
                bus_id: "0000:43:00.0".into(),
                memory_total: 80 << 30,
                compute_capability: Some("9.0".into()),
                mig_enabled: Some(true),
                mig_devices: vec![
                    MigDevice {
                        uuid: "MIG-aaaaaaaa-0000-0000-0000-000000000000".into(),
                        gpu_instance_id: 2,
                        compute_instance_id: 0,
                        profile: "3g.40gb".into(),
                        slice_count: 3,
                        memory_total: 40 << 30,
                    },
                    MigDevice {
                        uuid: "MIG-bbbbbbbb-0000-0000-0000-000000000000".into(),
                        gpu_instance_id: 9,
                        compute_instance_id: 0,
                        profile: "1g.10gb".into(),
                        slice_count: 1,
                        memory_total: 10 << 30,
                    },
                ],
                ..Gpu::default()
            },
        ],
        ..Topology::default()
    }
}

/// A copy of the built library in its own directory with the topology beside it: each copy
/// is loaded as a library of its own, with its own NVML state.
fn installed(dir: &Path) -> PathBuf {
    let lib = dir.join("libnvidia-ml.so.1");
    std::fs::copy(built_library(), &lib).unwrap();
    let json = serde_json::to_string(&topology()).unwrap();
    std::fs::write(topology_file_beside(&lib), json).unwrap();
    lib
}

fn open(lib: &Path) -> libloading::Library {
    // SAFETY: the fake NVML's initialisers are Rust statics; loading runs no foreign code.
    unsafe { libloading::Library::new(lib) }.unwrap()
}

type NoArgs = unsafe extern "C" fn() -> nvmlReturn_t;
type Count = unsafe extern "C" fn(*mut c_uint) -> nvmlReturn_t;

fn call(lib: &libloading::Library, name: &str) -> nvmlReturn_t {
    // SAFETY: `name` is one of NVML's `nvmlReturn_t f(void)` entry points.
    unsafe { lib.get::<NoArgs>(name.as_bytes()).unwrap()() }
}

fn count(lib: &libloading::Library) -> (nvmlReturn_t, c_uint) {
    let mut n = 0;
    // SAFETY: nvmlDeviceGetCount_v2(unsigned int *) as nvml.h declares it.
    let r = unsafe { lib.get::<Count>(b"nvmlDeviceGetCount_v2").unwrap()(&mut n) };
    (r, n)
}

#[test]
fn every_entry_point_nvidias_components_link_resolves() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/nvml/go-nvml-symbols.txt"
    );
    let names: Vec<String> = std::fs::read_to_string(fixture)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.trim().to_string())
        .collect();
    assert_eq!(names.len(), 415, "the list in {fixture}");
    let dir = tempfile::tempdir().unwrap();
    let lib = open(&installed(dir.path()));
    let missing: Vec<&String> = names
        .iter()
        // SAFETY: only the address is looked up; nothing is called.
        .filter(|n| unsafe { lib.get::<*const ()>(n.as_bytes()) }.is_err())
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");

    // One of the generic ones, called as nvml.h declares it: uninitialised, then unsupported.
    type FanSpeed = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint) -> nvmlReturn_t;
    // SAFETY: nvmlDeviceGetFanSpeed(nvmlDevice_t, unsigned int *) as nvml.h declares it.
    let fan = unsafe { lib.get::<FanSpeed>(b"nvmlDeviceGetFanSpeed").unwrap() };
    let mut speed = 7;
    // SAFETY: a valid out-pointer; the handle is not read.
    assert_eq!(
        unsafe { fan(std::ptr::null_mut(), &mut speed) },
        UNINITIALIZED
    );
    assert_eq!(call(&lib, "nvmlInit_v2"), SUCCESS);
    // SAFETY: as above.
    assert_eq!(
        unsafe { fan(std::ptr::null_mut(), &mut speed) },
        NOT_SUPPORTED
    );
    assert_eq!(speed, 7, "nothing written");
    assert_eq!(call(&lib, "nvmlShutdown"), SUCCESS);
}

/// NVIDIA's device plugin initialises once for its resource manager and once more for its
/// health check, and shuts the second down while the first is in use.
#[test]
fn init_and_shutdown_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let lib = open(&installed(dir.path()));
    assert_eq!(call(&lib, "nvmlShutdown"), UNINITIALIZED);
    assert_eq!(count(&lib).0, UNINITIALIZED);
    assert_eq!(call(&lib, "nvmlInit_v2"), SUCCESS);
    type InitWithFlags = unsafe extern "C" fn(c_uint) -> nvmlReturn_t;
    // SAFETY: nvmlInitWithFlags(unsigned int) as nvml.h declares it.
    let with_flags = unsafe { lib.get::<InitWithFlags>(b"nvmlInitWithFlags").unwrap() };
    // SAFETY: as declared.
    assert_eq!(unsafe { with_flags(0) }, SUCCESS);
    assert_eq!(call(&lib, "nvmlInit"), SUCCESS);
    for _ in 0..2 {
        assert_eq!(call(&lib, "nvmlShutdown"), SUCCESS);
        assert_eq!(count(&lib), (SUCCESS, 2), "still initialised");
    }
    assert_eq!(call(&lib, "nvmlShutdown"), SUCCESS);
    assert_eq!(count(&lib).0, UNINITIALIZED);
    assert_eq!(call(&lib, "nvmlShutdown"), UNINITIALIZED);
}

#[test]
fn nvml_wrapper_reads_the_topology() {
    let dir = tempfile::tempdir().unwrap();
    let path = installed(dir.path());
    let nvml = Nvml::builder().lib_path(path.as_os_str()).init().unwrap();
    // A second user of the same library: its shutdown leaves the first one working.
    Nvml::builder()
        .lib_path(path.as_os_str())
        .init()
        .unwrap()
        .shutdown()
        .unwrap();

    assert_eq!(nvml.sys_driver_version().unwrap(), "580.65.06");
    assert_eq!(nvml.sys_nvml_version().unwrap(), "13.580.65.06");
    assert_eq!(nvml.device_count().unwrap(), 2);
    let gpu0 = nvml.device_by_index(0).unwrap();
    assert_eq!(gpu0.name().unwrap(), "NVIDIA H100 80GB HBM3");
    let memory = gpu0.memory_info().unwrap();
    assert_eq!(
        (memory.total, memory.free, memory.used),
        (80 << 30, 80 << 30, 0)
    );
    assert_eq!(gpu0.pci_info().unwrap().bus_id, "00000000:1B:00.0");
    let gpu1 = nvml.device_by_pci_bus_id("0000:43:00.0").unwrap();
    assert_eq!(gpu1.index().unwrap(), 1);
    assert_eq!(
        gpu0.topology_common_ancestor(gpu1).unwrap(),
        TopologyLevel::Node
    );
    let gpu1 = nvml.device_by_pci_bus_id("43:00.0").unwrap();
    let mig = gpu1.mig_device_by_index(1).unwrap();
    assert_eq!(
        mig.uuid().unwrap(),
        "MIG-bbbbbbbb-0000-0000-0000-000000000000"
    );
    assert_eq!(mig.memory_info().unwrap().total, 10 << 30);
    assert_eq!(gpu1.running_compute_processes().unwrap().len(), 0);

    // The device plugin's health check: register, then waits that time out.
    let set = nvml.create_event_set().unwrap();
    let set = gpu1
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .unwrap();
    let started = std::time::Instant::now();
    assert!(matches!(set.wait(50), Err(NvmlError::Timeout)));
    assert!(started.elapsed() >= std::time::Duration::from_millis(50));
    assert!(matches!(gpu0.fan_speed(0), Err(NvmlError::NotSupported)));
}

/// go-nvlib's walk from a MIG device to its profile (`GetProfile` in
/// pkg/nvlib/device/mig_device.go, which NVIDIA's device plugin and DRA driver name MIG
/// devices with), through the C entry points.
#[test]
fn a_mig_device_leads_to_its_profile() {
    let dir = tempfile::tempdir().unwrap();
    let lib = open(&installed(dir.path()));
    assert_eq!(call(&lib, "nvmlInit_v2"), SUCCESS);
    macro_rules! sym {
        ($name:literal: $($arg:ty),*) => {
            // SAFETY: the signature is nvml.h's for that entry point.
            unsafe { lib.get::<unsafe extern "C" fn($($arg),*) -> nvmlReturn_t>($name).unwrap() }
        };
    }
    let by_uuid = sym!(b"nvmlDeviceGetHandleByUUID": *const c_char, *mut nvmlDevice_t);
    let parent_of =
        sym!(b"nvmlDeviceGetDeviceHandleFromMigDeviceHandle": nvmlDevice_t, *mut nvmlDevice_t);
    let gi_id = sym!(b"nvmlDeviceGetGpuInstanceId": nvmlDevice_t, *mut c_uint);
    let ci_id = sym!(b"nvmlDeviceGetComputeInstanceId": nvmlDevice_t, *mut c_uint);
    let gi_by_id =
        sym!(b"nvmlDeviceGetGpuInstanceById": nvmlDevice_t, c_uint, *mut nvmlGpuInstance_t);
    let ci_by_id = sym!(b"nvmlGpuInstanceGetComputeInstanceById": nvmlGpuInstance_t, c_uint, *mut nvmlComputeInstance_t);
    let gi_info = sym!(b"nvmlGpuInstanceGetInfo": nvmlGpuInstance_t, *mut nvmlGpuInstanceInfo_t);
    let ci_info = sym!(b"nvmlComputeInstanceGetInfo_v2": nvmlComputeInstance_t, *mut nvmlComputeInstanceInfo_t);
    let gi_profile = sym!(b"nvmlDeviceGetGpuInstanceProfileInfo": nvmlDevice_t, c_uint, *mut nvmlGpuInstanceProfileInfo_t);
    let ci_profile = sym!(b"nvmlGpuInstanceGetComputeInstanceProfileInfo": nvmlGpuInstance_t, c_uint, c_uint, *mut nvmlComputeInstanceProfileInfo_t);
    let gis = sym!(b"nvmlDeviceGetGpuInstances": nvmlDevice_t, c_uint, *mut nvmlGpuInstance_t, *mut c_uint);

    let uuid = c"MIG-aaaaaaaa-0000-0000-0000-000000000000";
    // SAFETY (all calls below): each pointer is a valid local of the type nvml.h names, and
    // each handle one the library handed out.
    unsafe {
        let (mut mig, mut parent) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(by_uuid(uuid.as_ptr(), &mut mig), SUCCESS);
        assert_eq!(parent_of(mig, &mut parent), SUCCESS);
        let (mut gi, mut ci) = (0, 0);
        assert_eq!(gi_id(mig, &mut gi), SUCCESS);
        assert_eq!(ci_id(mig, &mut ci), SUCCESS);
        assert_eq!((gi, ci), (2, 0));
        let mut gi_handle = std::ptr::null_mut();
        assert_eq!(gi_by_id(parent, gi, &mut gi_handle), SUCCESS);
        assert_eq!(gi_by_id(parent, 5, &mut gi_handle.clone()), 6, "NOT_FOUND");
        let mut ci_handle = std::ptr::null_mut();
        assert_eq!(ci_by_id(gi_handle, ci, &mut ci_handle), SUCCESS);
        let mut g: nvmlGpuInstanceInfo_t = std::mem::zeroed();
        assert_eq!(gi_info(gi_handle, &mut g), SUCCESS);
        assert_eq!(
            (g.device, g.id, g.profileId),
            (parent, 2, 2),
            "3-slice profile"
        );
        assert_eq!((g.placement.start, g.placement.size), (0, 3));
        let mut c: nvmlComputeInstanceInfo_t = std::mem::zeroed();
        assert_eq!(ci_info(ci_handle, &mut c), SUCCESS);
        assert_eq!((c.gpuInstance, c.id, c.profileId), (gi_handle, 0, 2));

        let mut matched = None;
        for i in 0..0x12 {
            let mut p: nvmlGpuInstanceProfileInfo_t = std::mem::zeroed();
            if gi_profile(parent, i, &mut p) != SUCCESS || p.id != g.profileId {
                continue;
            }
            for j in 0..0x9 {
                let mut q: nvmlComputeInstanceProfileInfo_t = std::mem::zeroed();
                if ci_profile(gi_handle, j, 0, &mut q) == SUCCESS && q.id == c.profileId {
                    matched = Some((p.sliceCount, p.memorySizeMB, q.sliceCount));
                }
            }
        }
        assert_eq!(matched, Some((3, 40 * 1024, 3)));
        // Profiles no MIG device uses have an H100's sizes; the rest of nvml.h's are not
        // offered, and past its count is an invalid argument.
        let mut p: nvmlGpuInstanceProfileInfo_t = std::mem::zeroed();
        assert_eq!(gi_profile(parent, 4, &mut p), SUCCESS);
        assert_eq!(
            (p.sliceCount, p.instanceCount, p.memorySizeMB),
            (7, 1, 80 * 1024)
        );
        assert_eq!(gi_profile(parent, 1, &mut p), SUCCESS);
        assert_eq!(
            (p.sliceCount, p.instanceCount, p.memorySizeMB),
            (2, 3, 20 * 1024)
        );
        assert_eq!(gi_profile(parent, 7, &mut p), NOT_SUPPORTED);
        assert_eq!(gi_profile(parent, 0x12, &mut p), 2, "INVALID_ARGUMENT");

        // The 1-slice profile has one instance here (GPU instance 9).
        let mut handles = [std::ptr::null_mut(); 7];
        let mut n = 0;
        assert_eq!(gis(parent, 0, handles.as_mut_ptr(), &mut n), SUCCESS);
        assert_eq!(n, 1);
        assert_eq!(gi_info(handles[0], &mut g), SUCCESS);
        assert_eq!((g.id, g.placement.start, g.placement.size), (9, 3, 1));
        // A device handle is not a GPU instance handle.
        assert_eq!(gi_info(parent.cast(), &mut g), 2, "INVALID_ARGUMENT");
    }
}
