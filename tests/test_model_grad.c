/* Finite-difference gradient checks for each NanoLM layer's backward.
 * Each layer has an independent double-precision reference forward here; the objective is
 * L = sum(out * R) for a fixed random R, central differences (h = 1e-6) in double give the
 * reference gradient, and the library's float backward (with dout = R) must match it. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/model.h"

static nl_rng rng;

static void fill(float *x, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(nl_rng_normal(&rng) * scale);
}

static void to_double(double *d, const float *f, size_t n) {
    for (size_t i = 0; i < n; i++) d[i] = f[i];
}

/* compares analytic (float) with numeric (double): max |a - n| <= tol * max |n| */
static void check(const char *what, const float *an, const double *num, size_t n, double tol) {
    double md = 0, mn = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(an[i] - num[i]);
        if (d > md) md = d;
        if (fabs(num[i]) > mn) mn = fabs(num[i]);
    }
    print_message("%-22s max|err| %.3g  max|grad| %.3g\n", what, md, mn);
    assert_true(mn > 0);
    if (md > tol * mn) fail_msg("%s: gradient error %.3g exceeds %.3g", what, md, tol * mn);
}

/* objective(x) in double; numeric gradient of obj w.r.t. x[i] by central differences */
typedef double (*objective_fn)(double *x, void *ctx);
static void numeric_grad(double *g, double *x, size_t n, objective_fn f, void *ctx) {
    const double h = 1e-6;
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double fp = f(x, ctx);
        x[i] = x0 - h;
        double fm = f(x, ctx);
        x[i] = x0;
        g[i] = (fp - fm) / (2 * h);
    }
}

/* ---- RMSNorm -------------------------------------------------------------------------------- */
typedef struct {
    int64_t N, C;
    double *x, *w, *R;
    int wrt_w;
} rms_ctx;
static double rms_obj(double *v, void *p) {
    rms_ctx *c = p;
    const double *x = c->wrt_w ? c->x : v, *w = c->wrt_w ? v : c->w;
    double L = 0;
    for (int64_t n = 0; n < c->N; n++) {
        double ss = 0;
        for (int64_t i = 0; i < c->C; i++) ss += x[n * c->C + i] * x[n * c->C + i];
        double r = 1.0 / sqrt(ss / c->C + 1e-5);
        for (int64_t i = 0; i < c->C; i++) L += x[n * c->C + i] * r * w[i] * c->R[n * c->C + i];
    }
    return L;
}

static void test_rmsnorm_grad(void **state) {
    (void)state;
    enum { N = 5, C = 16 };
    float x[N * C], w[C], R[N * C], out[N * C], rstd[N], dx[N * C] = {0}, dw[C] = {0};
    double xd[N * C], wd[C], Rd[N * C], gx[N * C], gw[C];
    fill(x, N * C, 1.0);
    fill(w, C, 1.0);
    fill(R, N * C, 1.0);
    nl_rmsnorm_forward(out, rstd, x, w, N, C, 1e-5f);
    nl_rmsnorm_backward(dx, dw, R, x, w, rstd, N, C);
    to_double(xd, x, N * C);
    to_double(wd, w, C);
    to_double(Rd, R, N * C);
    rms_ctx c = {N, C, xd, wd, Rd, 0};
    numeric_grad(gx, xd, N * C, rms_obj, &c);
    check("rmsnorm dx", dx, gx, N * C, 1e-4);
    c.wrt_w = 1;
    numeric_grad(gw, wd, C, rms_obj, &c);
    check("rmsnorm dw", dw, gw, C, 1e-4);
}

/* ---- SwiGLU ----------------------------------------------------------------------------------- */
typedef struct {
    int64_t N, H;
    double *R;
} swi_ctx;
static double swi_obj(double *h, void *p) {
    swi_ctx *c = p;
    double L = 0;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t i = 0; i < c->H; i++) {
            double g = h[n * 2 * c->H + i], u = h[n * 2 * c->H + c->H + i];
            L += g / (1 + exp(-g)) * u * c->R[n * c->H + i];
        }
    return L;
}

