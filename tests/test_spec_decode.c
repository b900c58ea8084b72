/* Speculative decoding: prompt-lookup drafting (nl_sampler_ngram_draft), the verification's
 * rejection sampling keeps the target's distribution (chi-square on a 6-token vocabulary, many
 * draws, fixed seeds; deterministic drafts and drafts drawn from a drafter's distribution,
 * with temperature, top-k and top-p), and in the engine (engine.h spec_k): greedy tokens
 * identical with and without drafting, batched, with prefix caching, fp32 and int8 KV, at the
 * max_tokens and context limits; drafts accepted; every block back in the pool. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/engine.h"
#include "nanolm/model.h"
#include "nanolm/sampler.h"

static void test_ngram_draft(void **state) {
    (void)state;
    const int32_t t[] = {1, 2, 3, 4, 1, 2};
    int32_t out[8];
    /* [4 1 2] never occurred before; [1 2] did, at 0: what followed it */
    assert_int_equal(nl_sampler_ngram_draft(t, 6, 3, 3, out), 3);
    assert_int_equal(out[0], 3);
    assert_int_equal(out[1], 4);
    assert_int_equal(out[2], 1);
    /* past the end of the tokens: the copy reads on in its own output (period 4) */
    assert_int_equal(nl_sampler_ngram_draft(t, 6, 3, 8, out), 8);
    const int32_t want[8] = {3, 4, 1, 2, 3, 4, 1, 2};
    assert_memory_equal(out, want, sizeof want);
    /* the latest earlier occurrence wins */
    const int32_t u[] = {5, 7, 5, 8, 5};
    assert_int_equal(nl_sampler_ngram_draft(u, 5, 2, 1, out), 1);
    assert_int_equal(out[0], 8);
    const int32_t w[] = {1, 2, 3};
    assert_int_equal(nl_sampler_ngram_draft(w, 3, 3, 4, out), 0);
    assert_int_equal(nl_sampler_ngram_draft(w, 1, 3, 4, out), 0);
}

enum { V = 6, K = 2, TRIALS = 60000 };

/* Chi-square of counts against probabilities p over n draws; a probability-0 token drawn fails. */
static double chi_square(const int64_t *count, const float *p, int64_t n, int *df) {
    double x2 = 0;
    *df = -1;
    for (int v = 0; v < V; v++) {
        if (p[v] <= 0) {
            assert_int_equal(count[v], 0);
            continue;
        }
        double e = (double)n * p[v];
        x2 += ((double)count[v] - e) * ((double)count[v] - e) / e;
        (*df)++;
    }
    return x2;
}

/* The 0.999 quantiles of chi-square with 1..5 degrees of freedom. */
static const double CHI999[6] = {0, 10.83, 13.82, 16.27, 18.47, 20.52};

static void check_distribution(const nl_sampling *s, int with_q) {
    static const float base[K + 1][V] = {{1.0f, 2.0f, 0.5f, 1.5f, -1.0f, 0.0f},
                                         {0.2f, -0.5f, 1.1f, 0.9f, 2.0f, 0.4f},
                                         {1.2f, 1.0f, 0.8f, 0.6f, 0.4f, 0.2f}};
    static const float qlog[K][V] = {{0.0f, 1.0f, 2.0f, 0.0f, 0.5f, 0.0f}, {1.0f, 0.0f, 0.0f, 1.5f, 0.3f, 0.0f}};
    float p[K + 1][V], q[K][V], probs[V], logits[(K + 1) * V];
    for (int j = 0; j <= K; j++) assert_int_equal(nl_sampler_probs(s, base[j], V, p[j]), NL_OK);
    nl_sampling qs;
    nl_sampling_default(&qs);
    for (int j = 0; j < K; j++) assert_int_equal(nl_sampler_probs(&qs, qlog[j], V, q[j]), NL_OK);
    int64_t first[V] = {0}, second[V] = {0}, third[V] = {0}, n2 = 0, n3 = 0, accepted = 0;
    nl_rng rng, drafter;
    nl_rng_seed(&rng, 2024);
    nl_rng_seed(&drafter, 7);
    for (int t = 0; t < TRIALS; t++) {
        int32_t d[K], out[K + 1];
        for (int j = 0; j < K; j++) {
            if (with_q) { /* a draw from the drafter's q */
                double r = nl_rng_double(&drafter), acc = 0;
                d[j] = V - 1;
                for (int v = 0; v < V; v++)
                    if (r < (acc += q[j][v])) {
                        d[j] = v;
                        break;
                    }
            } else
                d[j] = j == 0 ? 1 : 4; /* prompt lookup: fixed drafts */
        }
        memcpy(logits, base, sizeof logits);
        int64_t n = 0;
        assert_int_equal(nl_sampler_verify(s, &rng, logits, V, d, with_q ? &q[0][0] : NULL, K, probs, out, &n), NL_OK);
        assert_true(n >= 1 && n <= K + 1);
        accepted += n - 1;
        first[out[0]]++;
        if (n >= 2) second[out[1]]++, n2++;
        if (n >= 3) third[out[2]]++, n3++;
        for (int j = 0; j + 1 < n; j++) assert_int_equal(out[j], d[j]); /* the tokens before the last are drafts */
    }
    int df;
    double x1 = chi_square(first, p[0], TRIALS, &df);
    print_message("T %.2f top_k %d top_p %.2f q %d: first token chi2 %.2f (df %d)", s->temperature, s->top_k,
                  (double)s->top_p, with_q, x1, df);
    if (df > 0) assert_true(x1 < CHI999[df]);
    /* after an accepted first draft, the second token is drawn from row 1, and so on */
    if (n2 > 1000) {
        double x2 = chi_square(second, p[1], n2, &df);
        print_message(", second chi2 %.2f (df %d, %lld draws)", x2, df, (long long)n2);
        if (df > 0) assert_true(x2 < CHI999[df]);
    }
    if (n3 > 1000) {
        double x3 = chi_square(third, p[2], n3, &df);
        print_message(", third chi2 %.2f (df %d, %lld draws)", x3, df, (long long)n3);
        if (df > 0) assert_true(x3 < CHI999[df]);
    }
    print_message(", %.3f drafts accepted per step\n", (double)accepted / TRIALS);
    assert_true(accepted > 0);
}

