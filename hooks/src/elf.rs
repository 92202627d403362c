//! What ldconfig reads from a shared object: its `DT_SONAME` and the cache flags.
//!
//! A port of glibc 2.36's `process_file` (`elf/readlib.c`), `process_elf_file`
//! (`elf/readelflib.c`) and the architecture wrappers
//! (`sysdeps/unix/sysv/linux/{x86_64,aarch64}/readelflib.c`), with the same answers: `None`
//! exactly where ldconfig skips a file. Differences, all on files an attacker crafted: every read
//! is bounded (ldconfig maps the whole file and trusts offsets after a start-of-range check),
//! and a name that is not NUL-terminated within 4 KiB or within the file makes the file skipped.
//! The OS ABI note and the x86 ISA-level property are not read: glibc 2.36's ldconfig no longer
//! stores the former and only stores the latter for `glibc-hwcaps` subdirectories (left at 0).
//!
//! [`note`] reads one note from a named `SHT_NOTE` section, for `enable-cuda-compat`'s
//! `.note.cuda.fwd_compatibility` (a port of NVIDIA's `GetCUDACompatElfHeader`,
//! `cmd/nvidia-cdi-hook/cudacompat/cuda-elf-header.go`), with every read bounded as above.

use std::cell::RefCell;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// `FLAG_ELF`: an ELF library with no known libc dependency.
pub const FLAG_ELF: i32 = 0x0001;
/// `FLAG_ELF_LIBC5`.
pub const FLAG_ELF_LIBC5: i32 = 0x0002;
/// `FLAG_ELF_LIBC6`.
pub const FLAG_ELF_LIBC6: i32 = 0x0003;
/// `FLAG_X8664_LIB64`.
pub const FLAG_X8664_LIB64: i32 = 0x0300;
/// `FLAG_X8664_LIBX32`.
pub const FLAG_X8664_LIBX32: i32 = 0x0800;
/// `FLAG_ARM_LIBHF`.
pub const FLAG_ARM_LIBHF: i32 = 0x0900;
/// `FLAG_AARCH64_LIB64`.
pub const FLAG_AARCH64_LIB64: i32 = 0x0a00;
/// `FLAG_ARM_LIBSF`.
pub const FLAG_ARM_LIBSF: i32 = 0x0b00;

const EM_386: u16 = 3;
const EM_X86_64: u16 = 62;
/// Tests only: glibc's aarch64 wrapper accepts any 64-bit machine, x86-64's rejects this one.
#[cfg(test)]
const EM_AARCH64: u16 = 183;
const ET_DYN: u16 = 3;
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_SONAME: u64 = 14;

/// Longest name read from the dynamic string table.
const MAX_NAME: usize = 4096;
/// Most program headers read.
const MAX_PHNUM: usize = 4096;
/// Most bytes of dynamic section scanned for `DT_NULL`.
const MAX_DYNAMIC: u64 = 1 << 20;
/// Most section headers read.
const MAX_SHNUM: u64 = 4096;
/// Largest note section read (NVIDIA's is a few hundred bytes).
pub const MAX_NOTE: u64 = 64 << 10;
const SHT_NOTE: u32 = 7;
/// `SHN_XINDEX`: the section-name table index is in section 0's `sh_link`.
const SHN_XINDEX: u16 = 0xffff;

/// The machine whose ldconfig rules apply. Only these two have a native cache writer; other
/// hosts use the ldconfig fallback (`fallback.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    /// The architecture this binary was built for, if the native writer supports it.
    pub fn host() -> Option<Arch> {
        if cfg!(target_arch = "x86_64") {
            Some(Arch::X86_64)
        } else if cfg!(target_arch = "aarch64") {
            Some(Arch::Aarch64)
        } else {
            None
        }
    }

    /// The GNU multiarch triplet (`/usr/lib/<triplet>`).
    pub fn triplet(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-linux-gnu",
            Arch::Aarch64 => "aarch64-linux-gnu",
        }
    }

    /// musl's dynamic linker name part (`/etc/ld-musl-<arch>.path`).
    pub fn musl_name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// The flags a 64-bit library of this machine gets in the cache.
    pub fn lib64_flags(self) -> i32 {
        match self {
            Arch::X86_64 => FLAG_X8664_LIB64 | FLAG_ELF_LIBC6,
            Arch::Aarch64 => FLAG_AARCH64_LIB64 | FLAG_ELF_LIBC6,
        }
    }
}

