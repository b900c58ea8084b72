/* model/infer: the decode state and its int8 KV cache (per head, per token absmax, fp16 scales);
 * several decode states over one model. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "nanolm/formats.h"
#include "nanolm/infer.h"
#include "nanolm/kvcache.h"
#include "nanolm/model.h"

/* vocab 64, dim 64, 2 layers, 4 heads, 2 KV heads (hd 16), seq 32. */
static void tiny(nl_model *m) {
    nl_arch a = tu_arch("tiny", 64, 64, 2, 4, 2, 96, 32);
    tu_model(m, &a, 21);
}

/* Exact bytes; fp32-cache steps match the batched forward; the int8 cache stores each head's
 * K and V of a token as round(x / s), s = fp16(max|x| / 127), and its logits stay close to
 * fp32's without being equal. */
static void int8_cache(void **state) {
    (void)state;
    const int64_t T = 32;
    nl_model m;
    tiny(&m);
    const int64_t L = m.L, S = m.arch.seq_len, KVH = m.KVH, hd = m.hd, NH = m.NH, V = m.V;
    int32_t x[32];
    nl_rng g;
    nl_rng_seed(&g, 4);
    for (int i = 0; i < T; i++) x[i] = (int32_t)nl_rng_below(&g, (uint64_t)V);
    assert_int_equal(nl_model_alloc_acts(&m, 1, T), NL_OK);
    assert_int_equal(nl_model_forward(&m, x, NULL, 1, T, NULL), NL_OK);
    float *ref = malloc(sizeof(float) * (size_t)(T * V));
    memcpy(ref, m.train->a.logits, sizeof(float) * (size_t)(T * V));

    nl_decode_state st;
    assert_int_equal(nl_decode_state_init(&st, &m, NL_KV_FP32), NL_OK);
    assert_int_equal(st.kv_bytes, (size_t)(L * 2 * S * KVH * hd * 4));
    double d32 = 0, amax = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *lg = nl_model_step(&m, &st, x[t], t);
        assert_non_null(lg);
        for (int64_t v = 0; v < V; v++) {
            d32 = fmax(d32, fabs(lg[v] - ref[t * V + v]));
            amax = fmax(amax, fabs(ref[t * V + v]));
        }
    }
    nl_decode_state_free(&st);
    assert_int_equal(nl_decode_state_init(&st, &m, NL_KV_INT8), NL_OK);
    assert_int_equal(st.kv_dtype, NL_KV_INT8);
    assert_null(st.kv_cache);
    /* codes (1 byte) + one fp16 scale per head and token: exactly half of fp16 for the codes */
    assert_int_equal(st.kv_bytes, (size_t)(L * 2 * S * KVH * hd + L * 2 * S * KVH * 2));
    double d8 = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *lg = nl_model_step(&m, &st, x[t], t);
        assert_non_null(lg);
        for (int64_t v = 0; v < V; v++) d8 = fmax(d8, fabs(lg[v] - ref[t * V + v]));
        /* st.q holds the last layer's rotated q | k | v of this token: check its cache entries */
        const int64_t l = L - 1, kvd = KVH * hd;
        for (int kv = 0; kv < 2; kv++) {
            const float *src = st.q + (NH + kv * KVH) * hd;
            const int8_t *codes = st.kv_codes + ((l * 2 + kv) * S + t) * kvd;
            const uint16_t *sc = st.kv_scales + ((l * 2 + kv) * S + t) * KVH;
            for (int64_t h = 0; h < KVH; h++) {
                float hmax = 0;
                for (int64_t i = 0; i < hd; i++) hmax = fmaxf(hmax, fabsf(src[h * hd + i]));
                float s = nl_fmt_decode(NL_FMT_FP16, sc[h]);
                assert_true(s == nl_fmt_round(NL_FMT_FP16, hmax / 127.0f));
                int top = 0;
                for (int64_t i = 0; i < hd; i++) {
                    int c = codes[h * hd + i];
                    assert_true(c >= -127 && c <= 127);
                    top = abs(c) > top ? abs(c) : top;
                    /* round to nearest (clamped at 127 when the fp16 scale rounded down) */
                    float err = fabsf((float)c * s - src[h * hd + i]);
                    assert_true(err <= 0.5f * s * 1.0001f || abs(c) == 127);
                }
                assert_true(top >= 126); /* absmax: the largest value lands on the edge of the grid */
            }
        }
    }
    print_message(
        "max |logit - batched| fp32 cache %.3g, int8 cache %.3g (max |logit| %.3g); bytes fp32 %zu int8 %zu\n", d32, d8,
        amax, (size_t)(L * 2 * S * KVH * hd * 4), st.kv_bytes);
    assert_true(d32 <= 1e-4 * amax);
    assert_true(d8 > d32);
    assert_true(d8 <= 0.05 * amax);
    nl_decode_state_free(&st);
    assert_int_equal(nl_decode_state_init(&st, &m, (nl_kv_dtype)7), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "KV cache type 7"));
    assert_null(st.mem);
    free(ref);
    nl_model_free(&m);
}

