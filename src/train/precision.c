/* Gradient underflow/overflow in 16-bit formats, measured on a real backward pass. */
#include "nanolm/precision.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

nl_status nl_underflow_count(nl_format f, float scale, const float *x, size_t n, nl_underflow_counts *c) {
    if (!c || (n && !x)) return nl_fail(NL_ERR_INVALID, "underflow count: NULL pointer");
    if (!(scale > 0.0f) || !isfinite(scale))
        return nl_fail(NL_ERR_INVALID, "underflow count: scale %g must be finite and > 0", scale);
    const nl_format_info *fi = nl_fmt_info(f);
    if (!fi || fi->kind != NL_FMT_KIND_FLOAT || f == NL_FMT_E8M0)
        return nl_fail(NL_ERR_INVALID, "underflow count: format %s is not a floating-point element format",
                       nl_fmt_name(f));
    const double min_normal = fi->min_normal, fmax_v = fi->max_finite;
    int64_t nz = 0, fl = 0, sub = 0, ov = 0;
#pragma omp parallel for schedule(static) reduction(+ : nz, fl, sub, ov)
    for (size_t i = 0; i < n; i++) {
        if (x[i] == 0.0f) continue;
        nz++;
        const float v = x[i] * scale;
        uint32_t code;
        if (!isfinite(v) || fabsf(v) > (float)fmax_v * 2.0f) {
            ov++;
            continue;
        }
        if (nl_fmt_encode(f, v, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_IEEE, 0, &code) != NL_OK) {
            ov++;
            continue;
        }
        const float r = nl_fmt_decode(f, code);
        if (!isfinite(r))
            ov++;
        else if (r == 0.0f)
            fl++;
        else if (fabsf(r) < min_normal)
            sub++;
    }
    c->values += (int64_t)n;
    c->nonzero += nz;
    c->flushed += fl;
    c->subnormal += sub;
    c->overflow += ov;
    return NL_OK;
}

double nl_underflow_max_scale(const float *x, size_t n, double fmax_v, double s_max) {
    double amax = 0.0;
    for (size_t i = 0; i < n; i++) amax = fmax(amax, fabs((double)x[i]));
    if (amax == 0.0) return 0.0;
    double s = s_max;
    while (s > 0x1p-60 && amax * s >= fmax_v) s *= 0.5;
    return s;
}

typedef struct grab_ctx {
    nl_model *m;
    nl_linear_ops ops;
    float *buf;
    size_t n, cap;
    nl_status rc;
} grab_ctx;

static void grab_forward(void *user, const nl_linear_site *s, float *out, const float *in, const float *w, int64_t n,
                         int64_t in_dim, int64_t out_dim) {
    grab_ctx *g = user;
    g->m->linear_ops = NULL;
    nl_linear_forward(g->m, s, out, in, w, n, in_dim, out_dim);
    g->m->linear_ops = &g->ops;
}

static void grab_backward(void *user, const nl_linear_site *s, float *din, float *dw, const float *dout,
                          const float *in, const float *w, int64_t n, int64_t in_dim, int64_t out_dim) {
    grab_ctx *g = user;
    const size_t add = (size_t)(n * out_dim);
    if (g->rc == NL_OK && g->n + add > g->cap) {
        size_t cap = g->cap ? g->cap : 1 << 20;
        while (cap < g->n + add) cap *= 2;
        float *nb = nl_malloc(cap * sizeof(float), "output gradients");
        if (!nb)
            g->rc = NL_ERR_NOMEM;
        else {
            if (g->n) memcpy(nb, g->buf, g->n * sizeof(float));
            nl_free(g->buf);
            g->buf = nb;
            g->cap = cap;
        }
    }
    if (g->rc == NL_OK) {
        memcpy(g->buf + g->n, dout, add * sizeof(float));
        g->n += add;
    }
    g->m->linear_ops = NULL;
    nl_linear_backward(g->m, s, din, dw, dout, in, w, n, in_dim, out_dim);
    g->m->linear_ops = &g->ops;
}

