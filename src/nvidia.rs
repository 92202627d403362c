//! The NVIDIA driver's user-space files, and the `NVIDIA_DRIVER_CAPABILITIES` value that brings
//! each into a container: one home for the driver facts. The legacy resolver ([`crate::legacy`])
//! picks from these tables by capability; `docs/capabilities.md` is generated from them
//! ([`capability_table`]) and a test keeps the two equal.
//!
//! Where the rules come from, per row (the `source` column of the table):
//! - `libnvidia-container`: its per-capability lists (`src/nvc_info.c`), which NVIDIA's legacy
//!   runtime still applies;
//! - `nvidia-ctk`: files NVIDIA's CDI generator (toolkit 1.20) mounts that those lists predate;
//!   nvshim gives them the capability whose stack uses them;
//! - `nvshim`: where nvshim deliberately differs, with the reason in the row's note.
//!
//! The file names are the 580 driver's as it ships: the libraries NVIDIA's generator selected on
//! an Ubuntu 580 host and those of the RPM Fusion 580 packages (Fedora's `/usr/lib64` layout).
//!
//! One file (630 lines of code, 50 of tests): a table that must stay in one place; the
//! capabilities, the file lists and the generator of `docs/capabilities.md` are read together, and
//! splitting them would let a row and its documentation drift apart.

/// One `NVIDIA_DRIVER_CAPABILITIES` value (besides `all`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    Compute,
    Compat32,
    Display,
    Graphics,
    Ngx,
    Utility,
    Video,
}

impl Capability {
    pub fn name(self) -> &'static str {
        match self {
            Capability::Compute => "compute",
            Capability::Compat32 => "compat32",
            Capability::Display => "display",
            Capability::Graphics => "graphics",
            Capability::Ngx => "ngx",
            Capability::Utility => "utility",
            Capability::Video => "video",
        }
    }

    fn wanted(self, caps: &Capabilities) -> bool {
        match self {
            Capability::Compute => caps.compute,
            Capability::Compat32 => caps.compat32,
            Capability::Display => caps.display,
            Capability::Graphics => caps.graphics,
            Capability::Ngx => caps.ngx,
            Capability::Utility => caps.utility,
            Capability::Video => caps.video,
        }
    }
}

use Capability::{Compute, Display, Graphics, Ngx, Utility, Video};

/// Driver capabilities: which libraries and binaries are mounted
/// (libnvidia-container `src/options.h`). `NVIDIA_DRIVER_CAPABILITIES` is parsed into it by
/// [`Capabilities::parse`](crate::request), with the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    pub compute: bool,
    pub compat32: bool,
    pub graphics: bool,
    pub utility: bool,
    pub video: bool,
    pub display: bool,
    pub ngx: bool,
}

impl Capabilities {
    pub const ALL: Capabilities = Capabilities {
        compute: true,
        compat32: true,
        graphics: true,
        utility: true,
        video: true,
        display: true,
        ngx: true,
    };

    /// The capabilities set, in `NVIDIA_DRIVER_CAPABILITIES` spelling, in the order
    /// `nvshim explain` lists them.
    pub fn names(&self) -> Vec<&'static str> {
        [
            Capability::Compute,
            Capability::Compat32,
            Capability::Graphics,
            Capability::Utility,
            Capability::Video,
            Capability::Display,
            Capability::Ngx,
        ]
        .into_iter()
        .filter(|c| c.wanted(self))
        .map(Capability::name)
        .collect()
    }
}

/// True when `caps` asks for any of `by`.
pub fn brings(caps: &Capabilities, by: &[Capability]) -> bool {
    by.iter().any(|c| c.wanted(caps))
}

/// Every capability but `compat32`: the files any GPU container gets, whatever it asked for.
const ANY: &[Capability] = &[Compute, Display, Graphics, Ngx, Utility, Video];
/// The graphics stack: OpenGL, EGL, Vulkan, and the display server's needs.
const GRAPHICS: &[Capability] = &[Graphics, Display];
/// libnvidia-container gives video containers the compute libraries too (NVDEC/NVENC run
/// through CUDA).
const COMPUTE_OR_VIDEO: &[Capability] = &[Compute, Video];

/// Where a rule comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    LibnvidiaContainer,
    NvidiaCtk,
    Nvshim,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::LibnvidiaContainer => "libnvidia-container",
            Source::NvidiaCtk => "nvidia-ctk",
            Source::Nvshim => "nvshim",
        }
    }
}

/// How a library's file is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// `<stem>.so.<driver version>`, found through the host's ld.so.cache.
    DriverVersion,
    /// A version of its own (`libnvidia-egl-gbm.so.1.1.3`, `libnvidia-nvvm70.so.4`), found
    /// through the host's ld.so.cache.
    OwnVersion,
    /// `<dir>/<stem>.so.<driver version>` in a subdirectory of the driver's library directory,
    /// which ld.so.cache does not index (`vdpau/libvdpau_nvidia.so.580.95.05`).
    Subdir(&'static str),
}

