/* Every quantization scheme applied to the same fp32 model and measured side by side
 * (nanolm/quant_compare.h): the scheme list, the texts as tokens, and the measurements. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nanolm/quant_compare.h"
#include "nanolm/svg.h"
#include "nanolm/train.h"

nl_status nl_qc_parse_schemes(const char *schemes, nl_qc_row *rows, int max, int *n_rows) {
    char list[1024];
    *n_rows = 0;
    if (strlen(schemes) >= sizeof list) return nl_fail(NL_ERR_INVALID, "--schemes list too long");
    snprintf(list, sizeof list, "%s", schemes);
    for (char *save = NULL, *tokn = strtok_r(list, ",", &save); tokn; tokn = strtok_r(NULL, ",", &save)) {
        if (*n_rows == max) return nl_fail(NL_ERR_INVALID, "at most %d schemes", max);
        nl_qc_row *r = &rows[*n_rows];
        memset(r, 0, sizeof *r);
        if (nl_qm_parse(tokn, &r->s)) return nl_fail(NL_ERR_INVALID, "--schemes: %s", nl_last_error());
        if (r->s.method == NL_QM_FP32) continue;
        for (int j = 0; j < *n_rows; j++)
            if (!strcmp(rows[j].s.name, r->s.name))
                return nl_fail(NL_ERR_INVALID, "--schemes lists %s twice", rows[j].s.name);
        (*n_rows)++;
    }
    if (*n_rows == 0) return nl_fail(NL_ERR_INVALID, "--schemes names no scheme besides the fp32 baseline");
    return NL_OK;
}

void nl_qc_tokens_free(nl_qc_tokens *t) {
    nl_free(t->eval_ids);
    nl_free(t->calib_ids);
    nl_free(t->dtext);
    nl_free(t->ctext);
    memset(t, 0, sizeof *t);
}

nl_status nl_qc_encode(const char *data, const char *calib, const nl_tokenizer *tok, int64_t T, int64_t calib_n,
                       int64_t eval_n, nl_qc_tokens *t) {
    size_t dbytes = 0, cbytes = 0;
    memset(t, 0, sizeof *t);
    NL_TRY(nl_read_file(data, &t->dtext, &dbytes));
    const char *etext = t->dtext, *cal = NULL;
    size_t ebytes = dbytes, calb = 0;
    if (!strcmp(data, calib)) {
        size_t mid = dbytes / 2;
        while (mid < dbytes && t->dtext[mid] != '\n') mid++;
        cal = t->dtext;
        calb = mid;
        etext = t->dtext + mid;
        ebytes = dbytes - mid;
    } else {
        NL_TRY(nl_read_file(calib, &t->ctext, &cbytes));
        cal = t->ctext;
        calb = cbytes;
    }
    NL_TRY(nl_tokenizer_encode(tok, etext, ebytes, 1, 0, &t->eval_ids, &t->n_eval));
    NL_TRY(nl_tokenizer_encode(tok, cal, calb, 1, 0, &t->calib_ids, &t->n_calib));
    if (t->n_eval < 2 || t->n_calib < T)
        return nl_fail(NL_ERR_INVALID,
                       "%lld evaluation tokens and %lld calibration tokens; need >= 2 and >= --seq %lld",
                       (long long)t->n_eval, (long long)t->n_calib, (long long)T);
    if (t->n_calib > calib_n) t->n_calib = calib_n < T ? T : calib_n;
    if (eval_n > 0 && t->n_eval > eval_n) t->n_eval = eval_n;
    return NL_OK;
}

/* Keeps LLM.int8()'s outlier report of rt in r (copies; NULL when out of memory). */
static void keep_outliers(const nl_model *m, const nl_qm_runtime *rt, nl_qc_row *r) {
    if (!rt->calib_outliers) return;
    size_t k = (size_t)m->L * NL_QM_SITES * sizeof(int);
    r->calib_outliers = nl_malloc(k, "outlier report");
    r->eval_outliers = nl_malloc(k, "outlier report");
    if (r->calib_outliers && r->eval_outliers) {
        memcpy(r->calib_outliers, rt->calib_outliers, k);
        memcpy(r->eval_outliers, rt->eval_outliers_max, k);
    }
}

