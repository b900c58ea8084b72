/* Batch-means standard errors of a mean loss (see nanolm/lossstat.h). */
#include <math.h>
#include <string.h>

#include "nanolm/lossstat.h"
#include "nanolm/train.h"

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
        if (!isfinite(losses[i]))
            return nl_fail(NL_ERR_INVALID, "loss statistics: token %lld has loss %g", (long long)i, (double)losses[i]);
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

/* nl_eval_token_losses's visitor: appends the per-token losses in text order. */
typedef struct token_sink {
    float *out;
    int64_t n;
} token_sink;
static nl_status keep_losses(void *user, const float *losses, int64_t n) {
    token_sink *s = user;
    memcpy(s->out + s->n, losses, (size_t)n * sizeof(float));
    s->n += n;
    return NL_OK;
}

nl_status nl_eval_token_losses(nl_model *m, const nl_data *d, nl_data_split split, int64_t B, int64_t T,
                               int64_t max_windows, float **losses, int64_t *n) {
    *losses = NULL;
    *n = 0;
    int64_t windows;
    NL_TRY(nl_eval_window_count(d, split, T, max_windows, &windows));
    token_sink s = {nl_malloc((size_t)(windows * T) * sizeof(float), "per-token losses"), 0};
    if (!s.out) return NL_ERR_NOMEM;
    nl_status rc = nl_eval_windows(m, d, split, B, T, max_windows, keep_losses, &s); /* the one evaluation loop */
    if (rc) {
        nl_free(s.out);
        return rc;
    }
    *losses = s.out;
    *n = s.n;
    return NL_OK;
}

/* Non-ASCII byte-fallback targets (llama2.c pieces <0x80>..<0xFF>, ids 3+128..258; ASCII
 * fallbacks such as <0x0A> for a newline are ordinary text): loss i predicts token
 * split_begin + i + 1 (window w covers tokens wT .. wT+T of the split). */
static void byte_fallback_split(const nl_data *d, int llama2c, nl_data_split split, const float *tl,
                                nl_eval_summary *o) {
    double sum_all = 0;
    const int *tgt = d->tokens + nl_data_split_begin(d, split) + 1;
    for (int64_t i = 0; i < o->scored; i++) {
        sum_all += tl[i];
        if (llama2c && tgt[i] >= 3 + 128 && tgt[i] <= 258) {
            o->n_fb++;
            o->sum_fb += tl[i];
        }
    }
    o->loss = sum_all / (double)o->scored; /* all tokens; st.mean drops a last partial SE batch */
    o->fb_mean = o->n_fb ? o->sum_fb / (double)o->n_fb : 0;
    o->rest_mean = o->scored > o->n_fb ? (sum_all - o->sum_fb) / (double)(o->scored - o->n_fb) : 0;
}

nl_status nl_eval_summary_run(nl_model *m, const nl_data *d, int llama2c, nl_data_split split, int64_t B, int64_t T,
                              int kv, int64_t max_windows, int64_t se_batch, double target_se, nl_eval_summary *out) {
    memset(out, 0, sizeof *out);
    if (kv >= 0) {
        nl_decode_state st;
        NL_TRY(nl_decode_state_init(&st, m, (nl_kv_dtype)kv));
        out->kv_bytes = st.kv_bytes;
        nl_status rc = nl_eval_loss_kv(m, &st, d, split, T, max_windows, &out->loss, &out->scored);
        nl_decode_state_free(&st);
        return rc;
    }
    float *tl = NULL;
    NL_TRY(nl_model_alloc_acts(m, B, T));
    nl_status st = nl_eval_token_losses(m, d, split, B, T, max_windows, &tl, &out->scored);
    if (!st) st = nl_loss_stats_compute(tl, out->scored, se_batch, &out->st);
    if (!st) {
        byte_fallback_split(d, llama2c, split, tl, out);
        out->show_fb = llama2c;
        out->need = target_se > 0 ? nl_loss_stats_tokens_for_se(&out->st, target_se) : 0;
    }
    nl_free(tl);
    return st;
}
