/* muP for NanoLM (see nanolm/mup.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nanolm/mup.h"
#include "nanolm/train.h"

static int is_hidden(nl_param_kind k) {
    return k == NL_PARAM_WQ || k == NL_PARAM_WK || k == NL_PARAM_WV || k == NL_PARAM_WO || k == NL_PARAM_W1 ||
           k == NL_PARAM_W3 || k == NL_PARAM_W2;
}

/* The output multiplier alpha = 1/r at the classifier, around the model's default linear, so
 * that muP and the standard parametrisation compute the very same products (the default linear
 * splits each GEMM into row blocks; at r = 1 nothing is scaled and the two are bit-identical). */

/* out (n, out_dim) = alpha in . w^T */
static void mup_forward(void *user, const nl_linear_site *site, float *out, const float *in, const float *w, int64_t n,
                        int64_t in_dim, int64_t out_dim) {
    const nl_mup *mu = user;
    nl_linear_forward_default(mu->model, site, out, in, w, n, in_dim, out_dim);
    if (site->kind != NL_LIN_CLS || mu->out_mult == 1.0f) return;
    float alpha = mu->out_mult;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < out_dim; j++) out[i * out_dim + j] *= alpha;
}

/* din (n, in_dim) = alpha dout . w; dw (out_dim, in_dim) += alpha dout^T . in. The classifier's
 * weight gradient of this call goes to mu->dw_cls first (zeroed), then alpha times it into dw. */
static void mup_backward(void *user, const nl_linear_site *site, float *din, float *dw, const float *dout,
                         const float *in, const float *w, int64_t n, int64_t in_dim, int64_t out_dim) {
    const nl_mup *mu = user;
    if (site->kind != NL_LIN_CLS || mu->out_mult == 1.0f) {
        nl_linear_backward_default(mu->model, site, din, dw, dout, in, w, n, in_dim, out_dim);
        return;
    }
    float alpha = mu->out_mult, *g = mu->dw_cls;
    int64_t nw = out_dim * in_dim;
    memset(g, 0, (size_t)nw * sizeof(float));
    nl_linear_backward_default(mu->model, site, din, g, dout, in, w, n, in_dim, out_dim);
#pragma omp parallel
    {
        if (din) {
#pragma omp for schedule(static) nowait
            for (int64_t i = 0; i < n * in_dim; i++) din[i] *= alpha;
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < nw; i++) dw[i] += alpha * g[i];
    }
}

nl_status nl_mup_init(nl_mup *mu, nl_model *m, struct nl_adamw *opt, int64_t base_dim, int rescale_init) {
    memset(mu, 0, sizeof *mu);
    if (base_dim <= 0) return nl_fail(NL_ERR_INVALID, "muP base width %lld must be positive", (long long)base_dim);
    if (m->precision != NL_PREC_FP32) return nl_fail(NL_ERR_INVALID, "muP is implemented for fp32 training only");
    if (m->linear_ops) return nl_fail(NL_ERR_INVALID, "muP: the model already has a linear hook installed");
    mu->base_dim = base_dim;
    mu->width_mult = (double)m->C / (double)base_dim;
    mu->out_mult = (float)(1.0 / mu->width_mult);
    const nl_param_info *tab;
    int nt = nl_model_params_table(m, &tab);
    mu->lr_mult = nl_malloc((size_t)nt * sizeof(float), "muP learning-rate multipliers");
    if (!mu->lr_mult) return NL_ERR_NOMEM;
    float init_scale = (float)(1.0 / sqrt(mu->width_mult));
    for (int k = 0; k < nt; k++) {
        int hidden = is_hidden(tab[k].kind);
        mu->lr_mult[k] = hidden ? (float)(1.0 / mu->width_mult) : 1.0f;
        if (hidden && rescale_init) {
            float *p = m->params + tab[k].offset;
            for (size_t i = 0; i < tab[k].numel; i++) p[i] *= init_scale;
        }
    }
    if (mu->out_mult != 1.0f) { /* the classifier's weight gradient before the multiplier */
        mu->dw_cls = nl_malloc((size_t)(m->V * m->C) * sizeof(float), "muP classifier gradient scratch");
        if (!mu->dw_cls) {
            nl_free(mu->lr_mult);
            mu->lr_mult = NULL;
            return NL_ERR_NOMEM;
        }
    }
    mu->model = m;
    mu->ops = (nl_linear_ops){mup_forward, mup_backward, mu};
    m->linear_ops = &mu->ops;
    if (opt) opt->lr_mult = mu->lr_mult;
    return NL_OK;
}

void nl_mup_free(nl_mup *mu, nl_model *m, struct nl_adamw *opt) {
    if (m && m->linear_ops == &mu->ops) m->linear_ops = NULL;
    if (opt && opt->lr_mult == mu->lr_mult) opt->lr_mult = NULL;
    nl_free(mu->lr_mult);
    nl_free(mu->dw_cls);
    memset(mu, 0, sizeof *mu);
}

#include "nanolm/svg.h"
#include "nanolm/sweep.h"

/* Index of the smallest finite value of x (n); -1 if none. */
static int argmin(const double *x, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i]) && (best < 0 || x[i] < x[best])) best = i;
    return best;
}