static void test_swiglu_grad(void **state) {
    (void)state;
    enum { N = 4, H = 12 };
    float h[N * 2 * H], R[N * H], dh[N * 2 * H];
    double hd[N * 2 * H], Rd[N * H], g[N * 2 * H];
    fill(h, N * 2 * H, 1.5);
    fill(R, N * H, 1.0);
    nl_swiglu_backward(dh, R, h, N, H);
    to_double(hd, h, N * 2 * H);
    to_double(Rd, R, N * H);
    swi_ctx c = {N, H, Rd};
    numeric_grad(g, hd, N * 2 * H, swi_obj, &c);
    check("swiglu dh", dh, g, N * 2 * H, 1e-4);
}

/* ---- RoPE + causal GQA attention (the attention block without its linears) ----------------------
 * reference in double: q, k rotated, scores, causal softmax, weighted v. */
typedef struct {
    int64_t B, T, NH, KVH, hd;
    double *R;
} att_ctx;
static double att_obj(double *qkv_in, void *p) {
    att_ctx *c = p;
    int64_t QKV = (c->NH + 2 * c->KVH) * c->hd, half = c->hd / 2, group = c->NH / c->KVH;
    size_t n = (size_t)(c->B * c->T * QKV);
    double *qkv = malloc(n * sizeof(double));
    memcpy(qkv, qkv_in, n * sizeof(double));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t t = 0; t < c->T; t++)
            for (int64_t h = 0; h < c->NH + c->KVH; h++)
                for (int64_t i = 0; i < half; i++) {
                    double ang = t * pow(10000.0, -2.0 * i / c->hd);
                    double *v = qkv + (b * c->T + t) * QKV + h * c->hd + 2 * i, x0 = v[0], x1 = v[1];
                    v[0] = x0 * cos(ang) - x1 * sin(ang);
                    v[1] = x0 * sin(ang) + x1 * cos(ang);
                }
    double L = 0, sc[64];
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->NH; h++)
            for (int64_t t = 0; t < c->T; t++) {
                const double *q = qkv + (b * c->T + t) * QKV + h * c->hd;
                double mx = -1e300, sum = 0;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    const double *k = qkv + (b * c->T + t2) * QKV + (c->NH + h / group) * c->hd;
                    double s = 0;
                    for (int64_t i = 0; i < c->hd; i++) s += q[i] * k[i];
                    sc[t2] = s / sqrt((double)c->hd);
                    if (sc[t2] > mx) mx = sc[t2];
                }
                for (int64_t t2 = 0; t2 <= t; t2++) sum += (sc[t2] = exp(sc[t2] - mx));
                for (int64_t i = 0; i < c->hd; i++) {
                    double o = 0;
                    for (int64_t t2 = 0; t2 <= t; t2++)
                        o += sc[t2] / sum * qkv[(b * c->T + t2) * QKV + (c->NH + c->KVH + h / group) * c->hd + i];
                    L += o * c->R[(b * c->T + t) * c->NH * c->hd + h * c->hd + i];
                }
            }
    free(qkv);
    return L;
}