/* Applies scheme r->s to the fp32 parameters `orig` and measures it into r. */
static nl_status measure(nl_model *m, const float *orig, const nl_qm_calib *cb, const nl_qc_tokens *t, int64_t B,
                         int64_t T, nl_qc_row *r) {
    memcpy(m->params, orig, m->n_params * sizeof(float));
    nl_qm_runtime rt;
    double t0 = nl_time_s();
    nl_status rc = nl_qm_apply(m, &r->s, cb, &rt);
    r->time_s = nl_time_s() - t0;
    if (!rc) rc = nl_eval_loss_tokens(m, t->eval_ids, t->n_eval, B, T, &r->loss, NULL);
    if (!rc) {
        r->bytes = nl_qm_model_bytes(m, &r->s);
        r->awq_alpha = rt.awq_alpha_mean;
        keep_outliers(m, &rt, r);
    }
    nl_qm_runtime_free(&rt);
    return rc;
}

nl_status nl_qc_run(nl_model *m, const nl_qc_tokens *t, int64_t B, int64_t T, nl_qc_row *rows, int n, double *base,
                    int64_t *scored) {
    float *orig = nl_malloc(m->n_params * sizeof(float), "fp32 parameter copy");
    if (!orig) return NL_ERR_NOMEM;
    memcpy(orig, m->params, m->n_params * sizeof(float));
    nl_status st = nl_eval_loss_tokens(m, t->eval_ids, t->n_eval, B, T, base, scored);
    nl_qm_calib cb = {.tokens = t->calib_ids, .n = t->n_calib, .B = B, .T = T};
    for (int i = 0; !st && i < n; i++) st = measure(m, orig, &cb, t, B, T, &rows[i]);
    memcpy(m->params, orig, m->n_params * sizeof(float));
    nl_free(orig);
    return st;
}

void nl_qc_rows_free(nl_qc_row *rows, int n) {
    for (int i = 0; i < n; i++) {
        nl_free(rows[i].calib_outliers);
        nl_free(rows[i].eval_outliers);
        rows[i].calib_outliers = rows[i].eval_outliers = NULL;
    }
}

nl_status nl_qc_svg(const char *path, const nl_qc_row *rows, int n, double base) {
    nl_svg s;
    double W = 760, H = 40 + 26.0 * n + 40, left = 190, right = 40, top = 40;
    nl_svg_begin(&s, W, H);
    nl_svg_text(&s, W / 2, 22, 14, "middle", "loss increase over fp32 (nats/token), lower is better");
    double lo = 0, hi = 0;
    for (int i = 0; i < n; i++) {
        double d = rows[i].loss - base;
        if (d < lo) lo = d;
        if (d > hi) hi = d;
    }
    if (hi - lo <= 0) hi = lo + 1e-6;
    double span = W - left - right, x0 = left + (0 - lo) / (hi - lo) * span;
    for (int i = 0; i < n; i++) {
        double d = rows[i].loss - base, y = top + 26.0 * i;
        double x1 = left + (d - lo) / (hi - lo) * span;
        char val[48];
        snprintf(val, sizeof val, "%+.4f", d);
        nl_svg_rect(&s, x1 < x0 ? x1 : x0, y + 4, fabs(x1 - x0) < 1 ? 1 : fabs(x1 - x0), 18,
                    nl_svg_color((size_t)rows[i].s.method), val);
        nl_svg_text(&s, left - 8, y + 18, 12, "end", rows[i].s.name);
        nl_svg_text(&s, (x1 > x0 ? x1 : x0) + 4, y + 18, 11, "start", val);
    }
    nl_svg_line(&s, x0, top, x0, top + 26.0 * n, "#000", 1);
    return nl_svg_save(&s, path);
}