nl_status nl_lr_sweep(const nl_data *d, const int64_t *widths, int n_w, const double *lrs, int n_lr, int64_t layers,
                      int64_t steps, int64_t batch, int64_t seq, int64_t val_windows, int64_t base_dim, uint64_t seed,
                      double *loss) {
    for (int i = 0; i < n_w; i++) {
        for (int j = 0; j < n_lr; j++) {
            nl_arch a;
            nl_sweep_arch(widths[i], layers, seq, &a);
            nl_train_opts o;
            nl_train_opts_default(&o);
            o.steps = steps;
            o.batch = batch;
            o.seq = seq;
            o.lr = (float)lrs[j];
            o.lr_min = (float)lrs[j] / 10;
            o.warmup = steps / 10 > 0 ? steps / 10 : 1;
            o.eval_every = 0;
            o.eval_windows = 1;
            o.seed = seed;
            o.mup_base_dim = base_dim;
            nl_trainer t;
            nl_status rc = nl_trainer_init(&t, &a, &o);
            if (rc)
                return nl_fail(rc, "lr sweep, width %lld, lr %g: %s", (long long)widths[i], lrs[j], nl_last_error());
            rc = nl_trainer_run(&t, &o, d, NULL, NULL);
            double vl = INFINITY;
            if (rc == NL_ERR_NUMERIC)
                rc = NL_OK; /* diverged: infinite loss */
            else if (!rc)
                rc = nl_eval_loss(&t.model, d, NL_DATA_VAL, batch, seq, val_windows, &vl, NULL);
            nl_trainer_free(&t);
            if (rc)
                return nl_fail(rc, "lr sweep, width %lld, lr %g: %s", (long long)widths[i], lrs[j], nl_last_error());
            loss[i * n_lr + j] = isfinite(vl) ? vl : INFINITY;
        }
    }
    return NL_OK;
}

double nl_argmin_interp(const double *x, int n) {
    int b = argmin(x, n);
    if (b < 0) return NAN;
    if (b == 0 || b == n - 1 || !isfinite(x[b - 1]) || !isfinite(x[b + 1])) return b;
    double l = x[b - 1], c = x[b], r = x[b + 1], den = l - 2 * c + r;
    if (!(den > 0)) return b;
    return b + (l - r) / (2 * den);
}

/* The best learning rate per width of both parametrisations, and its spread over the widths. */
static void lrt_best(int n_w, int n_lr, nl_lr_transfer *x) {
    x->lo[0] = x->lo[1] = 99;
    x->hi[0] = x->hi[1] = -1;
    for (int i = 0; i < n_w; i++) {
        x->best_sp[i] = argmin(x->sp + i * n_lr, n_lr);
        x->best_mu[i] = argmin(x->mu + i * n_lr, n_lr);
        x->fb[0][i] = nl_argmin_interp(x->sp + i * n_lr, n_lr);
        x->fb[1][i] = nl_argmin_interp(x->mu + i * n_lr, n_lr);
        for (int k = 0; k < 2; k++) x->lo[k] = fmin(x->lo[k], x->fb[k][i]), x->hi[k] = fmax(x->hi[k], x->fb[k][i]);
    }
}

nl_status nl_lr_transfer_run(const nl_data *d, const int64_t *widths, int n_w, const double *lrs, int n_lr,
                             int64_t layers, int64_t steps, int64_t base, nl_lr_transfer *x) {
    if (n_w < 1 || n_w > NL_LRT_MAX_WIDTHS || n_lr < 1 || n_lr > NL_LRT_MAX_LRS)
        return nl_fail(NL_ERR_INVALID, "lr transfer: %d widths and %d learning rates (1..%d and 1..%d)", n_w, n_lr,
                       NL_LRT_MAX_WIDTHS, NL_LRT_MAX_LRS);
    memset(x, 0, sizeof *x);
    x->n_w = n_w, x->n_lr = n_lr;
    memcpy(x->widths, widths, (size_t)n_w * sizeof *widths);
    memcpy(x->lrs, lrs, (size_t)n_lr * sizeof *lrs);
    NL_TRY(nl_lr_sweep(d, widths, n_w, lrs, n_lr, layers, steps, 8, 32, 100, 0, 11, x->sp));
    NL_TRY(nl_lr_sweep(d, widths, n_w, lrs, n_lr, layers, steps, 8, 32, 100, base, 11, x->mu));
    lrt_best(n_w, n_lr, x);
    return NL_OK;
}

nl_status nl_lr_transfer_svg(const char *path, const nl_lr_transfer *x, char *mup_path, size_t n) {
    const char *slash = strrchr(path, '/');
    if (slash)
        snprintf(mup_path, n, "%.*s/mup-%s", (int)(slash - path), path, slash + 1);
    else
        snprintf(mup_path, n, "mup-%s", path);
    for (int k = 0; k < 2; k++) {
        nl_svg_series s[NL_LRT_MAX_WIDTHS];
        double ys[NL_LRT_MAX_WIDTHS][NL_LRT_MAX_LRS];
        char nm[NL_LRT_MAX_WIDTHS][32];
        for (int i = 0; i < x->n_w; i++) {
            for (int q = 0; q < x->n_lr; q++) {
                double v = (k ? x->mu : x->sp)[i * x->n_lr + q];
                ys[i][q] = isfinite(v) ? fmin(v, 6.0) : 6.0; /* diverged runs drawn at the top */
            }
            snprintf(nm[i], 32, "width %lld", (long long)x->widths[i]);
            s[i] = (nl_svg_series){nm[i], x->lrs, ys[i], (size_t)x->n_lr, NULL, 1};
        }
        nl_svg_plot_opts o = {k ? "muP: validation loss vs learning rate"
                                : "standard parametrisation: validation loss vs learning rate",
                              "peak learning rate",
                              "validation loss (nats/token; diverged = 6)",
                              1,
                              0,
                              0,
                              0};
        NL_TRY(nl_svg_plot(k ? mup_path : path, &o, s, (size_t)x->n_w));
    }
    return NL_OK;
}