/* Greedy decoding of prompt (np tokens) to n positions through one decode state: the tokens
 * (prompt, then generated) into out. */
static void greedy_alone(const nl_model *m, nl_kv_dtype dt, const int32_t *prompt, int64_t np, int64_t n,
                         int32_t *out) {
    nl_decode_state st;
    assert_int_equal(nl_decode_state_init(&st, m, dt), NL_OK);
    out[0] = prompt[0];
    for (int64_t pos = 0; pos + 1 < n; pos++) {
        float *lg = nl_model_step(m, &st, out[pos], pos);
        assert_non_null(lg);
        out[pos + 1] = pos + 1 < np ? prompt[pos + 1] : nl_model_sample(lg, m->V, 0.0f, NULL);
    }
    nl_decode_state_free(&st);
}

/* The model holds only weights: two decode states over one read-only model, stepped in turn
 * (one token of sequence a, one of b, ...), give each sequence the greedy tokens it gets alone,
 * for fp32 and int8 caches; and the step writes nothing of the model (its parameters keep their
 * bits). */
static void two_states_one_model(void **state) {
    (void)state;
    nl_model m;
    tiny(&m);
    const nl_model *cm = &m;
    const int64_t S = m.arch.seq_len;
    float *before = malloc(m.n_params * sizeof(float));
    memcpy(before, m.params, m.n_params * sizeof(float));
    const int32_t pa[3] = {5, 17, 40}, pb[5] = {63, 2, 2, 31, 8};
    for (int dt = 0; dt <= 1; dt++) {
        int32_t alone_a[32], alone_b[32], a[32], b[32];
        greedy_alone(cm, (nl_kv_dtype)dt, pa, 3, S, alone_a);
        greedy_alone(cm, (nl_kv_dtype)dt, pb, 5, S, alone_b);
        nl_decode_state sa, sb;
        assert_int_equal(nl_decode_state_init(&sa, cm, (nl_kv_dtype)dt), NL_OK);
        assert_int_equal(nl_decode_state_init(&sb, cm, (nl_kv_dtype)dt), NL_OK);
        a[0] = pa[0];
        b[0] = pb[0];
        for (int64_t pos = 0; pos + 1 < S; pos++) {
            float *la = nl_model_step(cm, &sa, a[pos], pos);
            assert_non_null(la);
            a[pos + 1] = pos + 1 < 3 ? pa[pos + 1] : nl_model_sample(la, m.V, 0.0f, NULL);
            float *lb = nl_model_step(cm, &sb, b[pos], pos);
            assert_non_null(lb);
            b[pos + 1] = pos + 1 < 5 ? pb[pos + 1] : nl_model_sample(lb, m.V, 0.0f, NULL);
        }
        assert_memory_equal(a, alone_a, sizeof a);
        assert_memory_equal(b, alone_b, sizeof b);
        int differ = 0; /* the two sequences are different ones (not one answer twice) */
        for (int64_t i = 5; i < S; i++) differ |= a[i] != b[i];
        assert_true(differ);
        /* bad input: a position past seq_len, a token outside the vocabulary, another shape's state */
        assert_null(nl_model_step(cm, &sa, 1, S));
        assert_non_null(strstr(nl_last_error(), "position 32"));
        assert_null(nl_model_step(cm, &sa, (int32_t)m.V, 0));
        assert_non_null(strstr(nl_last_error(), "token 64"));
        nl_model other;
        nl_arch oa = tu_arch("other", 64, 64, 3, 4, 2, 96, 32);
        tu_model(&other, &oa, 1);
        assert_null(nl_model_step(&other, &sa, 1, 0));
        assert_non_null(strstr(nl_last_error(), "decode state"));
        nl_model_free(&other);
        nl_decode_state_free(&sa);
        nl_decode_state_free(&sb);
    }
    assert_memory_equal(before, m.params, m.n_params * sizeof(float));
    assert_null(m.train); /* decoding allocates no training state */
    free(before);
    nl_model_free(&m);
}