/// A driver library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Library {
    /// `libcuda`.
    pub stem: &'static str,
    pub naming: Naming,
    /// Any of these brings the 64-bit library; with `compat32` also, its 32-bit build.
    pub brought_by: &'static [Capability],
    /// The driver ships a 32-bit build (`i386-linux-gnu`, `/usr/lib` on RHEL).
    pub has_32bit: bool,
    pub source: Source,
    pub note: &'static str,
}

const fn lib(
    stem: &'static str,
    brought_by: &'static [Capability],
    has_32bit: bool,
    source: Source,
) -> Library {
    Library {
        stem,
        naming: Naming::DriverVersion,
        brought_by,
        has_32bit,
        source,
        note: "",
    }
}

const L: Source = Source::LibnvidiaContainer;
const C: Source = Source::NvidiaCtk;

/// The driver's libraries.
pub const LIBRARIES: &[Library] = &[
    // utility: NVML and the driver's configuration.
    lib("libnvidia-ml", &[Utility], true, L),
    lib("libnvidia-cfg", &[Utility], false, L),
    lib("libnvidia-nscq", &[Utility], false, L),
    lib("libnvidia-sandboxutils", &[Utility], false, C),
    // compute: CUDA, OpenCL, the JIT and NVVM.
    lib("libcuda", COMPUTE_OR_VIDEO, true, L),
    lib("libcudadebugger", COMPUTE_OR_VIDEO, false, L),
    lib("libnvidia-opencl", COMPUTE_OR_VIDEO, true, L),
    lib("libnvidia-ptxjitcompiler", COMPUTE_OR_VIDEO, true, L),
    lib("libnvidia-fatbinaryloader", COMPUTE_OR_VIDEO, true, L),
    lib("libnvidia-compiler", COMPUTE_OR_VIDEO, true, L),
    lib("libnvidia-pkcs11", COMPUTE_OR_VIDEO, false, L),
    lib("libnvidia-pkcs11-openssl3", COMPUTE_OR_VIDEO, false, L),
    lib("libnvidia-nvvm", COMPUTE_OR_VIDEO, false, L),
    Library {
        naming: Naming::OwnVersion,
        note: "NVVM for CUDA 11 applications; its file is `.so.4`, not driver-versioned",
        ..lib("libnvidia-nvvm70", COMPUTE_OR_VIDEO, false, C)
    },
    lib("libnvidia-tileiras", COMPUTE_OR_VIDEO, false, L),
    // Shared by CUDA and the GL/Vulkan shader compilers, and by GBM.
    Library {
        note: "the shader compiler GL and Vulkan load too",
        ..lib(
            "libnvidia-gpucomp",
            &[Compute, Video, Graphics, Display],
            true,
            Source::Nvshim,
        )
    },
    Library {
        note: "GBM's buffer allocator (`gbm/nvidia-drm_gbm.so` links to it)",
        ..lib(
            "libnvidia-allocator",
            &[Compute, Video, Graphics, Display],
            true,
            Source::Nvshim,
        )
    },
    // video: decode, encode, optical flow, VDPAU.
    lib("libnvcuvid", &[Video], true, L),
    lib("libnvidia-encode", &[Video], true, L),
    lib("libnvidia-opticalflow", &[Video], false, L),
    Library {
        naming: Naming::Subdir("vdpau"),
        ..lib("libvdpau_nvidia", &[Video], true, L)
    },
    // graphics and display: GLX, EGL, GLES, Vulkan (SC), OptiX, frame capture.
    lib("libGLX_nvidia", GRAPHICS, true, L),
    lib("libEGL_nvidia", GRAPHICS, true, L),
    lib("libGLESv2_nvidia", GRAPHICS, true, L),
    lib("libGLESv1_CM_nvidia", GRAPHICS, true, L),
    lib("libnvidia-eglcore", GRAPHICS, true, L),
    lib("libnvidia-glcore", GRAPHICS, true, L),
    lib("libnvidia-tls", GRAPHICS, true, L),
    lib("libnvidia-glsi", GRAPHICS, true, L),
    lib("libnvidia-glvkspirv", GRAPHICS, true, L),
    lib("libnvidia-rtcore", GRAPHICS, false, L),
    lib("libnvoptix", GRAPHICS, false, L),
    lib("libnvidia-cbl", GRAPHICS, false, L),
    lib("libnvidia-fbc", GRAPHICS, true, L),
    lib("libnvidia-ifr", GRAPHICS, true, L),
    lib("libnvidia-present", GRAPHICS, false, C),
    lib("libnvidia-vksc-core", GRAPHICS, false, C),
    lib("libnvidia-wayland-client", GRAPHICS, false, C),
    Library {
        naming: Naming::OwnVersion,
        note: "NVIDIA's generator mounts it only with a feature flag",
        ..lib("libnvidia-api", GRAPHICS, false, C)
    },
    Library {
        naming: Naming::OwnVersion,
        ..lib("libnvidia-egl-gbm", GRAPHICS, false, C)
    },
    Library {
        naming: Naming::OwnVersion,
        ..lib("libnvidia-egl-wayland", GRAPHICS, false, C)
    },
    Library {
        naming: Naming::OwnVersion,
        ..lib("libnvidia-egl-wayland2", GRAPHICS, false, C)
    },
    Library {
        naming: Naming::OwnVersion,
        ..lib("libnvidia-egl-xcb", GRAPHICS, false, C)
    },
    Library {
        naming: Naming::OwnVersion,
        ..lib("libnvidia-egl-xlib", GRAPHICS, false, C)
    },
    Library {
        note: "nvidia-settings' GTK 2 front end",
        ..lib("libnvidia-gtk2", &[Display], false, C)
    },
    Library {
        note: "nvidia-settings' GTK 3 front end",
        ..lib("libnvidia-gtk3", &[Display], false, C)
    },
    // ngx: DLSS.
    lib("libnvidia-ngx", &[Ngx], false, L),
];

