/* FP8 linears for NanoLM training: the model's linear hook running the emulated FP8 GEMM. */
#include "nanolm/fp8_linear.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define ROLES 6 /* fwd A, fwd B, dgrad A, dgrad B, wgrad A, wgrad B */

void nl_fp8_recipe_default(nl_fp8_recipe *r) {
    memset(r, 0, sizeof *r);
    r->fmt_act = r->fmt_grad = NL_FMT_E4M3;
    r->scaling = NL_FP8_SCALE_BLOCK;
    r->acc = (nl_fp8_acc){0, 32, 128, NL_FP8_ACC_TRUNCATE};
    r->history_len = 16;
    r->margin = 0;
}

const char *nl_fp8_recipe_id(const nl_fp8_recipe *r, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s/%s/acc%d/promote%d", nl_fmt_name(r->fmt_act), nl_fmt_name(r->fmt_grad),
             nl_fp8_scaling_name(r->scaling), r->acc.bits, r->acc.promote);
    return buf;
}

const char *nl_fp8_recipe_desc(const nl_fp8_recipe *r, char *buf, size_t n) {
    char acc[48];
    if (r->acc.bits)
        snprintf(acc, sizeof acc, "%d-bit accumulator, promote %d", r->acc.bits, r->acc.promote);
    else
        snprintf(acc, sizeof acc, "fp32 accumulation");
    snprintf(buf, n, "%s/%s, %s scaling, %s", nl_fmt_name(r->fmt_act), nl_fmt_name(r->fmt_grad),
             nl_fp8_scaling_name(r->scaling), acc);
    return buf;
}

static nl_fp8_delayed *delayed_of(nl_fp8_linear *f, const nl_linear_site *s, int role) {
    if (!f->delayed) return NULL;
    return &f->delayed[((int64_t)s->layer * 4 + (int64_t)s->kind) * ROLES + role];
}

static void note_failure(nl_fp8_linear *f, const char *what, const nl_linear_site *s, float *out, int64_t n) {
    if (f->status == NL_OK) {
        f->status = NL_ERR_NUMERIC;
        snprintf(f->error, sizeof f->error, "fp8 %s of layer %d linear %d: %s", what, s->layer, (int)s->kind,
                 nl_last_error());
    }
    for (int64_t i = 0; i < n; i++) out[i] = NAN;
}

static void add_stats(nl_fp8_linear *f, const nl_fp8_stats *st, int64_t na, int64_t nb) {
    f->stats.gemms++;
    f->stats.saturated += st->a.saturated + st->b.saturated;
    f->stats.flushed += st->a.flushed + st->b.flushed;
    f->stats.quantized += na + nb;
}

static nl_fp8_gemm_opts base_opts(const nl_fp8_linear *f) {
    nl_fp8_gemm_opts o;
    nl_fp8_gemm_opts_default(&o);
    o.scaling = f->recipe.scaling;
    o.acc = f->recipe.acc;
    return o;
}

/* The classifier stays on the model's default (fp32/bf16) path. */
static int is_high_precision(const nl_linear_site *s) { return s->kind == NL_LIN_CLS || s->layer < 0; }

static void fp8_forward(void *user, const nl_linear_site *s, float *out, const float *in, const float *w, int64_t n,
                        int64_t in_dim, int64_t out_dim) {
    nl_fp8_linear *f = user;
    nl_model *m = f->model;
    if (is_high_precision(s)) {
        nl_linear_forward_default(m, s, out, in, w, n, in_dim, out_dim);
        return;
    }
    /* out (n, out_dim) = in (n, in_dim) . w^T, w stored (out_dim, in_dim) */
    nl_fp8_gemm_opts o = base_opts(f);
    o.fmt_a = o.fmt_b = f->recipe.fmt_act;
    o.trans_b = 1;
    o.delayed_a = delayed_of(f, s, 0);
    o.delayed_b = delayed_of(f, s, 1);
    nl_fp8_stats st;
    if (nl_fp8_gemm(&o, n, out_dim, in_dim, in, w, out, &st))
        note_failure(f, "forward", s, out, n * out_dim);
    else
        add_stats(f, &st, n * in_dim, in_dim * out_dim);
}

