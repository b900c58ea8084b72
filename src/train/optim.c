/* AdamW, gradient clipping, the cosine schedule and fp16 loss scaling (see nanolm/train.h). */
#include <math.h>
#include <string.h>

#include "nanolm/train.h"

nl_status nl_adamw_init(nl_adamw *opt, const nl_model *m, float beta1, float beta2, float eps, float weight_decay) {
    memset(opt, 0, sizeof *opt);
    opt->beta1 = beta1;
    opt->beta2 = beta2;
    opt->eps = eps;
    opt->weight_decay = weight_decay;
    opt->n = m->n_params;
    opt->m = nl_calloc(2 * opt->n, sizeof(float), "AdamW moments");
    if (!opt->m) return NL_ERR_NOMEM;
    opt->v = opt->m + opt->n;
    return NL_OK;
}

void nl_adamw_free(nl_adamw *opt) {
    nl_free(opt->m);
    memset(opt, 0, sizeof *opt);
}

size_t nl_adamw_bytes(const nl_adamw *opt) { return 2 * opt->n * sizeof(float); }

void nl_adamw_update_range(const nl_adamw *opt, const nl_model *m, float lr, size_t g0, size_t n, float *p,
                           const float *g, float *mm, float *vv) {
    float b1 = opt->beta1, b2 = opt->beta2, eps = opt->eps;
    /* bias corrections in double, as PyTorch computes them on Python floats */
    double bc1 = 1.0 - pow((double)b1, (double)opt->t), bc2 = 1.0 - pow((double)b2, (double)opt->t);
    float step_size0 = (float)((double)lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    const nl_param_info *tab;
    int nt = nl_model_params_table(m, &tab);
    size_t g1 = g0 + n;
    /* one OpenMP region for all tensors: each tensor's part of the range split over the threads,
     * no barrier between tensors (the updates are elementwise) */
#pragma omp parallel
    for (int k = 0; k < nt; k++) {
        size_t lo = tab[k].offset > g0 ? tab[k].offset : g0;
        size_t hi = tab[k].offset + tab[k].numel < g1 ? tab[k].offset + tab[k].numel : g1;
        if (lo >= hi) continue;
        float lrk = opt->lr_mult ? lr * opt->lr_mult[k] : lr; /* muP: per-tensor learning rate */
        float decay = tab[k].ndim == 2 ? 1.0f - lrk * opt->weight_decay : 1.0f;
        float step_size = opt->lr_mult ? (float)((double)lrk / bc1) : step_size0;
        float *pk = p + (lo - g0), *mk = mm + (lo - g0), *vk = vv + (lo - g0);
        const float *gk = g + (lo - g0);
        int64_t cnt = (int64_t)(hi - lo);
#pragma omp for simd schedule(static) nowait
        for (int64_t i = 0; i < cnt; i++) {
            pk[i] *= decay;
            mk[i] = b1 * mk[i] + (1.0f - b1) * gk[i];
            vk[i] = b2 * vk[i] + (1.0f - b2) * gk[i] * gk[i];
            float denom = sqrtf(vk[i]) / bc2_sqrt + eps;
            pk[i] -= step_size * (mk[i] / denom);
        }
    }
}

void nl_adamw_step(nl_adamw *opt, nl_model *m, float lr) {
    opt->t++;
    nl_adamw_update_range(opt, m, lr, 0, m->n_params, m->params, m->train->grads, opt->m, opt->v);
}

double nl_sumsq(const float *g, size_t n_) {
    double ss = 0.0;
    /* fixed-size chunks so the sum does not depend on the thread count */
    const int64_t chunk = 4096, n = (int64_t)n_, nchunks = (n + chunk - 1) / chunk;
    for (int64_t c0 = 0; c0 < nchunks; c0 += 256) {
        double part[256];
        int64_t cn = nchunks - c0 < 256 ? nchunks - c0 : 256;
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < cn; c++) {
            int64_t lo = (c0 + c) * chunk, hi = lo + chunk < n ? lo + chunk : n;
            /* 16 partial sums (i mod 16), added in order: the loop vectorizes, and the sum
             * order still depends only on n */
            double lane[16] = {0}, s = 0.0;
            int64_t i = lo;
            for (; i + 16 <= hi; i += 16)
                for (int j = 0; j < 16; j++) lane[j] += (double)g[i + j] * g[i + j];
            for (int j = 0; j < 16; j++) s += lane[j];
            for (; i < hi; i++) s += (double)g[i] * g[i];
            part[c] = s;
        }
        for (int64_t c = 0; c < cn; c++) ss += part[c];
    }
    return ss;
}

double nl_grad_norm(const nl_model *m) { return sqrt(nl_sumsq(m->train->grads, m->n_params)); }

float nl_clip_factor(double norm, double max_norm) {
    if (max_norm > 0 && isfinite(norm) && norm > max_norm) return (float)(max_norm / (norm + 1e-6));
    return 1.0f;
}

void nl_grad_scale(nl_model *m, float s) {
    int64_t n = (int64_t)m->n_params;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) m->train->grads[i] *= s;
}

double nl_grad_clip(nl_model *m, double max_norm) {
    double norm = nl_grad_norm(m);
    float f = nl_clip_factor(norm, max_norm);
    if (f != 1.0f) nl_grad_scale(m, f);
    return norm;
}

float nl_lr_cosine(int64_t step, int64_t warmup, int64_t total, float lr_max, float lr_min) {
    if (warmup > 0 && step < warmup) return lr_max * (float)(step + 1) / (float)warmup;
    int64_t span = total - 1 - warmup;
    if (span <= 0) return lr_max;
    double r = (double)(step - warmup) / (double)span;
    if (r > 1.0) r = 1.0;
    return (float)(lr_min + 0.5 * (lr_max - lr_min) * (1.0 + cos(M_PI * r)));
}

void nl_scaler_init(nl_loss_scaler *s) {
    s->scale = 65536.0f;
    s->growth_factor = 2.0f;
    s->backoff_factor = 0.5f;
    s->growth_interval = 2000;
    s->good_steps = 0;
    s->skipped = 0;
}

int nl_scaler_unscale(nl_loss_scaler *s, nl_model *m) {
    float inv = 1.0f / s->scale;
    int64_t n = (int64_t)m->n_params;
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
    for (int64_t i = 0; i < n; i++) {
        float g = m->train->grads[i] * inv;
        if (!isfinite(g)) bad = 1;
        m->train->grads[i] = g;
    }
    return bad;
}

void nl_scaler_update(nl_loss_scaler *s, int found_inf) {
    if (found_inf) {
        s->scale *= s->backoff_factor;
        s->good_steps = 0;
        s->skipped++;
        return;
    }
    if (++s->good_steps >= s->growth_interval) {
        s->scale *= s->growth_factor;
        s->good_steps = 0;
    }
}