/// The libraries `caps` brings, 64-bit.
pub fn libraries_for(caps: &Capabilities) -> impl Iterator<Item = &'static Library> + '_ {
    LIBRARIES.iter().filter(|l| brings(caps, l.brought_by))
}

/// The 32-bit libraries `caps` brings: none without `compat32`.
pub fn libraries_32bit_for(caps: &Capabilities) -> impl Iterator<Item = &'static Library> + '_ {
    LIBRARIES
        .iter()
        .filter(|l| caps.compat32 && l.has_32bit && brings(caps, l.brought_by))
}

/// A file other than a library, found at one of `host_paths` under the driver root (the first
/// that exists), mounted at `container_path` (`None`: where it was found).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataFile {
    /// `{v}` stands for the driver version.
    pub host_paths: &'static [&'static str],
    pub container_path: Option<&'static str>,
    pub brought_by: &'static [Capability],
    pub source: Source,
    pub note: &'static str,
}

const fn data(
    host_paths: &'static [&'static str],
    container_path: Option<&'static str>,
    brought_by: &'static [Capability],
    source: Source,
    note: &'static str,
) -> DataFile {
    DataFile {
        host_paths,
        container_path,
        brought_by,
        source,
        note,
    }
}

/// Configuration and data files: loader manifests (glvnd, EGL platforms, Vulkan, OpenCL), OptiX's
/// cache, application profiles, the X.Org configuration. The Vulkan and OpenCL manifests go to
/// `/etc`, as NVIDIA's generator puts them, where every loader looks first.
pub const DATA_FILES: &[DataFile] = &[
    data(
        &["/usr/share/glvnd/egl_vendor.d/10_nvidia.json"],
        None,
        GRAPHICS,
        C,
        "",
    ),
    data(
        &["/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json"],
        None,
        GRAPHICS,
        C,
        "",
    ),
    data(
        &["/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json"],
        None,
        GRAPHICS,
        C,
        "",
    ),
    data(
        &["/usr/share/egl/egl_external_platform.d/09_nvidia_wayland2.json"],
        None,
        GRAPHICS,
        C,
        "",
    ),
    data(
        &["/usr/share/egl/egl_external_platform.d/20_nvidia_xcb.json"],
        None,
        GRAPHICS,
        C,
        "",
    ),
    data(
        &["/usr/share/egl/egl_external_platform.d/20_nvidia_xlib.json"],
        None,
        GRAPHICS,
        C,
        "",
    ),
    data(
        &[
            "/usr/share/vulkan/icd.d/nvidia_icd.json",
            "/etc/vulkan/icd.d/nvidia_icd.json",
            "/usr/share/vulkan/icd.d/nvidia_icd.x86_64.json",
            "/usr/share/vulkan/icd.d/nvidia_icd.aarch64.json",
        ],
        Some("/etc/vulkan/icd.d/nvidia_icd.json"),
        GRAPHICS,
        C,
        "",
    ),
    data(
        &[
            "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
            "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
        ],
        Some("/etc/vulkan/implicit_layer.d/nvidia_layers.json"),
        GRAPHICS,
        C,
        "",
    ),
    data(
        &[
            "/usr/share/vulkansc/icd.d/nvidia_icd_vksc.json",
            "/usr/share/vulkansc/icd.d/nvidia_icd_vksc.x86_64.json",
        ],
        Some("/usr/share/vulkansc/icd.d/nvidia_icd_vksc.json"),
        GRAPHICS,
        Source::Nvshim,
        "the Vulkan SC manifest for libnvidia-vksc-core; NVIDIA's generator leaves it out",
    ),
    data(
        &["/etc/OpenCL/vendors/nvidia.icd"],
        None,
        COMPUTE_OR_VIDEO,
        Source::Nvshim,
        "OpenCL is compute; NVIDIA's generator mounts it with the graphics files",
    ),
    data(&["/usr/share/nvidia/nvoptix.bin"], None, GRAPHICS, C, ""),
    data(
        &["/usr/share/nvidia/nvidia-application-profiles-{v}-rc"],
        None,
        GRAPHICS,
        Source::Nvshim,
        "the driver's default application profiles, which its GL and Vulkan read",
    ),
    data(
        &["/usr/share/nvidia/nvidia-application-profiles-{v}-key-documentation"],
        None,
        GRAPHICS,
        Source::Nvshim,
        "documents the keys of the profiles above",
    ),
    data(
        &["/usr/share/X11/xorg.conf.d/10-nvidia.conf"],
        None,
        &[Display],
        C,
        "an X server's configuration: display only",
    ),
    data(
        &["/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf"],
        None,
        &[Display],
        C,
        "an X server's configuration: display only",
    ),
];