static void fp8_backward(void *user, const nl_linear_site *s, float *din, float *dw, const float *dout, const float *in,
                         const float *w, int64_t n, int64_t in_dim, int64_t out_dim) {
    nl_fp8_linear *f = user;
    nl_model *m = f->model;
    if (is_high_precision(s)) {
        nl_linear_backward_default(m, s, din, dw, dout, in, w, n, in_dim, out_dim);
        return;
    }
    nl_fp8_stats st;
    if (din) {
        /* dgrad: din (n, in_dim) = dout (n, out_dim) . w (out_dim, in_dim) */
        nl_fp8_gemm_opts o = base_opts(f);
        o.fmt_a = f->recipe.fmt_grad;
        o.fmt_b = f->recipe.fmt_act;
        o.delayed_a = delayed_of(f, s, 2);
        o.delayed_b = delayed_of(f, s, 3);
        if (nl_fp8_gemm(&o, n, in_dim, out_dim, dout, w, din, &st))
            note_failure(f, "dgrad", s, din, n * in_dim);
        else
            add_stats(f, &st, n * out_dim, out_dim * in_dim);
    }
    /* wgrad: dw (out_dim, in_dim) += dout^T (out_dim, n) . in (n, in_dim) */
    nl_fp8_gemm_opts o = base_opts(f);
    o.fmt_a = f->recipe.fmt_grad;
    o.fmt_b = f->recipe.fmt_act;
    o.trans_a = 1;
    o.accumulate = 1;
    o.delayed_a = delayed_of(f, s, 4);
    o.delayed_b = delayed_of(f, s, 5);
    if (nl_fp8_gemm(&o, out_dim, in_dim, n, dout, in, dw, &st))
        note_failure(f, "wgrad", s, dw, out_dim * in_dim);
    else
        add_stats(f, &st, n * out_dim, n * in_dim);
}

nl_status nl_fp8_linear_install(nl_fp8_linear *f, nl_model *m, const nl_fp8_recipe *r) {
    if (!f || !m || !r) return nl_fail(NL_ERR_INVALID, "fp8 linear: NULL argument");
    memset(f, 0, sizeof *f);
    if ((r->fmt_act != NL_FMT_E4M3 && r->fmt_act != NL_FMT_E5M2) ||
        (r->fmt_grad != NL_FMT_E4M3 && r->fmt_grad != NL_FMT_E5M2))
        return nl_fail(NL_ERR_INVALID, "fp8 linear: formats %s/%s (activations/gradients) must be e4m3 or e5m2",
                       nl_fmt_name(r->fmt_act), nl_fmt_name(r->fmt_grad));
    if (r->scaling < 0 || r->scaling >= NL_FP8_SCALE_COUNT)
        return nl_fail(NL_ERR_INVALID, "fp8 linear: unknown scaling %d", (int)r->scaling);
    NL_TRY(nl_fp8_acc_validate(&r->acc));
    if (r->scaling == NL_FP8_SCALE_BLOCK && r->acc.bits && (r->acc.promote == 0 || NL_FP8_BLOCK % r->acc.promote))
        return nl_fail(NL_ERR_INVALID, "fp8 linear: block scaling needs promote dividing %d (got %d)", NL_FP8_BLOCK,
                       r->acc.promote);
    f->recipe = *r;
    f->model = m;
    if (r->scaling == NL_FP8_SCALE_DELAYED) {
        const int64_t n = m->L * 4 * ROLES;
        f->delayed = nl_malloc((size_t)n * sizeof(nl_fp8_delayed), "fp8 delayed scaling states");
        if (!f->delayed) return NL_ERR_NOMEM;
        for (int64_t i = 0; i < n; i++) {
            nl_status rc = nl_fp8_delayed_init(&f->delayed[i], r->history_len, r->margin);
            if (rc) {
                nl_free(f->delayed);
                f->delayed = NULL;
                return rc;
            }
        }
    }
    nl_linear_hook_install(&f->hook, m, fp8_forward, fp8_backward, f);
    return NL_OK;
}

void nl_fp8_linear_remove(nl_fp8_linear *f) {
    if (!f) return;
    nl_linear_hook_remove(&f->hook);
    nl_free(f->delayed);
    f->delayed = NULL;
    f->model = NULL;
}

nl_status nl_fp8_linear_status(const nl_fp8_linear *f) { return f ? f->status : NL_ERR_INVALID; }
