/* train/qat: fake-quantized linears with the straight-through estimator. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "nanolm/qat.h"
#include "nanolm/tokenizer.h"
#include "nanolm/train.h"

static void tiny_arch(nl_arch *a, int64_t vocab) { *a = tu_arch("tiny", vocab, 64, 2, 4, 2, 96, 32); }

static void parse(void **state) {
    (void)state;
    nl_quant_spec s;
    assert_int_equal(nl_qat_parse("int4-g32", &s), NL_OK);
    assert_int_equal(s.bits, 4);
    assert_int_equal(s.gran, NL_QUANT_PER_BLOCK);
    assert_int_equal(s.block, 32);
    assert_int_equal(nl_qat_parse("int8-channel", &s), NL_OK);
    assert_int_equal(s.gran, NL_QUANT_PER_CHANNEL);
    assert_int_equal(nl_qat_parse("int4-g0", &s), NL_ERR_INVALID);
    assert_int_equal(nl_qat_parse("int9-g32", &s), NL_ERR_INVALID);
    assert_int_equal(nl_qat_parse("int4-g32x", &s), NL_ERR_INVALID);
    assert_int_equal(nl_qat_parse("fp4", &s), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "fp4"));
}

/* With the hook, loss and every gradient equal those of the plain fp32 model whose linear
 * weights were replaced by their quantized values (STE: dL/dw := dL/dw^); the master weights are
 * not modified; the gradients differ from the full-precision model's own. */
static void ste_gradients(void **state) {
    (void)state;
    const int64_t B = 3, T = 32;
    nl_arch a;
    tiny_arch(&a, 64);
    nl_model m, r;
    assert_int_equal(nl_model_init(&m, &a), NL_OK);
    assert_int_equal(nl_model_init(&r, &a), NL_OK);
    nl_model_init_random(&m, 11);
    memcpy(r.params, m.params, m.n_params * sizeof(float));
    assert_int_equal(nl_model_alloc_grads(&m), NL_OK);
    assert_int_equal(nl_model_alloc_acts(&m, B, T), NL_OK);
    assert_int_equal(nl_model_alloc_grads(&r), NL_OK);
    assert_int_equal(nl_model_alloc_acts(&r, B, T), NL_OK);
    int32_t x[3 * 32], y[3 * 32];
    nl_rng g;
    nl_rng_seed(&g, 3);
    for (int i = 0; i < B * T; i++) {
        x[i] = (int32_t)nl_rng_below(&g, 64);
        y[i] = (int32_t)nl_rng_below(&g, 64);
    }
    /* full precision */
    float loss_fp;
    nl_model_zero_grad(&m);
    assert_int_equal(nl_model_forward(&m, x, y, B, T, &loss_fp), NL_OK);
    assert_int_equal(nl_model_backward(&m), NL_OK);
    float *g_fp = malloc(m.n_params * sizeof(float));
    memcpy(g_fp, m.train->grads, m.n_params * sizeof(float));
    float *master = malloc(m.n_params * sizeof(float));
    memcpy(master, m.params, m.n_params * sizeof(float));

    nl_quant_spec s;
    assert_int_equal(nl_qat_parse("int4-g32", &s), NL_OK);
    nl_qat q;
    assert_int_equal(nl_qat_install(&q, &m, &s), NL_OK);
    float loss_q;
    nl_model_zero_grad(&m);
    assert_int_equal(nl_model_forward(&m, x, y, B, T, &loss_q), NL_OK);
    assert_int_equal(nl_model_backward(&m), NL_OK);
    assert_int_equal(nl_qat_status(&q), NL_OK);
    assert_int_equal(q.fake_quant_calls, m.L * 4);
    assert_memory_equal(master, m.params, m.n_params * sizeof(float));

    assert_int_equal(nl_qat_rtn_inplace(&r, &s), NL_OK);
    float loss_r;
    nl_model_zero_grad(&r);
    assert_int_equal(nl_model_forward(&r, x, y, B, T, &loss_r), NL_OK);
    assert_int_equal(nl_model_backward(&r), NL_OK);

    double gmax = 0, diff = 0, dfp = 0;
    for (size_t i = 0; i < m.n_params; i++) {
        gmax = fmax(gmax, fabs(r.train->grads[i]));
        diff = fmax(diff, fabs(m.train->grads[i] - r.train->grads[i]));
        dfp = fmax(dfp, fabs(m.train->grads[i] - g_fp[i]));
    }
    print_message("loss fp32 %.6f, QAT %.6f, fp32 at quantized weights %.6f; max |g_qat - g_at_wq| %.3g, "
                  "max |g_qat - g_fp32| %.3g (max |g| %.3g)\n",
                  loss_fp, loss_q, loss_r, diff, dfp, gmax);
    assert_true(fabs(loss_q - loss_r) <= 1e-6 * fabs(loss_r));
    assert_true(diff <= 1e-6 * gmax);
    assert_true(loss_q != loss_fp); /* quantization changed the forward */
    assert_true(dfp > 1e-4 * gmax); /* and the gradients */
    /* the quantized weights are on the int4 grid: at most 15 distinct values per group of 32 */
    const float *wq0 = r.params + m.table[2].offset; /* layer 0 q_proj, first row, first group */
    int distinct = 0;
    for (int i = 0; i < 32; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++) seen |= wq0[j] == wq0[i];
        distinct += !seen;
    }
    assert_true(distinct <= 15);
    /* removed: back to fp32 exactly */
    nl_qat_remove(&q);
    assert_null(m.linear_ops);
    float loss_back;
    assert_int_equal(nl_model_forward(&m, x, y, B, T, &loss_back), NL_OK);
    assert_true(loss_back == loss_fp);
    /* bf16 is refused */
    assert_int_equal(nl_model_set_precision(&m, NL_PREC_BF16), NL_OK);
    assert_int_equal(nl_qat_install(&q, &m, &s), NL_ERR_INVALID);
    free(g_fp);
    free(master);
    nl_model_free(&m);
    nl_model_free(&r);
}