/// X.Org modules, searched in these directories under each driver library directory (`{lib}`)
/// and the distributions' own: an X server in the container loads them.
pub const XORG_MODULE_DIRS: &[&str] = &[
    "{lib}/nvidia/xorg",
    "{lib}/xorg/modules/drivers",
    "{lib}/xorg/modules/extensions",
    "{lib}/xorg/modules/updates/drivers",
    "{lib}/xorg/modules/updates/extensions",
    "/usr/lib/xorg/modules/drivers",
    "/usr/lib/xorg/modules/extensions",
    "/usr/lib64/xorg/modules/drivers",
    "/usr/lib64/xorg/modules/extensions",
];

/// The X.Org modules (`{v}`: the driver version).
pub const XORG_MODULES: &[&str] = &["nvidia_drv.so", "libglxserver_nvidia.so.{v}"];
/// Who brings the X.Org modules (libnvidia-container: `display`; NVIDIA's generator mounts them
/// with every graphics request).
pub const XORG_BROUGHT_BY: &[Capability] = &[Display];

/// The driver's executables.
pub const EXECUTABLES: &[(&str, &[Capability], Source)] = &[
    ("nvidia-smi", &[Utility], L),
    ("nvidia-debugdump", &[Utility], L),
    ("nvidia-persistenced", &[Utility], L),
    ("nv-fabricmanager", &[Utility], L),
    ("nvidia-cuda-mps-control", &[Compute], L),
    ("nvidia-cuda-mps-server", &[Compute], L),
    ("nvidia-imex", &[Compute], C),
    ("nvidia-imex-ctl", &[Compute], C),
    ("nvidia-xconfig", &[Display], C),
];

/// The executables `caps` brings.
pub fn executables_for(caps: &Capabilities) -> Vec<&'static str> {
    EXECUTABLES
        .iter()
        .filter(|(_, by, _)| brings(caps, by))
        .map(|(name, _, _)| *name)
        .collect()
}

/// GSP firmware (`nvidia/<v>/gsp_*.bin`): any GPU container; nvidia-smi and the driver's
/// libraries read it on GSP GPUs (Turing and later).
pub const FIRMWARE_BROUGHT_BY: &[Capability] = ANY;

/// The daemons' sockets: nvidia-persistenced (NVML asks it) and the fabric manager (NVSwitch
/// systems), each under `/run` or `/var/run`.
pub const SOCKETS: &[&str] = &["nvidia-persistenced/socket", "nvidia-fabricmanager/socket"];
pub const SOCKETS_BROUGHT_BY: &[Capability] = &[Utility, Compute];

/// The DRM card and render nodes of the GPUs selected whole (`/dev/dri/cardN`, `renderDN`,
/// found through `<sys-root>/bus/pci/devices/<bus>/drm/`), with their `by-path` links; a MIG
/// device gets none (`crate::legacy::device_nodes`).
pub const DRM_BROUGHT_BY: &[Capability] = GRAPHICS;

/// The control nodes' minors on the `nvidia` major (195): the driver fixes them.
pub const NVIDIACTL_MINOR: u32 = 255;
pub const MODESET_MINOR: u32 = 254;
/// `nvidia-uvm-tools`' minor on the `nvidia-uvm` major (`nvidia-uvm` itself is 0).
pub const UVM_TOOLS_MINOR: u32 = 1;

