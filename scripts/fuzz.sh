#!/usr/bin/env bash
# Runs nvshim's coverage-guided fuzz targets (fuzz/, cargo-fuzz + libFuzzer) for a bounded
# time each, on the stable toolchain.
#
# cargo-fuzz's default build uses AddressSanitizer (-Zsanitizer, nightly only); `-s none` builds
# the same libFuzzer coverage instrumentation (sancov, stable -C flags) without a sanitizer,
# which cargo-fuzz supports on stable (rust-fuzz/cargo-fuzz#440). The code under test is safe
# Rust on these paths, so what a sanitizer would add is little; panics, failed assertions
# (debug assertions and overflow checks are on) and the targets' own property checks are what
# the runs find. No RUSTC_BOOTSTRAP anywhere.
#
# Each target starts from its committed corpus (fuzz/corpus/<target>, read-only) and writes
# what it finds to target/fuzz-corpus/<target>; a crash is saved to fuzz/artifacts/<target>/
# and the script exits non-zero, naming it. Reproduce one with
#   fuzz/target/x86_64-unknown-linux-gnu/release/<target> fuzz/artifacts/<target>/crash-...
# and fix it with a regression test next to the code.
#
# Usage: scripts/fuzz.sh [--time SECONDS] [--minimize] [TARGET...]
#   --time S     seconds per target (default 30, what CI runs)
#   --minimize   afterwards, merge what the runs found into fuzz/corpus/<target> (cmin), to commit
#   TARGET...    default: all of them (cargo fuzz list)
# Needs cargo-fuzz: cargo install cargo-fuzz --version 0.13.2 --locked
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

secs=30 minimize= targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --time) secs="$2"; shift 2 ;;
        --minimize) minimize=1; shift ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        -*) echo "fuzz: unknown option $1" >&2; exit 1 ;;
        *) targets+=("$1"); shift ;;
    esac
done
cargo fuzz --version >/dev/null 2>&1 || {
    echo "fuzz: cargo-fuzz is missing: cargo install cargo-fuzz --version 0.13.2 --locked" >&2
    exit 1
}
cd fuzz
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo fuzz list)

echo "== building ${#targets[@]} fuzz targets (cargo fuzz build -s none, stable)" >&2
cargo fuzz build -s none
bin="$repo/fuzz/target/x86_64-unknown-linux-gnu/release"

failed=()
for t in "${targets[@]}"; do
    found="$repo/target/fuzz-corpus/$t"
    mkdir -p "$found" "artifacts/$t"
    echo "== $t: ${secs}s" >&2
    # libFuzzer's input size limit follows the largest seed (ld.so.cache seeds are tens of KiB).
    # -timeout: one input taking over 10 s is a hang worth a report.
    if ! "$bin/$t" "$found" "corpus/$t" \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="artifacts/$t/" > "$repo/target/fuzz-$t.log" 2>&1; then
        failed+=("$t")
        echo "fuzz: $t FAILED; the input is in fuzz/artifacts/$t/:" >&2
        grep -E 'panicked at|ERROR: libFuzzer|SUMMARY|Test unit written' -A2 "$repo/target/fuzz-$t.log" \
            | cut -c1-300 | head -20 >&2 || true
    else
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$repo/target/fuzz-$t.log")
        echo "   $runs runs; corpus: $(ls "corpus/$t" | wc -l) committed + $(ls "$found" | wc -l) found so far" >&2
    fi
    if [ -n "$minimize" ]; then
        "$bin/$t" -merge=1 "corpus/$t" "$found" > "$repo/target/fuzz-$t-merge.log" 2>&1
    fi
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: ${#failed[@]} target(s) found a crash: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz: ${#targets[@]} passed, 0 failed"