static cJSON *eval_json(const char *args) {
    char *out = NULL;
    int rc = tu_run_cli(args, &out);
    if (rc != 0) print_message("%s\n", out ? out : "");
    assert_int_equal(rc, 0);
    cJSON *d = cJSON_Parse(out);
    free(out);
    assert_non_null(d);
    return d;
}

/* stories260K on tinystories: the int8 cache changes the loss by < 0.5% relative; the fp32
 * cache path gives the batched loss; greedy text agrees on its first tokens. */
static void stories(void **state) {
    (void)state;
    TU_REQUIRE_DATA(ck, "stories260K/stories260K.bin");
    TU_REQUIRE_DATA(tk, "stories260K/tok512.bin");
    TU_REQUIRE_DATA(tx, "tinystories/tinystories_head.txt");
    char args[2048];
    double loss[3], kvb[3];
    const char *mode[3] = {"", "--kv-cache fp32", "--kv-cache int8"};
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "eval --ckpt %s --tokenizer %s --data %s --max-windows 3 %s --json", ck, tk, tx,
                 mode[i]);
        cJSON *d = eval_json(args);
        loss[i] = cJSON_GetObjectItem(d, "mean_loss")->valuedouble;
        assert_int_equal((int)cJSON_GetObjectItem(d, "tokens")->valuedouble, 3 * 512);
        cJSON *b = cJSON_GetObjectItem(d, "kv_cache_bytes");
        kvb[i] = b ? b->valuedouble : 0;
        cJSON_Delete(d);
    }
    print_message(
        "stories260K, 1536 tokens: batched %.5f, fp32 cache %.5f, int8 cache %.5f (%+.3f%%); KV bytes %.0f -> %.0f\n",
        loss[0], loss[1], loss[2], 100 * (loss[2] - loss[1]) / loss[1], kvb[1], kvb[2]);
    assert_true(fabs(loss[1] - loss[0]) < 1e-4 * loss[0]);
    assert_true(fabs(loss[2] - loss[1]) < 0.005 * loss[1]);
    assert_true(loss[2] != loss[1]);
    /* 5 layers, 4 KV heads of 8, 512 positions: 81920 values per K and V */
    assert_true(kvb[1] == 5.0 * 2 * 512 * 32 * 4);
    assert_true(kvb[2] == 5.0 * 2 * 512 * 32 + 5.0 * 2 * 512 * 4 * 2);
    /* greedy generation: the first 40 tokens agree */
    cJSON *gen[2];
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args,
                 "generate --ckpt %s --tokenizer %s --prompt 'Once upon a time' --temperature 0 --steps 44 "
                 "--kv-cache %s --json",
                 ck, tk, i ? "int8" : "fp32");
        gen[i] = eval_json(args);
    }
    cJSON *a = cJSON_GetObjectItem(gen[0], "tokens"), *b = cJSON_GetObjectItem(gen[1], "tokens");
    assert_true(cJSON_GetArraySize(a) >= 40 && cJSON_GetArraySize(b) >= 40);
    for (int i = 0; i < 40; i++)
        assert_int_equal((int)cJSON_GetArrayItem(a, i)->valuedouble, (int)cJSON_GetArrayItem(b, i)->valuedouble);
    cJSON_Delete(gen[0]);
    cJSON_Delete(gen[1]);
    char *out = NULL;
    snprintf(args, sizeof args, "generate --ckpt %s --tokenizer %s --prompt hi --kv-cache int4", ck, tk);
    assert_int_equal(tu_run_cli(args, &out), 2);
    assert_non_null(strstr(out, "int4"));
    free(out);
}

