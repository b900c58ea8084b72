/* One trainer: `nanolm train` with a parallel layout of size 1 (--dp 1 with every ZeRO level,
 * --tp 1 --pp 1) runs the same loop, schedule, clipping and AdamW as `nanolm train` alone, so its
 * per-step training losses, gradient norms, learning rates and validation losses are
 * bit-identical (compared as the %.9g text of the CSV log, which round-trips a float). The layout
 * refuses what it does not support with a message naming it. The expert-parallel layout (moe train)
 * of one rank gives the same log as the plain trainer on the same MoE model. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/moe.h"
#include "nanolm/moe_ep.h"
#include "nanolm/par_run.h"
#include "nanolm/tokenizer.h"

#define SHAKES "tinyshakespeare/input.txt"
#define OPTS   "--steps 6 --batch 4 --seq 32 --eval-windows 4 --warmup 2 --eval-every 3"

/* The log without its last column (tokens/s, a wall-clock figure). */
static char *log_without_speed(const char *path) {
    char *text = tu_read_file(path, NULL);
    assert_non_null(text);
    char *res = calloc(1, strlen(text) + 1), *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *comma = strrchr(line, ',');
        if (comma) *comma = '\0';
        strcat(res, line);
        strcat(res, "\n");
    }
    free(text);
    return res;
}

static void test_layouts_of_size_1_bit_identical(void **state) {
    (void)state;
    TU_REQUIRE_DATA(data, SHAKES);
    char *dir = tu_tmpdir(), args[2048], path[512];
    snprintf(args, sizeof args, "train --data %s " OPTS " --log %s/plain.csv", data, dir);
    assert_int_equal(tu_run_cli(args, NULL), 0);
    snprintf(path, sizeof path, "%s/plain.csv", dir);
    char *ref = log_without_speed(path);
    print_message("one process:\n%s", ref);
    assert_non_null(strstr(ref, "\n6,")); /* six steps */
    const char *layouts[] = {"--dp 1",          "--dp 1 --zero 1",      "--dp 1 --zero 2",
                             "--dp 1 --zero 3", "--tp 1 --pp 1 --dp 1", "--dp 1 --no-overlap"};
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        snprintf(args, sizeof args, "train --data %s " OPTS " %s --log %s/layout%zu.csv", data, layouts[i], dir, i);
        char *out = NULL;
        int rc = tu_run_cli(args, &out);
        if (rc) print_message("%s\n", out);
        assert_int_equal(rc, 0);
        free(out);
        snprintf(path, sizeof path, "%s/layout%zu.csv", dir, i);
        char *got = log_without_speed(path);
        if (strcmp(got, ref)) print_message("%s:\n%s", layouts[i], got);
        assert_string_equal(got, ref);
        free(got);
    }
    free(ref);
    tu_rmdir(dir);
    free(dir);
}

static void expect_refused(const char *args, const char *needle) {
    char *out = NULL;
    int rc = tu_run_cli(args, &out);
    print_message("nanolm %s -> %d: %s", args, rc, out ? out : "");
    assert_int_not_equal(rc, 0);
    assert_non_null(out);
    assert_non_null(strstr(out, needle));
    free(out);
}

static void test_layout_refusals_are_named(void **state) {
    (void)state;
    TU_REQUIRE_DATA(data, SHAKES);
    char args[2048];
    snprintf(args, sizeof args, "train --data %s " OPTS " --dp 1 --precision bf16", data);
    expect_refused(args, "does not support a precision other than fp32");
    snprintf(args, sizeof args, "train --data %s " OPTS " --dp 1 --grad-accum 2", data);
    expect_refused(args, "does not support gradient accumulation");
}

/* The same floats, NaN equal to NaN (validation losses at steps without validation). */
static int same_float(float a, float b) { return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0; }

/* `moe train` runs nl_trainer_run through the expert-parallel layout's hooks: one rank (ep 1) with
 * a warmup, a cosine decay, clipping and validation gives the plain trainer's log bit for bit on
 * the same MoE model (loss, learning rate, gradient norm, validation loss per step). */
