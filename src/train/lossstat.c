/* Batch-means standard errors of a mean loss (see nanolm/lossstat.h). */
#include <math.h>
#include <string.h>

#include "nanolm/lossstat.h"

double nl_student_t975(double df) {
    const double z = 1.959963984540054;
    if (!(df > 0)) return NAN;
    double z2 = z * z, z3 = z2 * z, z5 = z3 * z2, z7 = z5 * z2;
    return z + (z3 + z) / (4 * df) + (5 * z5 + 16 * z3 + 3 * z) / (96 * df * df) +
           (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * df * df * df);
}

nl_status nl_loss_stats_compute(const float *losses, int64_t n, int64_t batch, nl_loss_stats *out) {
    memset(out, 0, sizeof *out);
    if (batch <= 0) batch = (int64_t)floor(sqrt((double)n));
    if (batch < 1) batch = 1;
    int64_t nb = n / batch;
    if (nb < 2)
        return nl_fail(NL_ERR_INVALID, "loss statistics: %lld tokens make fewer than 2 batches of %lld", (long long)n,
                       (long long)batch);
    int64_t used = nb * batch;
    double sum = 0;
    for (int64_t i = 0; i < used; i++) {
        if (!isfinite(losses[i])) return nl_fail(NL_ERR_INVALID, "loss statistics: token %lld has loss %g", (long long)i, (double)losses[i]);
        sum += losses[i];
    }
    double mean = sum / (double)used, ss = 0, sb = 0;
    for (int64_t k = 0; k < nb; k++) {
        double bs = 0;
        for (int64_t i = k * batch; i < (k + 1) * batch; i++) {
            double dv = losses[i] - mean;
            ss += dv * dv;
            bs += losses[i];
        }
        double dm = bs / (double)batch - mean;
        sb += dm * dm;
    }
    out->n = used;
    out->batch = batch;
    out->n_batches = nb;
    out->mean = mean;
    out->sd = sqrt(ss / (double)(used - 1));
    out->se_iid = out->sd / sqrt((double)used);
    out->se = sqrt(sb / (double)(nb - 1) / (double)nb);
    double t = nl_student_t975((double)(nb - 1));
    out->ci_lo = mean - t * out->se;
    out->ci_hi = mean + t * out->se;
    out->ess_factor = out->se_iid > 0 ? (out->se / out->se_iid) * (out->se / out->se_iid) : NAN;
    return NL_OK;
}

double nl_loss_stats_tokens_for_se(const nl_loss_stats *s, double target_se) {
    if (!(target_se > 0)) return NAN;
    return ceil((double)s->n * (s->se / target_se) * (s->se / target_se));
}

nl_status nl_eval_token_losses(nl_model *m, const nl_data *d, nl_data_split split, int64_t B, int64_t T,
                               int64_t max_windows, float **losses, int64_t *n) {
    *losses = NULL;
    *n = 0;
    int64_t windows = nl_data_eval_windows(d, split, (int)T);
    if (max_windows > 0 && windows > max_windows) windows = max_windows;
    if (windows < 1)
        return nl_fail(NL_ERR_INVALID, "%s: the %s split has %lld tokens, fewer than one window of %lld + 1", d->path,
                       nl_data_split_name(split), (long long)nl_data_split_tokens(d, split), (long long)T);
    int32_t *x = nl_malloc((size_t)(B * T) * sizeof(int32_t), "eval batch");
    int32_t *y = nl_malloc((size_t)(B * T) * sizeof(int32_t), "eval batch");
    float *out = nl_malloc((size_t)(windows * T) * sizeof(float), "per-token losses");
    nl_status rc = (x && y && out) ? NL_OK : NL_ERR_NOMEM;
    int64_t scored = 0;
    for (int64_t w = 0; !rc && w < windows; w += B) {
        int nb = 0;
        int want = (int)(windows - w < B ? windows - w : B);
        rc = nl_data_eval_batch(d, split, w, want, (int)T, x, y, &nb);
        if (rc || nb == 0) break;
        float loss;
        rc = nl_model_forward(m, x, y, nb, T, &loss);
        if (rc) break;
        memcpy(out + scored, m->a.losses, (size_t)(nb * T) * sizeof(float));
        scored += nb * T;
    }
    nl_free(x);
    nl_free(y);
    if (rc) {
        nl_free(out);
        return rc;
    }
    *losses = out;
    *n = scored;
    return NL_OK;
}