/* A tiny byte model trained briefly on tinyshakespeare; int3-g32 RTN costs loss. 60 QAT steps
 * from its weights bring the fake-quantized validation loss below RTN's at the start, and below
 * RTN of a control that fine-tuned the same 60 steps in fp32. */
static void qat_recovers(void **state) {
    (void)state;
    TU_REQUIRE_DATA(text, "tinyshakespeare/input.txt");
    char *dir = tu_tmpdir();
    char base[512];
    snprintf(base, sizeof base, "%s/base.safetensors", dir);
    nl_tokenizer tok;
    nl_data d;
    assert_int_equal(nl_tokenizer_init_byte(&tok), NL_OK);
    assert_int_equal(nl_data_open(&d, text, &tok), NL_OK);
    nl_tokenizer_free(&tok);
    nl_arch a;
    tiny_arch(&a, 256);
    nl_train_opts o;
    nl_train_opts_default(&o);
    o.steps = 300;
    o.batch = 8;
    o.seq = 32;
    o.warmup = 20;
    o.lr = 3e-3f;
    o.lr_min = 3e-4f;
    o.eval_every = 0;
    o.eval_windows = 8;
    o.out = base;
    nl_trainer t;
    assert_int_equal(nl_trainer_init(&t, &a, &o), NL_OK);
    assert_int_equal(nl_trainer_run(&t, &o, &d, NULL, NULL), NL_OK);
    nl_trainer_free(&t);

    nl_quant_spec s;
    assert_int_equal(nl_qat_parse("int3-g32", &s), NL_OK);
    const int64_t W = 100; /* validation windows of 32 */
    nl_train_opts f = o;
    f.out = NULL;
    f.init_weights = base;
    f.steps = 60;
    f.warmup = 6;
    f.lr = 1e-3f;
    f.lr_min = 1e-4f;
    f.seed = 7;
    /* QAT */
    double fp_start, rtn_start, qat_end, ctrl_fp, ctrl_rtn;
    assert_int_equal(nl_trainer_init(&t, &a, &f), NL_OK);
    assert_int_equal(t.step, 0);
    assert_int_equal(nl_eval_loss(&t.model, &d, NL_DATA_VAL, f.batch, f.seq, W, &fp_start, NULL), NL_OK);
    nl_qat q;
    assert_int_equal(nl_qat_install(&q, &t.model, &s), NL_OK);
    assert_int_equal(nl_eval_loss(&t.model, &d, NL_DATA_VAL, f.batch, f.seq, W, &rtn_start, NULL), NL_OK);
    assert_int_equal(nl_trainer_run(&t, &f, &d, NULL, NULL), NL_OK);
    assert_int_equal(nl_eval_loss(&t.model, &d, NL_DATA_VAL, f.batch, f.seq, W, &qat_end, NULL), NL_OK);
    assert_int_equal(nl_qat_status(&q), NL_OK);
    nl_qat_remove(&q);
    /* the hook's forward is RTN of the master weights, exactly */
    double qat_rtn;
    assert_int_equal(nl_qat_rtn_inplace(&t.model, &s), NL_OK);
    assert_int_equal(nl_eval_loss(&t.model, &d, NL_DATA_VAL, f.batch, f.seq, W, &qat_rtn, NULL), NL_OK);
    nl_trainer_free(&t);
    /* control: the same steps in fp32, then RTN */
    assert_int_equal(nl_trainer_init(&t, &a, &f), NL_OK);
    assert_int_equal(nl_trainer_run(&t, &f, &d, NULL, NULL), NL_OK);
    assert_int_equal(nl_eval_loss(&t.model, &d, NL_DATA_VAL, f.batch, f.seq, W, &ctrl_fp, NULL), NL_OK);
    assert_int_equal(nl_qat_rtn_inplace(&t.model, &s), NL_OK);
    assert_int_equal(nl_eval_loss(&t.model, &d, NL_DATA_VAL, f.batch, f.seq, W, &ctrl_rtn, NULL), NL_OK);
    nl_trainer_free(&t);
    print_message("int3-g32: start fp32 %.4f RTN %.4f; after 60 steps: QAT %.4f (RTN of its weights %.4f), "
                  "fp32 control %.4f, its RTN %.4f\n",
                  fp_start, rtn_start, qat_end, qat_rtn, ctrl_fp, ctrl_rtn);
    assert_true(rtn_start > fp_start);
    assert_true(qat_end < rtn_start);
    assert_true(qat_end < ctrl_rtn);
    assert_true(fabs(qat_rtn - qat_end) < 1e-5);

    /* the CLI: a QAT run from the checkpoint reports the losses */
    char args[2048], *out = NULL;
    snprintf(args, sizeof args,
             "train --data %s --qat int4-g32 --resume-weights %s --steps 3 --batch 2 --seq 32 --eval-windows 4 --json",
             text, base);
    int rc = tu_run_cli(args, &out);
    assert_int_equal(rc, 0);
    cJSON *j = cJSON_Parse(strchr(out, '{'));
    assert_non_null(j);
    cJSON *qj = cJSON_GetObjectItem(j, "qat");
    assert_non_null(qj);
    assert_string_equal(cJSON_GetObjectItem(qj, "scheme")->valuestring, "int4-g32");
    assert_true(cJSON_GetObjectItem(qj, "val_loss_rtn_start")->valuedouble > 0);
    assert_true(isfinite(cJSON_GetObjectItem(qj, "val_loss_qat_end")->valuedouble));
    assert_int_equal((int)cJSON_GetObjectItem(j, "steps")->valuedouble, 3);
    cJSON_Delete(j);
    free(out);
    snprintf(args, sizeof args, "train --data %s --qat int4-g32 --precision bf16 --resume-weights %s", text, base);
    assert_int_equal(tu_run_cli(args, &out), 2);
    assert_non_null(strstr(out, "--qat"));
    free(out);
    snprintf(args, sizeof args, "train --data %s --qat fp5", text);
    assert_int_equal(tu_run_cli(args, &out), 2);
    assert_non_null(strstr(out, "fp5"));
    free(out);
    snprintf(args, sizeof args, "train --data %s --resume %s --resume-weights %s", text, base, base);
    assert_int_equal(tu_run_cli(args, &out), 2);
    free(out);
    nl_data_free(&d);
    tu_rmdir(dir);
    free(dir);
}

