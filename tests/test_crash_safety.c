/* Crash safety of `nanolm train --out`: the training process is killed with SIGKILL at random
 * moments, half of them aimed at the moment a checkpoint write is in flight (its temporary file
 * exists). After every kill the checkpoint on disk must load (weights and training state), and
 * the run resumed from it (--resume) must end bit-identical to an uninterrupted run.
 *
 * The kills form chains: each run resumes from the checkpoint the previous kill left (or starts
 * fresh when there is none yet); a run that reaches the last step ends the chain, and its final
 * checkpoint is compared with the uninterrupted run's, byte for byte. Every kill's checkpoint is
 * thus resumed from, and any damage to one would change the end of its chain.
 *
 * Tiny config (shakespeare-char, batch 2 x 16, 16 steps, a checkpoint every 2 steps); one
 * thread, so each run is reproducible. 50 kills (10 under the sanitizers, which are slower). */
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nanolm/base.h"
#include "nanolm/checkpoint.h"
#include "nanolm/model.h"
#include "nanolm/train.h"

#define STEPS 16
#define EVERY 2

static char dir[256], data_path[320], ref_path[320], ck_path[320];

/* Deterministic English-like text (no shared data needed). */
static void write_text(const char *path) {
    static const char *words[] = {"the",   "king",   "and", "queen", "of",     "a",    "castle", "by",   "sea",
                                  "spoke", "softly", "to",  "their", "people", "when", "night",  "fell", "upon"};
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    uint32_t s = 7;
    for (int i = 0; i < 8000; i++) {
        s = s * 1103515245u + 12345u;
        fputs(words[(s >> 16) % (sizeof words / sizeof *words)], f);
        fputc(i % 13 == 12 ? '\n' : ' ', f);
    }
    fclose(f);
}

/* Starts `nanolm train` writing `out` (resuming from it when `resume`); returns the pid. */
static pid_t spawn_train(const char *out, int resume) {
    char steps[16], every[16];
    snprintf(steps, sizeof steps, "%d", STEPS);
    snprintf(every, sizeof every, "%d", EVERY);
    const char *argv[40];
    int n = 0;
    const char *fixed[] = {"train",
                           "--data",
                           data_path,
                           "--preset",
                           "shakespeare-char",
                           "--steps",
                           steps,
                           "--eval-every",
                           every,
                           "--eval-windows",
                           "2",
                           "--batch",
                           "2",
                           "--seq",
                           "16",
                           "--seed",
                           "11",
                           "--warmup",
                           "2",
                           "--json",
                           "--out",
                           out};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) argv[n++] = fixed[i];
    if (resume) {
        argv[n++] = "--resume";
        argv[n++] = out;
    }
    argv[n] = NULL;
    const tu_run_opts o = {.no_output = 1};
    tu_proc p;
    assert_int_equal(tu_spawn_cli(&o, argv, &p), 0);
    return (pid_t)p.pid;
}

static int wait_exit(pid_t pid) {
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    return st;
}

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* Number of "<ck>.tmp.*" files in the directory (writes that a kill interrupted). */
static int count_tmp(void) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        if (strstr(e->d_name, "ck.safetensors.tmp.")) n++;
    if (d) closedir(d);
    return n;
}

/* Whether the temporary file of process `pid`'s checkpoint write exists right now. */
static int writing_now(pid_t pid) {
    char p[400];
    snprintf(p, sizeof p, "%s.tmp.%d", ck_path, (int)pid);
    return exists(p);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Loads a checkpoint's model and training state; returns its step (fails the test if either
 * does not load). */
static int64_t load_step(const char *path) {
    nl_model m;
    char tok[64];
    nl_status rc = nl_ckpt_load_model(path, &m, tok);
    if (rc) fail_msg("checkpoint after a kill does not load: %s", nl_last_error());
    nl_adamw opt;
    assert_int_equal(nl_adamw_init(&opt, &m, 0.9f, 0.95f, 1e-8f, 0.1f), NL_OK);
    nl_ckpt_state st;
    memset(&st, 0, sizeof st);
    st.opt = &opt;
    rc = nl_ckpt_load_state(path, &m, &st);
    if (rc) fail_msg("training state after a kill does not load: %s", nl_last_error());
    nl_adamw_free(&opt);
    nl_model_free(&m);
    return st.step;
}

