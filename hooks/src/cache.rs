//! The identity rule that makes an answer kept between processes safe, and the trailer that
//! guards a kept file against damage: what nvshim-runtime's caches under `cache-dir` use
//! (`src/cache.rs` in the `nvshim` crate, which re-exports these).
//!
//! An entry is used only while a fresh `stat` of what it describes gives the same [`Key`], and
//! only once that key's ctime is more than [`RACY_NS`] older than the moment it was read (git's
//! "racily clean" rule).

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// nvshim's cache dir unless its config says otherwise (`cache-dir`).
pub const DEFAULT_DIR: &str = "/run/nvshim";

/// How much older than the read an entry's ctime must be to be trusted: file timestamps come
/// from a clock that ticks every few milliseconds (and every second or two on some file
/// systems), so 2 s covers every tick.
pub const RACY_NS: i64 = 2_000_000_000;

/// Whether a cache file (`is_file`: a regular file, not followed if a symlink) with this
/// owner and mode can be trusted: owned by root or this user and writable by its owner only.
/// Otherwise whoever could write it could choose the answers it gives.
pub fn private(is_file: bool, uid: u32, mode: u32) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    is_file && (uid == 0 || uid == euid) && mode & 0o022 == 0
}

/// What identifies one version of a file or directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// Nanoseconds since the epoch (an i64 holds them until 2262).
    pub mtime: i64,
    pub ctime: i64,
}

impl Key {
    pub const ZERO: Key = Key {
        dev: 0,
        ino: 0,
        size: 0,
        mtime: 0,
        ctime: 0,
    };

    pub fn of(m: &Metadata) -> Key {
        Key {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: m
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.mtime_nsec()),
            ctime: m
                .ctime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.ctime_nsec()),
        }
    }

    /// The key of what `path` names now, symlinks followed; `None` when it cannot be `stat`ed.
    pub fn at(path: &Path) -> Option<Key> {
        std::fs::metadata(path).ok().map(|m| Key::of(&m))
    }

    /// From `fstatat`, which a directory walk uses (same fields as [`Key::of`]).
    pub fn of_stat(st: &libc::stat) -> Key {
        Key {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size as u64,
            mtime: st
                .st_mtime
                .saturating_mul(1_000_000_000)
                .saturating_add(st.st_mtime_nsec),
            ctime: st
                .st_ctime
                .saturating_mul(1_000_000_000)
                .saturating_add(st.st_ctime_nsec),
        }
    }

    pub fn trusted_at(&self, read_at: i64) -> bool {
        self.ctime.saturating_add(RACY_NS) < read_at
    }
}

/// Now, in nanoseconds since the epoch: what [`Key::trusted_at`] is asked at.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// The checksum that ends a cache file (the index, `spec_cache.rs`). It only has to notice a
/// damaged or truncated file, since only root or this user can write one (`read_private`): so
/// FxHash's step over 8-byte words (rotate, xor the word, multiply by an odd constant), about
/// 0.6 instructions a byte where SipHash took 4.3. Each step is a bijection of the running
/// value, so a change within one word always changes the result; the length is mixed in first.
pub fn checksum(bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let step =
        |h: u64, word: [u8; 8]| (h.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
    let mut words = bytes.chunks_exact(8);
    let mut h = step(0, (bytes.len() as u64).to_le_bytes());
    for w in &mut words {
        let mut word = [0u8; 8];
        word.copy_from_slice(w);
        h = step(h, word);
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    step(h, tail)
}

/// `body` with the trailer [`unseal`] checks: its length and [`checksum`], as little-endian
/// u64s.
pub fn seal(mut body: Vec<u8>) -> Vec<u8> {
    let (len, sum) = (body.len() as u64, checksum(&body));
    body.extend_from_slice(&len.to_le_bytes());
    body.extend_from_slice(&sum.to_le_bytes());
    body
}

/// The body of what [`seal`] wrote; `None` when it is truncated or damaged.
pub fn unseal(bytes: &[u8]) -> Option<&[u8]> {
    let (body, trailer) = bytes.split_at_checked(bytes.len().checked_sub(16)?)?;
    let (len, sum) = trailer.split_at(8);
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
    (word(len) == body.len() as u64 && word(sum) == checksum(body)).then_some(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_body_reads_back_and_any_damage_is_refused() {
        let sealed = seal(b"gpu 0".to_vec());
        assert_eq!(unseal(&sealed), Some(&b"gpu 0"[..]));
        for cut in 0..sealed.len() {
            assert_eq!(unseal(&sealed[..cut]), None, "cut at {cut}");
        }
        for at in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[at] ^= 1;
            assert_eq!(unseal(&bad), None, "byte {at}");
        }
    }

    #[test]
    fn the_checksum_notices_any_one_changed_byte_and_the_length() {
        let bytes: Vec<u8> = (0..41u8).collect();
        let sum = checksum(&bytes);
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut changed = bytes.clone();
                changed[i] ^= 1 << bit;
                assert_ne!(checksum(&changed), sum, "byte {i} bit {bit}");
            }
        }
        assert_ne!(checksum(&bytes[..40]), sum);
        assert_ne!(checksum(&[&bytes[..], &[0]].concat()), sum);
        assert_ne!(checksum(b""), checksum(b"\0"));
    }
}
