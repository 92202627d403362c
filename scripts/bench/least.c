/*
 * The least a create costs under nvshim's own rules, without nvshim: the floor (floor.c)
 * plus only the system calls those rules call for, so that `scripts/bench.sh` can show how
 * much of a create's time over the floor no implementation of the rules could save.
 *
 *   LEAST_STAT_DIR=DIR  `fstatat` every entry of DIR, as the CDI index checks the identity
 *                       of every spec file on each create (src/cdi/index.rs: no directory
 *                       time moves when a file is rewritten in place). The names come from
 *                       the directory itself (nvshim reads them from its index: one read).
 *   LEAST_REWRITE=1     replace the bundle's config.json as nvshim does (src/atomic.rs): read
 *                       it, write it to a temporary file beside it, `fdatasync`, rename. The
 *                       bytes written are the ones read (nvshim writes the edited spec).
 *
 *   LEAST_REPLAY=LIST   replay the system calls of one nvshim-runtime create, as
 *                       scripts/bench/replay.py lists them from `strace`: the same paths,
 *                       flags, descriptors and sizes, none of nvshim's computation. The list
 *                       is read whole first (an open, a read and a close more than nvshim)
 *                       and parsed in place.
 *
 * Then it execs the runtime with its own argv, as the floor does. Built static like the
 * floor (the same compiler), so that the difference between the two is these calls alone.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef RUNTIME
#define RUNTIME "/bin/true"
#endif

static void stat_all(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	struct stat st;

	if (!d) {
		perror(dir);
		exit(127);
	}
	while ((e = readdir(d)))
		if (e->d_name[0] != '.' && fstatat(dirfd(d), e->d_name, &st, AT_NO_AUTOMOUNT) != 0) {
			perror(e->d_name);
			exit(127);
		}
	closedir(d);
}

static char io[1 << 20];

static void rewrite(const char *bundle)
{
	char path[4096], tmp[4096];
	ssize_t n;
	int in, out;

	snprintf(path, sizeof(path), "%s/config.json", bundle);
	snprintf(tmp, sizeof(tmp), "%s/.config.json.least-%d.tmp", bundle, (int)getpid());
	in = open(path, O_RDONLY | O_CLOEXEC);
	n = in < 0 ? -1 : read(in, io, sizeof(io));
	out = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (n < 0 || out < 0 || write(out, io, n) != n || fdatasync(out) != 0 ||
	    rename(tmp, path) != 0) {
		perror(path);
		exit(127);
	}
	close(out);
	close(in);
}

static void die(const char *what, const char *line)
{
	fprintf(stderr, "least: replay: %s: %s\n", what, line);
	exit(127);
}

/* One field of a list line, unescaped in place (`\t`, `\n`, `\\`); advances *p. */
static char *next_field(char **p)
{
	char *start = *p, *r = *p, *w = *p;

	for (; *r && *r != '\t'; r++, w++) {
		if (*r == '\\' && r[1]) {
			r++;
			*w = *r == 't' ? '\t' : *r == 'n' ? '\n' : *r;
		} else {
			*w = *r;
		}
	}
	*p = *r ? r + 1 : r;
	*w = 0;
	return start;
}

