#!/usr/bin/env python3
"""Turns `strace -o TRACE nvshim-runtime ... create ...` into the list of system calls that
scripts/bench/least.c replays (LEAST_REPLAY=LIST): every call nvshim-runtime made between its
own start and its `execve` of the low-level runtime, with the same paths, flags, descriptors
and sizes, but none of its computation. `scripts/bench.sh` times the replay beside the
create: what a create costs over its replay is nvshim's user-space work and its larger binary.

Left out: the anonymous mappings (nvshim's heap: part of its own work) and the two `execve`s.
Output, a call per line, fields separated by tabs, paths as bytes with `\\t`, `\\n` and `\\\\`
escaped: `NAME ARG...` (see least.c's `replay`).

Usage: replay.py TRACE > LIST
"""
import re
import sys

FLAGS = {
    "O_RDONLY": 0, "O_WRONLY": 0o1, "O_RDWR": 0o2, "O_CREAT": 0o100, "O_EXCL": 0o200,
    "O_NOCTTY": 0o400, "O_TRUNC": 0o1000, "O_APPEND": 0o2000, "O_NONBLOCK": 0o4000,
    "O_LARGEFILE": 0, "O_DIRECTORY": 0o200000, "O_NOFOLLOW": 0o400000,
    "O_CLOEXEC": 0o2000000, "O_PATH": 0o10000000, "O_TMPFILE": 0o20200000,
    "AT_SYMLINK_NOFOLLOW": 0x100, "AT_REMOVEDIR": 0x200, "AT_SYMLINK_FOLLOW": 0x400,
    "AT_NO_AUTOMOUNT": 0x800, "AT_EMPTY_PATH": 0x1000,
    # statx(2) sync mode, which glibc's fstatat passes on (0: as stat does).
    "AT_STATX_SYNC_AS_STAT": 0,
    "F_OK": 0, "R_OK": 4, "W_OK": 2, "X_OK": 1, "SEEK_SET": 0, "SEEK_CUR": 1, "SEEK_END": 2,
    "GRND_NONBLOCK": 1, "GRND_RANDOM": 2, "GRND_INSECURE": 4, "F_SETFD": 2, "F_GETFD": 1,
    "F_GETFL": 3, "F_SETFL": 4, "FD_CLOEXEC": 1, "PROT_READ": 1, "MAP_PRIVATE": 2,
    "MAP_SHARED": 1,
}
CALL = re.compile(r"^(?:\d+ +)?(\w+)\((.*)\) += (-?\d+|0x[0-9a-f]+|\?)")


def split_args(text):
    """strace's argument list, split at top-level commas (strings, {} and [] kept whole)."""
    args, depth, cur, i = [], 0, "", 0
    while i < len(text):
        c = text[i]
        if c == '"':
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            cur += text[i:j + 1]
            i = j + 1
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
        if c == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
        else:
            cur += c
        i += 1
    if cur.strip():
        args.append(cur.strip())
    return args


def string(arg):
    """A path argument's bytes (strace escapes: \\n, \\t, \\", \\\\, \\ooo, \\xhh)."""
    assert arg.startswith('"'), arg
    body = arg[1:arg.rindex('"')]
    return body.encode("latin-1").decode("unicode_escape").encode("latin-1")


def number(arg):
    """A flag set (`O_RDONLY|O_CLOEXEC`), a symbolic constant or a number."""
    total = 0
    for part in arg.split("|"):
        part = part.strip()
        if part in FLAGS:
            total |= FLAGS[part]
        elif re.fullmatch(r"0[0-7]*", part):
            total |= int(part, 8)
        else:
            total |= int(part, 0)
    return total


def fd(arg):
    return -100 if arg == "AT_FDCWD" else int(arg)


def field(b):
    return b.replace(b"\\", b"\\\\").replace(b"\t", b"\\t").replace(b"\n", b"\\n").decode(
        "latin-1")


def convert(lines):
    out, execs = [], 0
    for line in lines:
        m = CALL.match(line)
        if not m:
            continue
        name, args, ret = m.group(1), split_args(m.group(2)), m.group(3)
        if name == "execve":
            execs += 1
            if execs == 2:
                break
            continue
        r = int(ret, 0) if ret != "?" else -1
        if name == "open":
            out.append(("openat", -100, string(args[0]), number(args[1]),
                        number(args[2]) if len(args) > 2 else 0, r))
        elif name == "openat":
            out.append(("openat", fd(args[0]), string(args[1]), number(args[2]),
                        number(args[3]) if len(args) > 3 else 0, r))
        elif name in ("read", "getdents64", "write"):
            out.append((name, int(args[0]), int(args[2])))
        elif name == "pread64":
            out.append(("pread64", int(args[0]), int(args[2]), int(args[3])))
        elif name in ("fstat", "close", "fdatasync", "fsync"):
            out.append((name, int(args[0])))
        elif name == "newfstatat":
            out.append(("fstatat", fd(args[0]), string(args[1]), number(args[3])))
        elif name in ("stat", "lstat"):
            out.append(("fstatat", -100, string(args[0]), 0x100 if name == "lstat" else 0))
        elif name == "statx":
            out.append(("fstatat", fd(args[0]), string(args[1]), number(args[2]) & 0x1900))
        elif name in ("readlink", "statfs"):
            out.append((name, string(args[0])))
        elif name == "access":
            out.append(("access", string(args[0]), number(args[1])))
        elif name == "rename":
            out.append(("rename", string(args[0]), string(args[1])))
        elif name == "fchmod":
            out.append(("fchmod", int(args[0]), number(args[1])))
        elif name == "lseek":
            out.append(("lseek", int(args[0]), int(args[1]), number(args[2])))
        elif name == "fcntl":
            out.append(("fcntl", int(args[0]), number(args[1]),
                        number(args[2]) if len(args) > 2 else 0))
        elif name == "mmap" and "MAP_ANONYMOUS" not in args[3] and int(args[4]) >= 0:
            out.append(("mmap", int(args[4]), int(args[1]), r))
        elif name == "munmap":
            out.append(("munmap", int(args[0], 0)))
        elif name in ("getpid", "geteuid", "getuid", "getegid", "getgid"):
            out.append((name,))
        elif name == "getrandom":
            out.append(("getrandom", int(args[1])))
        elif name == "getcwd":
            out.append(("getcwd",))
        # Anything else (the heap's mappings, the loader's calls, arch_prctl) is not replayed.
    return out


def main():
    with open(sys.argv[1], encoding="latin-1") as f:
        calls = convert(f)
    for call in calls:
        print("\t".join(field(a) if isinstance(a, bytes) else str(a) for a in call))


if __name__ == "__main__":
    main()
