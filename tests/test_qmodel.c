/* model/quantize_model: quantize_model, model_size_bytes, quantized checkpoints; stories260K. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/checkpoint.h"
#include "nanolm/infer.h"
#include "nanolm/model.h"
#include "nanolm/quant_eval.h"
#include "nanolm/quantize_model.h"
#include "nanolm/tokenizer.h"
#include "nanolm/train.h"
#include "quant_check.h"

static void tiny_model(nl_model *m) {
    nl_arch a = tu_arch("tiny", 64, 48, 2, 4, 2, 96, 32);
    tu_model(m, &a, 7);
    QOK(nl_model_alloc_acts(m, 2, 32));
}

static float loss_of(nl_model *m, const int32_t *tok) {
    float loss;
    QOK(nl_model_forward(m, tok, tok + 1, 2, 32, &loss));
    return loss;
}

static void test_quantize_model_synthetic(void **state) {
    (void)state;
    nl_model m;
    tiny_model(&m);
    int32_t tok[2 * 32 + 1];
    nl_rng r;
    nl_rng_seed(&r, 3);
    for (int i = 0; i < 65; i++) tok[i] = (int32_t)nl_rng_below(&r, 64);
    const float l32 = loss_of(&m, tok);
    /* Exact sizes: linear weights per layer (q 48x48, k 24x48, v 24x48, o 48x48, w1 96x48,
     * w3 96x48, w2 48x96) = 2 layers x 16128 weights; 2 x 384 rows. */
    const size_t nlin = 2 * (48 * 48 + 24 * 48 * 2 + 48 * 48 + 96 * 48 * 2 + 48 * 96),
                 rows = 2 * (48 + 24 + 24 + 48 + 96 + 96 + 48);
    /* Blocks of 32 along each row: rows of 48 have 2 (one partial), rows of 96 have 3. */
    const size_t blocks32 = 2 * ((48 + 24 + 24 + 48 + 96 + 96) * 2 + 48 * 3);
    const size_t other = (size_t)(64 * 48 * 2 + 2 * 2 * 48 + 48) * 4; /* embed, classifier, norms */
    size_t lin;
    assert_int_equal(nl_qmodel_size_bytes(&m, NULL, &lin), other + nlin * 4);
    assert_int_equal(lin, nlin * 4);
    const char *schemes[] = {"int8-channel", "int8-tensor", "int8-b32", "int4-b32",
                             "int4-b16",     "mxfp8",       "mxfp4",    "affine-uint8-channel"};
    for (size_t s = 0; s < sizeof schemes / sizeof schemes[0]; s++) {
        nl_quant_spec spec;
        QOK(nl_quant_spec_parse(schemes[s], &spec));
        for (int mode = 0; mode < 2; mode++) {
            if (mode == NL_QLINEAR_W8A8 && s != 0) continue;
            nl_qmodel qm;
            QOK(nl_qmodel_quantize(&qm, &m, &spec, (nl_qlinear_mode)mode));
            size_t total = nl_qmodel_size_bytes(&m, &qm, &lin);
            assert_int_equal(total, other + lin);
            if (s == 0) assert_int_equal(lin, nlin + rows * 4);         /* int8 + fp32 scale per row */
            if (s == 1) assert_int_equal(lin, nlin + 2 * 7 * 4);        /* one scale per tensor */
            if (s == 3) assert_int_equal(lin, nlin / 2 + blocks32 * 4); /* nibbles + a scale per block */
            if (s == 5) assert_int_equal(lin, nlin + blocks32);         /* fp8 + an E8M0 byte per 32 */
            if (s == 6) assert_int_equal(lin, nlin / 2 + blocks32);
            float lq = loss_of(&m, tok);
            double tol = spec.bits >= 8 ? 0.01 : 0.08;
            if (!(fabs(lq - l32) < tol * l32))
                fail_msg("%s mode %d: loss %g vs fp32 %g", schemes[s], mode, (double)lq, (double)l32);
            /* Quantizing twice gives the same loss (deterministic), saving and loading too. */
            char *dir = tu_tmpdir(), path[512];
            snprintf(path, sizeof path, "%s/q.safetensors", dir);
            QOK(nl_qmodel_save(&qm, path, "byte"));
            assert_true(nl_qmodel_is_quantized(path));
            nl_model m2;
            nl_qmodel q2;
            char kind[64];
            QOK(nl_qmodel_load(path, &m2, &q2, kind));
            assert_string_equal(kind, "byte");
            assert_int_equal(nl_qmodel_size_bytes(&m2, &q2, NULL), total);
            QOK(nl_model_alloc_acts(&m2, 2, 32));
            float l2 = loss_of(&m2, tok);
            if (l2 != lq) fail_msg("%s: loaded loss %.9g != %.9g", schemes[s], (double)l2, (double)lq);
            nl_qmodel_free(&q2);
            nl_model_free(&m2);
            tu_rmdir(dir);
            free(dir);
            nl_qmodel_free(&qm);
            /* Freed: the model is fp32 again. */
            assert_true(loss_of(&m, tok) == l32);
        }
    }
    /* Errors: W8A8 needs int8 per channel; a NaN weight names its tensor. */
    nl_quant_spec spec;
    nl_qmodel qm;
    QOK(nl_quant_spec_parse("int4-b32", &spec));
    assert_int_equal(nl_qmodel_quantize(&qm, &m, &spec, NL_QLINEAR_W8A8), NL_ERR_UNSUPPORTED);
    const nl_param_info *p = nl_model_find_param(&m, "model.layers.1.mlp.down_proj.weight");
    assert_non_null(p);
    m.params[p->offset + 5] = NAN;
    QOK(nl_quant_spec_parse("int8-channel", &spec));
    assert_int_equal(nl_qmodel_quantize(&qm, &m, &spec, NL_QLINEAR_W8A8), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "model.layers.1.mlp.down_proj.weight"));
    assert_non_null(strstr(nl_last_error(), "index 5"));
    assert_null(m.linear_ops);
    nl_model_free(&m);
    /* A file that is not a quantized checkpoint. */
    nl_model m3;
    nl_qmodel q3;
    assert_false(nl_qmodel_is_quantized("tests/ref/quant_fixture.json"));
    assert_int_not_equal(nl_qmodel_load("tests/ref/quant_fixture.json", &m3, &q3, NULL), NL_OK);
    assert_non_null(strstr(nl_last_error(), "quant_fixture.json"));
}

