//! Reader and writer for glibc's `/etc/ld.so.cache`.
//!
//! The format is glibc's `cache_file_new` (`elf/cache.c`, `sysdeps/generic/dl-cache.h`):
//! a 48-byte header (`"glibc-ld.so.cache"`, version `"1.1"`, entry count, string table length,
//! endianness flag, extension offset), `nlibs` 24-byte entries (`flags: i32, key: u32,
//! value: u32, osversion: u32, hwcap: u64`) and a string table. Key and value are offsets from
//! the start of the new-format header. Caches written by glibc before 2.32 may begin with the
//! old `ld.so-1.7.0` table, which is skipped. Since glibc 2.33 an extension directory follows
//! the strings (`cache_extension`): the generator string (tag 0) and the `glibc-hwcaps`
//! subdirectory names (tag 1), whose offsets are relative to the start of the file.
//!
//! [`serialize`] writes what glibc 2.36's `save_cache` writes, byte for byte: entries in the
//! order of ldconfig's `compare` (see [`compare`]), strings deduplicated and tail-merged as in
//! `elf/stringtable.c`, the extension directory 4-byte aligned after the strings, the
//! `glibc-hwcaps` array, then the generator string. Only the new format is written (ldconfig's
//! default since 2.32) and only little-endian.
//!
//! Written by hand rather than taken from a crate: no maintained crate parses this format, and
//! the hook must bound every read of a file that a container image controls.
//!
//! One file (520 lines of code, 160 of tests): reader and writer of one binary format, sharing its
//! constants and entry types; the writer's ordering ([`compare`], [`libcmp`]) is also what lookups
//! rely on.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use foldhash::{HashMap, HashMapExt as _};

use thiserror::Error;

use crate::elf::Arch;

/// `ld.so-1.7.0`: the old format's magic, followed by a 4-byte count and 12-byte entries.
const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
/// `glibc-ld.so.cache1.1`: the new format's magic and version.
pub const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
/// Size of the new-format header.
pub const HEADER_LEN: usize = 48;
/// Size of one new-format entry.
pub const ENTRY_LEN: usize = 24;
/// Largest cache we accept. A real distribution cache is well under 1 MiB; a cache that claims
/// more is malformed or hostile.
pub const MAX_CACHE_LEN: usize = 64 << 20;

/// `FLAG_ELF_LIBC6`: the library type bits of an ordinary glibc shared object.
pub const FLAG_ELF_LIBC6: i32 = 0x0003;
/// `FLAG_X8664_LIB64`: an x86-64 library.
pub const FLAG_X8664_LIB64: i32 = 0x0300;
/// `FLAG_AARCH64_LIB64`: an aarch64 library.
pub const FLAG_AARCH64_LIB64: i32 = 0x0a00;
/// Mask of the architecture bits in `flags`.
pub const FLAG_REQUIRED_MASK: i32 = 0xff00;

/// `DL_CACHE_HWCAP_EXTENSION`: the low 32 bits of `hwcap` index the `glibc-hwcaps` section.
pub const HWCAP_EXTENSION: u64 = 1 << 62;
/// `DL_CACHE_HWCAP_ISA_LEVEL_MASK`, at bit 32 of an extension entry's `hwcap`.
const ISA_LEVEL_MASK: u64 = (1 << 10) - 1;
/// `cache_extension_magic`.
const EXT_MAGIC: u32 = 0xEAA4_2174;
/// `cache_extension_tag_generator`.
const TAG_GENERATOR: u32 = 0;
/// `cache_extension_tag_glibc_hwcaps`.
const TAG_GLIBC_HWCAPS: u32 = 1;
/// `cache_file_new_flags_endian_little`.
const ENDIAN_LITTLE: u8 = 2;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum LdCacheError {
    #[error("ld.so.cache is {0} bytes, more than the {MAX_CACHE_LEN} bytes accepted")]
    TooLarge(usize),
    #[error("ld.so.cache has no glibc-ld.so.cache1.1 header")]
    BadMagic,
    #[error("ld.so.cache is truncated: {0}")]
    Truncated(&'static str),
    #[error("ld.so.cache entry {index} points outside the file (offset {offset})")]
    BadOffset { index: usize, offset: u32 },
    #[error("ld.so.cache entry {index} has a name that is not UTF-8")]
    NotUtf8 { index: usize },
    #[error("ld.so.cache is big-endian; only little-endian caches are supported")]
    BigEndian,
}

/// One library in the cache: `name` (the SONAME or link name the dynamic linker looks up) and
/// `path` (the file it resolves to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub flags: i32,
    pub name: String,
    pub path: String,
    pub os_version: u32,
    pub hwcap: u64,
}