/* The recovered fraction is reported only where it measures recovery: RTN must cost something,
 * and training must not move the fp32 loss by more than that (a few steps from a random init
 * printed "-17836.6% of RTN's delta recovered"). */
static void recovered_fraction(void **state) {
    (void)state;
    nl_qat_recovery r = nl_qat_recovered(2.0, 2.1, 2.02, 2.01);
    assert_null(r.why);
    assert_true(fabs(r.fraction - 0.8) < 1e-12);
    assert_true(fabs(r.rtn_delta - 0.1) < 1e-12 && fabs(r.fp32_drift - 0.01) < 1e-12);
    r = nl_qat_recovered(2.0, 2.1, 2.15, 2.05); /* QAT made it worse: a negative fraction, reported */
    assert_null(r.why);
    assert_true(fabs(r.fraction + 0.5) < 1e-12);
    /* random init, 3 steps: RTN changes nothing measurable, training drops the loss a lot */
    r = nl_qat_recovered(5.5452, 5.54525, 4.6, 4.59);
    assert_true(isnan(r.fraction));
    assert_non_null(strstr(r.why, "nothing to recover"));
    r = nl_qat_recovered(4.0, 4.1, 3.0, 3.0);
    assert_true(isnan(r.fraction));
    assert_non_null(strstr(r.why, "training moved the fp32 loss"));
    r = nl_qat_recovered(4.0, NAN, 3.0, 3.0);
    assert_true(isnan(r.fraction));
    assert_non_null(strstr(r.why, "not finite"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(recovered_fraction),
        cmocka_unit_test(parse),
        cmocka_unit_test(ste_gradients),
        cmocka_unit_test(qat_recovers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
