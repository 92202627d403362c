//! Byte and substring searches that never ask the CPU what it can do at run time: the one home
//! of memchr calls in nvshim-runtime and nvshim-hook.
//!
//! memchr's top-level functions (`memchr`, `memchr_iter`, `memmem::Finder`) choose AVX2 on
//! their first call with std's `is_x86_feature_detected!`, and std's first answer runs about a
//! dozen CPUID instructions. Under a hypervisor each CPUID exits to it: 3.8 to 4.0 µs apiece on
//! the AMD EPYC guest this project is measured on (a C loop of CPUID), and std's detection
//! took about 75 µs of every legacy create there (`perf record -e cpu-clock` over 1,000
//! creates of the static shim: `std_detect::detect::cache::detect_and_initialize`), a tenth of
//! what a GPU create costs over the floor, for searches of a few kilobytes. Cloud GPU nodes
//! are such guests. So these call memchr's SSE2 routines directly (SSE2 is part of x86-64
//! itself: nothing to detect) and its portable ones on other architectures; memchr stays the
//! maintained implementation, only its dispatch is skipped.

#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
mod imp {
    pub use memchr::arch::x86_64::sse2::memchr::One;
    use memchr::arch::x86_64::sse2::packedpair;

    pub fn one(needle: u8) -> One {
        // SAFETY: compiled only where SSE2 is a target feature, which every x86-64 CPU has.
        unsafe { One::new_unchecked(needle) }
    }

    /// The SSE2 pair searcher, where the needle has a pair of bytes to look for.
    #[derive(Clone, Copy, Debug)]
    pub struct Pair(packedpair::Finder);

    impl Pair {
        pub fn new(needle: &[u8]) -> Option<Pair> {
            packedpair::Finder::new(needle).map(Pair)
        }

        /// `None` when the haystack is too short for it (the caller falls back).
        pub fn find(&self, haystack: &[u8], needle: &[u8]) -> Option<Option<usize>> {
            (haystack.len() >= self.0.min_haystack_len()).then(|| self.0.find(haystack, needle))
        }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
mod imp {
    pub use memchr::arch::all::memchr::One;

    pub fn one(needle: u8) -> One {
        One::new(needle)
    }

    /// No vector pair searcher here: Two-Way alone.
    #[derive(Clone, Copy, Debug)]
    pub struct Pair;

    impl Pair {
        pub fn new(_: &[u8]) -> Option<Pair> {
            None
        }

        pub fn find(&self, _: &[u8], _: &[u8]) -> Option<Option<usize>> {
            None
        }
    }
}

/// The first `needle` in `haystack`.
pub fn find(needle: u8, haystack: &[u8]) -> Option<usize> {
    imp::one(needle).find(haystack)
}

/// The last `needle` in `haystack`.
pub fn rfind(needle: u8, haystack: &[u8]) -> Option<usize> {
    imp::one(needle).rfind(haystack)
}

/// Every position of `needle` in `haystack`, in order.
pub fn positions(needle: u8, haystack: &[u8]) -> impl Iterator<Item = usize> + '_ {
    let one = imp::one(needle);
    every(haystack, move |h| one.find(h))
}

/// Every match `find` reports in `haystack`, each search starting a byte after the last match.
fn every<'h>(
    haystack: &'h [u8],
    find: impl Fn(&[u8]) -> Option<usize> + 'h,
) -> impl Iterator<Item = usize> + 'h {
    let mut start = 0;
    std::iter::from_fn(move || {
        let at = start + find(haystack.get(start..)?)?;
        start = at + 1;
        Some(at)
    })
}

/// A substring searcher for one needle, built once and used on many haystacks.
#[derive(Clone, Debug)]
pub struct Finder<'n> {
    needle: &'n [u8],
    pair: Option<imp::Pair>,
    two_way: memchr::arch::all::twoway::Finder,
}

impl<'n> Finder<'n> {
    pub fn new(needle: &'n [u8]) -> Finder<'n> {
        Finder {
            needle,
            pair: imp::Pair::new(needle),
            two_way: memchr::arch::all::twoway::Finder::new(needle),
        }
    }

    pub fn needle(&self) -> &'n [u8] {
        self.needle
    }

    /// The first occurrence of the needle in `haystack`.
    pub fn find(&self, haystack: &[u8]) -> Option<usize> {
        match self.pair.and_then(|p| p.find(haystack, self.needle)) {
            Some(found) => found,
            None => self.two_way.find(haystack, self.needle),
        }
    }

    /// Every occurrence, overlapping ones included, in order.
    pub fn find_iter<'a, 'h>(&'a self, haystack: &'h [u8]) -> impl Iterator<Item = usize> + 'a
    where
        'h: 'a,
    {
        every(haystack, move |h| self.find(h))
    }
}

/// The first occurrence of `needle` in `haystack`.
pub fn find_str(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    Finder::new(needle).find(haystack)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every search agrees with a plain scan, for every needle over haystacks of every length up
    /// to past the vector widths, with the needle at every place.
    #[test]
    fn searches_agree_with_a_plain_scan() {
        let alphabet = b"ab\n\0 ";
        for len in 0..80usize {
            let haystacks: Vec<Vec<u8>> = (0..alphabet.len())
                .map(|seed| {
                    (0..len)
                        .map(|i| alphabet[(i * 7 + seed * 3 + i / 5) % alphabet.len()])
                        .collect()
                })
                .collect();
            for h in &haystacks {
                for &b in alphabet {
                    let all: Vec<usize> = (0..h.len()).filter(|&i| h[i] == b).collect();
                    assert_eq!(positions(b, h).collect::<Vec<_>>(), all);
                    assert_eq!(find(b, h), all.first().copied());
                    assert_eq!(rfind(b, h), all.last().copied());
                }
                for needle in [&b"a"[..], b"ab", b"b\n", b"ab a", b"\0 ab\nab", b"zz", b""] {
                    let all: Vec<usize> = (0..=h.len())
                        .filter(|&i| h[i..].starts_with(needle))
                        .collect();
                    let f = Finder::new(needle);
                    assert_eq!(
                        f.find_iter(h).collect::<Vec<_>>(),
                        all,
                        "{needle:?} in {h:?}"
                    );
                    assert_eq!(f.find(h), all.first().copied());
                    assert_eq!(find_str(h, needle), all.first().copied());
                }
            }
        }
    }
}
