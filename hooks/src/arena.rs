//! The allocator of `nvshim-runtime` and `nvshim-hook` (their musl builds): memory carved front
//! to back from 1 MiB mappings, small freed blocks handed out again by size class, because each
//! process lives about a millisecond (the shim then execs runc; the hook exits).
//!
//! Why not the C library's `malloc`. The shim ships as a static musl build (a static glibc
//! program spends about 0.3 ms of every start in CPUID, which a hypervisor traps: the floors of
//! figure 1 in docs/benchmarks.md), and musl's allocator made a CDI create 0.22 ms slower than
//! the same code on glibc (1.26 against 1.04 ms over the floor, bundle on disk, 150 runs
//! interleaved: it maps and unmaps small groups and copies on every `realloc`). mimalloc,
//! the maintained fast allocator at hand, costs more than it saves in a process this short:
//! +0.05 ms on `state` and +0.14 to +0.49 ms on creates, with a peak RSS of 5 to 14 MiB (its
//! start-up and per-thread heaps). With this arena (and memcpy.rs), against glibc's static
//! build, 120 interleaved runs with the bundle on disk: `state` 0.30 ms faster, legacy, CDI
//! and pod creates 0.31 to 0.32 ms, 1,000 spec files 0.25 ms; peak RSS 1.25 to 2.77 MiB against
//! 1.74 to 2.86 MiB. MIG `all` was the exception, 0.15 to 0.2 ms slower: it touched more fresh
//! pages (460 page faults against 347; `perf record -e page-faults`: first writes into arena
//! memory, and about 66 per create in musl's own malloc, which `opendir` called for each
//! directory of the MIG walk; directories are now listed without it,
//! `nvshim_hook::root::list_dir`). No crate offers such an arena for the field: the bump
//! allocators on crates.io are unmaintained experiments.
//!
//! Each fresh page a call touches costs it about 1.2 µs on this project's KVM guest (the fault,
//! zeroing, the memory cgroup's charge; as much with `MAP_POPULATE`), so freed small blocks are
//! handed out again: blocks up to 2 KiB come in 16 classes ([`CLASS_SIZES`]: 16-byte steps to
//! 128, where most of a create's names, paths and map entries fall, then half powers of two),
//! each with a list of its freed blocks. Paired runs of the same build with and without the
//! lists (700 rounds each, docs/benchmarks.md): legacy, CDI and pod creates 0.02 to 0.03 ms
//! faster, MIG `all` and 1,000 spec files 0.05 ms (6 to 12 page faults fewer); a create
//! without the CDI index (every one of 1,000 spec files parsed) peaks at 3.7 MiB instead of
//! 10.3 MiB. Power-of-two classes alone, tried before, cost MIG `all` the rounding.
//!
//! A freed block larger than the largest class is kept (up to [`BIG_SLOTS`] of them) and
//! handed out again, from its front, for the next large block it holds: a `Vec` grown past
//! its block, a spec file's bytes read and parsed. Before, such a block was lost unless it
//! was the last one carved; the bytes a create carved (instrumented arena) went down from 411
//! to 350 KB for a CDI create, 694 to 588 KB for MIG `all` and 546 to 405 KB with 500 spec
//! files, and in paired runs (600 rounds) those creates took 0.02, 0.04 and 0.04 ms less.
//!
//! What it gives up: a small freed block is reused only for its class, and a large one only
//! for a block it holds at its front (the rest goes back: to the large ones, or to the largest
//! class it holds). Blocks of
//! [`OWN_MAPPING`] bytes or more (a spec file read whole, config.json's output buffer) get
//! their own mapping, unmapped when freed. So the arena suits a process that does one bounded
//! job and execs or exits: only `nvshim-runtime` and `nvshim-hook` install it; the operator
//! tool `nvshim`, which can run for long, keeps the C library's allocator.
//!
//! The hook, built for musl with this arena and memcpy.rs instead of static with glibc, ran
//! a GPU container's fix-ups in place under runc 0.26 ms faster and `update-ldcache` 0.21 ms
//! faster (paired, 200 rounds, docs/benchmarks.md): glibc's static start-up (its CPU probe,
//! tunables, `/proc/self/exe`) and its `malloc` (7% of the hook's time by `perf`) were a
//! quarter of the hook's own time. With musl's `malloc` instead of the arena the same build was
//! 0.55 ms slower than glibc's.
//!
//! It is thread-safe (a spin lock around its cursor and lists: the shim runs one thread, so it
//! is never contended) and returns null when the kernel refuses a mapping, as `GlobalAlloc` asks.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Bytes mapped at a time for small blocks (only the pages touched count in RSS).
const CHUNK: usize = 1 << 20;

/// Blocks at least this large get a mapping of their own, returned when freed.
pub const OWN_MAPPING: usize = 128 << 10;

/// The page size every x86-64 and arm64 Linux maps with at least; mappings are aligned to it.
const PAGE: usize = 4096;

