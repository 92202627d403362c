//! The host's libraries by machine: a node's ld.so.cache can name libraries of several
//! machines, and only its own (and, on x86-64, the i386 ones for `compat32`) are the driver's.
//! The flags are glibc's (`sysdeps/generic/ldconfig.h`): `FLAG_ELF_LIBC6` 0x0003,
//! `FLAG_X8664_LIB64` 0x0300, `FLAG_ARM_LIBHF` 0x0900, `FLAG_AARCH64_LIB64` 0x0a00.

use std::os::unix::fs::symlink;

use nvshim_hook::elf::Arch;
use nvshim_hook::ldcache::{Entry, LdCache};

use super::{Host, HostRoots, WordSize};

const V: &str = "580.95.05";

/// A driver root with a `libcuda` per multiarch directory, and its cache entries.
fn multiarch_root() -> (tempfile::TempDir, LdCache) {
    let dir = tempfile::tempdir().unwrap();
    let mut cache = LdCache::default();
    for (triplet, flags) in [
        ("x86_64-linux-gnu", 0x0303),
        ("i386-linux-gnu", 0x0003),
        ("aarch64-linux-gnu", 0x0a03),
        ("arm-linux-gnueabihf", 0x0903),
    ] {
        let lib = dir.path().join("usr/lib").join(triplet);
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join(format!("libcuda.so.{V}")), b"stub").unwrap();
        symlink(format!("libcuda.so.{V}"), lib.join("libcuda.so.1")).unwrap();
        cache.entries.push(Entry {
            flags,
            name: "libcuda.so.1".into(),
            path: format!("/usr/lib/{triplet}/libcuda.so.1"),
            os_version: 0,
            hwcap: 0,
        });
    }
    (dir, cache)
}

fn libcuda(dir: &tempfile::TempDir, cache: &LdCache, arch: Arch, word: WordSize) -> Vec<String> {
    let host = Host::new(HostRoots {
        driver_root: dir.path().into(),
        dev_root: dir.path().into(),
        proc_root: dir.path().join("proc"),
    })
    .with_arch(Some(arch));
    let rules = crate::nvidia::LIBRARIES
        .iter()
        .filter(|l| l.stem == "libcuda");
    host.libraries(cache, rules, V, word)
        .into_iter()
        .map(|l| l.file.container_path)
        .collect()
}

#[test]
fn each_machine_takes_its_own_libraries() {
    let (dir, cache) = multiarch_root();
    let lib = |t: &str| vec![format!("/usr/lib/{t}/libcuda.so.{V}")];
    assert_eq!(
        libcuda(&dir, &cache, Arch::X86_64, WordSize::Bits64),
        lib("x86_64-linux-gnu")
    );
    assert_eq!(
        libcuda(&dir, &cache, Arch::X86_64, WordSize::Bits32),
        lib("i386-linux-gnu")
    );
    assert_eq!(
        libcuda(&dir, &cache, Arch::Aarch64, WordSize::Bits64),
        lib("aarch64-linux-gnu")
    );
    // NVIDIA's aarch64 driver has no 32-bit libraries: `compat32` brings nothing there.
    assert!(libcuda(&dir, &cache, Arch::Aarch64, WordSize::Bits32).is_empty());
}