/* A prompt chunk's tiled attention (nl_paged_attend_rows) gives each token the bits that
 * attending it alone (nl_paged_attend_head) gives: fp32 and int8 pools, grouped-query heads,
 * blocks scattered in the pool, chunks that start mid-block and end mid-tile; heads of 24
 * dimensions (partial vectors), 32 and 96 (a last group of two whole vectors) and 64 and 128
 * (groups of four), which take different loops in the one-token sum. */
static void attend_rows_equals_one_at_a_time(void **state) {
    (void)state;
    static const int64_t HDS[] = {24, 32, 64, 96, 128};
    for (size_t hi = 0; hi < sizeof HDS / sizeof HDS[0]; hi++)
        for (int dt = 0; dt <= 1; dt++) {
            const int64_t NH = 4, KVH = 2, hd = HDS[hi], bs = 5, S = 80, QKV = (NH + 2 * KVH) * hd;
            nl_kvcache c;
            assert_int_equal(nl_kvcache_init(&c, 1, KVH, hd, (nl_kv_dtype)dt, bs, 2 * S / bs), NL_OK);
            int32_t table[S / bs];
            for (int64_t b = 0; b < S / bs; b++) {
                table[b] = (int32_t)(2 * b + 1); /* every other block, so the table is not the identity */
                assert_true(table[b] >= 0);
            }
            float *q = malloc(sizeof(float) * S * QKV), *tiled = malloc(sizeof(float) * S * NH * hd),
                  *one = malloc(sizeof(float) * NH * hd);
            float *scratch = malloc(sizeof(float) * nl_paged_attend_scratch(S, S, hd));
            uint64_t rng = 12345;
            for (int64_t i = 0; i < S * QKV; i++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                q[i] = (float)((int64_t)(rng >> 40) % 2001 - 1000) / 250.0f;
            }
            for (int64_t t = 0; t < S; t++)
                nl_kvcache_store(&c, table, 0, t, q + t * QKV + NH * hd, q + t * QKV + (NH + KVH) * hd);
            const int64_t chunks[][2] = {{0, 1}, {0, 16}, {3, 17}, {17, 40}, {57, 23}, {79, 1}};
            for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
                int64_t pos0 = chunks[k][0], nq = chunks[k][1];
                for (int64_t h = 0; h < NH; h++)
                    nl_paged_attend_rows(&c, table, 0, pos0, nq, q + pos0 * QKV, QKV, NH, h, tiled + h * hd, NH * hd,
                                         scratch);
                for (int64_t r = 0; r < nq; r++) {
                    for (int64_t h = 0; h < NH; h++)
                        nl_paged_attend_head(&c, table, 0, pos0 + r, q + (pos0 + r) * QKV, NH, h, one + h * hd,
                                             scratch);
                    assert_memory_equal(one, tiled + r * NH * hd, sizeof(float) * NH * hd);
                }
            }
            free(q);
            free(tiled);
            free(one);
            free(scratch);
            nl_kvcache_free(&c);
        }
}