/// Mount options for driver files: read-only, no setuid or device files, private propagation
/// (NVIDIA v1.18 made every mount rprivate so nothing leaks back to the host).
pub const MOUNT_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "rbind", "rprivate"];
/// Options of the daemons' sockets and the MPS pipe directory: writable (clients connect or
/// create pipes), no exec, devices or setuid, private (NVIDIA's IPC mounts).
pub const IPC_MOUNT_OPTIONS: &[&str] = &["rw", "nosuid", "nodev", "noexec", "rbind", "rprivate"];

/// The environment every nvshim hook runs with: never the container's.
pub const HOOK_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn cap_names(by: &[Capability]) -> String {
    if by == ANY {
        return "any".into();
    }
    by.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
}

/// The capability table of `docs/capabilities.md`, generated from the tables above.
pub fn capability_table() -> String {
    let mut out = String::from(
        "# What each driver capability brings\n\n\
         Generated from `src/nvidia.rs` (a test keeps this file equal to it: after changing the \
         tables, run `NVSHIM_BLESS=1 cargo test -p nvshim --lib capability_table` to rewrite it).\n\n\
         `NVIDIA_DRIVER_CAPABILITIES` (default `utility,compute`; `all` is every value) decides \
         which of the driver's files a container gets from `NVIDIA_VISIBLE_DEVICES` requests. \
         `{v}` is the driver version. Sources: `libnvidia-container` = its per-capability lists, \
         which NVIDIA's legacy runtime applies; `nvidia-ctk` = files NVIDIA's CDI generator (1.20) \
         mounts that those lists predate; `nvshim` = a deliberate difference, with the reason.\n\n\
         ## Libraries\n\n\
         Found through the driver root's ld.so.cache; a driver root without one (a driver \
         directory such as GKE's `/home/kubernetes/bin/nvidia`) is scanned as `ldconfig -r` \
         would scan NVIDIA's library search directories and `lib`, `lib32`. \
         Mounted read-only at their host paths, with their SONAME links and the container's \
         ld.so.cache updated by the hooks. `compat32` adds the 32-bit build of each library marked \
         32-bit, for the capabilities that bring it.\n\n\
         | library | brought by | 32-bit | source | note |\n|---|---|---|---|---|\n",
    );
    for l in LIBRARIES {
        let file = match l.naming {
            Naming::DriverVersion => format!("{}.so.{{v}}", l.stem),
            Naming::OwnVersion => format!("{}.so.*", l.stem),
            Naming::Subdir(d) => format!("{d}/{}.so.{{v}}", l.stem),
        };
        out.push_str(&format!(
            "| `{file}` | {} | {} | {} | {} |\n",
            cap_names(l.brought_by),
            if l.has_32bit { "yes" } else { "" },
            l.source.name(),
            l.note
        ));
    }
    out.push_str(
        "\n## Configuration and data files\n\n\
         The first host path that exists under the driver root; mounted read-only at the \
         container path.\n\n\
         | host path | container path | brought by | source | note |\n|---|---|---|---|---|\n",
    );
    for f in DATA_FILES {
        let hosts: Vec<String> = f.host_paths.iter().map(|p| format!("`{p}`")).collect();
        out.push_str(&format!(
            "| {} | `{}` | {} | {} | {} |\n",
            hosts.join(", "),
            f.container_path.unwrap_or(f.host_paths[0]),
            cap_names(f.brought_by),
            f.source.name(),
            f.note
        ));
    }
    out.push_str(
        "\n## Executables\n\nLooked for in the driver root's `/usr/bin`, `/usr/sbin`, `/bin`, `/sbin`, \
         `/usr/local/bin`, then in the `bin/` beside the `lib`/`lib64` directory the libraries \
         are in (a driver directory such as `/usr/local/nvidia`); mounted read-only at \
         `/usr/bin/<name>`, where libnvidia-container puts them, so they are on the image's \
         `PATH` wherever the host keeps them.\n\n\
         | executable | brought by | source |\n|---|---|---|\n",
    );
    for (name, by, source) in EXECUTABLES {
        out.push_str(&format!(
            "| `{name}` | {} | {} |\n",
            cap_names(by),
            source.name()
        ));
    }
    out.push_str(&format!(
        "\n## Everything else\n\n\
         | what | brought by | source | note |\n|---|---|---|---|\n\
         | X.Org modules {} (in `nvidia/xorg`, `xorg/modules/{{drivers,extensions}}`) | {} | libnvidia-container | NVIDIA's generator mounts them with graphics too |\n\
         | GSP firmware `lib/firmware/nvidia/{{v}}/gsp_*.bin` | {} | nvidia-ctk | |\n\
         | sockets `/run/nvidia-persistenced/socket`, `/run/nvidia-fabricmanager/socket` (rw, noexec) | {} | nvidia-ctk | |\n\
         | the MPS pipe directory (`mps-pipe-directory`), with `CUDA_MPS_PIPE_DIRECTORY` | compute | nvshim | NVIDIA mounts `/tmp/nvidia-mps` only; nvshim mounts the configured directory and tells CUDA where it is |\n\
         | DRM nodes `/dev/dri/cardN`, `renderDN` of the GPUs selected whole, their cgroup rules, their groups in `additionalGids`, and `/dev/dri/by-path` links | {} | nvidia-ctk | a MIG device gets none: they open the whole GPU |\n\
         | `/dev/nvidiaN` of the selected GPUs, `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`, `nvidia-modeset` | any | libnvidia-container | |\n",
        XORG_MODULES
            .iter()
            .map(|m| format!("`{m}`"))
            .collect::<Vec<_>>()
            .join(", "),
        cap_names(XORG_BROUGHT_BY),
        cap_names(FIRMWARE_BROUGHT_BY),
        cap_names(SOCKETS_BROUGHT_BY),
        cap_names(DRM_BROUGHT_BY),
    ));
    out.push_str(
        "\n## Hooks\n\n\
         NVIDIA runs these container fix-ups as five hooks; nvshim runs them as one, \
         `nvshim-hook fixups` (one process, one open of the container's root), in NVIDIA's \
         order, with an explicit minimal environment: the links (SONAME, development and \
         graphics links, DRM `by-path` links), CUDA forward compatibility with the host driver \
         version (compute: the image's compatibility libraries, used only when newer than the \
         host driver), the container's ld.so.cache for the folders of the mounted libraries, \
         the device-node parameters (the container's view of `/proc/driver/nvidia/params` says \
         `ModifyDeviceFiles: 0`), the application profile (graphics: EGL and Vulkan see only the \
         container's GPUs). Each optional step that cannot apply (read-only root, no \
         `/proc/driver/nvidia`) warns and lets the container start. Specs written by others \
         keep NVIDIA's separate hooks, which `nvshim-hook` answers under NVIDIA's names.\n",
    );
    out.push_str(GPU_MEMORY_LIMITS);
    out.push_str(FEATURE_GATED);
    out.push_str(PLATFORMS);
    out
}