static void test_attention_grad(void **state) {
    (void)state;
    enum { B = 2, T = 7, NH = 4, KVH = 2, HD = 6, QKV = (NH + 2 * KVH) * HD };
    nl_arch a = tu_arch("t", 8, NH * HD, 1, NH, KVH, 8, T);
    nl_model m;
    assert_int_equal(nl_model_init(&m, &a), NL_OK);
    static float qkv[B * T * QKV], R[B * T * NH * HD], out[B * T * NH * HD], att[B * NH * T * T], dqkv[B * T * QKV],
        datt[B * NH * T * T];
    static double qd[B * T * QKV], Rd[B * T * NH * HD], g[B * T * QKV];
    fill(qkv, B * T * QKV, 1.0);
    fill(R, B * T * NH * HD, 1.0);
    to_double(qd, qkv, B * T * QKV);
    to_double(Rd, R, B * T * NH * HD);
    /* library: rope, attention forward, attention backward, inverse rope on dq/dk */
    nl_rope_apply(qkv, m.rope_cos, m.rope_sin, B, T, NH, HD, QKV, 0);
    nl_rope_apply(qkv + NH * HD, m.rope_cos, m.rope_sin, B, T, KVH, HD, QKV, 0);
    nl_attention_forward(out, att, qkv, B, T, NH, KVH, HD);
    nl_attention_backward(dqkv, datt, R, att, qkv, B, T, NH, KVH, HD);
    nl_rope_apply(dqkv, m.rope_cos, m.rope_sin, B, T, NH, HD, QKV, 1);
    nl_rope_apply(dqkv + NH * HD, m.rope_cos, m.rope_sin, B, T, KVH, HD, QKV, 1);
    att_ctx c = {B, T, NH, KVH, HD, Rd};
    /* the forward must agree with the reference too */
    double L = 0;
    for (int i = 0; i < B * T * NH * HD; i++) L += (double)out[i] * Rd[i];
    double Lref = att_obj(qd, &c);
    print_message("attention objective %.9f reference %.9f\n", L, Lref);
    assert_true(fabs(L - Lref) <= 1e-5 * fabs(Lref) + 1e-5);
    numeric_grad(g, qd, B * T * QKV, att_obj, &c);
    check("rope+attention dq", dqkv, g, B * T * QKV, 1e-4);
    nl_model_free(&m);
}

/* ---- whole model: every parameter tensor against double central differences of the loss ---------
 * The float model is exact enough in the loss for h = 1e-2 on a tiny config (errors ~1e-3), so
 * this check is coarser than the per-layer ones; it catches wiring mistakes (a wrong offset, a
 * missing residual) that per-layer checks cannot. */
static void test_model_grad(void **state) {
    (void)state;
    nl_arch a = tu_arch("t", 11, 8, 2, 2, 1, 12, 6);
    a.tied_embeddings = 1;
    nl_model m;
    tu_model(&m, &a, 7);
    for (size_t i = 0; i < m.n_params; i++) m.params[i] += (float)(0.3 * nl_rng_normal(&rng));
    assert_int_equal(nl_model_alloc_grads(&m), NL_OK);
    assert_int_equal(nl_model_alloc_acts(&m, 2, 6), NL_OK);
    int32_t tok[12], tgt[12];
    for (int i = 0; i < 12; i++) {
        tok[i] = (int32_t)nl_rng_below(&rng, 11);
        tgt[i] = (int32_t)nl_rng_below(&rng, 11);
    }
    float loss;
    assert_int_equal(nl_model_forward(&m, tok, tgt, 2, 6, &loss), NL_OK);
    nl_model_zero_grad(&m);
    assert_int_equal(nl_model_backward(&m), NL_OK);
    const nl_param_info *tab;
    int nt = nl_model_params_table(&m, &tab);
    for (int k = 0; k < nt; k++) {
        /* three entries per tensor */
        double md = 0, mg = 0;
        for (int r = 0; r < 3; r++) {
            size_t i = tab[k].offset + nl_rng_below(&rng, tab[k].numel);
            float x0 = m.params[i], h = 1e-2f;
            float lp, lm;
            m.params[i] = x0 + h;
            nl_model_forward(&m, tok, tgt, 2, 6, &lp);
            m.params[i] = x0 - h;
            nl_model_forward(&m, tok, tgt, 2, 6, &lm);
            m.params[i] = x0;
            double num = ((double)lp - lm) / (2.0 * h);
            double d = fabs(num - m.train->grads[i]);
            if (d > md) md = d;
            if (fabs(num) > mg) mg = fabs(num);
            if (d > 2e-3 + 2e-2 * fabs(num))
                fail_msg("%s[%zu]: analytic %.6g numeric %.6g", tab[k].name, i - tab[k].offset, m.train->grads[i], num);
        }
        print_message("%-44s max|err| %.2g (max|grad| %.2g)\n", tab[k].name, md, mg);
    }
    nl_model_free(&m);
}

int main(void) {
    /* thousands of tiny forwards: one thread avoids OpenMP barrier costs on a loaded machine */
    nl_set_threads(1);
    nl_rng_seed(&rng, 2024);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm_grad),
        cmocka_unit_test(test_swiglu_grad),
        cmocka_unit_test(test_attention_grad),
        cmocka_unit_test(test_model_grad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
