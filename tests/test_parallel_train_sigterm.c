/* SIGTERM during `parallel train` (what a preempted job gets): the ranks agree on the stop once
 * per step, so every rank finishes the same step, the checkpoint of that step is saved, every
 * rank exits 0 (so mpirun does), and no temporary file is left. The signal goes to one rank (what
 * mpirun forwards, or a scheduler that signals one process) and to all ranks; the stopped run
 * then resumes from its checkpoint. */
#include "testutil.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nanolm/checkpoint.h"

static const char *ARGS[] = {"--dim",        "32", "--layers", "1",  "--heads", "4",     "--kv-heads",     "2",
                             "--hidden",     "64", "--seq",    "16", "--batch", "2",     "--eval-windows", "2",
                             "--eval-every", "1",  "--warmup", "2",  "--steps", "100000"};
#define N_ARGS (sizeof ARGS / sizeof ARGS[0])

static int count_tmp(const char *dir) {
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (strstr(e->d_name, ".tmp.")) n++;
    if (d) closedir(d);
    return n;
}

/* The pids of the processes whose parent is `parent` (the ranks mpirun started), from /proc. */
static int children_of(pid_t parent, pid_t *out, int cap) {
    int n = 0;
    DIR *d = opendir("/proc");
    for (struct dirent *e; d && (e = readdir(d)) && n < cap;) {
        char path[300], buf[512];
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = 0;
        const char *rp = strrchr(buf, ')'); /* "pid (comm) state ppid ..." */
        char state;
        int ppid;
        if (rp && sscanf(rp + 1, " %c %d", &state, &ppid) == 2 && ppid == (int)parent)
            out[n++] = (pid_t)atoi(e->d_name);
    }
    if (d) closedir(d);
    return n;
}

/* Runs `mpirun -np 2 nanolm parallel train ... --out CKPT`, waits for three steps, sends SIGTERM
 * to rank pids[which] (which < 0: to every rank), and returns the exit status; *rest gets what
 * was printed after the signal (malloc'd). */
static int run_and_signal(const char *data, const char *ckpt, int which, char **rest) {
    const char *bin = getenv("NANOLM_BIN");
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        setenv("OMP_NUM_THREADS", "1", 1);
        const char *argv[64] = {"mpirun",
                                "--allow-run-as-root",
                                "--oversubscribe",
                                "-np",
                                "2",
                                bin ? bin : "build/nanolm",
                                "parallel",
                                "train",
                                "--data",
                                data,
                                "--out",
                                ckpt};
        int k = 12;
        for (size_t i = 0; i < N_ARGS; i++) argv[k++] = ARGS[i];
        argv[k] = NULL;
        execvp("mpirun", (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    char line[512];
    int seen = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "step ") && ++seen == 3) break; /* a few steps (and saves) done */
    assert_int_equal(seen, 3);
    pid_t ranks[8];
    int n = children_of(pid, ranks, 8);
    assert_int_equal(n, 2);
    if (ranks[0] > ranks[1]) { /* started in rank order: the lower pid is rank 0 (only a label here) */
        pid_t x = ranks[0];
        ranks[0] = ranks[1];
        ranks[1] = x;
    }
    for (int r = 0; r < n; r++)
        if (which < 0 || which == r) kill(ranks[r], SIGTERM);
    size_t cap = 1 << 16, len = 0;
    char *buf = calloc(cap, 1);
    assert_non_null(buf);
    while (fgets(line, sizeof line, f))
        if (len + strlen(line) < cap - 1) len += (size_t)snprintf(buf + len, cap - len, "%s", line);
    fclose(f);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    *rest = buf;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void sigterm_case(int which) {
    const char *data = tu_committed_data("tinyshakespeare/input.txt");
    char *dir = tu_tmpdir(), ckpt[512], *rest = NULL;
    snprintf(ckpt, sizeof ckpt, "%s/run.st", dir);
    int rc = run_and_signal(data, ckpt, which, &rest);
    print_message("SIGTERM to %s: exit status %d; after the signal:\n%s", which < 0 ? "every rank" : "rank 1", rc,
                  rest);
    assert_int_equal(rc, 0);
    const char *at = strstr(rest, "stopped by SIGTERM after step ");
    assert_non_null(at);
    long long stopped = atoll(at + strlen("stopped by SIGTERM after step "));
    assert_true(stopped >= 3);
    assert_int_equal(count_tmp(dir), 0);
    /* the checkpoint holds the step the ranks stopped after */
    nl_model m;
    char tok[64];
    assert_int_equal(nl_ckpt_load_model(ckpt, &m, tok), NL_OK);
    nl_ckpt_state st;
    memset(&st, 0, sizeof st);
    assert_int_equal(nl_ckpt_load_state(ckpt, &m, &st), NL_OK);
    nl_model_free(&m);
    assert_int_equal(st.step, stopped);
    /* and the run resumes from it */
    char args[2048], *out = NULL;
    snprintf(args, sizeof args,
             "parallel train --data %s --dim 32 --layers 1 --heads 4 --kv-heads 2 --hidden 64 --seq 16 --batch 2 "
             "--eval-windows 2 --warmup 2 --steps %lld --resume %s",
             data, stopped + 1, ckpt);
    const tu_run_opts o = {.np = 2, .timeout_s = 120, .one_thread = 1};
    int rc2 = tu_run_cli_ex(&o, args, &out, NULL);
    if (rc2) print_message("%s\n", out);
    assert_int_equal(rc2, 0);
    free(out);
    free(rest);
    tu_rmdir(dir);
    free(dir);
}

static void test_sigterm_to_one_rank(void **state) {
    (void)state;
    sigterm_case(1);
}
static void test_sigterm_to_every_rank(void **state) {
    (void)state;
    sigterm_case(-1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigterm_to_one_rank),
        cmocka_unit_test(test_sigterm_to_every_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