/// The "Feature-gated devices" section of docs/capabilities.md (`crate::host::gated`).
const FEATURE_GATED: &str = r#"
## Feature-gated devices

Beside a GPU request (`none` included), whatever the capabilities, as NVIDIA's runtime gives
them (nvidia-container-toolkit `internal/modifier/gated.go`, `internal/discover/*.go`); only
the exact value `enabled` asks. A node must be listed under its major in `/proc/devices`.
Beside CDI devices the variables are ignored (as in NVIDIA's `cdi` mode): ask for the mode's
`all` device instead.
In a container without `CAP_SYS_ADMIN` they follow `accept-envvar-unprivileged`: `true`
served, `false` refused, `"allocation-backed"` served only when the device plugin's allocate
response (the kubelet's device checkpoint) sets the same variable; a refusal fails the create.

| variable | brings | `nvshim cdi generate --mode` |
|---|---|---|
| `NVIDIA_GDS=enabled` | `/dev/nvidia-fs*`; with them `/etc/cufile.json` and `/run/udev` from the driver root, read-only | `gds` (`nvidia.com/gds=all`) |
| `NVIDIA_MOFED=enabled` | `/dev/infiniband/uverbs*`, `/dev/infiniband/rdma_cm` | `mofed` |
| `NVIDIA_GDRCOPY=enabled` | `/dev/gdrdrv` | `gdrcopy` |
| `NVIDIA_NVSWITCH=enabled` | `/dev/nvidia-nvswitchctl`, `/dev/nvidia-nvswitch*` | `nvswitch` |
"#;

/// The "Platforms" section of docs/capabilities.md: what each kind of host gets
/// (`crate::host::platform`, `crate::legacy::platform`) and the tests that show it.
const PLATFORMS: &str = r#"
## Platforms

What NVIDIA's runtime serves on each kind of host, what nvshim serves there, and the
end-to-end test (`tests/e2e/`) that checks it from inside a container on a simulated host.
The platform is the config's `platform` (`auto`, `nvml`, `wsl`, `csv`); `auto` decides as
NVIDIA's runtime does (go-nvlib `pkg/nvlib/info/resolver.go`), without loading NVML: `wsl`
when `<driver-root>/usr/lib/wsl/lib/libdxcore.so` exists; `csv` when `/etc/nv_tegra_release`
exists or `/sys/devices/soc0/family` says `tegra`, and `/proc/driver/nvidia/gpus` lists no GPU
(an Orin's nvgpu driver) or one at `0000:01:00.0` (a Thor's integrated GPU); else `nvml`.
`nvshim doctor` says which, and why.

| platform | NVIDIA's runtime gives | nvshim gives | tests |
|---|---|---|---|
| x86-64 server, NVIDIA driver (`nvml`) | the tables above (legacy and CDI modes) | the same, but for the rows marked `nvshim` | `runtime::`, `cdi::`, `k8s::`, `engines::` |
| aarch64, Grace and arm64 servers (`nvml`) | as on x86-64, from the aarch64 entries (`libc6,AArch64`, flags `0x0a03`) of the host's ld.so.cache (`/usr/lib/aarch64-linux-gnu`, `/usr/lib64`); no 32-bit compat libraries; the `for aarch64` driver banner | the same, from aarch64 binaries (hook and runtime linked static), arm64 .deb, .rpm and installer image; the container's ld.so.cache written with aarch64 flags, byte for byte as arm64 glibc's `ldconfig` | `aarch64::` (arm64 images under qemu on a simulated GB200 host), hooks `ldconfig_compat::aarch64_image_matches_arm64_ldconfig` |
| WSL2 (`wsl`) | `/dev/dxg` as device `all`, no `/dev/nvidia*`; `libdxcore.so` from `/usr/lib/wsl/lib`; from the NVIDIA driver store (`/usr/lib/wsl/drivers/<inf>_amd64_<hash>`, the one with `libcuda.so.1.1`) its required files and every other `*.so*`, `*.bin`, `*.dll`; `/usr/bin/nvidia-smi` linked to the store's; both folders in the ld.so.cache (`pkg/nvcdi/lib-wsl.go`, `driver-wsl.go`) | the same, by `NVIDIA_VISIBLE_DEVICES=all` and by the spec `nvshim cdi generate` writes | `platforms::wsl_all_gets_dxg_and_the_driver_store_as_nvidia_gives_them`, `platforms::wsl_refuses_gpu_ids_and_a_missing_dxg` |
| Jetson Orin (`csv`) | the CSV lists of `/etc/nvidia-container-runtime/host-files-for-container.d` (`devices.csv`, `drivers.csv`, `l4t.csv`; every `*.csv` with `NVIDIA_REQUIRE_JETPACK=csv-mounts=all`): `dev` nodes that exist (globs expanded) as device `0` and `all`, `lib` files (links followed), `sym` chains recreated hop by hop with their final file, `dir` directories, `/etc/nv_tegra_release`, `libcuda.so` links, the ld.so.cache (`pkg/nvcdi/lib-csv.go`, `internal/platform-support/tegra/`) | the same, by `NVIDIA_VISIBLE_DEVICES` `all` or `0` and by the generated spec | `platforms::orin_csv_lists_give_their_nodes_files_and_links_as_nvidia_does`, `platforms::orin_csv_mounts_all_other_ids_and_missing_lists` |
| Jetson Thor (`csv`) | its CSV lists with NVML: the iGPU as device `0` (a dGPU beside it as device `1`), `enable-cuda-compat --host-cuda-version` | the CSV lists as on an Orin, a node's group in `additionalGids` when the node is not world-usable; not a dGPU beside the iGPU, not the CUDA compatibility hook | `platforms::thor_is_served_from_its_csv_lists_with_the_nvmap_group` |
| feature-gated devices (GDS, MOFED, GDRCOPY, NVSwitch) | with the NVIDIA driver: "Feature-gated devices" above | the same | `gated::` |

On WSL and CSV hosts, as NVIDIA's CDI and CSV modes: `NVIDIA_DRIVER_CAPABILITIES` does not
narrow what a container gets, and `none` gets the files without the device nodes. Other GPU
ids than `all` (WSL) or `0` and `all` (CSV) fail the create, as does a host that lacks what the
request needs (no `/dev/dxg`, no driver store, no CSV lists, none of the listed nodes), with
the file and the fix. Deliberate differences: nvshim finds the WSL driver store by looking for
`libcuda.so.1.1` under `/usr/lib/wsl/drivers` instead of asking `libdxcore.so` for the
adapters (it loads no library); it reads `/etc/nv_tegra_release` under `driver-root`; it does
not check `NVIDIA_REQUIRE_*` there (it warns: the CUDA version comes from
`/proc/driver/nvidia`, which these hosts lack); `NVIDIA_IMEX_CHANNELS` and the MIG variables
fail the create there; CSV lists (and their directory) not owned by root or writable by others
are refused, since their lines become every GPU container's mounts and device nodes. `nvshim cdi refresh` and the installer do not know these platforms yet:
run `nvshim cdi generate`.
"#;

/// The "GPU memory limits" section of docs/capabilities.md: NVIDIA's `apply-cuda-memory-limits`
/// hook and nvshim's (`crate::memory_limits`, `nvshim_hook::apply_cuda_memory_limits`).
const GPU_MEMORY_LIMITS: &str = r#"
## GPU memory limits

NVIDIA's toolkit added a createRuntime hook in September 2026 (nvidia-container-toolkit PR
#2075, `cmd/nvidia-cdi-hook/apply-cuda-memory-limits`): `nvidia-cdi-hook
apply-cuda-memory-limits --driver-root R --gpu-id ID ...` (the GPU UUIDs; `--container-spec F`
names the OCI state, stdin when empty or `-`). It reads the state's bundle and pid, then
`NVIDIA_GPU_MEMORY_REQUEST` and `NVIDIA_GPU_MEMORY_LIMIT` from the bundle's config.json
`process.env`, and does nothing unless both are there. Both are whole MiB, and a request above
the limit is an error. It requires cgroup v2 (`statfs("/sys/fs/cgroup")` is `CGROUP2_SUPER_MAGIC`)
and takes the container's cgroup directory from the `0::` line of `/proc/<pid>/cgroup`, joined
to `/sys/fs/cgroup`. It loads `libnvidia-ml.so.1` under the driver root, `nvmlInit_v2`, and for
each id `nvmlDeviceGetHandleByUUID` and `nvmlDeviceSetMemoryLimits_v1(device, &limits)` with
`nvmlSetMemoryLimits_v1_t { const char *nameSpace; unsigned long long softLimit, hardLimit; }`
(24 bytes): the cgroup directory, the request and the limit in bytes; then `nvmlShutdown`. Any
failure fails the hook. The call is in NVML from the R615 driver (CUDA 13.4); driver 580 does
not export it.

nvshim answers the same command line (`nvshim-hook apply-cuda-memory-limits`, and under
`nvidia-cdi-hook` and `nvidia-ctk hook`) with the same errors, and one difference: a driver
that does not offer the call (no symbol, or `NVML_ERROR_NOT_SUPPORTED` /
`NVML_ERROR_FUNCTION_NOT_FOUND`) and a host without cgroup v2 at `/sys/fs/cgroup` get one
warning naming the driver version, and the container starts without a limit. It also accepts
MIG UUIDs and NVML indices as ids, and `--log-file F` to append the warning to nvshim's log
(runc drops a successful hook's stderr). nvshim-runtime adds the hook itself, at createRuntime
with `--driver-root` and the selected GPUs' UUIDs, when a GPU container's final env has both
variables and no such hook yet (`src/memory_limits.rs` says which ids; MIG devices not named by
MIG UUID get none). The released `nvshim-hook` is static and runs the NVML calls through the
dynamically linked `nvshim nvml-set-memory-limits` beside it
(`hooks/src/apply_cuda_memory_limits.rs`).
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_table_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/capabilities.md");
        let want = capability_table();
        if std::env::var_os("NVSHIM_BLESS").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{} is out of date: run `NVSHIM_BLESS=1 cargo test -p nvshim --lib capability_table`",
            path.display()
        );
    }

    #[test]
    fn every_capability_brings_its_own_subset() {
        let only = |c: &str| Capabilities::parse(Some(c)).unwrap();
        let stems =
            |caps: &Capabilities| -> Vec<&str> { libraries_for(caps).map(|l| l.stem).collect() };
        let utility = stems(&only("utility"));
        assert!(utility.contains(&"libnvidia-ml") && !utility.contains(&"libcuda"));
        let compute = stems(&only("compute"));
        assert!(compute.contains(&"libcuda") && compute.contains(&"libnvidia-nvvm70"));
        assert!(!compute.contains(&"libGLX_nvidia") && !compute.contains(&"libnvcuvid"));
        let video = stems(&only("video"));
        assert!(video.contains(&"libnvcuvid") && video.contains(&"libvdpau_nvidia"));
        assert!(
            video.contains(&"libcuda"),
            "video brings the compute libraries"
        );
        let graphics = stems(&only("graphics"));
        for s in ["libGLX_nvidia", "libnvidia-egl-gbm", "libnvidia-vksc-core"] {
            assert!(graphics.contains(&s), "{s}");
        }
        assert!(!graphics.contains(&"libcuda"));
        assert_eq!(stems(&only("ngx")), ["libnvidia-ngx"]);
        assert_eq!(libraries_32bit_for(&only("compute")).count(), 0);
        let c32: Vec<&str> = libraries_32bit_for(&only("compute,compat32"))
            .map(|l| l.stem)
            .collect();
        assert!(c32.contains(&"libcuda") && !c32.contains(&"libGLX_nvidia"));
        assert_eq!(executables_for(&only("display")), ["nvidia-xconfig"]);
        assert!(executables_for(&only("utility")).contains(&"nvidia-smi"));
    }
}
