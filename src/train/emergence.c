/* Per-token loss/accuracy against exact match of the next k tokens (see nanolm/emergence.h). */
#include <math.h>
#include <string.h>

#include "nanolm/emergence.h"
#include "nanolm/hf.h"
#include "nanolm/model_load.h"
#include "nanolm/tokenizer.h"

nl_status nl_emergence_eval(nl_model *m, const nl_data *d, nl_data_split split, int64_t B, int64_t T, int64_t windows,
                            int kmax, nl_emergence *out) {
    memset(out, 0, sizeof *out);
    if (kmax < 1 || kmax > NL_EMERGENCE_KMAX || kmax >= T)
        return nl_fail(NL_ERR_INVALID, "emergence: k max %d must be in 1..%d and below the window %lld", kmax,
                       NL_EMERGENCE_KMAX, (long long)T);
    int64_t avail = nl_data_eval_windows(d, split, (int)T);
    if (windows <= 0 || windows > avail) windows = avail;
    if (windows < 1)
        return nl_fail(NL_ERR_INVALID, "%s: the %s split has no window of %lld tokens", d->path,
                       nl_data_split_name(split), (long long)T);
    int32_t *x = nl_malloc((size_t)(B * T) * sizeof(int32_t), "emergence batch");
    int32_t *y = nl_malloc((size_t)(B * T) * sizeof(int32_t), "emergence batch");
    unsigned char *ok = nl_malloc((size_t)(B * T), "emergence correct");
    nl_status rc = (x && y && ok) ? NL_OK : NL_ERR_NOMEM;
    double loss = 0;
    int64_t correct = 0, scored = 0, starts = 0, hits[NL_EMERGENCE_KMAX + 1] = {0}, prev_ok = 0, both_ok = 0;
    const int64_t V = m->V;
    for (int64_t w = 0; !rc && w < windows; w += B) {
        int nb = 0, want = (int)(windows - w < B ? windows - w : B);
        if ((rc = nl_data_eval_batch(d, split, w, want, (int)T, x, y, &nb)) || nb == 0) break;
        float l;
        if ((rc = nl_model_forward(m, x, y, nb, T, &l))) break;
        for (int64_t i = 0; i < nb * T; i++) {
            const float *z = m->train->a.logits + i * V;
            int64_t best = 0;
            for (int64_t v = 1; v < V; v++)
                if (z[v] > z[best]) best = v;
            ok[i] = best == y[i];
            correct += ok[i];
            loss += m->train->a.losses[i];
        }
        scored += nb * T;
        for (int64_t b = 0; b < nb; b++)
            for (int64_t t = 1; t < T; t++)
                if (ok[b * T + t - 1]) {
                    prev_ok++;
                    both_ok += ok[b * T + t];
                }
        for (int64_t b = 0; b < nb; b++)
            for (int64_t t = 0; t + kmax <= T; t++) {
                int run = 0;
                while (run < kmax && ok[b * T + t + run]) run++;
                for (int k = 1; k <= run; k++) hits[k]++;
                starts++;
            }
    }
    nl_free(x);
    nl_free(y);
    nl_free(ok);
    if (rc) return rc;
    out->mean_loss = loss / (double)scored;
    out->accuracy = (double)correct / (double)scored;
    out->tokens = scored;
    out->starts = starts;
    out->kmax = kmax;
    out->p_after_correct = prev_ok ? (double)both_ok / (double)prev_ok : NAN;
    for (int k = 1; k <= kmax; k++) out->exact[k] = (double)hits[k] / (double)starts;
    return NL_OK;
}

nl_status nl_emergence_eval_file(const char *ckpt, const char *text, nl_data_split split, int64_t windows, int *kmax,
                                 nl_emergence *out) {
    nl_model m;
    nl_tokenizer tok;
    nl_data d;
    memset(&d, 0, sizeof d);
    NL_TRY(nl_model_load(ckpt, NULL, NL_HF_DEFAULT_MAX_SEQ, &m, &tok, NULL));
    int64_t T = m.arch.seq_len;
    int k = (int)(T - 1 < NL_EMERGENCE_KMAX ? T - 1 : NL_EMERGENCE_KMAX);
    *kmax = k < *kmax ? k : *kmax;
    nl_status st = nl_data_open(&d, text, &tok);
    if (!st) st = nl_model_alloc_acts(&m, 8, T);
    if (!st) st = nl_emergence_eval(&m, &d, split, 8, T, windows, k, out);
    nl_data_free(&d);
    nl_tokenizer_free(&tok);
    nl_model_free(&m);
    return st;
}