/// What ldconfig learns from one library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DsoInfo {
    /// `DT_SONAME`, if the library has one: bytes, as ldconfig keeps any.
    pub soname: Option<Vec<u8>>,
    /// Cache flags (`FLAG_*`).
    pub flags: i32,
}

/// A bounded view of the file: every read checks the file size first.
struct Reader<'a> {
    file: &'a File,
    size: u64,
    head: Vec<u8>,
    /// The file's bytes from an offset: the last chunk [`Reader::cstr`] read past `head`. A
    /// library's `DT_NEEDED` names and its `DT_SONAME` lie a few bytes apart in its string
    /// table, so the second name is usually in the first one's chunk: one `pread` fewer per
    /// library, as is every name that lies in `head`.
    strings: RefCell<(u64, Vec<u8>)>,
}

impl Reader<'_> {
    fn bytes(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        let end = offset.checked_add(len as u64)?;
        if end > self.size {
            return None;
        }
        if end <= self.head.len() as u64 {
            return Some(self.head[offset as usize..end as usize].to_vec());
        }
        let mut buf = vec![0u8; len];
        let mut done = 0;
        while done < len {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => return None,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return None,
            }
        }
        Some(buf)
    }

    /// A NUL-terminated string starting at `offset`, inside the file.
    fn cstr(&self, offset: u64) -> Option<Vec<u8>> {
        if offset >= self.size {
            return None;
        }
        let len = (self.size - offset).min(MAX_NAME as u64 + 1) as usize;
        if let Some(name) = held_cstr(&self.head, 0, offset, len) {
            return name;
        }
        if let Some(name) = {
            let last = self.strings.borrow();
            held_cstr(&last.1, last.0, offset, len)
        } {
            return name;
        }
        let mut chunk = 256.min(len);
        loop {
            let bytes = self.bytes(offset, chunk)?;
            if let Some(end) = bytes.iter().position(|&b| b == 0) {
                let name = bytes[..end].to_vec();
                *self.strings.borrow_mut() = (offset, bytes);
                return Some(name);
            }
            if chunk == len {
                return None;
            }
            chunk = (chunk * 4).min(len);
        }
    }
}

