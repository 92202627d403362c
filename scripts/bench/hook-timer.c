/*
 * Times an OCI hook in place, as runc runs it: scripts/bench.sh puts this program in a
 * bundle's hook entry in place of the hook, with `hook-timer LOG HOOK HOOK-ARGV0 ARGS...` as
 * its argv. runc runs it as it would run the hook (the container state on stdin, the hook's
 * env, in the container's namespaces before pivot_root); it runs HOOK with the rest of argv,
 * which inherits all of that, waits for it, and appends the nanoseconds from just before the
 * fork to the end of the wait to LOG, one line per hook run. Exits with the hook's status.
 *
 * What it adds is a fork and a wait; the same figure with /bin/true as HOOK measures that and
 * the exec of any program, so the difference between the two is the hook's own work.
 */
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	struct timespec start, end;
	int status;
	pid_t pid;
	FILE *log;

	if (argc < 4) {
		fprintf(stderr, "usage: hook-timer LOG HOOK HOOK-ARGV0 [ARGS...]\n");
		return 2;
	}
	clock_gettime(CLOCK_MONOTONIC, &start);
	pid = fork();
	if (pid < 0) {
		perror("hook-timer: fork");
		return 1;
	}
	if (pid == 0) {
		execv(argv[2], argv + 3);
		perror("hook-timer: exec");
		_exit(127);
	}
	if (waitpid(pid, &status, 0) < 0) {
		perror("hook-timer: waitpid");
		return 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &end);
	log = fopen(argv[1], "a");
	if (log == NULL) {
		perror(argv[1]);
		return 1;
	}
	fprintf(log, "%lld\n",
		(long long)(end.tv_sec - start.tv_sec) * 1000000000LL + (end.tv_nsec - start.tv_nsec));
	fclose(log);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