impl Entry {
    /// True for a 64-bit library of this binary's machine ([`Arch::host`]): the only ones its
    /// dynamic linker, and so nvshim, uses.
    pub fn is_64bit(&self) -> bool {
        Arch::host().is_some_and(|arch| self.is_lib64_of(arch))
    }

    /// True for a 64-bit library of `arch`: architecture bits `FLAG_X8664_LIB64` (x86-64) or
    /// `FLAG_AARCH64_LIB64` (aarch64), the entries glibc's `_dl_cache_check_flags` accepts
    /// there (both with `FLAG_ELF_LIBC6`, as ldconfig forces for 64-bit objects).
    pub fn is_lib64_of(&self, arch: Arch) -> bool {
        self.flags & FLAG_REQUIRED_MASK == arch.lib64_flags() & FLAG_REQUIRED_MASK
    }

    /// True for a 32-bit compat library of `arch`: an i386 one on x86-64, which ldconfig tags
    /// with the plain glibc type and no architecture bits. None on aarch64: NVIDIA's aarch64
    /// driver ships no 32-bit libraries, and an armhf library there is no CUDA library.
    pub fn is_lib32_of(&self, arch: Arch) -> bool {
        arch == Arch::X86_64
            && self.flags & FLAG_REQUIRED_MASK == 0
            && self.flags & 0xff == FLAG_ELF_LIBC6
    }
}

/// A parsed cache: its entries in file order, the generator string and the `glibc-hwcaps`
/// subdirectory names (in section order) so that a writer can keep them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LdCache {
    pub entries: Vec<Entry>,
    /// The generator string from the extension section (e.g. `ldconfig (GNU libc) 2.36`).
    pub generator: Option<String>,
    /// The `glibc-hwcaps` section: subdirectory names, indexed by an extension entry's `hwcap`.
    pub hwcaps: Vec<String>,
}

fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    buf.get(at..at.checked_add(4)?)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn u64_at(buf: &[u8], at: usize) -> Option<u64> {
    buf.get(at..at.checked_add(8)?).map(|b| {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        u64::from_le_bytes(a)
    })
}

/// Reads a NUL-terminated string starting at `at`.
fn cstr_at(buf: &[u8], at: usize) -> Option<&[u8]> {
    let rest = buf.get(at..)?;
    Some(&rest[..crate::bytes::find(0, rest)?])
}

impl LdCache {
    /// Parses a cache image. Every offset is bounds-checked; nothing is trusted.
    pub fn parse(buf: &[u8]) -> Result<Self, LdCacheError> {
        Self::parse_only(buf, |_| true)
    }

    /// [`LdCache::parse`], keeping only the entries whose name `keep` accepts. Every entry's
    /// offsets are checked as `parse` checks them, but only the kept ones are copied (and
    /// checked as UTF-8): a `create` needs the driver's few dozen entries of a node's 500 or
    /// more (520 on the lent H200, an Ubuntu 24.04 CUDA image), and copying them all cost a
    /// legacy create 0.46 M of its 2.2 M instructions (callgrind, 462 entries).
    pub fn parse_only(
        buf: &[u8],
        mut keep: impl FnMut(&[u8]) -> bool,
    ) -> Result<Self, LdCacheError> {
        // Not sized by `nlibs`: a create keeps a few dozen of 500 or more.
        let mut entries = Vec::new();
        let (generator, hwcaps) = walk(buf, |index, raw| {
            if !keep(raw.name) {
                return Ok(());
            }
            let string = |b: &[u8]| {
                String::from_utf8(b.to_vec()).map_err(|_| LdCacheError::NotUtf8 { index })
            };
            entries.push(Entry {
                flags: raw.flags,
                name: string(raw.name)?,
                path: string(raw.path)?,
                os_version: raw.os_version,
                hwcap: raw.hwcap,
            });
            Ok(())
        })?;
        Ok(LdCache {
            entries,
            generator,
            hwcaps: hwcaps
                .into_iter()
                .map(|h| String::from_utf8(h).unwrap_or_default())
                .collect(),
        })
    }

