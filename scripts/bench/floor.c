/*
 * The physical floor for any runtime shim: a static program that does nothing but exec the
 * low-level runtime with its own argv. `scripts/bench.sh` builds it (musl-gcc -static, else
 * gcc -static) and times it beside nvshim-runtime; the difference between the two is what
 * nvshim's own work costs.
 *
 * The runtime is compiled in (-DRUNTIME="/bin/true") so the floor reads no environment and
 * no file.
 */
#include <stdio.h>
#include <unistd.h>

#ifndef RUNTIME
#define RUNTIME "/bin/true"
#endif

int main(int argc, char **argv)
{
	(void)argc;
	argv[0] = RUNTIME;
	execv(RUNTIME, argv);
	perror("floor: execv " RUNTIME);
	return 127;
}