static void test_verify_keeps_distribution(void **state) {
    (void)state;
    nl_sampling s;
    nl_sampling_default(&s);
    for (int with_q = 0; with_q <= 1; with_q++) {
        s.temperature = 1.0f, s.top_k = 0, s.top_p = 1.0f;
        check_distribution(&s, with_q);
        s.temperature = 0.7f, s.top_k = 4, s.top_p = 1.0f;
        check_distribution(&s, with_q);
        s.temperature = 1.3f, s.top_k = 0, s.top_p = 0.8f;
        check_distribution(&s, with_q);
    }
}

static void test_verify_greedy(void **state) {
    (void)state;
    nl_sampling s;
    nl_sampling_default(&s);
    s.temperature = 0;
    float logits[3 * 4] = {0, 3, 1, 2, /* argmax 1 */ 5, 0, 0, 1, /* argmax 0 */ 0, 0, 2, 2 /* argmax 2 (tie) */};
    float probs[4];
    int32_t out[3];
    int64_t n;
    nl_rng rng;
    nl_rng_seed(&rng, 1);
    int32_t d1[2] = {1, 0}; /* both right: the bonus token too */
    assert_int_equal(nl_sampler_verify(&s, &rng, logits, 4, d1, NULL, 2, probs, out, &n), NL_OK);
    assert_int_equal(n, 3);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 0);
    assert_int_equal(out[2], 2);
    int32_t d2[2] = {1, 3}; /* the second wrong: the argmax instead */
    assert_int_equal(nl_sampler_verify(&s, &rng, logits, 4, d2, NULL, 2, probs, out, &n), NL_OK);
    assert_int_equal(n, 2);
    assert_int_equal(out[1], 0);
    int32_t d3[2] = {2, 0};
    assert_int_equal(nl_sampler_verify(&s, &rng, logits, 4, d3, NULL, 2, probs, out, &n), NL_OK);
    assert_int_equal(n, 1);
    assert_int_equal(out[0], 1);
    logits[5] = NAN;
    assert_int_equal(nl_sampler_verify(&s, &rng, logits, 4, d1, NULL, 2, probs, out, &n), NL_ERR_NUMERIC);
}

/* A byte-vocabulary random model with weights scaled by `scale`: at 25 its greedy text wanders (few
 * drafts accepted), at 2.5 it repeats itself (most accepted). */
static void make_model(nl_model *m, int64_t seq_len, float scale) {
    nl_arch a;
    memset(&a, 0, sizeof a);
    snprintf(a.name, sizeof a.name, "spec-test");
    a.vocab_size = 256;
    a.dim = 64;
    a.n_layers = 2;
    a.n_heads = 4;
    a.n_kv_heads = 2;
    a.hidden_dim = 96;
    a.seq_len = seq_len;
    a.rope_theta = 10000;
    a.norm_eps = 1e-5;
    a.tied_embeddings = 1;
    assert_int_equal(nl_model_init(m, &a), NL_OK);
    nl_model_init_random(m, 3);
    for (size_t i = 0; i < m->n_params; i++) m->params[i] *= scale;
    for (int64_t l = 0; l < m->L; l++)
        for (int64_t i = 0; i < m->C; i++) m->w.layers[l].rms_att[i] = m->w.layers[l].rms_ffn[i] = 1.0f;
    for (int64_t i = 0; i < m->C; i++) m->w.rms_final[i] = 1.0f;
}