/* Decode attention (one query) over an fp32 and an int8 pool against a plain double-precision
 * reference (int8: on the codes times their scales, read back through nl_kvcache_gather):
 * the keys are stored transposed in their blocks and read in place in groups of tiles, so block
 * sizes that hold one tile (16), two (32), a tile and a half (24: tiles across blocks, gathered)
 * and less than one (5), contexts that end mid-tile and span several groups of tiles, and heads
 * of 24, 32 and 64 dimensions must all give the reference's output. */
static void decode_matches_reference(void **state) {
    (void)state;
    static const int64_t BSS[] = {5, 16, 24, 32}, HDS[] = {24, 32, 64};
    for (size_t bi = 0; bi < sizeof BSS / sizeof BSS[0]; bi++)
        for (size_t hi = 0; hi < sizeof HDS / sizeof HDS[0]; hi++)
            for (int dt = 0; dt <= 1; dt++) {
                const int64_t NH = 2, KVH = 1, hd = HDS[hi], bs = BSS[bi], S = 150, nb = (S + bs - 1) / bs;
                nl_kvcache c;
                assert_int_equal(nl_kvcache_init(&c, 2, KVH, hd, (nl_kv_dtype)dt, bs, 2 * nb + 1), NL_OK);
                int32_t *table = malloc(sizeof(int32_t) * (size_t)nb);
                for (int64_t b = 0; b < nb; b++) table[b] = (int32_t)(2 * nb - 2 * b); /* scattered, reversed */
                float *k = malloc(sizeof(float) * S * hd), *v = malloc(sizeof(float) * S * hd),
                      *q = malloc(sizeof(float) * NH * hd), out[64];
                float *scratch = malloc(sizeof(float) * nl_paged_attend_scratch(1, S, hd));
                uint64_t rng = 99;
                for (int64_t i = 0; i < S * hd; i++) {
                    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                    k[i] = (float)((int64_t)(rng >> 40) % 2001 - 1000) / 1000.0f;
                    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                    v[i] = (float)((int64_t)(rng >> 40) % 2001 - 1000) / 1000.0f;
                }
                for (int64_t i = 0; i < NH * hd; i++) q[i] = (float)((i * 37) % 23 - 11) / 8.0f;
                for (int64_t t = 0; t < S; t++) nl_kvcache_store(&c, table, 1, t, k + t * hd, v + t * hd);
                if (dt == NL_KV_INT8) { /* the reference sees what the pool holds */
                    uint8_t *g = malloc(nl_kvcache_seq_bytes(2, KVH, hd, NL_KV_INT8, S));
                    nl_kvcache_gather(&c, table, S, g);
                    const uint8_t *sc = g + (size_t)(2 * 2 * S * hd); /* rows (l * 2 + kv) * S + t */
                    for (int kv = 0; kv < 2; kv++)
                        for (int64_t t = 0; t < S; t++) {
                            const int64_t r = (1 * 2 + kv) * S + t;
                            uint16_t h;
                            memcpy(&h, sc + r * 2, 2);
                            uint32_t code = h;
                            const float step = nl_fmt_decode(NL_FMT_FP16, code);
                            int8_t want[64];
                            uint16_t want_scale;
                            nl_kv_quantize_token(want, &want_scale, (kv ? v : k) + t * hd, 1, hd);
                            assert_int_equal(want_scale, h); /* the store kept the token's codes */
                            assert_memory_equal(want, g + r * hd, (size_t)hd);
                            for (int64_t i = 0; i < hd; i++)
                                (kv ? v : k)[t * hd + i] = (float)(int8_t)g[r * hd + i] * step;
                        }
                    free(g);
                }
                const int64_t positions[] = {0, 15, 16, 63, 64, 100, 149};
                for (size_t pi = 0; pi < sizeof positions / sizeof positions[0]; pi++)
                    for (int64_t h = 0; h < NH; h++) {
                        const int64_t pos = positions[pi];
                        nl_paged_attend_head(&c, table, 1, pos, q, NH, h, out, scratch);
                        double sc[150], mx = -1e300, sum = 0;
                        for (int64_t t = 0; t <= pos; t++) {
                            sc[t] = 0;
                            for (int64_t i = 0; i < hd; i++) sc[t] += (double)q[h * hd + i] * k[t * hd + i];
                            sc[t] /= sqrt((double)hd);
                            mx = sc[t] > mx ? sc[t] : mx;
                        }
                        for (int64_t t = 0; t <= pos; t++) sum += (sc[t] = exp(sc[t] - mx));
                        for (int64_t i = 0; i < hd; i++) {
                            double o = 0;
                            for (int64_t t = 0; t <= pos; t++) o += sc[t] / sum * v[t * hd + i];
                            assert_true(fabs(out[i] - o) <= 1e-5 * (1 + fabs(o)));
                        }
                    }
                free(table);
                free(k);
                free(v);
                free(q);
                free(scratch);
                nl_kvcache_free(&c);
            }
}