    /// The path the dynamic linker would pick for `name` among 64-bit entries (the first match:
    /// ldconfig sorts entries so that the preferred one comes first).
    pub fn lookup(&self, name: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|e| e.is_64bit() && e.name == name)
            .map(|e| e.path.as_str())
    }

    /// The entries in the writer's form ([`cache_entries`] of the file they were read from).
    pub fn cache_entries(&self) -> Vec<CacheEntry> {
        self.entries
            .iter()
            .map(|e| {
                let raw = RawEntry {
                    flags: e.flags,
                    name: e.name.as_bytes(),
                    path: e.path.as_bytes(),
                    os_version: e.os_version,
                    hwcap: e.hwcap,
                };
                writer_entry(raw, &self.hwcaps)
            })
            .collect()
    }
}

/// One entry as stored, its strings borrowed from the file.
struct RawEntry<'a> {
    flags: i32,
    name: &'a [u8],
    path: &'a [u8],
    os_version: u32,
    hwcap: u64,
}

/// Checks a cache image and hands each entry to `each` in file order (with its index); returns
/// the generator string and the `glibc-hwcaps` names. Every offset is bounds-checked.
fn walk<'a>(
    buf: &'a [u8],
    mut each: impl FnMut(usize, RawEntry<'a>) -> Result<(), LdCacheError>,
) -> Result<(Option<String>, Vec<Vec<u8>>), LdCacheError> {
    if buf.len() > MAX_CACHE_LEN {
        return Err(LdCacheError::TooLarge(buf.len()));
    }
    let start = new_format_start(buf)?;
    let new = &buf[start..];
    if new.len() < HEADER_LEN {
        return Err(LdCacheError::Truncated("header"));
    }
    let nlibs = u32_at(new, 20).ok_or(LdCacheError::Truncated("header"))? as usize;
    let endian = new[28];
    // glibc: 0 = unset (old writers, native), 2 = little, 3 = big.
    if endian == 3 {
        return Err(LdCacheError::BigEndian);
    }
    let ext_offset = u32_at(new, 32).ok_or(LdCacheError::Truncated("header"))? as usize;
    let table_end = nlibs
        .checked_mul(ENTRY_LEN)
        .and_then(|n| n.checked_add(HEADER_LEN))
        .ok_or(LdCacheError::Truncated("entries"))?;
    if table_end > new.len() {
        return Err(LdCacheError::Truncated("entries"));
    }
    for index in 0..nlibs {
        let at = HEADER_LEN + index * ENTRY_LEN;
        let word = |off: usize| u32_at(new, at + off).ok_or(LdCacheError::Truncated("entries"));
        let (flags, key, value, os_version) = (word(0)? as i32, word(4)?, word(8)?, word(12)?);
        let hwcap = u64_at(new, at + 16).ok_or(LdCacheError::Truncated("entries"))?;
        let bytes = |offset: u32| {
            cstr_at(new, offset as usize).ok_or(LdCacheError::BadOffset { index, offset })
        };
        let (name, path) = (bytes(key)?, bytes(value)?);
        each(
            index,
            RawEntry {
                flags,
                name,
                path,
                os_version,
                hwcap,
            },
        )?;
    }
    // The extension's offsets count from the start of the file (dl-cache.c
    // `cache_extension_load`), not from the new header.
    Ok(if ext_offset != 0 {
        parse_extensions(buf, start, ext_offset)
    } else {
        (None, Vec::new())
    })
}

/// The entries of a cache image in the writer's form, names and paths as the bytes stored
/// (glibc's ldconfig keeps any byte string), `glibc-hwcaps` indices turned back into names.
/// What update-ldcache keeps of an image's cache.
pub fn cache_entries(buf: &[u8]) -> Result<Vec<CacheEntry>, LdCacheError> {
    let mut raw = Vec::new();
    let (_, hwcaps) = walk(buf, |_, e| {
        raw.push(e);
        Ok(())
    })?;
    Ok(raw.into_iter().map(|e| writer_entry(e, &hwcaps)).collect())
}

