//! `nvshim-runtime`'s allocator: memory carved front to back from 1 MiB mappings and not reused,
//! because the process execs runc a millisecond after it starts.
//!
//! Why not the C library's `malloc`. The shim ships as a static musl build (a static glibc
//! program spends about 0.3 ms of every start in CPUID, which a hypervisor traps: the floors of
//! figure 1 in docs/benchmarks.md), and musl's allocator made a CDI create 0.22 ms slower than
//! the same code on glibc (1.26 against 1.04 ms over the floor, bundle on disk, 150 runs
//! interleaved: it maps and unmaps small groups and copies on every `realloc`). mimalloc,
//! the maintained fast allocator at hand, costs more than it saves in a process this short:
//! +0.05 ms on `state` and +0.14 to +0.49 ms on creates, with a peak RSS of 5 to 14 MiB (its
//! start-up and per-thread heaps). With this arena (and src/memcpy.rs), against glibc's static
//! build, 120 interleaved runs with the bundle on disk: `state` 0.30 ms faster, legacy, CDI
//! and pod creates 0.31 to 0.32 ms, 1,000 spec files 0.25 ms; peak RSS 1.25 to 2.77 MiB against
//! 1.74 to 2.86 MiB. MIG `all` was the exception, 0.15 to 0.2 ms slower: it touched more fresh
//! pages (460 page faults against 347; `perf record -e page-faults`: first writes into arena
//! memory, and about 66 per create in musl's own malloc, which `opendir` called for each
//! directory of the MIG walk; directories are now listed without it,
//! `nvshim_hook::root::list_dir`). Lists of freed small blocks by size class were tried: 0.06 ms off legacy and CDI
//! creates, nothing off MIG `all`, whose peak RSS went over 3 MiB; not kept. A create without
//! the CDI index (every spec file parsed) holds what it freed: 10.6 MiB at 1,000 spec files
//! against glibc's 4.3 MiB; handing blocks past 2 or 4 MiB to musl's malloc cut that to 5.8
//! MiB but cost 2 ms there and +0.02 ms on every create; not kept. No crate offers such an
//! arena for the field: the bump allocators on crates.io are unmaintained experiments.
//!
//! What it gives up: freed memory is reused only when it is the last block (a temporary's
//! buffer, a `Vec` grown in place), so the peak is about what a call allocated in all. Blocks of
//! [`OWN_MAPPING`] bytes or more (a spec file read whole, config.json's output buffer) get
//! their own mapping, unmapped when freed. So the arena suits a process that does one bounded
//! job and execs or exits: only `nvshim-runtime` installs it; the operator tool `nvshim`,
//! which can run for long, keeps the C library's allocator.
//!
//! It is thread-safe (a spin lock around three words: the shim runs one thread, so it is never
//! contended) and returns null when the kernel refuses a mapping, as `GlobalAlloc` asks.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Bytes mapped at a time for small blocks (only the pages touched count in RSS).
const CHUNK: usize = 1 << 20;

/// Blocks at least this large get a mapping of their own, returned when freed.
pub const OWN_MAPPING: usize = 128 << 10;

/// The page size every x86-64 and arm64 Linux maps with at least; mappings are aligned to it.
const PAGE: usize = 4096;

/// The allocator (`#[global_allocator]` in src/bin/nvshim-runtime.rs).
pub struct Arena {
    locked: AtomicBool,
    state: UnsafeCell<State>,
}

/// The current chunk: the next free byte, its end, and where the last block starts.
struct State {
    next: usize,
    end: usize,
    last: usize,
}

// SAFETY: `state` is only touched while `locked` is held (`Arena::with`).
unsafe impl Sync for Arena {}

impl Arena {
    pub const fn new() -> Arena {
        Arena {
            locked: AtomicBool::new(false),
            state: UnsafeCell::new(State {
                next: 0,
                end: 0,
                last: 0,
            }),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // SAFETY: the lock is held, so this is the only reference to the state.
        let out = f(unsafe { &mut *self.state.get() });
        self.locked.store(false, Ordering::Release);
        out
    }
}

impl Default for Arena {
    fn default() -> Arena {
        Arena::new()
    }
}

/// Whether a block gets a mapping of its own.
fn own_mapping(layout: Layout) -> bool {
    layout.size() >= OWN_MAPPING && layout.align() <= PAGE
}

/// `len` fresh zeroed bytes from the kernel, page aligned; null when refused.
fn map(len: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping at an address the kernel picks: no existing memory
    // is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        p.cast()
    }
}

