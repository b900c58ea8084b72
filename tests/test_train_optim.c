/* train/: the cosine schedule, gradient clipping, GradScaler semantics, AdamW's decay mask, and
 * bf16/fp16 mixed-precision training end to end. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/train.h"

static void test_cosine_schedule(void **state) {
    (void)state;
    /* warmup 10 to lr 1e-3, cosine to 1e-4 at step 99 */
    assert_float_equal(nl_lr_cosine(0, 10, 100, 1e-3f, 1e-4f), 1e-4f, 1e-9);
    assert_float_equal(nl_lr_cosine(9, 10, 100, 1e-3f, 1e-4f), 1e-3f, 1e-9);
    assert_float_equal(nl_lr_cosine(10, 10, 100, 1e-3f, 1e-4f), 1e-3f, 1e-9);
    /* halfway through the decay: (lr + lr_min) / 2 */
    float mid = nl_lr_cosine(10 + 89 / 2, 10, 100, 1e-3f, 1e-4f);
    assert_true(fabsf(mid - 5.5e-4f) < 1e-5f);
    assert_float_equal(nl_lr_cosine(99, 10, 100, 1e-3f, 1e-4f), 1e-4f, 1e-9);
    for (int s = 11; s < 100; s++)
        assert_true(nl_lr_cosine(s, 10, 100, 1e-3f, 1e-4f) <= nl_lr_cosine(s - 1, 10, 100, 1e-3f, 1e-4f));
}

static void tiny_model(nl_model *m) {
    nl_arch a = tu_arch("t", 16, 8, 1, 2, 1, 12, 8);
    tu_model(m, &a, 3);
    assert_int_equal(nl_model_alloc_grads(m), NL_OK);
}

static void test_grad_clip(void **state) {
    (void)state;
    nl_model m;
    tiny_model(&m);
    double ss = 0;
    for (size_t i = 0; i < m.n_params; i++) {
        m.train->grads[i] = (float)((int)(i % 7) - 3) * 0.5f;
        ss += (double)m.train->grads[i] * m.train->grads[i];
    }
    double norm = nl_grad_clip(&m, 1.0);
    assert_true(fabs(norm - sqrt(ss)) < 1e-6 * sqrt(ss));
    assert_true(fabs(nl_grad_norm(&m) - 1.0) < 1e-5);
    /* below the threshold nothing changes */
    float g0 = m.train->grads[1];
    nl_grad_clip(&m, 10.0);
    assert_true(m.train->grads[1] == g0);
    nl_model_free(&m);
}

/* torch.cuda.amp.GradScaler: init 65536, x0.5 and skip on inf/NaN, x2 after 2000 good steps. */
static void test_grad_scaler(void **state) {
    (void)state;
    nl_loss_scaler s;
    nl_scaler_init(&s);
    assert_true(s.scale == 65536.0f);
    nl_model m;
    tiny_model(&m);
    for (size_t i = 0; i < m.n_params; i++) m.train->grads[i] = 65536.0f * 0.25f;
    assert_int_equal(nl_scaler_unscale(&s, &m), 0);
    assert_true(m.train->grads[0] == 0.25f);
    nl_scaler_update(&s, 0);
    m.train->grads[5] = INFINITY;
    assert_int_equal(nl_scaler_unscale(&s, &m), 1);
    nl_scaler_update(&s, 1);
    assert_true(s.scale == 32768.0f);
    assert_int_equal(s.skipped, 1);
    assert_int_equal(s.good_steps, 0);
    m.train->grads[5] = NAN;
    assert_int_equal(nl_scaler_unscale(&s, &m), 1);
    for (int i = 0; i < 1999; i++) nl_scaler_update(&s, 0);
    assert_true(s.scale == 32768.0f);
    nl_scaler_update(&s, 0);
    assert_true(s.scale == 65536.0f);
    assert_int_equal(s.good_steps, 0);
    nl_model_free(&m);
}

/* Weight decay applies to 2-D weights only: with zero gradients, norms stay, matrices shrink. */
static void test_adamw_decay_mask(void **state) {
    (void)state;
    nl_model m;
    tiny_model(&m);
    nl_adamw opt;
    assert_int_equal(nl_adamw_init(&opt, &m, 0.9f, 0.95f, 1e-8f, 0.5f), NL_OK);
    nl_model_zero_grad(&m);
    const nl_param_info *tab;
    int nt = nl_model_params_table(&m, &tab);
    float before[64];
    for (int k = 0; k < nt; k++) before[k] = m.params[tab[k].offset];
    nl_adamw_step(&opt, &m, 0.1f);
    for (int k = 0; k < nt; k++) {
        float after = m.params[tab[k].offset];
        if (tab[k].ndim == 1)
            assert_true(after == before[k]);
        else
            assert_true(fabsf(after - before[k] * (1.0f - 0.1f * 0.5f)) <= 1e-7f * fabsf(before[k]) + 1e-12f);
    }
    nl_adamw_free(&opt);
    nl_model_free(&m);
}