static void replay(const char *list)
{
	/* Parsed in place, without malloc: the replay should cost its calls and little else. */
	static char text[1 << 20];
	static int fds[4096];
	static struct { long from; void *to; size_t len; } maps[64];
	int nmaps = 0, in = open(list, O_RDONLY | O_CLOEXEC);
	ssize_t n = in < 0 ? -1 : read(in, text, sizeof(text) - 1);
	char *line, *save = NULL;
	struct stat st;
	struct statfs sf;

	if (n < 0 || n == sizeof(text) - 1)
		die("cannot read the list", list);
	close(in);
	text[n] = 0;
	/* fds[n] is the replay's descriptor for the trace's n, plus one; 0: the same number. */
#define FD(x) ((x) < 0 || !fds[(x) % 4096] ? (int)(x) : fds[(x) % 4096] - 1)
	for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *p = line, *op = next_field(&p), *a = next_field(&p), *b = next_field(&p);
		char *c = next_field(&p), *d = next_field(&p), *e = next_field(&p);
		long x = atol(a), y = atol(b), z = atol(c);

		if (!strcmp(op, "openat")) {
			int fd = openat(FD(x), b, (int)z, (mode_t)atol(d)), want = atoi(e);

			if (want >= 0 && fd < 0)
				die("open failed", b);
			if (want >= 0)
				fds[want % 4096] = fd + 1;
		} else if (!strcmp(op, "read")) {
			(void)!read(FD(x), io, y < (long)sizeof(io) ? y : (long)sizeof(io));
		} else if (!strcmp(op, "pread64")) {
			(void)!pread(FD(x), io, y < (long)sizeof(io) ? y : (long)sizeof(io), z);
		} else if (!strcmp(op, "getdents64")) {
			syscall(SYS_getdents64, FD(x), io, y < (long)sizeof(io) ? y : (long)sizeof(io));
		} else if (!strcmp(op, "write")) {
			(void)!write(FD(x), io, y < (long)sizeof(io) ? y : (long)sizeof(io));
		} else if (!strcmp(op, "fstat")) {
			fstat(FD(x), &st);
		} else if (!strcmp(op, "fstatat")) {
			fstatat(FD(x), b, &st, (int)z);
		} else if (!strcmp(op, "close")) {
			close(FD(x));
			if (x >= 0)
				fds[x % 4096] = 0;
		} else if (!strcmp(op, "fdatasync")) {
			fdatasync(FD(x));
		} else if (!strcmp(op, "fsync")) {
			fsync(FD(x));
		} else if (!strcmp(op, "fchmod")) {
			fchmod(FD(x), (mode_t)y);
		} else if (!strcmp(op, "lseek")) {
			lseek(FD(x), y, (int)z);
		} else if (!strcmp(op, "fcntl")) {
			fcntl(FD(x), (int)y, z);
		} else if (!strcmp(op, "readlink")) {
			(void)!readlink(a, io, 4096);
		} else if (!strcmp(op, "statfs")) {
			statfs(a, &sf);
		} else if (!strcmp(op, "access")) {
			access(a, (int)y);
		} else if (!strcmp(op, "rename")) {
			if (rename(a, b) != 0)
				die("rename failed", a);
		} else if (!strcmp(op, "mmap")) {
			/* nvshim reads what it maps: every page is touched here too. */
			char *m = mmap(NULL, y, PROT_READ, MAP_PRIVATE, FD(x), 0);
			volatile char sink;

			if (m == MAP_FAILED)
				die("mmap failed", line);
			for (long i = 0; i < y; i += 4096)
				sink = m[i];
			(void)sink;
			if (nmaps < 64)
				maps[nmaps++] = (typeof(maps[0])){ strtol(c, NULL, 0), m, (size_t)y };
		} else if (!strcmp(op, "munmap")) {
			for (int i = 0; i < nmaps; i++)
				if (maps[i].from == strtol(a, NULL, 0) && maps[i].to) {
					munmap(maps[i].to, maps[i].len);
					maps[i].to = NULL;
				}
		} else if (!strcmp(op, "getrandom")) {
			getrandom(io, x, GRND_INSECURE);
		} else if (!strcmp(op, "getcwd")) {
			(void)!getcwd(io, 4096);
		} else if (!strcmp(op, "getpid")) {
			syscall(SYS_getpid);
		} else if (!strcmp(op, "geteuid")) {
			syscall(SYS_geteuid);
		} else if (!strcmp(op, "getuid")) {
			syscall(SYS_getuid);
		} else if (!strcmp(op, "getegid")) {
			syscall(SYS_getegid);
		} else if (!strcmp(op, "getgid")) {
			syscall(SYS_getgid);
		} else {
			die("unknown call", op);
		}
	}
}

int main(int argc, char **argv)
{
	const char *list = getenv("LEAST_REPLAY");
	const char *dir = getenv("LEAST_STAT_DIR");
	const char *bundle = NULL;

	for (int i = 1; i + 1 < argc; i++)
		if (strcmp(argv[i], "--bundle") == 0)
			bundle = argv[i + 1];
	if (list)
		replay(list);
	if (dir)
		stat_all(dir);
	if (getenv("LEAST_REWRITE") && bundle)
		rewrite(bundle);
	argv[0] = RUNTIME;
	execv(RUNTIME, argv);
	perror("least: execv " RUNTIME);
	return 127;
}