/* Greedy tokens after the prompt (the first n), from an fp32 cache. */
static void greedy(const nl_model *m, const int *ids, int64_t np, int n, int *out) {
    nl_decode_state st;
    QOK(nl_decode_state_init(&st, m, NL_KV_FP32));
    int token = ids[0], k = 0;
    for (int64_t pos = 0; k < n; pos++) {
        float *logits = nl_model_step(m, &st, token, pos);
        assert_non_null(logits);
        int next = pos < np - 1 ? ids[pos + 1] : nl_model_sample(logits, m->V, 0.0f, NULL);
        if (pos >= np - 1) out[k++] = next;
        token = next;
    }
    nl_decode_state_free(&st);
}

/* The real model: int8 per channel (W8A8) on stories260K changes the mean loss on the first
 * 16,384 tokens of tinystories_head.txt by < 1% and keeps the first 20 greedy tokens. */
static void test_stories260k(void **state) {
    (void)state;
    TU_REQUIRE_DATA(bin, "stories260K/stories260K.bin");
    TU_REQUIRE_DATA(tokp, "stories260K/tok512.bin");
    TU_REQUIRE_DATA(txt, "tinystories/tinystories_head.txt");
    nl_model m;
    nl_tokenizer tok;
    QOK(nl_ckpt_load_model(bin, &m, NULL));
    QOK(nl_tokenizer_load_llama2c(&tok, tokp, (int)m.V));
    char *text;
    size_t bytes;
    QOK(nl_read_file(txt, &text, &bytes));
    int *ids, *pids;
    int64_t n, np;
    QOK(nl_tokenizer_encode(&tok, text, bytes, 1, 0, &ids, &n));
    QOK(nl_tokenizer_encode(&tok, "Once upon a time", 16, 1, 0, &pids, &np));
    if (n > 16384) n = 16384;
    QOK(nl_model_alloc_acts(&m, 4, 512));
    double l32, lq;
    int64_t scored;
    QOK(nl_eval_loss_tokens(&m, ids, n, 4, 512, &l32, &scored));
    int g32[20], gq[20];
    greedy(&m, pids, np, 20, g32);
    /* The fp32 model's own continuation (documented in the data README) as a sanity anchor. */
    char *dec;
    size_t dn;
    QOK(nl_tokenizer_decode(&tok, g32, 20, &dec, &dn));
    assert_non_null(strstr(dec, "there was a little girl named Lily"));
    nl_free(dec);
    nl_quant_spec spec;
    QOK(nl_quant_spec_parse("int8-channel", &spec));
    nl_qmodel qm;
    QOK(nl_qmodel_quantize(&qm, &m, &spec, NL_QLINEAR_W8A8));
    size_t lin32, linq;
    nl_qmodel_size_bytes(&m, NULL, &lin32);
    nl_qmodel_size_bytes(&m, &qm, &linq);
    /* 226,560 int8 weights + 3,000 fp32 row scales. */
    assert_int_equal(lin32, 226560 * 4);
    assert_int_equal(linq, 226560 + 3000 * 4);
    QOK(nl_eval_loss_tokens(&m, ids, n, 4, 512, &lq, &scored));
    greedy(&m, pids, np, 20, gq);
    print_message("[  INFO    ] stories260K: fp32 loss %.4f, int8-channel W8A8 %.4f (%+.3f%%), linear %.2fx smaller\n",
                  l32, lq, 100 * (lq - l32) / l32, (double)lin32 / (double)linq);
    assert_true(fabs(lq - l32) < 0.01 * l32);
    assert_memory_equal(g32, gq, sizeof g32);
    nl_qmodel_free(&qm);
    nl_free(ids);
    nl_free(pids);
    nl_free(text);
    nl_tokenizer_free(&tok);
    nl_model_free(&m);
}

