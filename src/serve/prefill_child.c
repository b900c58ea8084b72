/* The prefill child of `serve --role disagg` (prefill_child.h): starts this program again as
 * the prefill role, learns its port through a file, and stops it. */
#include "nanolm/prefill_child.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Forks the child that runs args; it dies with this process, even of SIGKILL. */
static nl_status fork_child(char **args, pid_t *pid) {
    fflush(NULL);
    pid_t parent = getpid();
    *pid = fork();
    if (*pid == 0) {
        /* the signal outlives exec */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(127); /* the parent died before prctl */
        nl_reexec_self(args);
        _exit(127);
    }
    return *pid < 0 ? nl_fail(NL_ERR_IO, "fork: %s", strerror(errno)) : NL_OK;
}

/* Waits up to 120 s (loading a large checkpoint) for the child's port in port_file. */
static nl_status await_port(pid_t *pid, const char *port_file, char *addr, size_t addr_len) {
    for (int i = 0; i < 1200; i++) {
        FILE *f = fopen(port_file, "r");
        int port = 0, st;
        if (f) {
            if (fscanf(f, "%d", &port) != 1) port = 0;
            fclose(f);
        }
        if (port > 0) {
            snprintf(addr, addr_len, "127.0.0.1:%d", port);
            return NL_OK;
        }
        if (waitpid(*pid, &st, WNOHANG) == *pid) {
            *pid = -1;
            return nl_fail(NL_ERR_IO, "the prefill process exited before listening (status %d)",
                           WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        }
        sleep_ms(100);
    }
    kill(*pid, SIGKILL);
    waitpid(*pid, NULL, 0);
    *pid = -1;
    return nl_fail(NL_ERR_IO, "the prefill process did not listen within 120 s");
}

nl_status nl_prefill_child_start(int argc, char **argv, pid_t *pid, char *addr, size_t addr_len) {
    char dir[] = "/tmp/nanolm-serve-XXXXXX", port_file[64];
    *pid = -1;
    if (!mkdtemp(dir)) return nl_fail(NL_ERR_IO, "cannot make a temporary directory: %s", strerror(errno));
    snprintf(port_file, sizeof port_file, "%s/port", dir);
    char **args = calloc((size_t)argc + 10, sizeof *args);
    if (!args) {
        rmdir(dir);
        return nl_fail(NL_ERR_NOMEM, "out of memory");
    }
    int n = 0;
    args[n++] = "nanolm";
    for (int i = 0; i < argc; i++) args[n++] = argv[i];
    const char *extra[] = {"--role", "prefill", "--host", "127.0.0.1", "--port", "0", "--port-file", port_file};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) args[n++] = (char *)extra[i]; /* the last one wins */
    nl_status rc = fork_child(args, pid);
    free(args);
    if (!rc) rc = await_port(pid, port_file, addr, addr_len);
    unlink(port_file);
    rmdir(dir);
    return rc;
}

int nl_prefill_child_stop(pid_t pid) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) != pid) {
        kill(pid, SIGTERM);
        for (int i = 0; i < 600 && waitpid(pid, &st, WNOHANG) != pid; i++) {
            sleep_ms(100);
            if (i == 599) {
                kill(pid, SIGKILL);
                waitpid(pid, &st, 0);
            }
        }
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