static void test_moe_layout_of_size_1_bit_identical(void **state) {
    (void)state;
    TU_REQUIRE_DATA(path, SHAKES);
    nl_arch a;
    assert_int_equal(nl_moe_preset("moe-course-tiny", &a), NL_OK);
    nl_train_opts o;
    nl_train_opts_default(&o);
    o.steps = 6, o.batch = 2, o.seq = 32, o.warmup = 2, o.eval_every = 3, o.eval_windows = 4;
    if (a.seq_len < o.seq) a.seq_len = o.seq;
    nl_tokenizer tok;
    nl_data d;
    assert_int_equal(nl_tokenizer_init_byte(&tok), NL_OK);
    assert_int_equal(nl_data_open(&d, path, &tok), NL_OK);
    nl_trainer plain;
    assert_int_equal(nl_trainer_init(&plain, &a, &o), NL_OK);
    assert_non_null(plain.model.moe);
    assert_int_equal(nl_trainer_run(&plain, &o, &d, NULL, NULL), NL_OK);
    assert_int_equal(nl_comm_init(NULL, NULL), NL_OK);
    nl_ep_opts eo;
    nl_ep_opts_default(&eo);
    eo.train = o;
    eo.aux_coef = plain.model.moe->aux_coef, eo.capacity_factor = plain.model.moe->capacity_factor;
    nl_ep_trainer ep;
    assert_int_equal(nl_ep_init(&ep, &a, &eo, nl_comm_world()), NL_OK);
    nl_train_layout L;
    nl_ep_layout(&ep, &L);
    nl_trainer lt;
    assert_int_equal(nl_trainer_init_layout(&lt, &o, &L), NL_OK);
    assert_int_equal(nl_trainer_run(&lt, &o, &d, NULL, NULL), NL_OK);
    assert_int_equal(lt.n_log, 6);
    assert_int_equal(plain.n_log, 6);
    int n_val = 0;
    for (int64_t i = 0; i < 6; i++) {
        const nl_train_log *x = &plain.log[i], *y = &lt.log[i];
        print_message("step %lld: loss %.9g / %.9g, lr %.9g / %.9g, norm %.9g / %.9g, val %.9g / %.9g\n",
                      (long long)x->step, x->loss, y->loss, x->lr, y->lr, x->grad_norm, y->grad_norm, x->val_loss,
                      y->val_loss);
        assert_true(same_float(x->loss, y->loss));
        assert_true(same_float(x->lr, y->lr));
        assert_true(same_float(x->grad_norm, y->grad_norm));
        assert_true(same_float(x->val_loss, y->val_loss));
        n_val += !isnan(x->val_loss);
    }
    assert_int_equal(n_val, 2);
    assert_true(plain.log[0].lr < plain.log[1].lr && plain.log[5].lr < plain.log[2].lr); /* warmup, then decay */
    nl_trainer_free(&lt);
    nl_ep_free(&ep);
    nl_comm_finalize();
    nl_trainer_free(&plain);
    nl_data_free(&d);
    nl_tokenizer_free(&tok);
}

/* One rank's run in this process: DDP of one rank trains through the probe (its hook called at
 * every step); a missing data file and a layout the ranks cannot hold name their part. */
static int hook_calls;
static void count_hook(void *user, int64_t step) {
    (void)step;
    (*(int *)user)++;
}
static void test_run_one_rank(void **state) {
    (void)state;
    assert_int_equal(nl_comm_init(NULL, NULL), NL_OK);
    nl_arch a;
    assert_int_equal(nl_arch_preset("shakespeare-char", &a), NL_OK);
    a.dim = 32, a.n_layers = 1, a.n_heads = a.n_kv_heads = 2, a.hidden_dim = 64, a.seq_len = 32;
    nl_dist_opts o;
    nl_dist_opts_default(&o);
    o.train.steps = 2, o.train.batch = 2, o.train.seq = 32, o.train.eval_every = 0, o.train.eval_windows = 1;
    o.train.tokenizer = "byte";
    nl_par_run x;
    nl_par_run_part part;
    hook_calls = 0;
    assert_int_equal(nl_par_run_open(&x, nl_comm_world(), &a, &o, 1, 1, 1, 1, NL_PIPE_GPIPE,
                                     tu_committed_data("tinyshakespeare/input.txt"), count_hook, &hook_calls, &part),
                     NL_OK);
    assert_int_equal(x.mp, 0);
    assert_int_equal(x.tn.step, 0);
    assert_int_equal(nl_trainer_run(&x.tn, &o.train, &x.d, NULL, NULL), NL_OK);
    assert_int_equal(x.tn.step, 2);
    assert_int_equal(hook_calls, 2);
    assert_true(isfinite(x.tn.log[1].loss));
    nl_par_run_free(&x);
    assert_int_not_equal(
        nl_par_run_open(&x, nl_comm_world(), &a, &o, 1, 1, 1, 1, NL_PIPE_GPIPE, "/no/such/file", NULL, NULL, &part),
        NL_OK);
    assert_int_equal(part, NL_PAR_RUN_DATA);
    nl_par_run_free(&x);
    assert_int_not_equal(nl_par_run_open(&x, nl_comm_world(), &a, &o, 1, 2, 1, 1, NL_PIPE_GPIPE,
                                         tu_committed_data("tinyshakespeare/input.txt"), NULL, NULL, &part),
                         NL_OK);
    assert_int_equal(part, NL_PAR_RUN_LAYOUT);
    assert_int_equal(x.mp, 1);
    nl_par_run_free(&x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_one_rank), /* before the MoE test, which finalizes MPI */
        cmocka_unit_test(test_layouts_of_size_1_bit_identical),
        cmocka_unit_test(test_layout_refusals_are_named),
        cmocka_unit_test(test_moe_layout_of_size_1_bit_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
