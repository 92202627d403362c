//! Reader for glibc's `/etc/ld.so.cache`.
//!
//! The format is glibc's `cache_file_new` (`elf/cache.c`, `sysdeps/generic/dl-cache.h`):
//! a 48-byte header (`"glibc-ld.so.cache"`, version `"1.1"`, entry count, string table length,
//! endianness flag, extension offset), `nlibs` 24-byte entries (`flags: i32, key: u32,
//! value: u32, osversion: u32, hwcap: u64`) and a string table. Key and value are offsets from
//! the start of the new-format header. Caches written by glibc before 2.32 may begin with the
//! old `ld.so-1.7.0` table, which is skipped.
//!
//! Written by hand rather than taken from a crate: no maintained crate parses this format, and
//! the hook must bound every read of a file that a container image controls.

use thiserror::Error;

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
    /// True for 64-bit x86-64 or aarch64 glibc libraries, the only ones nvshim mounts.
    pub fn is_64bit(&self) -> bool {
        let arch = self.flags & FLAG_REQUIRED_MASK;
        arch == FLAG_X8664_LIB64 || arch == FLAG_AARCH64_LIB64
    }
}

/// A parsed cache: its entries in file order, and the raw extension area (if any) so that a
/// writer can keep it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LdCache {
    pub entries: Vec<Entry>,
    /// The generator string from the extension section (e.g. `ldconfig (GNU libc) 2.36`).
    pub generator: Option<String>,
}

fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    buf.get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn u64_at(buf: &[u8], at: usize) -> Option<u64> {
    buf.get(at..at + 8).map(|b| {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        u64::from_le_bytes(a)
    })
}

/// Reads a NUL-terminated string starting at `at`.
fn cstr_at(buf: &[u8], at: usize) -> Option<&[u8]> {
    let rest = buf.get(at..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    Some(&rest[..end])
}

impl LdCache {
    /// Parses a cache image. Every offset is bounds-checked; nothing is trusted.
    pub fn parse(buf: &[u8]) -> Result<Self, LdCacheError> {
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
        let mut entries = Vec::with_capacity(nlibs);
        for index in 0..nlibs {
            let at = HEADER_LEN + index * ENTRY_LEN;
            let flags = u32_at(new, at).ok_or(LdCacheError::Truncated("entries"))? as i32;
            let key = u32_at(new, at + 4).ok_or(LdCacheError::Truncated("entries"))?;
            let value = u32_at(new, at + 8).ok_or(LdCacheError::Truncated("entries"))?;
            let os_version = u32_at(new, at + 12).ok_or(LdCacheError::Truncated("entries"))?;
            let hwcap = u64_at(new, at + 16).ok_or(LdCacheError::Truncated("entries"))?;
            let string = |offset: u32| -> Result<String, LdCacheError> {
                let bytes = cstr_at(new, offset as usize)
                    .ok_or(LdCacheError::BadOffset { index, offset })?;
                String::from_utf8(bytes.to_vec()).map_err(|_| LdCacheError::NotUtf8 { index })
            };
            entries.push(Entry {
                flags,
                name: string(key)?,
                path: string(value)?,
                os_version,
                hwcap,
            });
        }
        let generator = if ext_offset != 0 {
            parse_generator(new, ext_offset)
        } else {
            None
        };
        Ok(LdCache { entries, generator })
    }

    /// The path the dynamic linker would pick for `name` among 64-bit entries (the first match:
    /// ldconfig sorts entries so that the preferred one comes first).
    pub fn lookup(&self, name: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|e| e.is_64bit() && e.name == name)
            .map(|e| e.path.as_str())
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
        let start = (old_end + 7) & !7;
        if buf.get(start..start + NEW_MAGIC.len()) == Some(NEW_MAGIC) {
            return Ok(start);
        }
        return Err(LdCacheError::BadMagic);
    }
    Err(LdCacheError::BadMagic)
}

/// Extension area: `magic 0xEAA42174, count`, then `count` sections of `tag, flags, offset,
/// size`; tag 0 is the generator string.
fn parse_generator(new: &[u8], ext_offset: usize) -> Option<String> {
    const EXT_MAGIC: u32 = 0xEAA4_2174;
    if u32_at(new, ext_offset)? != EXT_MAGIC {
        return None;
    }
    let count = u32_at(new, ext_offset + 4)? as usize;
    for i in 0..count.min(64) {
        let at = ext_offset + 8 + i * 16;
        let tag = u32_at(new, at)?;
        let offset = u32_at(new, at + 8)? as usize;
        let size = u32_at(new, at + 12)? as usize;
        if tag == 0 {
            let bytes = new.get(offset..offset.checked_add(size)?)?;
            return String::from_utf8(bytes.to_vec()).ok();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn parses_host_cache_when_present() {
        // Every Debian machine (and CI) has one; it is the format's ground truth.
        let Ok(buf) = std::fs::read("/etc/ld.so.cache") else {
            return;
        };
        let cache = LdCache::parse(&buf).expect("host cache parses");
        assert!(cache.lookup("libc.so.6").is_some());
    }
}