/// An entry in the writer's form. An extension entry whose index is out of range keeps its raw
/// `hwcap`.
fn writer_entry(e: RawEntry, hwcaps: &[impl AsRef<[u8]>]) -> CacheEntry {
    let sub = if e.hwcap & HWCAP_EXTENSION != 0 {
        hwcaps
            .get((e.hwcap & 0xffff_ffff) as usize)
            .map(|h| h.as_ref().to_vec())
    } else {
        None
    };
    CacheEntry {
        flags: e.flags,
        name: e.name.to_vec(),
        path: e.path.to_vec(),
        os_version: e.os_version,
        hwcap: if sub.is_some() { 0 } else { e.hwcap },
        isa_level: if sub.is_some() {
            ((e.hwcap >> 32) & ISA_LEVEL_MASK) as u32
        } else {
            0
        },
        hwcaps: sub,
    }
}

/// Finds where the new-format header begins: at 0, or after an old-format table.
fn new_format_start(buf: &[u8]) -> Result<usize, LdCacheError> {
    if buf.starts_with(NEW_MAGIC) {
        return Ok(0);
    }
    if buf.starts_with(OLD_MAGIC) {
        // struct cache_file { char magic[11]; uint32_t nlibs; struct file_entry libs[]; }
        // laid out with 4-byte alignment: magic at 0..11, padding, nlibs at 12.
        let nlibs = u32_at(buf, 12).ok_or(LdCacheError::Truncated("old header"))? as usize;
        let old_end = nlibs
            .checked_mul(12)
            .and_then(|n| n.checked_add(16))
            .ok_or(LdCacheError::Truncated("old entries"))?;
        // The new header follows, aligned to 8 bytes (glibc ALIGN_CACHE).
        let start = old_end
            .checked_add(7)
            .ok_or(LdCacheError::Truncated("old entries"))?
            & !7;
        if buf.get(start..start.saturating_add(NEW_MAGIC.len())) == Some(NEW_MAGIC) {
            return Ok(start);
        }
        return Err(LdCacheError::BadMagic);
    }
    Err(LdCacheError::BadMagic)
}

/// Extension area: `magic 0xEAA42174, count`, then `count` sections of `tag, flags, offset,
/// size`. Tag 0 is the generator string, tag 1 an array of `u32` string offsets (relative to
/// the new header) naming the `glibc-hwcaps` subdirectories. Malformed sections are ignored,
/// as glibc's loader does.
fn parse_extensions(buf: &[u8], start: usize, ext_offset: usize) -> (Option<String>, Vec<Vec<u8>>) {
    let mut generator = None;
    let mut hwcaps = Vec::new();
    if u32_at(buf, ext_offset) != Some(EXT_MAGIC) {
        return (None, hwcaps);
    }
    let Some(count) = u32_at(buf, ext_offset + 4) else {
        return (None, hwcaps);
    };
    for i in 0..(count as usize).min(64) {
        let at = ext_offset + 8 + i * 16;
        let (Some(tag), Some(offset), Some(size)) =
            (u32_at(buf, at), u32_at(buf, at + 8), u32_at(buf, at + 12))
        else {
            break;
        };
        let (offset, size) = (offset as usize, size as usize);
        let Some(bytes) = offset
            .checked_add(size)
            .and_then(|end| buf.get(offset..end))
        else {
            continue;
        };
        match tag {
            TAG_GENERATOR => generator = String::from_utf8(bytes.to_vec()).ok(),
            TAG_GLIBC_HWCAPS if size % 4 == 0 => {
                hwcaps = bytes
                    .chunks_exact(4)
                    .map(|c| {
                        let off = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize;
                        cstr_at(&buf[start..], off)
                            .map(<[u8]>::to_vec)
                            .unwrap_or_default()
                    })
                    .collect();
            }
            _ => {}
        }
    }
    (generator, hwcaps)
}

/// One entry as the writer sees it (ldconfig's `struct cache_entry`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    pub flags: i32,
    /// The key the dynamic linker looks up: a SONAME, or a link name. Bytes, as glibc keeps
    /// them: a name need not be UTF-8.
    pub name: Vec<u8>,
    pub path: Vec<u8>,
    /// Written as is. glibc 2.36's ldconfig always writes 0; older caches may carry a value.
    pub os_version: u32,
    /// Legacy hwcap bits (`tls`, platform and hwcap subdirectories); 0 for extension entries.
    pub hwcap: u64,
    /// The `glibc-hwcaps` subdirectory this entry was found in, if any.
    pub hwcaps: Option<Vec<u8>>,
    /// x86 ISA level, stored in an extension entry's `hwcap` (bits 32..42).
    pub isa_level: u32,
}

