/* nanolm under an address-space limit (ulimit -v): start OpenBLAS single-threaded and reserve
 * its GEMM buffers before any command runs, or refuse with a message (nl_blas_guard in
 * src/base/resources.c says why). Two hooks of the executable, so no command has to remember:
 *  - a preinit_array entry, which runs before any shared library's initialiser: OpenBLAS's
 *    starts its thread pool there, each thread taking a 128 MiB buffer and spinning forever
 *    when that fails, unless OPENBLAS_NUM_THREADS=1 is in the environment;
 *  - a constructor, which runs after them and before main().
 * Without a limit neither does anything but two getrlimit calls. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli.h"
#include "nanolm/resources.h"

/* 1 when RLIMIT_AS or RLIMIT_DATA is finite. */
static int address_limited(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) return 1;
    return getrlimit(RLIMIT_DATA, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY;
}

/* Runs before libc's own initialisation, so setenv() would be undone (libc then takes the
 * environment from the original envp): when a limit is set and OpenBLAS would start threads,
 * re-execute this program with OPENBLAS_NUM_THREADS=1 added, using only system calls and the
 * stack. If the exec fails the program goes on as it is. */
static void single_threaded_blas_under_limit(int argc, char **argv, char **envp) {
    (void)argc;
    if (!address_limited()) return;
    static char one[] = "OPENBLAS_NUM_THREADS=1";
    size_t n = 0, key = sizeof "OPENBLAS_NUM_THREADS=" - 1;
    for (char **e = envp; *e; e++) {
        if (!strcmp(*e, one)) return; /* already single-threaded (or re-executed) */
        n++;
    }
    char *env[n + 2];
    size_t k = 0;
    for (char **e = envp; *e; e++)
        if (strncmp(*e, one, key) != 0) env[k++] = *e;
    env[k++] = one;
    env[k] = NULL;
    execve("/proc/self/exe", argv, env);
}

__attribute__((section(".preinit_array"),
               used)) static void (*const nl_preinit_blas)(int, char **, char **) = single_threaded_blas_under_limit;

/* 1 when the command line only asks for help or the version (those need no BLAS). */
static int help_only(int argc, char **argv) {
    if (argc < 2) return 1;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return !strcmp(argv[1], "help") || !strcmp(argv[1], "version") || !strcmp(argv[1], "--version");
}

__attribute__((constructor)) static void reserve_blas_buffers(int argc, char **argv, char **envp) {
    (void)envp;
    if (!address_limited() || help_only(argc, argv)) return;
    int threads = 0;
    if (nl_blas_guard(&threads)) {
        fprintf(stderr, "nanolm: %s\n", nl_last_error());
        fflush(NULL);
        _exit(NL_EXIT_FAIL); /* nothing to clean up yet, and no library destructor to wait on */
    }
}