impl State {
    /// A block for `layout` from the current chunk, or from a new one when it does not fit
    /// (the rest of the old chunk is left unused).
    fn carve(&mut self, layout: Layout) -> *mut u8 {
        let align = layout.align();
        let fits = |next: usize, end: usize| {
            let start = next.checked_add(align - 1)? & !(align - 1);
            let stop = start.checked_add(layout.size())?;
            (next != 0 && stop <= end).then_some((start, stop))
        };
        let (start, stop) = match fits(self.next, self.end) {
            Some(span) => span,
            None => {
                let Some(len) = layout
                    .size()
                    .checked_add(align)
                    .and_then(|n| n.checked_next_multiple_of(CHUNK))
                    .map(|n| n.max(CHUNK))
                else {
                    return std::ptr::null_mut();
                };
                let base = map(len) as usize;
                if base == 0 {
                    return std::ptr::null_mut();
                }
                self.next = base;
                self.end = base + len;
                match fits(self.next, self.end) {
                    Some(span) => span,
                    None => return std::ptr::null_mut(),
                }
            }
        };
        self.next = stop;
        self.last = start;
        start as *mut u8
    }
}

// SAFETY: every block is carved from memory no other block overlaps (the cursor only moves
// forward, except back to the start of the last block when that block is freed), aligned
// as its layout asks, and stays mapped until it is freed (own mappings) or the process ends.
unsafe impl GlobalAlloc for Arena {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if own_mapping(layout) {
            return map(layout.size());
        }
        self.with(|s| s.carve(layout))
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if own_mapping(layout) {
            // SAFETY: `ptr` is the start of the mapping `alloc` made for this layout's size.
            unsafe { libc::munmap(ptr.cast(), layout.size()) };
            return;
        }
        self.with(|s| {
            if ptr as usize == s.last && s.last + layout.size() == s.next {
                s.next = s.last;
            }
        })
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        if !own_mapping(layout) && !own_mapping(new) {
            // The last block grows or shrinks where it is.
            let in_place = self.with(|s| {
                let top = ptr as usize == s.last && s.last + layout.size() == s.next;
                let fits = s.last.checked_add(new_size).is_some_and(|e| e <= s.end);
                if top && fits {
                    s.next = s.last + new_size;
                    true
                } else {
                    new_size <= layout.size()
                }
            });
            if in_place {
                return ptr;
            }
        }
        // SAFETY: `new` has a non-zero size (realloc's contract) and the layout's alignment.
        let moved = unsafe { self.alloc(new) };
        if !moved.is_null() {
            // SAFETY: both blocks are live and distinct; the old one holds `layout.size()`
            // bytes, the new one at least the smaller of the two sizes.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block of `layout` from `arena`, filled with `tag`.
    fn block(arena: &Arena, size: usize, align: usize, tag: u8) -> (*mut u8, Layout) {
        let layout = Layout::from_size_align(size, align).unwrap();
        // SAFETY: a non-zero size.
        let p = unsafe { arena.alloc(layout) };
        assert!(!p.is_null());
        assert_eq!(p as usize % align, 0, "{size} bytes aligned to {align}");
        // SAFETY: `p` holds `size` bytes.
        unsafe { std::ptr::write_bytes(p, tag, size) };
        (p, layout)
    }

    fn holds(p: *mut u8, size: usize, tag: u8) -> bool {
        // SAFETY: the caller's block of `size` bytes, still live.
        unsafe { std::slice::from_raw_parts(p, size) }
            .iter()
            .all(|b| *b == tag)
    }

    /// Blocks of every size class and alignment do not overlap: each keeps its own bytes after
    /// all the others are written.
    #[test]
    fn blocks_are_aligned_and_apart() {
        let arena = Arena::new();
        let mut blocks = Vec::new();
        for i in 0..3000usize {
            let size = [1, 3, 8, 24, 100, 4000, 70_000, 200_000][i % 8];
            let align = [1, 2, 8, 16, 64, 4096][i % 6];
            blocks.push((
                block(&arena, size, align, (i % 251) as u8),
                size,
                (i % 251) as u8,
            ));
        }
        for ((p, layout), size, tag) in blocks {
            assert!(holds(p, size, tag));
            // SAFETY: a live block of this layout.
            unsafe { arena.dealloc(p, layout) };
        }
    }

    /// The last block grows in place; another block moves with its bytes; the last block freed
    /// is handed out again.
    #[test]
    fn the_last_block_is_grown_in_place_and_reused() {
        let arena = Arena::new();
        let (a, la) = block(&arena, 40, 8, 1);
        // SAFETY: `a` is live with layout `la`.
        let grown = unsafe { arena.realloc(a, la, 4000) };
        assert_eq!(grown, a);
        assert!(holds(a, 40, 1));
        // SAFETY: `a` now holds 4000 bytes.
        unsafe { std::ptr::write_bytes(a, 1, 4000) };
        let la = Layout::from_size_align(4000, 8).unwrap();
        let (b, lb) = block(&arena, 16, 8, 2);
        // SAFETY: `a` is live with layout `la`, and no longer the last block.
        let moved = unsafe { arena.realloc(a, la, 8000) };
        assert_ne!(moved, a);
        assert!(holds(moved, 4000, 1));
        assert!(holds(b, 16, 2));
        let lm = Layout::from_size_align(8000, 8).unwrap();
        // SAFETY: `moved` is live, the last block.
        unsafe { arena.dealloc(moved, lm) };
        let (again, _) = block(&arena, 8000, 8, 3);
        assert_eq!(again, moved);
        // A large block has its own mapping, and moves out of the arena when grown to it.
        let (big, lbig) = block(&arena, OWN_MAPPING, 8, 4);
        // SAFETY: `big` is live with layout `lbig`.
        let bigger = unsafe { arena.realloc(big, lbig, 3 * OWN_MAPPING) };
        assert!(holds(bigger, OWN_MAPPING, 4));
        // SAFETY: as above, and `b` is live with layout `lb`.
        unsafe {
            arena.dealloc(bigger, Layout::from_size_align(3 * OWN_MAPPING, 8).unwrap());
            arena.dealloc(b, lb);
        }
    }

    /// 100,000 allocations, frees and reallocations in a random order (a fixed-seed generator),
    /// of every size kind: each live block keeps its own bytes to the end.
    #[test]
    fn random_use_keeps_every_block_intact() {
        let arena = Arena::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let sizes = [
            1,
            7,
            16,
            17,
            100,
            2048,
            2049,
            5000,
            60_000,
            OWN_MAPPING,
            300_000,
        ];
        let mut live: Vec<(*mut u8, Layout, u8)> = Vec::new();
        for i in 0..100_000usize {
            let tag = (i % 253) as u8 + 1;
            match rand(3) {
                0 if live.len() < 300 => {
                    let size = sizes[rand(sizes.len())];
                    let (p, l) = block(&arena, size, [1, 8, 16][rand(3)], tag);
                    live.push((p, l, tag));
                }
                1 if !live.is_empty() => {
                    let (p, l, t) = live.swap_remove(rand(live.len()));
                    assert!(holds(p, l.size(), t), "round {i}");
                    // SAFETY: a live block of this layout.
                    unsafe { arena.dealloc(p, l) };
                }
                _ if !live.is_empty() => {
                    let at = rand(live.len());
                    let (p, l, t) = live[at];
                    let size = sizes[rand(sizes.len())];
                    // SAFETY: a live block of this layout, and a non-zero size.
                    let q = unsafe { arena.realloc(p, l, size) };
                    assert!(!q.is_null());
                    assert!(holds(q, l.size().min(size), t), "round {i}");
                    let nl = Layout::from_size_align(size, l.align()).unwrap();
                    // SAFETY: `q` holds `size` bytes.
                    unsafe { std::ptr::write_bytes(q, tag, size) };
                    live[at] = (q, nl, tag);
                }
                _ => {}
            }
        }
    }

    /// Threads allocating at once get blocks apart from each other's.
    #[test]
    fn threads_get_blocks_apart() {
        let arena = Arena::new();
        std::thread::scope(|scope| {
            for t in 0..8u8 {
                let arena = &arena;
                scope.spawn(move || {
                    let blocks: Vec<_> = (0..5000)
                        .map(|i| (block(arena, 1 + i % 300, 8, t), 1 + i % 300))
                        .collect();
                    for ((p, layout), size) in blocks {
                        assert!(holds(p, size, t));
                        // SAFETY: a live block of this layout.
                        unsafe { arena.dealloc(p, layout) };
                    }
                });
            }
        });
    }

    /// A size the address space cannot hold is refused with null, not a wrapped pointer.
    #[test]
    fn an_impossible_size_is_refused() {
        let arena = Arena::new();
        let huge = Layout::from_size_align(1 << 62, 64).unwrap();
        // SAFETY: a non-zero size.
        assert!(unsafe { arena.alloc(huge) }.is_null());
        let (p, l) = block(&arena, 10, 8, 5);
        // SAFETY: `p` is live with layout `l`.
        assert!(unsafe { arena.realloc(p, l, 1 << 62) }.is_null());
        assert!(holds(p, 10, 5));
    }
}
