#!/usr/bin/env bash
# The linker of nvshim-runtime's musl build (scripts/build-release.sh sets it): links as `cc`
# does, with the functions a runtime call runs (scripts/hot-functions.txt) placed first and
# together.
#
# Why: nvshim-runtime lives a millisecond, so every page of code it runs is mapped on first
# use, and the kernel maps file pages 64 KiB at a time around each fault (about 1.3 µs a
# fault here), then unmaps them all at the `execve` of runc. In the default order the ~400
# functions a create runs are spread over the whole 2.2 MB of code: a legacy create faulted in
# 39 of the binary's 40 windows (`perf record -e page-faults -d`); placed first, 13. Measured
# in paired runs (500 rounds each, docs/benchmarks.md): `state` 0.05 ms and creates 0.10 ms
# faster, a legacy create's peak RSS 2.3 → 1.4 MiB (fewer code pages mapped).
#
# How: rustc hands this script cc's arguments. With fat LTO every Rust function is in the one
# object file rustc made, each in its own section. The listed names are demangled as `nm -C`
# prints them (no hashes, so a rebuild or a new dependency version does not stale the list);
# they are looked up in that object's symbols, and the symbols found go to LLVM's lld (rustup
# ships it as rust-lld, with the gcc-ld wrapper rustc itself uses to link with it) as its
# `--symbol-ordering-file`. Names of the C library (no `::`) go as they are. A listed name no
# longer in the code is skipped; where lld or nm is missing, `cc` links in the default order
# (the same program, without the gain) and this says so on stderr.
set -euo pipefail
list="$(dirname "$0")/hot-functions.txt"
gcc_ld=""
if lld=$(command -v rust-lld); then gcc_ld="$(dirname "$lld")/gcc-ld"; fi
if [ -z "$gcc_ld" ] || [ ! -x "$gcc_ld/ld.lld" ] || ! command -v nm >/dev/null || [ ! -f "$list" ]; then
    echo "link-hot-first: rust-lld (rustup's gcc-ld), nm or $list missing: linking in the default order" >&2
    exec cc "$@"
fi
objects=()
for a in "$@"; do
    case "$a" in *.o) [ -f "$a" ] && objects+=("$a") ;; esac
done
if [ "${#objects[@]}" -eq 0 ]; then
    echo "link-hot-first: no object file among the arguments: linking in the default order" >&2
    exec cc "$@"
fi
order=$(mktemp)
status=0
{
    # `nm` and `nm -C` list the same symbols in the same order: pair them line by line.
    paste -d '\t' <(nm --defined-only "${objects[@]}") <(nm -C --defined-only "${objects[@]}") \
        | awk -F '\t' -v list="$list" '
            BEGIN {
                while ((getline line < list) > 0) {
                    if (line ~ /^#/ || line == "") continue
                    n++; rank[line] = n
                    if (line !~ /::/) c[n] = line
                }
            }
            {
                split($1, m, " ")
                if (m[2] !~ /^[tTwW]$/) next
                d = $2; sub(/^[^ ]* [^ ]* /, "", d)
                if (d in rank) found[rank[d]] = found[rank[d]] m[3] "\n"
            }
            END {
                for (i = 1; i <= n; i++) printf "%s%s", found[i], (i in c ? c[i] "\n" : "")
            }'
} > "$order" || status=$?
if [ "$status" -ne 0 ] || [ ! -s "$order" ]; then
    rm -f "$order"
    echo "link-hot-first: no listed function found in ${objects[*]}: linking in the default order" >&2
    exec cc "$@"
fi
cc "$@" -fuse-ld=lld -B"$gcc_ld" -Wl,--symbol-ordering-file="$order" \
    -Wl,--no-warn-symbol-ordering || status=$?
rm -f "$order"
exit "$status"