/// The sign convention of C `char` in glibc's comparison: signed on x86, unsigned on arm.
#[cfg(any(target_arch = "aarch64", target_arch = "arm"))]
fn c_char(b: u8) -> i32 {
    i32::from(b)
}

#[cfg(not(any(target_arch = "aarch64", target_arch = "arm")))]
fn c_char(b: u8) -> i32 {
    i32::from(b as i8)
}

/// glibc's `_dl_cache_libcmp` (`elf/dl-cache.c`): runs of digits compare as numbers and sort
/// after other characters; other characters compare as C `char`s. glibc accumulates the number
/// in an `int` and subtracts; here the number wraps the same way (so digit runs of 10 or more
/// digits compare as glibc's `int`s do) but is compared without the subtraction's overflow, which
/// keeps this a total order (Rust's sort requires one; glibc's can disagree with itself only for
/// numbers that differ by 2^31 or more).
pub fn libcmp(a: &[u8], b: &[u8]) -> Ordering {
    let (mut i, mut j) = (0usize, 0usize);
    let at = |s: &[u8], k: usize| s.get(k).copied().unwrap_or(0);
    let digit = |c: u8| c.is_ascii_digit();
    while at(a, i) != 0 {
        let (ca, cb) = (at(a, i), at(b, j));
        if digit(ca) {
            if !digit(cb) {
                return Ordering::Greater;
            }
            let mut va: i32 = 0;
            while digit(at(a, i)) {
                va = va.wrapping_mul(10).wrapping_add(i32::from(at(a, i) - b'0'));
                i += 1;
            }
            let mut vb: i32 = 0;
            while digit(at(b, j)) {
                vb = vb.wrapping_mul(10).wrapping_add(i32::from(at(b, j) - b'0'));
                j += 1;
            }
            if va != vb {
                return va.cmp(&vb);
            }
        } else if digit(cb) {
            return Ordering::Less;
        } else if ca != cb {
            return c_char(ca).cmp(&c_char(cb));
        } else {
            i += 1;
            j += 1;
        }
    }
    c_char(at(a, i)).cmp(&c_char(at(b, j)))
}

/// ldconfig's `compare` (`elf/cache.c`, glibc 2.36) as an ordering: `Less` means `a` comes
/// first in the cache. Names sort in *descending* `_dl_cache_libcmp` order; for one name,
/// higher flags first, then `glibc-hwcaps` entries (by subdirectory name), then entries with
/// more legacy hwcap bits, then the higher hwcap value. ldconfig inserts each entry after all
/// entries that compare equal, so ties keep the order in which directories were scanned; the
/// caller supplies that as a secondary key.
pub fn compare(a: &CacheEntry, b: &CacheEntry) -> Ordering {
    libcmp(&b.name, &a.name)
        .then_with(|| b.flags.cmp(&a.flags))
        .then_with(|| match (&a.hwcaps, &b.hwcaps) {
            (Some(x), Some(y)) => x.cmp(y),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        })
        .then_with(|| b.hwcap.count_ones().cmp(&a.hwcap.count_ones()))
        .then_with(|| b.hwcap.cmp(&a.hwcap))
}

/// `elf/stringtable.c`: unique strings, sorted so that a string that is a suffix of another comes
/// right after it, each placed either inside its predecessor (tail merging) or after it.
struct StringTable {
    bytes: Vec<u8>,
    offsets: HashMap<Vec<u8>, u32>,
}

/// `finalize_compare`: reversed strings in descending order, longer first on a common suffix.
fn tail_order(a: &[u8], b: &[u8]) -> Ordering {
    for (x, y) in a.iter().rev().zip(b.iter().rev()) {
        if x != y {
            return y.cmp(x);
        }
    }
    b.len().cmp(&a.len())
}

impl StringTable {
    fn build(strings: BTreeSet<&[u8]>) -> StringTable {
        let mut sorted: Vec<&[u8]> = strings.into_iter().collect();
        sorted.sort_by(|a, b| tail_order(a, b));
        let mut offsets = HashMap::with_capacity(sorted.len());
        let mut bytes = Vec::new();
        let mut prev: Option<(&[u8], u32)> = None;
        for s in sorted {
            let offset = match prev {
                Some((p, po)) if p.len() >= s.len() && p.ends_with(s) => {
                    po + (p.len() - s.len()) as u32
                }
                _ => {
                    let o = bytes.len() as u32;
                    bytes.extend_from_slice(s);
                    bytes.push(0);
                    o
                }
            };
            offsets.insert(s.to_vec(), offset);
            prev = Some((s, offset));
        }
        StringTable { bytes, offsets }
    }