enum { N_REQ = 8, MAXGEN = 80 };

/* Request i: a text that repeats itself (a period of 5 + i tokens, 3 times) or, for i = 5,
 * tokens that do not; max_tokens from 1 to 80 (request 7: up to the context). */
static int64_t prompt_of(int i, int32_t *p, int64_t *max_tokens) {
    const int64_t period = 5 + i, n = 3 * period + 2;
    for (int64_t j = 0; j < n; j++)
        p[j] = i == 5 ? (int32_t)((37 * j + j * j) % 256) : (int32_t)((17 * i + 29 * (j % period)) % 256);
    static const int64_t mt[N_REQ] = {1, 2, 5, 40, 80, 40, 17, 0};
    *max_tokens = mt[i];
    return n;
}

typedef struct cfg {
    int spec_k, caching, kv, max_batch;
    const nl_model *draft; /* NULL: prompt lookup */
} cfg;

static int64_t run(const nl_model *m, const cfg *c, int32_t out[N_REQ][MAXGEN + 1], int64_t n_out[N_REQ],
                   nl_engine_stats *st) {
    nl_engine_opts o;
    nl_engine_opts_default(&o);
    o.spec_k = c->spec_k;
    o.draft_model = c->draft;
    o.prefix_cache = c->caching;
    o.kv = c->kv ? NL_KV_INT8 : NL_KV_FP32;
    o.block_size = 8;
    o.max_batch = c->max_batch;
    o.threads = 1;
    nl_engine *e;
    assert_int_equal(nl_engine_open_model(&e, m, NULL, &o), NL_OK);
    uint64_t ids[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        int32_t p[64];
        nl_sampling s;
        nl_sampling_default(&s);
        s.temperature = 0;
        s.ignore_eos = 1;
        int64_t n = prompt_of(i, p, &s.max_tokens);
        assert_int_equal(nl_engine_submit(e, p, n, &s, &ids[i]), NL_OK);
    }
    int guard = 0;
    while (nl_engine_busy(e)) {
        assert_int_equal(nl_engine_step(e, NULL), NL_OK);
        assert_true(++guard < 100000);
    }
    for (int i = 0; i < N_REQ; i++) {
        nl_engine_output r;
        assert_int_equal(nl_engine_read(e, ids[i], 1, &r), NL_OK);
        assert_true(r.n_tokens <= MAXGEN + 1);
        memcpy(out[i], r.tokens, sizeof(int32_t) * (size_t)r.n_tokens);
        n_out[i] = r.n_tokens;
        nl_engine_output_free(&r);
        nl_engine_release(e, ids[i]);
    }
    nl_engine_stats_get(e, st);
    assert_int_equal(st->kv_blocks_used, 0);
    nl_engine_close(e);
    return st->steps;
}

static void test_engine_greedy_identical(void **state) {
    (void)state;
    static int32_t ref[2][N_REQ][MAXGEN + 1], got[N_REQ][MAXGEN + 1];
    int64_t nref[2][N_REQ], ngot[N_REQ];
    const cfg cfgs[] = {{1, 0, 0, 8, NULL},  {4, 0, 0, 8, NULL}, {7, 1, 0, 8, NULL}, {4, 1, 0, 1, NULL},
                        {15, 1, 0, 3, NULL}, {4, 1, 1, 8, NULL}, {6, 0, 1, 2, NULL}};
    for (int sc = 0; sc < 2; sc++) {
        nl_model m;
        make_model(&m, 64, sc ? 2.5f : 25.0f); /* request 7 runs to the end of the context */
        nl_engine_stats st;
        int64_t steps_off = 0;
        for (int kv = 0; kv <= 1; kv++) {
            cfg c = {0, 0, kv, 8, NULL};
            steps_off = run(&m, &c, ref[kv], nref[kv], &st);
            assert_int_equal(st.spec_drafted, 0);
        }
        for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
            int64_t steps = run(&m, &cfgs[k], got, ngot, &st);
            print_message("scale %s, spec k %d, caching %d, kv %d, batch %d: %lld of %lld drafts accepted, %lld "
                          "steps (%lld without)\n",
                          sc ? "2.5" : "25", cfgs[k].spec_k, cfgs[k].caching, cfgs[k].kv, cfgs[k].max_batch,
                          (long long)st.spec_accepted, (long long)st.spec_drafted, (long long)steps,
                          (long long)steps_off);
            for (int i = 0; i < N_REQ; i++) {
                assert_int_equal(ngot[i], nref[cfgs[k].kv][i]);
                assert_memory_equal(got[i], ref[cfgs[k].kv][i], sizeof(int32_t) * (size_t)ngot[i]);
            }
            assert_true(st.spec_accepted <= st.spec_drafted);
            if (sc) assert_true(st.spec_accepted > st.spec_drafted / 2);
        }
        nl_model_free(&m);
    }
}