static char *csv_field(const char *csv, int row, int col) {
    const char *p = csv;
    for (int r = 0; r < row && p; r++) {
        p = strchr(p, '\n');
        if (p) p++;
    }
    assert_non_null(p);
    for (int c = 0; c < col && p; c++) {
        p = strchr(p, ',');
        if (p) p++;
    }
    assert_non_null(p);
    return strndup(p, strcspn(p, ",\n"));
}

/* bf16 / fp16 training runs, differ from fp32 in the last bits but learn the same; fp16 with an
 * oversized initial scale skips steps and halves the scale until gradients fit. */
static void test_mixed_precision_training(void **state) {
    (void)state;
    TU_REQUIRE_DATA(data, "tinyshakespeare/input.txt");
    char *dir = tu_tmpdir(), args[2048], path[512];
    const char *precs[] = {"fp32", "bf16", "fp16"};
    double last[3];
    char *first[3];
    for (int i = 0; i < 3; i++) {
        snprintf(
            args, sizeof args,
            "train --data %s --steps 10 --batch 4 --seq 32 --eval-windows 4 --warmup 2 --precision %s --log %s/%s.csv",
            data, precs[i], dir, precs[i]);
        assert_int_equal(tu_run_cli(args, NULL), 0);
        snprintf(path, sizeof path, "%s/%s.csv", dir, precs[i]);
        char *csv = tu_read_file(path, NULL);
        assert_non_null(csv);
        first[i] = csv_field(csv, 1, 2);
        char *l = csv_field(csv, 10, 2);
        last[i] = atof(l);
        print_message("%s: loss step 1 %s, step 10 %.5f\n", precs[i], first[i], last[i]);
        free(l);
        free(csv);
    }
    /* rounding changes the numbers... */
    assert_string_not_equal(first[0], first[1]);
    assert_string_not_equal(first[0], first[2]);
    /* ...but not the learning: each run drops well below its start, within 2% of fp32 */
    for (int i = 0; i < 3; i++) {
        assert_true(last[i] < atof(first[i]) - 0.4);
        assert_true(fabs(last[i] - last[0]) < 0.02 * last[0]);
        free(first[i]);
    }
    /* fp16, initial scale 2^24: the first steps overflow in fp16, are skipped, the scale halves */
    snprintf(args, sizeof args,
             "train --data %s --steps 10 --batch 4 --seq 32 --eval-windows 4 --warmup 2 --precision fp16 --loss-scale "
             "16777216 --log %s/s.csv",
             data, dir);
    char *out = NULL;
    assert_int_equal(tu_run_cli(args, &out), 0);
    print_message("%s", out);
    assert_non_null(strstr(out, "skipped steps"));
    free(out);
    snprintf(path, sizeof path, "%s/s.csv", dir);
    char *csv = tu_read_file(path, NULL);
    int skipped = 0, good = 0;
    double scale_prev = 16777216.0 * 2;
    for (int r = 1; r <= 10; r++) {
        char *sk = csv_field(csv, r, 6), *sc = csv_field(csv, r, 5);
        double scale = atof(sc);
        if (atoi(sk)) {
            skipped++;
            assert_true(scale <= scale_prev); /* the scale used at a skipped step ... */
        } else {
            good++;
        }
        scale_prev = scale;
        free(sk);
        free(sc);
    }
    char *s1 = csv_field(csv, 1, 6), *sc1 = csv_field(csv, 1, 5), *sc2 = csv_field(csv, 2, 5);
    assert_string_equal(s1, "1");            /* 2^24 overflows fp16 at once */
    assert_true(atof(sc2) == atof(sc1) / 2); /* ... and the next step uses half */
    print_message("fp16 from 2^24: %d skipped, %d applied\n", skipped, good);
    assert_true(skipped >= 1 && good >= 3);
    free(s1);
    free(sc1);
    free(sc2);
    free(csv);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cosine_schedule),
        cmocka_unit_test(test_grad_clip),
        cmocka_unit_test(test_grad_scaler),
        cmocka_unit_test(test_adamw_decay_mask),
        cmocka_unit_test(test_mixed_precision_training),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
