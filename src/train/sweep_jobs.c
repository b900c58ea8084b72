/* A scaling sweep trained by forked single-threaded workers sharing its directory
 * (nanolm/sweep_jobs.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nanolm/sweep_jobs.h"

/* One worker: trains with one thread and ends its process (it never returns). */
static void worker(const nl_sweep_grid *g, const char *data_path, const char *dir, const nl_sweep_progress *p, int w,
                   void (*on_error)(void *, int, const char *), void *user) {
    nl_set_threads(1);
    nl_status rc = nl_sweep_run_worker(g, data_path, dir, p, 1);
    if (rc && on_error) on_error(user, w, nl_last_error());
    fflush(NULL);
    _exit(rc ? 1 : 0);
}

nl_status nl_sweep_run_jobs(const nl_sweep_grid *g, const char *data_path, const char *dir, const nl_sweep_progress *p,
                            int jobs, void (*on_error)(void *user, int worker, const char *message), void *user) {
    if (jobs <= 1) return nl_sweep_run(g, data_path, dir, p);
    if (jobs > 16) return nl_fail(NL_ERR_INVALID, "sweep: %d workers (at most 16)", jobs);
    pid_t pids[16] = {0};
    int failed = 0;
    for (int w = 0; w < jobs; w++) {
        fflush(NULL);
        pids[w] = fork();
        if (pids[w] < 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "fork: %s", strerror(errno));
            if (on_error) on_error(user, -1, msg);
            failed = 1;
            break;
        }
        if (pids[w] == 0) worker(g, data_path, dir, p, w, on_error, user);
    }
    for (int w = 0; w < jobs; w++) {
        if (pids[w] <= 0) continue;
        int st = 0;
        while (waitpid(pids[w], &st, 0) < 0 && errno == EINTR) {}
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed = 1;
    }
    if (failed)
        return nl_fail(NL_ERR_IO, "a worker failed (finished runs are in %s/sweep.csv; run again to resume)", dir);
    return NL_OK;
}