/* Draft model mode: with the target itself as the draft every greedy draft is accepted; with
 * another model few are; the tokens are greedy decoding's either way. Sampled requests run too. */
static void test_draft_model(void **state) {
    (void)state;
    nl_model m, other;
    make_model(&m, 64, 25.0f);
    make_model(&other, 64, 2.5f);
    static int32_t ref[N_REQ][MAXGEN + 1], got[N_REQ][MAXGEN + 1];
    int64_t nref[N_REQ], ngot[N_REQ];
    nl_engine_stats st;
    cfg c0 = {0, 0, 0, 8, NULL};
    run(&m, &c0, ref, nref, &st);
    const cfg cfgs[] = {{4, 0, 0, 8, &m}, {3, 1, 0, 2, &m}, {4, 1, 0, 8, &other}, {7, 0, 1, 3, &other}};
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
        if (cfgs[k].kv) { /* an int8 reference */
            cfg c1 = {0, 0, 1, 8, NULL};
            run(&m, &c1, ref, nref, &st);
        }
        run(&m, &cfgs[k], got, ngot, &st);
        print_message("draft %s, k %d, caching %d, kv %d, batch %d: %lld of %lld drafts accepted\n",
                      cfgs[k].draft == &m ? "= target" : "other", cfgs[k].spec_k, cfgs[k].caching, cfgs[k].kv,
                      cfgs[k].max_batch, (long long)st.spec_accepted, (long long)st.spec_drafted);
        for (int i = 0; i < N_REQ; i++) {
            assert_int_equal(ngot[i], nref[i]);
            assert_memory_equal(got[i], ref[i], sizeof(int32_t) * (size_t)ngot[i]);
        }
        assert_true(st.spec_drafted > 0);
        if (cfgs[k].draft == &m && !cfgs[k].kv) assert_int_equal(st.spec_accepted, st.spec_drafted);
    }
    /* sampled requests with drafts from another model: they finish with their lengths */
    nl_engine_opts o;
    nl_engine_opts_default(&o);
    o.spec_k = 4;
    o.draft_model = &other;
    o.threads = 1;
    nl_engine *e;
    assert_int_equal(nl_engine_open_model(&e, &m, NULL, &o), NL_OK);
    uint64_t ids[4];
    for (int i = 0; i < 4; i++) {
        int32_t p[64];
        nl_sampling s;
        nl_sampling_default(&s);
        s.temperature = 0.9f;
        s.top_p = i % 2 ? 0.9f : 1.0f;
        s.seed = (uint64_t)i;
        s.ignore_eos = 1;
        int64_t n = prompt_of(i + 2, p, &s.max_tokens);
        s.max_tokens = 20;
        assert_int_equal(nl_engine_submit(e, p, n, &s, &ids[i]), NL_OK);
    }
    while (nl_engine_busy(e)) assert_int_equal(nl_engine_step(e, NULL), NL_OK);
    for (int i = 0; i < 4; i++) {
        nl_engine_output r;
        assert_int_equal(nl_engine_read(e, ids[i], 1, &r), NL_OK);
        assert_int_equal(r.n_tokens, 20);
        nl_engine_output_free(&r);
        nl_engine_release(e, ids[i]);
    }
    nl_engine_stats_get(e, &st);
    assert_true(st.spec_drafted > 0);
    assert_int_equal(st.kv_blocks_used, 0);
    nl_engine_close(e);
    /* a draft of another vocabulary is refused by name */
    nl_model small;
    nl_arch a = other.arch;
    a.vocab_size = 128;
    assert_int_equal(nl_model_init(&small, &a), NL_OK);
    nl_model_init_random(&small, 1);
    o.draft_model = &small;
    assert_int_equal(nl_engine_open_model(&e, &m, NULL, &o), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "vocabulary"));
    nl_model_free(&small);
    nl_model_free(&other);
    nl_model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram_draft),
        cmocka_unit_test(test_verify_greedy),
        cmocka_unit_test(test_verify_keeps_distribution),
        cmocka_unit_test(test_engine_greedy_identical),
        cmocka_unit_test(test_draft_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