/* What `quant model` measures, as the library runs it: the model as loaded, each scheme applied to
 * it (int8 per channel in W8A8, the others weight-only), a written scheme loaded back. */
static void test_quant_model_steps(void **state) {
    (void)state;
    TU_REQUIRE_DATA(bin, "stories260K/stories260K.bin");
    TU_REQUIRE_DATA(tokp, "stories260K/tok512.bin");
    TU_REQUIRE_DATA(txt, "tinystories/tinystories_head.txt");
    nl_quant_spec s8, s8t, s4;
    QOK(nl_quant_spec_parse("int8-channel", &s8));
    QOK(nl_quant_spec_parse("int8-tensor", &s8t));
    QOK(nl_quant_spec_parse("int4-b32", &s4));
    assert_true(nl_qmodel_w8a8_ok(&s8));
    assert_false(nl_qmodel_w8a8_ok(&s8t));
    assert_false(nl_qmodel_w8a8_ok(&s4));
    nl_model m;
    nl_tokenizer tok;
    nl_qmodel lq;
    int quantized = -1;
    char tkind[64];
    QOK(nl_qmodel_open(bin, tokp, 0, &m, &tok, &lq, &quantized, tkind));
    assert_int_equal(quantized, 0);
    assert_string_equal(tkind, "tok512");
    nl_qeval_input in = {.B = 2, .T = 128, .n_gen = 20};
    QOK(nl_qeval_input_load(&tok, txt, "Once upon a time", 600, &in));
    assert_int_equal(in.n, 600);
    assert_true(in.np > 1);
    QOK(nl_model_alloc_acts(&m, in.B, in.T));
    nl_quant_eval rows[3];
    memset(rows, 0, sizeof rows);
    QOK(nl_quant_eval_loaded(&m, NULL, &tok, &in, &rows[0]));
    assert_string_equal(rows[0].scheme, "fp32");
    assert_string_equal(rows[0].mode, "fp32");
    assert_int_equal(rows[0].linear_bytes, 226560 * 4);
    assert_int_equal(rows[0].n_gen, 20);
    assert_non_null(strstr(rows[0].text, "Lily"));
    char *dir = tu_tmpdir(), out[1100];
    snprintf(out, sizeof out, "%s/q.safetensors", dir);
    QOK(nl_quant_eval_scheme(&m, &s8, NL_QLINEAR_W8A8, &tok, &in, out, tkind, &rows[1]));
    assert_string_equal(rows[1].scheme, "int8-channel");
    assert_string_equal(rows[1].mode, "w8a8");
    assert_int_equal(rows[1].linear_bytes, 226560 + 3000 * 4);
    assert_true(fabs(rows[1].loss - rows[0].loss) < 0.01 * rows[0].loss);
    QOK(nl_quant_eval_scheme(&m, &s4, NL_QLINEAR_W8A8, &tok, &in, NULL, tkind, &rows[2]));
    assert_string_equal(rows[2].mode, "weight-only"); /* W8A8 is for int8 per channel only */
    nl_quant_eval_shared(rows, 3);
    assert_int_equal(rows[0].shared, 20);
    assert_int_equal(rows[1].shared, 20);
    nl_quant_eval fp32_again;
    QOK(nl_quant_eval_loaded(&m, NULL, &tok, &in, &fp32_again)); /* the schemes gave the fp32 weights back */
    assert_true(fp32_again.loss == rows[0].loss);
    nl_tokenizer_free(&tok);
    nl_model_free(&m);
    /* the written scheme, loaded back: it names its tokenizer, which must then be given */
    assert_int_equal(nl_qmodel_open(out, NULL, 0, &m, &tok, &lq, &quantized, tkind), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "tok512 tokenizer"));
    QOK(nl_qmodel_open(out, tokp, 0, &m, &tok, &lq, &quantized, tkind));
    assert_int_equal(quantized, 1);
    QOK(nl_model_alloc_acts(&m, in.B, in.T));
    nl_quant_eval back;
    QOK(nl_quant_eval_loaded(&m, &lq, &tok, &in, &back));
    assert_string_equal(back.scheme, "int8-channel (loaded)");
    assert_string_equal(back.mode, "w8a8");
    assert_true(fabs(back.loss - rows[1].loss) < 1e-3 * rows[1].loss);
    nl_qeval_input_free(&in);
    /* a text of one token (BOS) cannot be evaluated */
    char empty[1100];
    snprintf(empty, sizeof empty, "%s/empty.txt", dir);
    FILE *f = fopen(empty, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(nl_qeval_input_load(&tok, empty, "Once", 0, &in), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "empty.txt"));
    nl_qeval_input_free(&in);
    nl_qmodel_free(&lq);
    nl_tokenizer_free(&tok);
    nl_model_free(&m);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quant_model_steps),
        cmocka_unit_test(test_quantize_model_synthetic),
        cmocka_unit_test(test_stories260k),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
