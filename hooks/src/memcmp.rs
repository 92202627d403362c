//! `memcmp` and `bcmp` for the musl builds: eight bytes at a time.
//!
//! musl compares a byte at a time (its `memcmp` is a C loop over bytes, and its `bcmp` calls
//! it), and every slice or string `==`, `<` and sort in Rust ends in one of the two. In
//! `nvshim-hook fixups` on a real image (figure 9's, docs/benchmarks.md) they ran 0.39 M of the
//! hook's 1.48 M instructions (callgrind): sorting and filing the folder's library names, the
//! cache's entries in ldconfig's order. No maintained crate provides these symbols to link, so
//! this module does, as [`crate::memcpy`] does for `memcpy`: whole 64-bit words compared while
//! they are equal; the first that differs, read big-endian, orders the two as their first
//! differing byte does; the tail of under eight bytes as one word overlapping the last full
//! one (or, for short inputs, two overlapping halves). No byte loop, so the compiler cannot
//! turn one back into a call of the function it is in. A static link takes these definitions
//! and leaves musl's out (an archive member is only pulled for a symbol still undefined).
//! Measured in paired runs (300 rounds, the bench's set-up): a GPU container's hooks in place
//! 0.07 ms faster, `update-ldcache` 0.06 ms; nvshim-runtime's creates and `state` unchanged
//! (within ±0.03 ms, 200 rounds), as in the three earlier tries for the runtime alone, which
//! were not kept for that (docs/benchmarks.md, the change table).
//!
//! The two are never inlined: defined in the one module fat LTO makes, a call of `memcmp` is
//! an ordinary call to LLVM, and inlining it at every comparison made nvshim-runtime 125 KB
//! larger (more code pages for a process that lives a millisecond).
//!
//! Only the musl builds export the symbols; [`compare`] is tested on every build.

use std::cmp::Ordering;

/// How `n` bytes at `a` compare with `n` bytes at `b`, as C's `memcmp` orders them (bytes as
/// unsigned).
///
/// # Safety
/// `a` and `b` are readable for `n` bytes.
#[inline(always)]
pub unsafe fn compare(a: *const u8, b: *const u8, n: usize) -> Ordering {
    // SAFETY (every read below): each stays within `a[..n]` and `b[..n]`: words from `i` while
    // `i + 8 <= n`, the last word at `n - 8` when `n >= 8`, and for shorter inputs two pieces
    // that cover `0..n` from both ends.
    unsafe {
        if n >= 8 {
            let mut i = 0;
            while i + 8 <= n {
                let (x, y) = (word(a, i), word(b, i));
                if x != y {
                    return x.cmp(&y);
                }
                i += 8;
            }
            // The bytes before `n - 8` are equal, so the first difference in this last word
            // is the first difference of all.
            if i < n {
                return word(a, n - 8).cmp(&word(b, n - 8));
            }
            Ordering::Equal
        } else if n >= 4 {
            let x = (half(a, 0), half(a, n - 4));
            let y = (half(b, 0), half(b, n - 4));
            x.cmp(&y)
        } else if n >= 2 {
            let x = (quarter(a, 0), quarter(a, n - 2));
            let y = (quarter(b, 0), quarter(b, n - 2));
            x.cmp(&y)
        } else if n == 1 {
            (*a).cmp(&*b)
        } else {
            Ordering::Equal
        }
    }
}

/// The eight bytes at `p + at`, as a big-endian number: numbers order as their bytes do.
#[inline(always)]
unsafe fn word(p: *const u8, at: usize) -> u64 {
    // SAFETY: the caller vouches for eight readable bytes at `p + at`.
    u64::from_be_bytes(unsafe { p.add(at).cast::<[u8; 8]>().read_unaligned() })
}

#[inline(always)]
unsafe fn half(p: *const u8, at: usize) -> u32 {
    // SAFETY: the caller vouches for four readable bytes at `p + at`.
    u32::from_be_bytes(unsafe { p.add(at).cast::<[u8; 4]>().read_unaligned() })
}

#[inline(always)]
unsafe fn quarter(p: *const u8, at: usize) -> u16 {
    // SAFETY: the caller vouches for two readable bytes at `p + at`.
    u16::from_be_bytes(unsafe { p.add(at).cast::<[u8; 2]>().read_unaligned() })
}

/// The C library's `memcmp`, in the musl builds (module doc).
///
/// # Safety
/// As C's `memcmp`.
#[cfg(target_env = "musl")]
#[no_mangle]
#[inline(never)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> std::os::raw::c_int {
    // SAFETY: C's contract is [`compare`]'s.
    unsafe { compare(a, b, n) as std::os::raw::c_int }
}

/// The C library's `bcmp` (zero when equal), which Rust's slice `==` calls, in the musl builds.
///
/// # Safety
/// As C's `bcmp`.
#[cfg(target_env = "musl")]
#[no_mangle]
#[inline(never)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> std::os::raw::c_int {
    // SAFETY: C's contract is [`compare`]'s.
    unsafe { compare(a, b, n) as std::os::raw::c_int }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length up to 40 at every offset within 8 bytes, with one byte changed at every
    /// position (up and down, and to and from bytes of 128 and more, which compare unsigned):
    /// the order is the slices' own.
    #[test]
    fn orders_as_the_first_differing_byte_does() {
        let base: Vec<u8> = (0..64u32).map(|i| (i * 37 + 11) as u8).collect();
        for n in 0..40 {
            for off in 0..8 {
                let a = &base[off..off + n];
                // SAFETY: both are `n` bytes long.
                assert_eq!(
                    unsafe { compare(a.as_ptr(), a.as_ptr(), n) },
                    Ordering::Equal
                );
                for at in 0..n {
                    for v in [0u8, 1, 127, 128, 200, 255] {
                        let mut b = a.to_vec();
                        b[at] = v;
                        // SAFETY: both are `n` bytes long.
                        let got = unsafe { compare(a.as_ptr(), b.as_ptr(), n) };
                        assert_eq!(got, a.cmp(&b[..]), "{n} bytes at {off}, byte {at} = {v}");
                    }
                }
            }
        }
    }

    /// Two differences: the first one decides, whichever way the later one goes.
    #[test]
    fn the_first_difference_decides() {
        for n in 2..40 {
            for first in 0..n - 1 {
                for later in first + 1..n {
                    let a = vec![b'm'; n];
                    let mut b = a.clone();
                    b[first] = b'n';
                    b[later] = b'a';
                    // SAFETY: both are `n` bytes long.
                    let got = unsafe { compare(a.as_ptr(), b.as_ptr(), n) };
                    assert_eq!(got, Ordering::Less, "{n} bytes, {first} then {later}");
                }
            }
        }
    }
}