/// [`Reader::cstr`]'s answer from bytes already read (`held`, the file's bytes from offset
/// `at`) when they hold the name at `offset` and its NUL within `len` bytes; `None` when the
/// name must be read.
fn held_cstr(held: &[u8], at: u64, offset: u64, len: usize) -> Option<Option<Vec<u8>>> {
    let start = usize::try_from(offset.checked_sub(at)?).ok()?;
    let rest = held.get(start..)?;
    let end = rest[..rest.len().min(len)].iter().position(|&b| b == 0)?;
    Some(Some(rest[..end].to_vec()))
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// ELF class-dependent layout.
#[derive(Clone, Copy)]
struct Class {
    is64: bool,
}

impl Class {
    fn phentsize(self) -> usize {
        if self.is64 {
            56
        } else {
            32
        }
    }
    fn dynsize(self) -> usize {
        if self.is64 {
            16
        } else {
            8
        }
    }
    fn word(self, b: &[u8], at: usize) -> u64 {
        if self.is64 {
            u64_at(b, at)
        } else {
            u64::from(u32_at(b, at))
        }
    }
    /// (p_type, p_offset, p_vaddr, p_filesz) of a program header.
    fn phdr(self, b: &[u8]) -> (u32, u64, u64, u64) {
        if self.is64 {
            (u32_at(b, 0), u64_at(b, 8), u64_at(b, 16), u64_at(b, 32))
        } else {
            (
                u32_at(b, 0),
                u64::from(u32_at(b, 4)),
                u64::from(u32_at(b, 8)),
                u64::from(u32_at(b, 16)),
            )
        }
    }
}

/// `interpreters[]` and `known_libs[]` of `elf/readelflib.c` with x86's and Linux's
/// `SYSDEP_KNOWN_*` additions (`sysdeps/unix/sysv/linux/{x86,}/ldconfig.h`).
fn interpreter_flag(interp: &[u8]) -> Option<i32> {
    match interp {
        b"/lib/ld-linux.so.2"
        | b"/libx32/ld-linux-x32.so.2"
        | b"/lib64/ld-linux-x86-64.so.2"
        | b"/lib/ld-linux-aarch64.so.1"
        | b"/lib/ld-linux-armhf.so.3" => Some(FLAG_ELF_LIBC6),
        b"/lib/ld-linux.so.1" => Some(FLAG_ELF_LIBC5),
        _ => None,
    }
}

fn known_lib_flag(needed: &[u8]) -> Option<i32> {
    match needed {
        b"libc.so.6" | b"libm.so.6" => Some(FLAG_ELF_LIBC6),
        b"libc.so.5" | b"libm.so.5" => Some(FLAG_ELF_LIBC5),
        _ => None,
    }
}

/// Reads a library as ldconfig's `process_file` does. `size` is the file's `fstat` size.
/// `None`: ldconfig would skip this file (not ELF, not `ET_DYN`, another machine, no dynamic
/// section or string table, truncated).
pub fn inspect(file: &File, size: u64, arch: Arch) -> Option<DsoInfo> {
    // process_file: smaller than an ELF header (or an a.out header) is skipped.
    if size < 64 {
        return None;
    }
    let head_len = size.min(4096) as usize;
    let mut reader = Reader {
        file,
        size,
        head: Vec::new(),
        strings: RefCell::default(),
    };
    reader.head = reader.bytes(0, head_len)?;
    let h = &reader.head;
    if &h[..4] != b"\x7fELF" {
        return None;
    }
    // Only little-endian objects carry meaningful fields for a little-endian ldconfig.
    if h[5] != 1 {
        return None;
    }
    let is64 = match h[4] {
        1 => false,
        2 => true,
        _ => return None,
    };
    if u16_at(h, 16) != ET_DYN {
        return None;
    }
    let machine = u16_at(h, 18);
    let e_flags = u32_at(h, if is64 { 48 } else { 36 });
    // The architecture wrapper decides the final flags (or rejects the machine).
    let forced: Option<i32> = match arch {
        Arch::X86_64 => match (machine, is64) {
            // "X86-64 64bit libraries are always libc.so.6+."
            (EM_X86_64, true) => Some(FLAG_X8664_LIB64 | FLAG_ELF_LIBC6),
            // "X32 libraries are always libc.so.6+."
            (EM_X86_64, false) => Some(FLAG_X8664_LIBX32 | FLAG_ELF_LIBC6),
            (EM_386, false) => None,
            _ => return None,
        },
        // The aarch64 wrapper does not look at e_machine; 64-bit objects are always AArch64.
        Arch::Aarch64 => {
            if is64 {
                Some(FLAG_AARCH64_LIB64 | FLAG_ELF_LIBC6)
            } else {
                None
            }
        }
    };
    let class = Class { is64 };
    let info = process_elf(&reader, class)?;
    let flags = match (forced, arch) {
        (Some(f), _) => f,
        // The aarch64 wrapper classifies 32-bit objects by their ARM EABI float flags.
        (None, Arch::Aarch64) => {
            // EF_ARM_EABI_VERSION(e_flags) == EF_ARM_EABI_VER5
            if e_flags & 0xff00_0000 == 0x0500_0000 {
                if e_flags & 0x400 != 0 {
                    FLAG_ARM_LIBHF | FLAG_ELF_LIBC6
                } else if e_flags & 0x200 != 0 {
                    FLAG_ARM_LIBSF | FLAG_ELF_LIBC6
                } else {
                    FLAG_ELF_LIBC6
                }
            } else {
                info.flags
            }
        }
        (None, _) => info.flags,
    };
    Some(DsoInfo {
        soname: info.soname,
        flags,
    })
}

/// The generic `process_elf_file` for one class.
fn process_elf(r: &Reader, class: Class) -> Option<DsoInfo> {
    let h = &r.head;
    let (phoff, phnum) = if class.is64 {
        (u64_at(h, 32), usize::from(u16_at(h, 56)))
    } else {
        (u64::from(u32_at(h, 28)), usize::from(u16_at(h, 44)))
    };
    if phnum > MAX_PHNUM {
        return None;
    }
    let phdrs = r.bytes(phoff, phnum * class.phentsize())?;
    let mut flags = FLAG_ELF;
    let mut loadaddr: Option<u64> = None;
    let mut dynamic: Option<(u64, u64)> = None;
    for i in 0..phnum {
        let (p_type, p_offset, p_vaddr, p_filesz) =
            class.phdr(&phdrs[i * class.phentsize()..(i + 1) * class.phentsize()]);
        match p_type {
            PT_LOAD if loadaddr.is_none() => loadaddr = Some(p_vaddr.wrapping_sub(p_offset)),
            // "more than one dynamic segment": the last one wins, as in ldconfig.
            PT_DYNAMIC => dynamic = Some((p_offset, p_filesz)),
            PT_INTERP => {
                let interp = r.cstr(p_offset)?;
                if let Some(f) = interpreter_flag(&interp) {
                    flags = f;
                }
            }
            _ => {}
        }
    }
    let loadaddr = loadaddr.unwrap_or(0);
    let (dyn_offset, dyn_size) = dynamic?;
    if dyn_size == 0 {
        return None;
    }
    let entries = read_dynamic(r, class, dyn_offset, dyn_size)?;
    // The first DT_STRTAB, translated from an address to a file offset.
    let strtab = entries
        .iter()
        .find(|(tag, _)| *tag == DT_STRTAB)
        .map(|(_, val)| val.wrapping_sub(loadaddr))?;
    let mut soname = None;
    for (tag, val) in entries {
        if tag != DT_NEEDED && tag != DT_SONAME {
            continue;
        }
        let name = r.cstr(strtab.checked_add(val)?)?;
        if tag == DT_NEEDED {
            if flags == FLAG_ELF {
                if let Some(f) = known_lib_flag(&name) {
                    flags = f;
                }
            }
        } else {
            soname = Some(name);
        }
        if soname.is_some() && flags != FLAG_ELF {
            break;
        }
    }
    Some(DsoInfo { soname, flags })
}

/// The dynamic entries up to `DT_NULL`. ldconfig reads past `p_filesz` until `DT_NULL`; so do
/// we, up to the end of the file or `MAX_DYNAMIC` bytes.
fn read_dynamic(r: &Reader, class: Class, offset: u64, size: u64) -> Option<Vec<(u64, u64)>> {
    let entsize = class.dynsize() as u64;
    let limit = r.size.checked_sub(offset)?.min(MAX_DYNAMIC);
    let mut want = size.max(entsize).min(limit);
    loop {
        let len = (want / entsize * entsize) as usize;
        let bytes = r.bytes(offset, len)?;
        let mut out = Vec::new();
        for e in bytes.chunks_exact(entsize as usize) {
            let tag = class.word(e, 0);
            if tag == DT_NULL {
                return Some(out);
            }
            out.push((tag, class.word(e, entsize as usize / 2)));
        }
        if want >= limit {
            // No DT_NULL before the end of what may be read: ldconfig would read past the file.
            return None;
        }
        want = (want * 4).min(limit);
    }
}

/// One section header: (sh_name, sh_type, sh_offset, sh_size, sh_link, sh_addralign).
type Shdr = (u32, u32, u64, u64, u32, u64);

impl Class {
    fn shentsize(self) -> usize {
        if self.is64 {
            64
        } else {
            40
        }
    }
    fn shdr(self, b: &[u8]) -> Shdr {
        if self.is64 {
            (
                u32_at(b, 0),
                u32_at(b, 4),
                u64_at(b, 24),
                u64_at(b, 32),
                u32_at(b, 40),
                u64_at(b, 48),
            )
        } else {
            (
                u32_at(b, 0),
                u32_at(b, 4),
                u64::from(u32_at(b, 16)),
                u64::from(u32_at(b, 20)),
                u32_at(b, 24),
                u64::from(u32_at(b, 32)),
            )
        }
    }
}

/// Go's `alignUp` in NVIDIA's parser: `(size + to - 1) &^ (to - 1)`, in wrapping arithmetic
/// (the section's `sh_addralign` is the note alignment there, not the gABI's 4).
fn align_up(size: u64, to: u64) -> u64 {
    size.wrapping_add(to).wrapping_sub(1) & !to.wrapping_sub(1)
}

/// NVIDIA's `trim`: `data[from:from+len]` with both bounds clamped to the data (the fix for an
/// Orin library whose padding ran past the section, `232dda7`), NULs trimmed at both ends.
fn trim_nul(data: &[u8], from: u64, len: u64) -> &[u8] {
    let n = data.len() as u64;
    let start = from.min(n) as usize;
    let end = (from.saturating_add(len).min(n) as usize).max(start);
    let s = &data[start..end];
    let first = s.iter().position(|&b| b != 0).unwrap_or(s.len());
    let last = s.iter().rposition(|&b| b != 0).map_or(first, |i| i + 1);
    &s[first..last]
}

/// The descriptor of the first note in section `section` when that note's owner is `owner`,
/// found as NVIDIA's `GetCUDACompatElfHeader` finds it: the first `SHT_NOTE` section with that
/// name, its `Elf32_Nhdr` (the 12-byte header of both classes), the name padded to the section's
/// `sh_addralign`, name and descriptor each trimmed of NULs. `None` for anything else: not a
/// little-endian ELF file, no such section, an empty name or descriptor, another owner, headers
/// pointing outside the file. `size` is the file's `fstat` size; at most the first 4 KiB,
/// [`MAX_SHNUM`] section headers, the section names compared and [`MAX_NOTE`] bytes of note are
/// read.
pub fn note(file: &File, size: u64, section: &str, owner: &str) -> Option<Vec<u8>> {
    if size < 52 {
        return None;
    }
    let mut reader = Reader {
        file,
        size,
        head: Vec::new(),
        strings: RefCell::default(),
    };
    reader.head = reader.bytes(0, size.min(4096) as usize)?;
    let h = &reader.head;
    if &h[..4] != b"\x7fELF" || h[5] != 1 {
        return None;
    }
    let class = match h[4] {
        1 => Class { is64: false },
        2 if size >= 64 => Class { is64: true },
        _ => return None,
    };
    let (shoff, shentsize, shnum, shstrndx) = if class.is64 {
        (u64_at(h, 40), u16_at(h, 58), u16_at(h, 60), u16_at(h, 62))
    } else {
        (
            u64::from(u32_at(h, 32)),
            u16_at(h, 46),
            u16_at(h, 48),
            u16_at(h, 50),
        )
    };
    let entsize = class.shentsize();
    if shoff == 0 || usize::from(shentsize) != entsize {
        return None;
    }
    let first = class.shdr(&reader.bytes(shoff, entsize)?);
    // SHN_LORESERVE sections or more: the count is section 0's sh_size (gABI).
    let count = if shnum == 0 {
        first.3
    } else {
        u64::from(shnum)
    };
    if count == 0 || count > MAX_SHNUM {
        return None;
    }
    let table = reader.bytes(shoff, count as usize * entsize)?;
    let header = |i: u64| {
        let at = i as usize * entsize;
        class.shdr(&table[at..at + entsize])
    };
    let strndx = if shstrndx == SHN_XINDEX {
        u64::from(first.4)
    } else {
        u64::from(shstrndx)
    };
    if strndx >= count {
        return None;
    }
    let (_, _, str_off, str_size, _, _) = header(strndx);
    let (_, _, off, len, _, align) = (0..count).map(header).find(|s| {
        s.1 == SHT_NOTE
            && u64::from(s.0) < str_size
            && reader
                .cstr(str_off.saturating_add(u64::from(s.0)))
                .as_deref()
                == Some(section.as_bytes())
    })?;
    if !(12..=MAX_NOTE).contains(&len) {
        return None;
    }
    let data = reader.bytes(off, len as usize)?;
    let namesz = u64::from(u32_at(&data, 0));
    let descsz = u64::from(u32_at(&data, 4));
    if namesz == 0 || descsz == 0 {
        return None;
    }
    let name_len = align_up(namesz, align);
    if trim_nul(&data, 12, name_len) != owner.as_bytes() {
        return None;
    }
    Some(trim_nul(&data, 12u64.saturating_add(name_len), descsz).to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn garbage_and_short_files_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        for (name, data) in [
            ("empty", Vec::new()),
            ("short", b"\x7fELF".to_vec()),
            ("text", b"GROUP ( /lib/libc.so.6 )\n".repeat(10)),
            ("zeros", vec![0u8; 4096]),
        ] {
            let path = dir.path().join(name);
            std::fs::File::create(&path)
                .unwrap()
                .write_all(&data)
                .unwrap();
            let f = File::open(&path).unwrap();
            assert_eq!(inspect(&f, data.len() as u64, Arch::X86_64), None, "{name}");
        }
    }

    /// This machine's own `libc.so.6` (from its ld.so.cache), with its `e_machine` set to
    /// `machine`. `None` without a cache that names one.
    fn libc_as(machine: u16, dir: &std::path::Path) -> Option<(File, u64)> {
        let cache =
            crate::ldcache::LdCache::parse(&std::fs::read("/etc/ld.so.cache").ok()?).ok()?;
        let mut bytes = std::fs::read(cache.lookup("libc.so.6")?).ok()?;
        bytes[18..20].copy_from_slice(&machine.to_le_bytes());
        let path = dir.join(format!("libc-{machine}.so.6"));
        std::fs::write(&path, &bytes).unwrap();
        Some((File::open(&path).unwrap(), bytes.len() as u64))
    }

    /// glibc 2.36's `sysdeps/unix/sysv/linux/{x86_64,aarch64}/readelflib.c`: x86-64's ldconfig
    /// takes only `EM_X86_64` 64-bit objects (`FLAG_X8664_LIB64 | FLAG_ELF_LIBC6` = 0x0303);
    /// aarch64's takes any 64-bit object as `FLAG_AARCH64_LIB64 | FLAG_ELF_LIBC6` = 0x0a03.
    #[test]
    fn sixty_four_bit_objects_by_machine() {
        let dir = tempfile::tempdir().unwrap();
        let Some((aarch64, size)) = libc_as(EM_AARCH64, dir.path()) else {
            eprintln!("no libc.so.6 in /etc/ld.so.cache: skipped");
            return;
        };
        assert_eq!(inspect(&aarch64, size, Arch::X86_64), None);
        let info = inspect(&aarch64, size, Arch::Aarch64).expect("an aarch64 library");
        assert_eq!(info.flags, 0x0a03);
        assert_eq!(info.soname.as_deref(), Some(&b"libc.so.6"[..]));
        let (x86, size) = libc_as(EM_X86_64, dir.path()).unwrap();
        assert_eq!(inspect(&x86, size, Arch::X86_64).unwrap().flags, 0x0303);
        assert_eq!(Arch::X86_64.lib64_flags(), 0x0303);
        assert_eq!(Arch::Aarch64.lib64_flags(), 0x0a03);
    }

    #[test]
    fn truncated_elf_with_huge_offsets_is_skipped() {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2;
        h[5] = 1;
        h[16] = ET_DYN as u8;
        h[18] = EM_X86_64 as u8;
        h[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        h[56] = 0xff;
        h[57] = 0x0f;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lib");
        std::fs::write(&path, &h).unwrap();
        let f = File::open(&path).unwrap();
        assert_eq!(inspect(&f, 64, Arch::X86_64), None);
    }
}
