#!/usr/bin/env bash
# Writes scripts/hot-functions.txt: the functions nvshim-runtime runs on the calls the bench
# measures, which scripts/link-hot-first.sh places first in the musl build (it says why). Run
# it after changing what a create runs. A stale list never makes a wrong program: a listed
# function that is gone is skipped at link time, and one the list lacks stays where the
# linker puts it (a page fault or two more per call).
#
# Usage: sudo scripts/bench.sh --quick --keep     (prints the work dir it kept)
#        sudo scripts/hot-functions.sh WORK
# Each single-step call of the shipped build in WORK/spec.json (creates of every kind the
# bench has, pass-through calls; not the reference builds, nor the scans without the CDI index
# or the NVML cache) runs three times under callgrind, the last one counted up to its `execve`
# of the low-level runtime (the first two fill the caches, which are keyed on the binary).
# Needs: valgrind, the musl target (rustup target add x86_64-unknown-linux-musl), python3.
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:?usage: scripts/hot-functions.sh WORK (a work dir kept by scripts/bench.sh --keep)}"
[ -f "$work/spec.json" ] || { echo "hot-functions: no $work/spec.json: run scripts/bench.sh --keep first" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "hot-functions: valgrind is required" >&2; exit 1; }
# Symbols kept (the shipped build strips them); the link order does not matter here.
target="$PWD/target/hot-functions"
CARGO_TARGET_DIR="$target" CARGO_PROFILE_RELEASE_STRIP=none cargo build --release --quiet \
    --target x86_64-unknown-linux-musl -p nvshim --bin nvshim-runtime
bin="$target/x86_64-unknown-linux-musl/release/nvshim-runtime"
profiles=$(mktemp -d)
trap 'rm -rf "$profiles"' EXIT
# `nm` and `nm -C` list the same symbols in the same order: mangled and demangled, paired.
paste -d '\t' <(nm --defined-only "$bin") <(nm -C --defined-only "$bin") > "$profiles/names"
python3 - "$work/spec.json" "$bin" "$profiles" scripts/hot-functions.txt <<'PY'
import glob, json, os, re, subprocess, sys

spec, binp, profiles, out = sys.argv[1:5]
calls = 0
for c in json.load(open(spec))["commands"]:
    if len(c["steps"]) != 1 or not c["steps"][0][0].endswith("/nvshim-runtime"):
        continue
    if "noindex" in c["name"] or "nocache" in c["name"]:
        continue
    env = dict(os.environ, **c.get("env", {}))
    for i in range(3):
        for p in c.get("prepare", []):
            subprocess.run(p, check=True)
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--demangle=no", "--dump-before=execve",
             f"--callgrind-out-file={profiles}/{c['name']}.{i}", binp] + c["steps"][0][1:],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    calls += 1
ran = set()
for f in glob.glob(f"{profiles}/*.2.1"):
    for line in open(f, errors="replace"):
        m = re.match(r"c?fn=\(\d+\) (\S+)", line)
        if m:
            ran.add(m.group(1))
text = {}
for line in open(f"{profiles}/names"):
    mangled, _, demangled = line.rstrip("\n").partition("\t")
    m = mangled.split()
    if len(m) == 3 and m[1] in "tTwW":
        text[m[2]] = demangled.split(" ", 2)[2]
hot = sorted({text[n] for n in ran if n in text})
if calls == 0 or not hot:
    sys.exit(f"hot-functions: nothing profiled from {spec}")
with open(out, "w") as f:
    f.write("""# The functions nvshim-runtime runs on the calls scripts/bench.sh measures (legacy, CDI, pod,
# MIG and many-spec-file creates, pass-through calls), as `nm -C` names them: placed first in
# the musl build by scripts/link-hot-first.sh, which says why. Written by
# scripts/hot-functions.sh; a name no longer in the code is skipped at link time.
""")
    f.write("\n".join(hot) + "\n")
print(f"hot-functions: {len(hot)} functions from {calls} calls -> {out}", file=sys.stderr)
PY