/* A bf16 model decodes through the state's own matmul scratch, with no activations: its step
 * logits follow its batched bf16 forward (both round the same weights and inputs to bf16) and
 * differ from fp32's. */
static void bf16_decode(void **state) {
    (void)state;
    const int64_t T = 24;
    nl_model m;
    tiny(&m);
    int32_t x[24];
    for (int i = 0; i < T; i++) x[i] = (int32_t)((i * 29 + 3) % 64);
    float *f32 = malloc(sizeof(float) * (size_t)(T * m.V));
    nl_decode_state st;
    assert_int_equal(nl_decode_state_init(&st, &m, NL_KV_FP32), NL_OK);
    for (int64_t t = 0; t < T; t++) {
        const float *lg = nl_model_step(&m, &st, x[t], t);
        assert_non_null(lg);
        memcpy(f32 + t * m.V, lg, sizeof(float) * (size_t)m.V);
    }
    assert_int_equal(nl_model_set_precision(&m, NL_PREC_BF16), NL_OK);
    assert_non_null(m.train);
    assert_null(m.train->acts_mem); /* the step needs no activations */
    float *bf = malloc(sizeof(float) * (size_t)(T * m.V));
    for (int64_t t = 0; t < T; t++) {
        const float *lg = nl_model_step(&m, &st, x[t], t);
        assert_non_null(lg);
        memcpy(bf + t * m.V, lg, sizeof(float) * (size_t)m.V);
    }
    assert_int_equal(nl_model_alloc_acts(&m, 1, T), NL_OK);
    assert_int_equal(nl_model_forward(&m, x, NULL, 1, T, NULL), NL_OK);
    double d_fwd = 0, d_32 = 0, amax = 0;
    for (int64_t i = 0; i < T * m.V; i++) {
        d_fwd = fmax(d_fwd, fabs(bf[i] - m.train->a.logits[i]));
        d_32 = fmax(d_32, fabs(bf[i] - f32[i]));
        amax = fmax(amax, fabs(f32[i]));
    }
    print_message("bf16 step: max |step - bf16 forward| %.3g, |step - fp32 step| %.3g (max |logit| %.3g)\n", d_fwd,
                  d_32, amax);
    assert_true(d_fwd <= 1e-4 * amax);
    assert_true(d_32 > 10 * d_fwd);
    nl_decode_state_free(&st);
    free(f32);
    free(bf);
    nl_model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(attend_rows_equals_one_at_a_time),
        cmocka_unit_test(decode_matches_reference),
        cmocka_unit_test(int8_cache),
        cmocka_unit_test(two_states_one_model),
        cmocka_unit_test(bf16_decode),
        cmocka_unit_test(stories),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