nl_status nl_grad_sample(nl_model *m, const int32_t *tokens, int64_t n, int64_t B, int64_t T, int batches, float **act,
                         size_t *n_act, float **wgt, size_t *n_wgt) {
    if (!m || !tokens || !act || !n_act || !wgt || !n_wgt) return nl_fail(NL_ERR_INVALID, "grad sample: NULL argument");
    if (batches < 1 || B < 1 || T < 1) return nl_fail(NL_ERR_INVALID, "grad sample: batches, B and T must be >= 1");
    if (n < (int64_t)batches * B * (T + 1))
        return nl_fail(NL_ERR_INVALID, "grad sample: %lld tokens are fewer than %d batches of %lld windows of %lld + 1",
                       (long long)n, batches, (long long)B, (long long)T);
    NL_TRY(nl_model_alloc_grads(m)); /* (nothing when they exist) */
    *act = *wgt = NULL;
    *n_act = *n_wgt = 0;
    float *w = nl_malloc((size_t)batches * m->n_params * sizeof(float), "parameter gradients");
    int32_t *x = nl_malloc((size_t)(B * T) * sizeof(int32_t), "inputs"),
            *y = nl_malloc((size_t)(B * T) * sizeof(int32_t), "targets");
    grab_ctx g = {.m = m};
    g.ops.forward = grab_forward;
    g.ops.backward = grab_backward;
    g.ops.user = &g;
    nl_linear_ops *prev = m->linear_ops;
    const float prev_scale = m->train->loss_scale;
    nl_status rc = (!w || !x || !y) ? NL_ERR_NOMEM : NL_OK;
    m->train->loss_scale = 1.0f;
    for (int b = 0; b < batches && rc == NL_OK; b++) {
        for (int64_t i = 0; i < B; i++) {
            const int32_t *win = tokens + ((int64_t)b * B + i) * (T + 1);
            memcpy(x + i * T, win, (size_t)T * sizeof(int32_t));
            memcpy(y + i * T, win + 1, (size_t)T * sizeof(int32_t));
        }
        nl_model_zero_grad(m);
        m->linear_ops = &g.ops;
        rc = nl_model_forward(m, x, y, B, T, NULL);
        if (rc == NL_OK) rc = nl_model_backward(m);
        m->linear_ops = prev;
        if (rc == NL_OK) rc = g.rc;
        if (rc == NL_OK) memcpy(w + (size_t)b * m->n_params, m->train->grads, m->n_params * sizeof(float));
    }
    m->linear_ops = prev;
    m->train->loss_scale = prev_scale;
    nl_free(x);
    nl_free(y);
    if (rc != NL_OK) {
        nl_free(w);
        nl_free(g.buf);
        return rc;
    }
    *act = g.buf;
    *n_act = g.n;
    *wgt = w;
    *n_wgt = (size_t)batches * m->n_params;
    return NL_OK;
}

#define GRADSCALER_INIT 65536.0 /* torch.cuda.amp.GradScaler(init_scale=2**16) */

/* The four schemes: fp16 unscaled, at GradScaler's initial scale, at the largest scale that
 * overflows neither tensor; bf16 unscaled. */
static void study_schemes(const float *act, size_t n_act, const float *wgt, size_t n_wgt, nl_underflow_study *u) {
    const double fp16_max = nl_fmt_info(NL_FMT_FP16)->max_finite;
    double s_act = nl_underflow_max_scale(act, n_act, fp16_max, 0x1p24);
    double s_wgt = nl_underflow_max_scale(wgt, n_wgt, fp16_max, 0x1p24);
    double s_best = s_act == 0.0 ? s_wgt : (s_wgt == 0.0 ? s_act : fmin(s_act, s_wgt));
    if (s_best == 0.0) s_best = 1.0;
    const nl_format f[NL_UNDERFLOW_SCHEMES] = {NL_FMT_FP16, NL_FMT_FP16, NL_FMT_FP16, NL_FMT_BF16};
    const double sc[NL_UNDERFLOW_SCHEMES] = {1.0, GRADSCALER_INIT, s_best, 1.0};
    for (int s = 0; s < NL_UNDERFLOW_SCHEMES; s++) u->fmt[s] = f[s], u->scale[s] = sc[s];
    snprintf(u->label[0], sizeof u->label[0], "1 (none)");
    snprintf(u->label[1], sizeof u->label[1], "2^16 (GradScaler init)");
    snprintf(u->label[2], sizeof u->label[2], "2^%d (largest w/o overflow)", (int)lround(log2(s_best)));
    snprintf(u->label[3], sizeof u->label[3], "1 (none)");
}

nl_status nl_underflow_study_run(nl_model *m, const int32_t *tokens, int64_t n, int64_t B, int64_t T, int batches,
                                 nl_underflow_study *out) {
    memset(out, 0, sizeof *out);
    float *act = NULL, *wgt = NULL;
    size_t n_act = 0, n_wgt = 0;
    NL_TRY(nl_model_alloc_acts(m, B, T));
    NL_TRY(nl_model_alloc_grads(m));
    nl_status st = nl_grad_sample(m, tokens, n, B, T, batches, &act, &n_act, &wgt, &n_wgt);
    if (!st) study_schemes(act, n_act, wgt, n_wgt, out);
    const float *vals[2] = {act, wgt};
    const size_t nv[2] = {n_act, n_wgt};
    for (int k = 0; !st && k < 2; k++)
        for (int s = 0; !st && s < NL_UNDERFLOW_SCHEMES; s++)
            st = nl_underflow_count(out->fmt[s], (float)out->scale[s], vals[k], nv[k], &out->cnt[k][s]);
    nl_free(act);
    nl_free(wgt);
    return st;
}