    fn offset(&self, s: &[u8]) -> u32 {
        self.offsets.get(s).copied().unwrap_or(0)
    }
}

fn push_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Writes a cache holding `entries` in the given order (sort them with [`compare`] first).
/// `hwcaps_names` are all the `glibc-hwcaps` subdirectory names ldconfig registered while
/// reading its configuration: ldconfig interns every one into the string table, used or not.
/// The names of subdirectories that hold entries form the `glibc-hwcaps` section, sorted.
pub fn serialize(
    entries: &[CacheEntry],
    hwcaps_names: &BTreeSet<Vec<u8>>,
    generator: &str,
) -> Vec<u8> {
    let used: BTreeSet<&[u8]> = entries.iter().filter_map(|e| e.hwcaps.as_deref()).collect();
    let mut strings: BTreeSet<&[u8]> = BTreeSet::new();
    for e in entries {
        strings.insert(&e.name);
        strings.insert(&e.path);
    }
    strings.extend(hwcaps_names.iter().map(Vec::as_slice));
    strings.extend(used.iter().copied());
    let table = StringTable::build(strings);
    // glibc-hwcaps section indices: used names in strcmp order.
    let index: HashMap<&[u8], u32> = used
        .iter()
        .enumerate()
        .map(|(i, n)| (*n, i as u32))
        .collect();

    let str_offset = (HEADER_LEN + entries.len() * ENTRY_LEN) as u32;
    let strings_end = str_offset as usize + table.bytes.len();
    let ext_offset = (strings_end + 3) & !3;
    let mut out = Vec::with_capacity(ext_offset + 64 + generator.len());
    out.extend_from_slice(NEW_MAGIC);
    push_u32(&mut out, entries.len() as u32);
    push_u32(&mut out, table.bytes.len() as u32);
    out.extend_from_slice(&[ENDIAN_LITTLE, 0, 0, 0]);
    push_u32(&mut out, ext_offset as u32);
    out.extend_from_slice(&[0u8; 12]);
    for e in entries {
        push_u32(&mut out, e.flags as u32);
        push_u32(&mut out, str_offset + table.offset(&e.name));
        push_u32(&mut out, str_offset + table.offset(&e.path));
        push_u32(&mut out, e.os_version);
        let hwcap = match e.hwcaps.as_deref() {
            Some(name) => {
                HWCAP_EXTENSION
                    | ((u64::from(e.isa_level) & ISA_LEVEL_MASK) << 32)
                    | u64::from(index.get(name).copied().unwrap_or(0))
            }
            None => e.hwcap,
        };
        out.extend_from_slice(&hwcap.to_le_bytes());
    }
    out.extend_from_slice(&table.bytes);
    out.resize(ext_offset, 0);
    // write_extensions: the directory (generator section first, then glibc-hwcaps if any),
    // the glibc-hwcaps array, then the generator string.
    let sections = if used.is_empty() { 1u32 } else { 2 };
    let dir_end = ext_offset as u32 + 8 + 16 * sections;
    let hwcaps_size = 4 * used.len() as u32;
    push_u32(&mut out, EXT_MAGIC);
    push_u32(&mut out, sections);
    push_u32(&mut out, TAG_GENERATOR);
    push_u32(&mut out, 0);
    push_u32(&mut out, dir_end + hwcaps_size);
    push_u32(&mut out, generator.len() as u32);
    if !used.is_empty() {
        push_u32(&mut out, TAG_GLIBC_HWCAPS);
        push_u32(&mut out, 0);
        push_u32(&mut out, dir_end);
        push_u32(&mut out, hwcaps_size);
        for name in &used {
            push_u32(&mut out, str_offset + table.offset(name));
        }
    }
    out.extend_from_slice(generator.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, path: &str) -> CacheEntry {
        CacheEntry {
            flags: 0x0303,
            name: name.into(),
            path: path.into(),
            os_version: 0,
            hwcap: 0,
            hwcaps: None,
            isa_level: 0,
        }
    }

    /// The flags of glibc's `sysdeps/generic/ldconfig.h`: `FLAG_ELF_LIBC6` 0x0003,
    /// `FLAG_X8664_LIB64` 0x0300, `FLAG_ARM_LIBHF` 0x0900, `FLAG_AARCH64_LIB64` 0x0a00.
    #[test]
    fn entries_belong_to_one_machine() {
        let e = |flags| Entry {
            flags,
            name: "libcuda.so.1".into(),
            path: "/usr/lib/libcuda.so.1".into(),
            os_version: 0,
            hwcap: 0,
        };
        let (x86_64, i386, aarch64, armhf) = (e(0x0303), e(0x0003), e(0x0a03), e(0x0903));
        assert!(x86_64.is_lib64_of(Arch::X86_64) && !x86_64.is_lib64_of(Arch::Aarch64));
        assert!(aarch64.is_lib64_of(Arch::Aarch64) && !aarch64.is_lib64_of(Arch::X86_64));
        assert!(i386.is_lib32_of(Arch::X86_64) && !i386.is_lib64_of(Arch::X86_64));
        // No 32-bit compat libraries on aarch64, whatever their flags.
        for lib in [&i386, &armhf, &aarch64] {
            assert!(!lib.is_lib32_of(Arch::Aarch64));
        }
        assert!(!armhf.is_lib64_of(Arch::Aarch64));
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(LdCache::parse(b"hello"), Err(LdCacheError::BadMagic));
        assert_eq!(LdCache::parse(b""), Err(LdCacheError::BadMagic));
    }

    #[test]
    fn rejects_truncated_entry_table() {
        let mut buf = NEW_MAGIC.to_vec();
        buf.resize(HEADER_LEN, 0);
        buf[20..24].copy_from_slice(&1000u32.to_le_bytes());
        assert_eq!(
            LdCache::parse(&buf),
            Err(LdCacheError::Truncated("entries"))
        );
    }

    #[test]
    fn parse_only_copies_the_kept_entries_and_checks_every_one() {
        let all = [
            entry("liba.so.1", "/lib/liba.so.1"),
            entry("libb.so.1", "/lib/libb.so.1"),
        ];
        let buf = serialize(&all, &BTreeSet::new(), "g");
        let only_b = LdCache::parse_only(&buf, |name| name == b"libb.so.1").unwrap();
        let full = LdCache::parse(&buf).unwrap();
        assert_eq!(only_b.entries, full.entries[1..]);
        assert_eq!(only_b.generator, full.generator);
        // An entry that is not kept still has its offsets checked.
        let mut bad = buf.clone();
        bad[HEADER_LEN + 4..HEADER_LEN + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            LdCache::parse_only(&bad, |name| name == b"libb.so.1"),
            Err(LdCacheError::BadOffset { index: 0, .. })
        ));
    }

    #[test]
    fn rejects_entries_pointing_outside() {
        let mut e = entry("libx.so.1", "/lib/libx.so.1");
        e.name = "libx.so.1".into();
        let mut buf = serialize(&[e], &BTreeSet::new(), "g");
        buf[HEADER_LEN + 4..HEADER_LEN + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            LdCache::parse(&buf),
            Err(LdCacheError::BadOffset { index: 0, .. })
        ));
    }

    #[test]
    fn parses_host_cache_when_present() {
        // Every Debian machine (and CI) has one; it is the format's ground truth.
        let Ok(buf) = std::fs::read("/etc/ld.so.cache") else {
            return;
        };
        let cache = LdCache::parse(&buf).expect("host cache parses");
        assert!(cache.lookup("libc.so.6").is_some());
    }

    #[test]
    fn libcmp_orders_numbers_numerically() {
        use Ordering::*;
        assert_eq!(libcmp(b"libfoo.so.10", b"libfoo.so.9"), Greater);
        assert_eq!(libcmp(b"libfoo.so.1", b"libfoo.so.1.2"), Less);
        assert_eq!(libcmp(b"libfoo.so.01", b"libfoo.so.1"), Equal);
        assert_eq!(libcmp(b"libfoo.so", b"libfoo.so.1"), Less);
        // A digit sorts after any other character.
        assert_eq!(libcmp(b"lib1", b"libz"), Greater);
        assert_eq!(
            libcmp(b"libcuda.so.580.65.06", b"libcuda.so.580.65.6"),
            Equal
        );
        assert_eq!(libcmp(b"", b""), Equal);
        // Long digit runs wrap like glibc's int and stay a total order.
        assert_eq!(libcmp(b"l99999999999", b"l99999999999"), Equal);
    }

    #[test]
    fn sort_order_is_ldconfigs() {
        let mut es = vec![
            entry("liba.so.1", "/usr/lib/liba.so.1"),
            entry("libz.so.1", "/usr/lib/libz.so.1"),
            entry("libc.so.6", "/lib/libc.so.6"),
            entry("libcuda.so.1", "/usr/lib/libcuda.so.1"),
            entry("libcuda.so", "/usr/lib/libcuda.so"),
        ];
        let mut tls = entry("libz.so.1", "/usr/lib/tls/libz.so.1");
        tls.hwcap = 1 << 63;
        let mut v3 = entry("libz.so.1", "/usr/lib/glibc-hwcaps/x86-64-v3/libz.so.1.3");
        v3.hwcaps = Some("x86-64-v3".into());
        let mut i386 = entry("libz.so.1", "/usr/lib32/libz.so.1");
        i386.flags = 0x0003;
        es.extend([tls, v3, i386]);
        es.sort_by(compare);
        let got: Vec<&str> = es
            .iter()
            .map(|e| std::str::from_utf8(&e.path).unwrap())
            .collect();
        assert_eq!(
            got,
            [
                "/usr/lib/glibc-hwcaps/x86-64-v3/libz.so.1.3",
                "/usr/lib/tls/libz.so.1",
                "/usr/lib/libz.so.1",
                "/usr/lib32/libz.so.1",
                "/usr/lib/libcuda.so.1",
                "/usr/lib/libcuda.so",
                "/lib/libc.so.6",
                "/usr/lib/liba.so.1",
            ]
        );
    }

    #[test]
    fn round_trip_keeps_entries_and_extensions() {
        let mut es = vec![
            entry("libfoo.so.1", "/usr/lib/libfoo.so.1"),
            entry("libfoo.so", "/usr/lib/libfoo.so"),
            entry("libbar.so.2", "/usr/lib/x86_64-linux-gnu/libbar.so.2"),
        ];
        let mut v3 = entry(
            "libfoo.so.1",
            "/usr/lib/glibc-hwcaps/x86-64-v3/libfoo.so.1.2",
        );
        v3.hwcaps = Some("x86-64-v3".into());
        v3.isa_level = 3;
        let mut old = entry("libold.so.1", "/lib/libold.so.1");
        old.os_version = 0x0003_0200;
        old.hwcap = 1 << 63;
        es.extend([v3, old]);
        es.sort_by(compare);
        let names: BTreeSet<Vec<u8>> = [b"x86-64-v3".to_vec(), b"x86-64-v2".to_vec()].into();
        let bytes = serialize(&es, &names, "nvshim-hook test");
        let cache = LdCache::parse(&bytes).unwrap();
        assert_eq!(cache.generator.as_deref(), Some("nvshim-hook test"));
        assert_eq!(cache.hwcaps, ["x86-64-v3"]);
        assert_eq!(cache.cache_entries(), es);
        // Writing what was read gives the same bytes.
        assert_eq!(
            serialize(&cache.cache_entries(), &names, "nvshim-hook test"),
            bytes
        );
        assert_eq!(
            cache.lookup("libfoo.so.1"),
            Some("/usr/lib/glibc-hwcaps/x86-64-v3/libfoo.so.1.2")
        );
    }

    #[test]
    fn empty_cache_has_only_a_header_and_generator() {
        let bytes = serialize(&[], &BTreeSet::new(), "g");
        assert_eq!(bytes.len(), HEADER_LEN + 8 + 16 + 1);
        let cache = LdCache::parse(&bytes).unwrap();
        assert!(cache.entries.is_empty());
        assert_eq!(cache.generator.as_deref(), Some("g"));
    }

    #[test]
    fn tail_merging_shares_suffixes() {
        let es = vec![entry("libfoo.so.1", "/usr/lib/libfoo.so.1")];
        let bytes = serialize(&es, &BTreeSet::new(), "g");
        let len_strings = u32::from_le_bytes(bytes[24..28].try_into().unwrap()) as usize;
        assert_eq!(len_strings, "/usr/lib/libfoo.so.1".len() + 1);
    }
}