/// What a small block (up to 2 KiB, aligned to at most 16) holds, by its class: 16-byte steps
/// to 128 (most of a create's blocks: names, paths, map entries), then half powers of two.
const CLASS_SIZES: [usize; 16] = [
    16, 32, 48, 64, 80, 96, 112, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
];

/// Every block is carved aligned to at least this: a freed block may be handed out again for
/// any small layout of its class.
const MIN_ALIGN: usize = 16;

/// How many freed blocks larger than the largest class are kept for reuse ([`State::big`]).
const BIG_SLOTS: usize = 32;

/// The allocator (`#[global_allocator]` in src/bin/nvshim-runtime.rs).
pub struct Arena {
    locked: AtomicBool,
    state: UnsafeCell<State>,
}

/// The current chunk: the next free byte, its end, and where the last block starts; the
/// freed small blocks of each class, each holding the address of the next in its first word;
/// and freed larger blocks, as (address, bytes), `(0, 0)` for an empty slot.
struct State {
    next: usize,
    end: usize,
    last: usize,
    free: [usize; CLASS_SIZES.len()],
    big: [(usize, usize); BIG_SLOTS],
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
                free: [0; CLASS_SIZES.len()],
                big: [(0, 0); BIG_SLOTS],
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

/// The class of a small block ([`CLASS_SIZES`]); `None` for a larger or more aligned one.
fn class(layout: Layout) -> Option<usize> {
    let size = layout.size();
    if layout.align() > MIN_ALIGN {
        None
    } else if size <= 128 {
        Some(size.saturating_sub(1) / 16)
    } else {
        (8..CLASS_SIZES.len()).find(|&c| size <= CLASS_SIZES[c])
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
        let align = layout.align().max(MIN_ALIGN);
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

    /// A freed large block for `layout` (larger than the largest class), the smallest that
    /// holds it at its alignment; what it holds beyond goes back: to the large blocks, or to
    /// the largest class it holds. `None`: none fits.
    fn reuse(&mut self, layout: Layout) -> Option<*mut u8> {
        let need = layout.size().checked_next_multiple_of(MIN_ALIGN)?;
        let mut best: Option<usize> = None;
        for (i, &(at, len)) in self.big.iter().enumerate() {
            if len >= need && at % layout.align() == 0 && best.is_none_or(|b| len < self.big[b].1) {
                best = Some(i);
            }
        }
        let i = best?;
        let (at, len) = std::mem::take(&mut self.big[i]);
        let (rest, rest_len) = (at + need, len - need);
        if rest_len > LARGEST_CLASS {
            self.big[i] = (rest, rest_len);
        } else if let Some(c) = CLASS_SIZES.iter().rposition(|&size| size <= rest_len) {
            // SAFETY: `rest` is free (the block's tail), 16-aligned (`at` and `need` are) and
            // holds `CLASS_SIZES[c]` bytes: its first word links it into its class's list.
            unsafe { *(rest as *mut usize) = self.free[c] };
            self.free[c] = rest;
        }
        Some(at as *mut u8)
    }

    /// Keeps a freed block of `len` bytes larger than the largest class for [`State::reuse`]:
    /// in an empty slot, else in place of the smallest kept when it is larger.
    fn keep_big(&mut self, at: usize, len: usize) {
        let slot = self
            .big
            .iter()
            .enumerate()
            .min_by_key(|(_, &(_, len))| len)
            .map(|(i, _)| i);
        if let Some(i) = slot.filter(|&i| self.big[i].1 < len) {
            self.big[i] = (at, len);
        }
    }

    /// Whether `ptr` is the last block carved and reaches to the cursor with `len` bytes.
    fn is_top(&self, ptr: *mut u8, len: usize) -> bool {
        ptr as usize == self.last && self.last + len == self.next
    }
}

/// The largest class's size: larger blocks are carved for their size, and kept for reuse when
/// freed ([`State::reuse`]).
const LARGEST_CLASS: usize = CLASS_SIZES[CLASS_SIZES.len() - 1];

/// The bytes a live block of `layout` holds in the arena: its class's size for a small one.
fn reserved(layout: Layout) -> usize {
    class(layout).map_or(layout.size(), |c| CLASS_SIZES[c])
}

// SAFETY: every block is carved from memory no other block overlaps (the cursor only moves
// forward, except back to the start of the last block when that block is freed), aligned
// as its layout asks, and stays mapped until it is freed (own mappings) or the process ends.
// A block holds at least [`reserved`] bytes of its current layout: a small block carved for
// its class, a larger one carved for its size or shrunk in place from a larger one (the last
// block's end moved to what the new layout reserves), so a freed small block is handed out
// again only for layouts its class holds, and it is 16-aligned as every block is. A freed
// larger block holds its size rounded up to 16 (the next block starts 16-aligned beyond it);
// it is handed out again from its front, for a layout it holds at that layout's alignment,
// and what it holds beyond the layout's size rounded up to 16 is kept as a free block of
// its own (both 16-aligned).
unsafe impl GlobalAlloc for Arena {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if own_mapping(layout) {
            return map(layout.size());
        }
        match class(layout) {
            None if layout.size() > LARGEST_CLASS => {
                self.with(|s| s.reuse(layout).unwrap_or_else(|| s.carve(layout)))
            }
            None => self.with(|s| s.carve(layout)),
            Some(c) => self.with(|s| match s.free[c] {
                0 => s.carve(Layout::from_size_align(CLASS_SIZES[c], MIN_ALIGN).unwrap_or(layout)),
                head => {
                    // SAFETY: a listed block is free and holds the next one's address in its
                    // first word (`dealloc`); nothing else reads or writes it.
                    s.free[c] = unsafe { *(head as *const usize) };
                    head as *mut u8
                }
            }),
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if own_mapping(layout) {
            // SAFETY: `ptr` is the start of the mapping `alloc` made for this layout's size.
            unsafe { libc::munmap(ptr.cast(), layout.size()) };
            return;
        }
        self.with(|s| {
            if s.is_top(ptr, reserved(layout)) {
                s.next = s.last;
            } else if let Some(c) = class(layout) {
                // SAFETY: the block is free, 16-aligned and holds at least `CLASS_SIZES[c]`
                // bytes (the impl's invariant): its first word links it into its class's list.
                unsafe { *(ptr as *mut usize) = s.free[c] };
                s.free[c] = ptr as usize;
            } else if layout.size() > LARGEST_CLASS {
                // What it holds, rounded up to the 16 bytes the next block starts beyond.
                if let Some(len) = layout.size().checked_next_multiple_of(MIN_ALIGN) {
                    s.keep_big(ptr as usize, len);
                }
            }
        })
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        if !own_mapping(layout) && !own_mapping(new) {
            // The last block grows or shrinks where it is; another one keeps its place when
            // what it holds is enough (a small block within its class).
            let (old, want) = (reserved(layout), reserved(new));
            let in_place = self.with(|s| {
                let fits = s.last.checked_add(want).is_some_and(|e| e <= s.end);
                if s.is_top(ptr, old) && fits {
                    s.next = s.last + want;
                    true
                } else {
                    want <= old
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

    /// A freed small block is handed out again for its class, whatever the layout within it; a
    /// small block grows within its class where it is; a large block shrunk into a class, at
    /// the top of the chunk or not, serves that class once freed, and the blocks after it keep
    /// their bytes.
    #[test]
    fn small_blocks_are_reused_by_class() {
        let arena = Arena::new();
        let (a, la) = block(&arena, 100, 8, 1);
        let (keep, lkeep) = block(&arena, 24, 1, 2);
        // SAFETY: `a` is live with layout `la`, not the last block.
        unsafe { arena.dealloc(a, la) };
        let (b, lb) = block(&arena, 110, 16, 3);
        assert_eq!(b, a, "the 112-byte class's freed block");
        // SAFETY: `b` is live with layout `lb`; 112 bytes are its class's.
        assert_eq!(unsafe { arena.realloc(b, lb, 112) }, b);
        // A large block shrunk where it is (not the last one), then freed into a class.
        let (big, lbig) = block(&arena, 3000, 1, 4);
        let (after, lafter) = block(&arena, 8, 1, 5);
        // SAFETY: `big` is live with layout `lbig`.
        let small = unsafe { arena.realloc(big, lbig, 64) };
        assert_eq!(small, big);
        // SAFETY: `small` is live with a 64-byte layout of alignment 1.
        unsafe { arena.dealloc(small, Layout::from_size_align(64, 1).unwrap()) };
        let (c, _) = block(&arena, 64, 16, 6);
        assert_eq!(c, big);
        // The last block shrunk into a class keeps what the class holds before the next one.
        let (top, ltop) = block(&arena, 5000, 8, 7);
        // SAFETY: `top` is live with layout `ltop`, the last block.
        let top = unsafe { arena.realloc(top, ltop, 40) };
        let (next, lnext) = block(&arena, 200, 8, 8);
        assert!(
            next as usize >= top as usize + 48,
            "the class of 40 bytes holds 48"
        );
        // SAFETY: `top` is live with a 40-byte layout.
        unsafe { arena.dealloc(top, Layout::from_size_align(40, 8).unwrap()) };
        let (reused, lreused) = block(&arena, 48, 8, 9);
        assert_eq!(reused, top);
        assert!(holds(next, 200, 8) && holds(after, 8, 5) && holds(keep, 24, 2));
        // SAFETY: live blocks of these layouts.
        unsafe {
            arena.dealloc(reused, lreused);
            arena.dealloc(next, lnext);
            arena.dealloc(after, lafter);
            arena.dealloc(keep, lkeep);
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
            128,
            129,
            700,
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
                    let (p, l) = block(&arena, size, [1, 8, 16, 32][rand(4)], tag);
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