static void same_as_reference(const char *path) {
    size_t a_n, b_n;
    char *a = tu_read_file(ref_path, &a_n), *b = tu_read_file(path, &b_n);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a_n, b_n);
    if (memcmp(a, b, a_n) != 0) {
        size_t i = 0;
        while (a[i] == b[i]) i++;
        fail_msg("resumed run's final checkpoint differs from the uninterrupted run's at byte %zu", i);
    }
    free(a);
    free(b);
}

static void test_kill_and_resume(void **state) {
    (void)state;
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    char *d = tu_tmpdir();
    assert_non_null(d);
    snprintf(dir, sizeof dir, "%s", d);
    snprintf(data_path, sizeof data_path, "%s/text.txt", dir);
    snprintf(ref_path, sizeof ref_path, "%s/ref.safetensors", dir);
    snprintf(ck_path, sizeof ck_path, "%s/ck.safetensors", dir);
    write_text(data_path);

    /* The uninterrupted run; its duration only spreads the kill times. */
    double t0 = now_s();
    int st = wait_exit(spawn_train(ref_path, 0));
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    double t_run = now_s() - t0;
    assert_int_equal(load_step(ref_path), STEPS);

    int kills = getenv("NANOLM_SANITIZED") ? 10 : 50;
    nl_rng rng;
    nl_rng_seed(&rng, 2024);
    int done = 0, mid_write = 0, no_ckpt = 0, chains = 0, finished_before_kill = 0, attempts = 0;
    int64_t last_step = -1;
    while (done < kills || (mid_write == 0 && attempts < kills + 50)) {
        attempts++;
        int resume = exists(ck_path);
        int aim_at_write = attempts % 2 == 0;
        pid_t pid = spawn_train(ck_path, resume);
        double deadline = now_s() + nl_rng_double(&rng) * t_run * 1.2, limit = now_s() + 20 * t_run + 30;
        int killed = 0, exited = 0, status = 0;
        while (!killed && !exited) {
            if (waitpid(pid, &status, WNOHANG) == pid) {
                exited = 1;
                break;
            }
            if (aim_at_write ? writing_now(pid) : now_s() >= deadline) {
                kill(pid, SIGKILL);
                killed = 1;
            } else if (now_s() > limit) {
                kill(pid, SIGKILL);
                fail_msg("nanolm train did not finish in %.0f s", limit - deadline);
            } else {
                usleep(aim_at_write ? 50 : 500);
            }
        }
        if (killed) status = wait_exit(pid);
        if (exited || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            /* Reached the last step before the kill: the chain is complete. */
            assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
            same_as_reference(ck_path);
            finished_before_kill++;
            chains++;
            unlink(ck_path);
            last_step = -1;
            continue;
        }
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        done++;
        if (writing_now(pid)) mid_write++;
        if (!exists(ck_path)) { /* killed before the first checkpoint: nothing to lose */
            no_ckpt++;
            assert_true(last_step < 0);
            continue;
        }
        int64_t step = load_step(ck_path);
        assert_true(step >= EVERY && step <= STEPS && step % EVERY == 0);
        assert_true(step >= last_step); /* a kill never takes the checkpoint back */
        last_step = step;
    }
    /* Finish the open chain. */
    if (exists(ck_path)) {
        st = wait_exit(spawn_train(ck_path, 1));
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        same_as_reference(ck_path);
        chains++;
    }
    print_message("%d SIGKILLs (%d during a checkpoint write, %d before the first checkpoint), %d runs finished "
                  "first; %d resumed chains ended bit-identical to the uninterrupted run; %d temporary files left "
                  "by interrupted writes\n",
                  done, mid_write, no_ckpt, finished_before_kill, chains, count_tmp());
    assert_true(mid_write > 0);
    assert_true(chains >= 1);
    tu_rmdir(dir);
    free(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_and_resume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
