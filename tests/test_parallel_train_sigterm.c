/* SIGTERM during `parallel train` (what a preempted job gets): the ranks agree on the stop once
 * per step, so every rank finishes the same step, the checkpoint of that step is saved, every
 * rank exits 0 (so mpirun does), and no temporary file is left. The signal goes to one rank (what
 * mpirun forwards, or a scheduler that signals one process) and to all ranks; the stopped run
 * then resumes from its checkpoint. And while it runs, a second run with the same --out, parallel
 * or not, is refused naming the rank that holds the output's lock. */
#include "testutil.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nanolm/checkpoint.h"

static const char *ARGS[] = {"--dim",        "32", "--layers", "1",  "--heads", "4",     "--kv-heads",     "2",
                             "--hidden",     "64", "--seq",    "16", "--batch", "2",     "--eval-windows", "2",
                             "--eval-every", "1",  "--warmup", "2",  "--steps", "100000"};
#define N_ARGS (sizeof ARGS / sizeof ARGS[0])

/* Starts `mpirun -np 2 nanolm parallel train ... --out CKPT` and waits for `steps` steps. */
static void spawn_run(const char *data, const char *ckpt, int steps, tu_proc *p) {
    const char *argv[64] = {"parallel", "train", "--data", data, "--out", ckpt};
    int k = 6;
    for (size_t i = 0; i < N_ARGS; i++) argv[k++] = ARGS[i];
    argv[k] = NULL;
    const tu_run_opts o = {.np = 2, .one_thread = 1};
    assert_int_equal(tu_spawn_cli(&o, argv, p), 0);
    assert_int_equal(tu_wait_for_output(p, "step ", steps), steps);
}

/* Runs `mpirun -np 2 nanolm parallel train ... --out CKPT`, waits for three steps, sends SIGTERM
 * to rank pids[which] (which < 0: to every rank), and returns the exit status; *rest gets what
 * was printed after the signal (malloc'd). */
static int run_and_signal(const char *data, const char *ckpt, int which, char **rest) {
    tu_proc p;
    spawn_run(data, ckpt, 3, &p); /* a few steps (and saves) done */
    int ranks[8];
    int n = tu_children_of(p.pid, ranks, 8); /* started in rank order: the lower pid is rank 0 (a label here) */
    assert_int_equal(n, 2);
    for (int r = 0; r < n; r++)
        if (which < 0 || which == r) kill(ranks[r], SIGTERM);
    int rc = tu_proc_finish(&p, rest);
    assert_non_null(*rest);
    return rc;
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
    assert_int_equal(tu_count_tmp(dir), 0);
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

/* Two runs with the same --out: rank 0 of a running `parallel train` holds the lock beside it (its
 * PID in the lock file), so a second `parallel train` and a one-process `train` on that --out are
 * refused naming that PID (both used to write the same file); after the first ends the lock file
 * is gone. */
static void test_out_locked_by_one_run(void **state) {
    (void)state;
    const char *data = tu_committed_data("tinyshakespeare/input.txt");
    char *dir = tu_tmpdir(), ckpt[512], lock[600], args[2048];
    snprintf(ckpt, sizeof ckpt, "%s/same.st", dir);
    snprintf(lock, sizeof lock, "%s.lock", ckpt);
    tu_proc p;
    spawn_run(data, ckpt, 1, &p);
    int ranks[8], n = tu_children_of(p.pid, ranks, 8);
    char *held = tu_read_file(lock, NULL);
    long holder = held ? atol(held) : -1;
    free(held);
    char want[96];
    snprintf(want, sizeof want, "being written by another run (PID %ld", holder);
    char *out2 = NULL, *out1 = NULL;
    const char *shape = "--dim 32 --layers 1 --heads 4 --kv-heads 2 --hidden 64 --seq 16 --batch 2 --steps 2";
    snprintf(args, sizeof args, "parallel train --data %s %s --out %s", data, shape, ckpt);
    const tu_run_opts o2 = {.np = 2, .timeout_s = 120, .one_thread = 1};
    int rc2 = tu_run_cli_ex(&o2, args, &out2, NULL);
    snprintf(args, sizeof args, "train --data %s --seq 16 --batch 2 --steps 2 --out %s", data, ckpt);
    const tu_run_opts o1 = {.timeout_s = 120, .one_thread = 1};
    int rc1 = tu_run_cli_ex(&o1, args, &out1, NULL);
    for (int r = 0; r < n; r++) kill(ranks[r], SIGTERM);
    char *rest = NULL;
    int rc = tu_proc_finish(&p, &rest);
    free(rest);
    int holder_is_rank = 0;
    for (int r = 0; r < n; r++) holder_is_rank |= ranks[r] == holder;
    int refused2 = rc2 != 0 && out2 && strstr(out2, want) && !strstr(out2, "step ");
    int refused1 = rc1 != 0 && out1 && strstr(out1, want) && !strstr(out1, "step ");
    if (!holder_is_rank || !refused2 || !refused1)
        fail_msg("lock held by PID %ld (a rank: %d); second parallel run: status %d, %s\none-process run: status "
                 "%d, %s",
                 holder, holder_is_rank, rc2, out2 ? out2 : "", rc1, out1 ? out1 : "");
    free(out1);
    free(out2);
    assert_int_equal(rc, 0);
    assert_int_equal(access(lock, F_OK), -1); /* removed by the rank that held it */
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigterm_to_one_rank),
        cmocka_unit_test(test_sigterm_to_every_rank),
        cmocka_unit_test(test_out_locked_by_one_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
