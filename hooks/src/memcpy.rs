//! `memcpy` for the musl build of `nvshim-runtime`: small copies without `rep movsq`.
//!
//! musl's x86-64 `memcpy` starts every copy with `rep movsq`, whose start-up costs about 10 ns
//! whatever the size: a copy of 16 or 200 bytes took 10.6 and 11.3 ns against glibc's 1.4 and
//! 2.0 ns (a C loop of copies, each libc linked static, on this project's AMD EPYC guest). A
//! create copies tens of thousands of short strings (every token serde_json writes goes
//! through `Vec::extend_from_slice`), and with musl's `memcpy` a MIG `all` create (a 53 KB
//! config.json written) took 0.75 ms longer than the same code on glibc. The same finding is
//! known elsewhere (uv's musl builds are 10% slower for it, and openvmm writes its own for
//! musl); no maintained crate provides one to link. So this one: sizes up to 64 bytes as two to
//! four overlapping unaligned loads and stores of 1 to 16 bytes (no loop, so the compiler
//! cannot turn it back into a `memcpy` call), longer ones with `rep movsb`, which CPUs with
//! ERMS (every x86-64 server CPU of the last decade) run at full speed from about 64 bytes on.
//! A static link takes this definition and leaves musl's out (an archive member is only pulled
//! for a symbol still undefined), provided `__memcpy_fwd` is defined here too: musl's `memmove`
//! jumps to that name (defined beside its `memcpy`) for a forward copy, one whose destination
//! may overlap the source from below, which [`copy`] also does right.
//!
//! Only the musl build on x86-64 exports the symbol; [`copy`] is tested on every build.

/// Copies `n` bytes from `src` to `dst`, front to back: right also when `dst` overlaps `src`
/// from below (each block of up to 64 bytes is read whole before it is written; `rep movsb`
/// moves byte by byte forwards).
///
/// # Safety
/// `src` is readable and `dst` writable for `n` bytes, and `dst` is not inside `src[1..n]`.
#[inline(always)]
pub unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY (every block below): the reads stay within `src[..n]` and the writes within
    // `dst[..n]` (each pair covers the range from both ends, overlapping in the middle), and
    // all reads of a block happen before its writes.
    unsafe {
        if n <= 16 {
            if n >= 8 {
                let a = src.cast::<u64>().read_unaligned();
                let b = src.add(n - 8).cast::<u64>().read_unaligned();
                dst.cast::<u64>().write_unaligned(a);
                dst.add(n - 8).cast::<u64>().write_unaligned(b);
            } else if n >= 4 {
                let a = src.cast::<u32>().read_unaligned();
                let b = src.add(n - 4).cast::<u32>().read_unaligned();
                dst.cast::<u32>().write_unaligned(a);
                dst.add(n - 4).cast::<u32>().write_unaligned(b);
            } else if n >= 2 {
                let a = src.cast::<u16>().read_unaligned();
                let b = src.add(n - 2).cast::<u16>().read_unaligned();
                dst.cast::<u16>().write_unaligned(a);
                dst.add(n - 2).cast::<u16>().write_unaligned(b);
            } else if n == 1 {
                *dst = *src;
            }
        } else if n <= 32 {
            let a = src.cast::<u128>().read_unaligned();
            let b = src.add(n - 16).cast::<u128>().read_unaligned();
            dst.cast::<u128>().write_unaligned(a);
            dst.add(n - 16).cast::<u128>().write_unaligned(b);
        } else if n <= 64 {
            let a = src.cast::<u128>().read_unaligned();
            let b = src.add(16).cast::<u128>().read_unaligned();
            let c = src.add(n - 32).cast::<u128>().read_unaligned();
            let d = src.add(n - 16).cast::<u128>().read_unaligned();
            dst.cast::<u128>().write_unaligned(a);
            dst.add(16).cast::<u128>().write_unaligned(b);
            dst.add(n - 32).cast::<u128>().write_unaligned(c);
            dst.add(n - 16).cast::<u128>().write_unaligned(d);
        } else {
            long(dst, src, n);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn long(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: `rep movsb` copies rcx bytes from rsi to rdi forwards (the direction flag is
    // clear at every function boundary, by the ABI); the caller vouches for both ranges.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") n => _,
            inout("rdi") dst => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags)
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
unsafe fn long(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: the caller vouches for both ranges; only used where this module's symbol is not
    // exported (it would call itself).
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) }
}

/// The C library's `memcpy`, in the musl build (module doc).
///
/// # Safety
/// As C's `memcpy`.
#[cfg(all(target_env = "musl", target_arch = "x86_64"))]
#[no_mangle]
pub unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: C's contract is [`copy`]'s.
    unsafe { copy(dst, src, n) };
    dst
}

/// musl's forward copy for its `memmove` (module doc).
///
/// # Safety
/// As [`copy`].
#[cfg(all(target_env = "musl", target_arch = "x86_64"))]
#[no_mangle]
pub unsafe extern "C" fn __memcpy_fwd(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: musl calls it as [`copy`] asks: a destination below the source or apart from it.
    unsafe { copy(dst, src, n) };
    dst
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size up to past the `rep movsb` threshold, at every offset of source and
    /// destination within 16 bytes: the bytes copied are the source's, and not one byte around
    /// the destination changes.
    #[test]
    fn copies_exactly_the_bytes_asked_for() {
        let src: Vec<u8> = (0..400u32).map(|i| (i * 31 + 7) as u8).collect();
        for n in 0..300 {
            for so in 0..16 {
                for d in 0..16 {
                    let mut dst = vec![0xAAu8; 340];
                    // SAFETY: `src[so..so + n]` and `dst[d..d + n]` are in bounds and distinct.
                    unsafe { copy(dst.as_mut_ptr().add(d), src.as_ptr().add(so), n) };
                    assert_eq!(&dst[d..d + n], &src[so..so + n], "{n} bytes, {so} -> {d}");
                    assert!(dst[..d].iter().all(|b| *b == 0xAA), "{n} bytes, before {d}");
                    assert!(dst[d + n..].iter().all(|b| *b == 0xAA), "{n} bytes, after");
                }
            }
        }
    }

    /// A destination overlapping the source from below gets the source as it was (memmove's
    /// forward case).
    #[test]
    fn copies_forward_over_its_own_source() {
        for n in 0..300 {
            for shift in 1..20 {
                let mut buf: Vec<u8> = (0..340u32).map(|i| (i * 13 + 1) as u8).collect();
                let want = buf[shift..shift + n].to_vec();
                // SAFETY: both ranges are in `buf`; the destination starts below the source.
                unsafe { copy(buf.as_mut_ptr(), buf.as_ptr().add(shift), n) };
                assert_eq!(&buf[..n], &want[..], "{n} bytes, {shift} down");
            }
        }
    }
}
