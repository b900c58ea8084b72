/* Context parallelism (ring attention, load-balanced causal split) against the single-rank
 * causal attention, under mpirun with 2, 3 and 4 ranks (CP = world size), at T = 16 x CP, i.e.
 * 8x the chunk of c = T/(2 CP) (each rank holds 2 chunks). Checks that the attention output
 * and the gradient of q, k, v match nl_attention_forward/backward within 1e-5 (relative to the
 * largest entry), for plain and grouped-query heads, and that the activation bytes a rank
 * holds fall as 1/CP (CP x bytes per rank = bytes of the same context on one rank). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/comm.h"
#include "nanolm/cp.h"
#include "nanolm/model.h"
#include "testutil.h"

static double rel_err(const float *a, const float *b, size_t n) {
    double md = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(a[i] - b[i]) > md) md = fabs(a[i] - b[i]);
        if (fabs(b[i]) > mx) mx = fabs(b[i]);
    }
    return md / mx;
}

static void check(int64_t NH, int64_t KVH) {
    nl_comm *w = nl_comm_world();
    int P = nl_comm_size(w), r = nl_comm_rank(w);
    const int64_t B = 2, hd = 8, T = 16 * P, QKV = (NH + 2 * KVH) * hd, OD = NH * hd;
    /* the same global q, k, v and dout on every rank (same seed) */
    float *qkv = malloc(sizeof(float) * (size_t)(B * T * QKV)), *dout = malloc(sizeof(float) * (size_t)(B * T * OD));
    float *out = malloc(sizeof(float) * (size_t)(B * T * OD)), *att = malloc(sizeof(float) * (size_t)(B * NH * T * T));
    float *datt = malloc(sizeof(float) * (size_t)(B * NH * T * T)),
          *dqkv = malloc(sizeof(float) * (size_t)(B * T * QKV));
    nl_rng rng;
    nl_rng_seed(&rng, 42);
    for (int64_t i = 0; i < B * T * QKV; i++) qkv[i] = (float)nl_rng_normal(&rng);
    for (int64_t i = 0; i < B * T * OD; i++) dout[i] = (float)nl_rng_normal(&rng);
    nl_attention_forward(out, att, qkv, B, T, NH, KVH, hd);
    nl_attention_backward(dqkv, datt, dout, att, qkv, B, T, NH, KVH, hd);
    /* this rank's rows */
    nl_cp_attn a;
    assert_int_equal(nl_cp_attn_init(&a, w, B, T, NH, KVH, hd), NL_OK);
    int64_t Tl = a.Tl;
    float *lq = malloc(sizeof(float) * (size_t)(B * Tl * QKV)), *ld = malloc(sizeof(float) * (size_t)(B * Tl * OD));
    float *ro = malloc(sizeof(float) * (size_t)(B * Tl * OD)), *rq = malloc(sizeof(float) * (size_t)(B * Tl * QKV));
    float *gq = malloc(sizeof(float) * (size_t)(B * Tl * QKV));
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < Tl; t++) {
            int64_t p = nl_cp_position(P, r, T, t);
            memcpy(lq + (b * Tl + t) * QKV, qkv + (b * T + p) * QKV, sizeof(float) * (size_t)QKV);
            memcpy(ld + (b * Tl + t) * OD, dout + (b * T + p) * OD, sizeof(float) * (size_t)OD);
            memcpy(ro + (b * Tl + t) * OD, out + (b * T + p) * OD, sizeof(float) * (size_t)OD);
            memcpy(rq + (b * Tl + t) * QKV, dqkv + (b * T + p) * QKV, sizeof(float) * (size_t)QKV);
        }
    assert_int_equal(nl_cp_attn_forward(&a, lq), NL_OK);
    double eo = rel_err(a.out, ro, (size_t)(B * Tl * OD));
    assert_int_equal(nl_cp_attn_backward(&a, gq, ld, lq), NL_OK);
    double eg = rel_err(gq, rq, (size_t)(B * Tl * QKV));
    /* memory: the same context on one rank */
    nl_comm *self;
    assert_int_equal(nl_comm_split(w, r, 0, "self", &self), NL_OK);
    nl_cp_attn one;
    assert_int_equal(nl_cp_attn_init(&one, self, B, T, NH, KVH, hd), NL_OK);
    if (r == 0)
        print_message("CP %d, T %lld (chunk %lld), heads %lld/%lld: output rel err %.2e, dqkv rel err %.2e; "
                      "activation bytes per rank %zu vs %zu on one rank (x%.3f)\n",
                      P, (long long)T, (long long)a.c, (long long)NH, (long long)KVH, eo, eg, a.bytes, one.bytes,
                      (double)a.bytes / (double)one.bytes);
    assert_true(T >= 4 * a.c);
    assert_true(eo < 1e-5);
    assert_true(eg < 1e-5);
    assert_true(a.bytes * (size_t)P == one.bytes);
    nl_cp_attn_free(&one);
    nl_comm_free(self);
    nl_cp_attn_free(&a);
    free(qkv), free(dout), free(out), free(att), free(datt), free(dqkv), free(lq), free(ld), free(ro), free(rq),
        free(gq);
}

static void test_mha(void **state) {
    (void)state;
    check(4, 4);
}
static void test_gqa(void **state) {
    (void)state;
    check(4, 2);
}

int main(int argc, char **argv) {
    nl_set_threads(1); /* several ranks share the cores: OpenMP spinning threads would starve them */
    if (nl_comm_init(&argc, &argv)) {
        fprintf(stderr, "nl_comm_init: %s\n", nl_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_mha), cmocka_unit_test(test_gqa)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    nl_comm_finalize();
    return rc;
}
