//! `nvshim_hook::ldcache`: the ld.so.cache reader (the host's cache on every create, and the
//! container's in the update-ldcache hook) and the writer it feeds.
//!
//! Properties: parsing never panics, whatever the bytes; a cache that parses, written back
//! with `serialize` and parsed again, has the same entries (what the hook relies on when it
//! rewrites a container's cache that it read); `parse_only` (what a create runs) keeps
//! exactly the entries its filter accepts of what `parse` gives; and `cache_entries` (what the
//! hook reads, names as bytes) gives the same entries as `parse` where that succeeds.
#![no_main]

use std::collections::BTreeSet;

use libfuzzer_sys::fuzz_target;
use nvshim_hook::ldcache::{self, LdCache};

fuzz_target!(|data: &[u8]| {
    let keep = |name: &[u8]| name.len() % 2 == 1;
    let only = LdCache::parse_only(data, keep);
    // What the hook keeps of an image's cache: names as bytes, the same entries.
    let raw = ldcache::cache_entries(data);
    let Ok(cache) = LdCache::parse(data) else {
        return;
    };
    assert_eq!(
        raw.expect("cache_entries fails where parse does not"),
        cache.cache_entries(),
        "the byte reader and the string reader disagree"
    );
    let expected: Vec<_> = cache
        .entries
        .iter()
        .filter(|e| keep(e.name.as_bytes()))
        .cloned()
        .collect();
    assert_eq!(
        only.expect("parse_only fails where parse does not").entries,
        expected,
        "parse_only kept other entries than its filter accepts"
    );
    let _ = cache.lookup("libcuda.so.1");
    let entries = cache.cache_entries();
    let written = ldcache::serialize(&entries, &BTreeSet::new(), "nvshim-fuzz");
    let again = LdCache::parse(&written).expect("a cache nvshim wrote must parse");
    assert_eq!(
        again.cache_entries(),
        entries,
        "entries changed in a write and read back"
    );
});
