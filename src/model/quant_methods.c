/* RTN, GPTQ, AWQ, SmoothQuant, W8A8 and LLM.int8() on a whole NanoLM model
 * (see include/nanolm/quant_methods.h). */
#include "nanolm/quant_methods.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/awq.h"
#include "nanolm/gptq.h"
#include "nanolm/llmint8.h"
#include "nanolm/qgrid.h"
#include "nanolm/smoothquant.h"

enum { SITE_QKV = 0, SITE_O = 1, SITE_GATE_UP = 2, SITE_DOWN = 3 };
static const char *site_names[NL_QM_SITES] = {"qkv", "o", "gate_up", "down"};

const char *nl_qm_site_name(int site) { return site >= 0 && site < NL_QM_SITES ? site_names[site] : "?"; }

const char *nl_qm_method_name(nl_qm_method m) {
    static const char *names[] = {"fp32", "rtn", "gptq", "awq", "smoothquant", "w8a8", "llm.int8"};
    return m >= NL_QM_FP32 && m <= NL_QM_LLMINT8 ? names[m] : "?";
}

nl_status nl_qm_parse(const char *name, nl_qm_scheme *s) {
    memset(s, 0, sizeof *s);
    if (!name || strlen(name) >= sizeof s->name)
        return nl_fail(NL_ERR_INVALID, "quantization scheme name '%s' is empty or too long", name ? name : "");
    snprintf(s->name, sizeof s->name, "%s", name);
    s->act_bits = 32;
    char meth[16];
    int bits = 0, group = -1, len = 0;
    double p = 0;
    if (!strcmp(name, "fp32")) {
        s->method = NL_QM_FP32;
        s->bits = 32;
        return NL_OK;
    }
    if (!strcmp(name, "w8a8")) {
        s->method = NL_QM_W8A8;
        s->bits = s->act_bits = 8;
        s->param = INFINITY;
        return NL_OK;
    }
    if (!strncmp(name, "smoothquant-w8a8", 16)) {
        s->method = NL_QM_SMOOTHQUANT;
        s->bits = s->act_bits = 8;
        s->param = 0.5;
        if (name[16] == '\0') return NL_OK;
        if (sscanf(name + 16, "-a%lf%n", &p, &len) == 1 && name[16 + len] == '\0' && p >= 0 && p <= 1) {
            s->param = p;
            return NL_OK;
        }
        return nl_fail(NL_ERR_INVALID,
                       "scheme '%s': expected smoothquant-w8a8 or smoothquant-w8a8-aALPHA with ALPHA in [0, 1]", name);
    }
    if (!strncmp(name, "int8-outlier", 12)) {
        if (sscanf(name + 12, "%lf%n", &p, &len) == 1 && name[12 + len] == '\0' && p > 0) {
            s->method = NL_QM_LLMINT8;
            s->bits = s->act_bits = 8;
            s->param = p;
            return NL_OK;
        }
        return nl_fail(NL_ERR_INVALID,
                       "scheme '%s': expected int8-outlierT with a threshold T > 0 (e.g. int8-outlier6)", name);
    }
    if (sscanf(name, "%15[a-z]-int%d-g%d%n", meth, &bits, &group, &len) == 3 && name[len] == '\0') {
        if (!strcmp(meth, "rtn"))
            s->method = NL_QM_RTN;
        else if (!strcmp(meth, "gptq"))
            s->method = NL_QM_GPTQ;
        else if (!strcmp(meth, "awq"))
            s->method = NL_QM_AWQ;
        else
            return nl_fail(NL_ERR_INVALID, "scheme '%s': unknown method '%s' (rtn, gptq, awq)", name, meth);
        if (bits < 2 || bits > 8) return nl_fail(NL_ERR_INVALID, "scheme '%s': bits must be 2..8, got %d", name, bits);
        if (group < 0) return nl_fail(NL_ERR_INVALID, "scheme '%s': group must be >= 0, got %d", name, group);
        s->bits = bits;
        s->group = group;
        return NL_OK;
    }
    return nl_fail(NL_ERR_INVALID,
                   "unknown quantization scheme '%s' (fp32, rtn-int4-g32, gptq-int4-g32, "
                   "awq-int4-g128, smoothquant-w8a8, w8a8, int8-outlier6, ...)",
                   name);
}

/* ---- sites ------------------------------------------------------------------------------- */

static void site_weight(nl_model *m, int l, int site, float **w, int64_t *rows, int64_t *cols) {
    nl_layer_weights *lw = &m->w.layers[l];
    switch (site) {
    case SITE_QKV:
        *w = lw->wq;
        *rows = m->QKV;
        *cols = m->C;
        break;
    case SITE_O:
        *w = lw->wo;
        *rows = m->C;
        *cols = m->NH * m->hd;
        break;
    case SITE_GATE_UP:
        *w = lw->w1;
        *rows = 2 * m->H;
        *cols = m->C;
        break;
    default:
        *w = lw->w2;
        *rows = m->C;
        *cols = m->H;
        break;
    }
}

static int64_t site_in_dim(const nl_model *m, int site) {
    return site == SITE_O ? m->NH * m->hd : site == SITE_DOWN ? m->H : m->C;
}

/* Input of (l, site) in the activations of the last forward over BT tokens: (BT, in_dim). */
static const float *site_input(const nl_model *m, int l, int site, int64_t BT) {
    const nl_acts *a = &m->train->a;
    switch (site) {
    case SITE_QKV: return a->ln1 + l * BT * m->C;
    case SITE_O: return a->atty + l * BT * m->NH * m->hd;
    case SITE_GATE_UP: return a->ln2 + l * BT * m->C;
    default: return a->hact + l * BT * m->H;
    }
}

static int site_of_kind(nl_linear_kind k) {
    return k == NL_LIN_QKV ? SITE_QKV : k == NL_LIN_O ? SITE_O : k == NL_LIN_GATE_UP ? SITE_GATE_UP : SITE_DOWN;
}

/* ---- calibration ---------------------------------------------------------------------------- */

typedef void (*calib_fn)(void *user, const nl_model *m, int64_t BT);

/* Number of calibration tokens used: whole windows of T. */
static int64_t calib_tokens(const nl_qm_calib *c) { return (c->n / c->T) * c->T; }

/* Runs the model over the calibration windows (targets not needed) and calls fn after each. */
static nl_status run_calib(nl_model *m, const nl_qm_calib *c, calib_fn fn, void *user) {
    int64_t used = calib_tokens(c);
    for (int64_t pos = 0; pos < used;) {
        int64_t nb = (used - pos) / c->T < c->B ? (used - pos) / c->T : c->B;
        NL_TRY(nl_model_forward(m, c->tokens + pos, NULL, nb, c->T, NULL));
        fn(user, m, nb * c->T);
        pos += nb * c->T;
    }
    return NL_OK;
}

typedef struct layer_capture {
    int layer;
    int64_t n;             /* tokens captured so far */
    float *x[NL_QM_SITES]; /* (n_total, in_dim) */
} layer_capture;

static void capture_layer(void *user, const nl_model *m, int64_t BT) {
    layer_capture *cap = user;
    for (int s = 0; s < NL_QM_SITES; s++) {
        int64_t d = site_in_dim(m, s);
        memcpy(cap->x[s] + cap->n * d, site_input(m, cap->layer, s, BT), (size_t)(BT * d) * sizeof(float));
    }
    cap->n += BT;
}

typedef struct stats_capture {
    float *absmax;  /* [L][site][in_dim max] per-channel max |x| */
    int64_t stride; /* floats per (layer, site) */
} stats_capture;

static void capture_absmax(void *user, const nl_model *m, int64_t BT) {
    stats_capture *st = user;
    for (int l = 0; l < m->L; l++)
        for (int s = 0; s < NL_QM_SITES; s++)
            nl_smoothquant_observe(site_input(m, l, s, BT), BT, (int)site_in_dim(m, s),
                                   st->absmax + (l * NL_QM_SITES + s) * st->stride);
}

static nl_status absmax_stats(nl_model *m, const nl_qm_calib *c, float **out, int64_t *stride) {
    stats_capture st;
    st.stride = m->C > m->H ? m->C : m->H;
    if (m->NH * m->hd > st.stride) st.stride = m->NH * m->hd;
    st.absmax = nl_calloc((size_t)(m->L * NL_QM_SITES * st.stride), sizeof(float), "activation absmax");
    if (!st.absmax) return NL_ERR_NOMEM;
    nl_status rc = run_calib(m, c, capture_absmax, &st);
    if (rc) {
        nl_free(st.absmax);
        return rc;
    }
    *out = st.absmax;
    *stride = st.stride;
    return NL_OK;
}

/* ---- W8A8 hook -------------------------------------------------------------------------- */

static void qm_forward(void *user, const nl_linear_site *site, float *out, const float *in, const float *w, int64_t n,
                       int64_t in_dim, int64_t out_dim) {
    nl_qm_runtime *rt = user;
    if (site->kind == NL_LIN_CLS || site->layer < 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)out_dim, (int)in_dim, 1.f, in, (int)in_dim, w,
                    (int)in_dim, 0.f, out, (int)out_dim);
        return;
    }
    int idx = site->layer * NL_QM_SITES + site_of_kind(site->kind);
    int cnt = 0;
    if (nl_llmint8_forward(in, n, (int)in_dim, rt->codes[idx], rt->scales[idx], (int)out_dim, rt->threshold, out,
                           &cnt) != NL_OK) {
        for (int64_t i = 0; i < n * out_dim; i++) out[i] = NAN; /* a bad input shows in the loss */
        return;
    }
    if (cnt > rt->eval_outliers_max[idx]) rt->eval_outliers_max[idx] = cnt;
}

static nl_status install_w8a8(nl_model *m, nl_qm_runtime *rt, float threshold) {
    int n = (int)m->L * NL_QM_SITES;
    rt->codes = nl_calloc((size_t)n, sizeof(int8_t *), "w8a8 codes table");
    rt->scales = nl_calloc((size_t)n, sizeof(float *), "w8a8 scales table");
    rt->eval_outliers_max = nl_calloc((size_t)n, sizeof(int), "outlier counts");
    if (!rt->codes || !rt->scales || !rt->eval_outliers_max) return NL_ERR_NOMEM;
    for (int l = 0; l < m->L; l++)
        for (int s = 0; s < NL_QM_SITES; s++) {
            float *w;
            int64_t rows, cols;
            site_weight(m, l, s, &w, &rows, &cols);
            int i = l * NL_QM_SITES + s;
            rt->codes[i] = nl_malloc((size_t)(rows * cols), "w8a8 codes");
            rt->scales[i] = nl_malloc((size_t)rows * sizeof(float), "w8a8 scales");
            if (!rt->codes[i] || !rt->scales[i]) return NL_ERR_NOMEM;
            NL_TRY(nl_llmint8_quantize_weight(w, (int)rows, (int)cols, rt->codes[i], rt->scales[i]));
        }
    rt->threshold = threshold;
    rt->ops.forward = qm_forward;
    rt->ops.backward = NULL;
    rt->ops.user = rt;
    m->linear_ops = &rt->ops;
    return NL_OK;
}

void nl_qm_runtime_free(nl_qm_runtime *rt) {
    if (rt->m && rt->m->linear_ops == &rt->ops) rt->m->linear_ops = NULL;
    int n = rt->m ? (int)rt->m->L * NL_QM_SITES : 0;
    for (int i = 0; i < n; i++) {
        if (rt->codes) nl_free(rt->codes[i]);
        if (rt->scales) nl_free(rt->scales[i]);
    }
    nl_free(rt->codes);
    nl_free(rt->scales);
    nl_free(rt->calib_outliers);
    nl_free(rt->eval_outliers_max);
    memset(rt, 0, sizeof *rt);
}

/* ---- the methods -------------------------------------------------------------------------- */

static nl_status apply_rtn(nl_model *m, const nl_qm_scheme *s) {
    for (int l = 0; l < m->L; l++)
        for (int site = 0; site < NL_QM_SITES; site++) {
            float *w;
            int64_t rows, cols;
            site_weight(m, l, site, &w, &rows, &cols);
            NL_TRY(nl_qgrid_rtn(w, rows, cols, s->bits, s->group, 0, NULL, NULL, NULL, w));
        }
    return NL_OK;
}

/* W' rows j /= s[j] for a (rows, cols) weight (folding 1/s into the layer that produces x). */
static void scale_rows_inv(float *w, int64_t rows, int64_t cols, const float *s) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) w[r * cols + c] /= s[r];
}

static nl_status apply_sequential(nl_model *m, const nl_qm_scheme *s, const nl_qm_calib *c, nl_qm_runtime *rt) {
    int64_t n_tok = calib_tokens(c);
    layer_capture cap;
    memset(&cap, 0, sizeof cap);
    int64_t maxd = m->C > m->H ? m->C : m->H;
    if (m->NH * m->hd > maxd) maxd = m->NH * m->hd;
    int64_t maxrows = m->QKV > 2 * m->H ? m->QKV : 2 * m->H;
    if (m->C > maxrows) maxrows = m->C;
    nl_status rc = NL_OK;
    float *tmp = nl_malloc((size_t)(maxrows * maxd) * sizeof(float), "quantized weight");
    float *sc = nl_malloc((size_t)maxd * sizeof(float), "awq scales");
    if (!tmp || !sc) rc = NL_ERR_NOMEM;
    for (int site = 0; site < NL_QM_SITES && !rc; site++) {
        cap.x[site] = nl_malloc((size_t)(n_tok * site_in_dim(m, site)) * sizeof(float), "calibration inputs");
        if (!cap.x[site]) rc = NL_ERR_NOMEM;
    }
    double alpha_sum = 0;
    int alpha_n = 0;
    for (int l = 0; l < m->L && !rc; l++) {
        cap.layer = l;
        cap.n = 0;
        rc = run_calib(m, c, capture_layer, &cap);
        for (int site = 0; site < NL_QM_SITES && !rc; site++) {
            float *w;
            int64_t rows, cols;
            site_weight(m, l, site, &w, &rows, &cols);
            if (s->method == NL_QM_GPTQ) {
                nl_gptq_hessian hs;
                rc = nl_gptq_hessian_init(&hs, (int)cols);
                if (!rc) rc = nl_gptq_hessian_add(&hs, cap.x[site], cap.n);
                nl_gptq_opts o = nl_gptq_defaults();
                o.bits = s->bits;
                o.group_size = s->group;
                if (!rc) rc = nl_gptq_quantize(w, (int)rows, (int)cols, hs.h, &o, NULL, NULL, NULL, tmp, NULL);
                nl_gptq_hessian_free(&hs);
                if (!rc) memcpy(w, tmp, (size_t)(rows * cols) * sizeof(float));
            } else {                                     /* AWQ */
                if (site == SITE_O && m->NH != m->KVH) { /* no exact fold into v under GQA: RTN */
                    rc = nl_qgrid_rtn(w, rows, cols, s->bits, s->group, 0, NULL, NULL, NULL, w);
                    continue;
                }
                nl_awq_opts o = nl_awq_defaults();
                o.bits = s->bits;
                o.group_size = s->group;
                const float *wl[1] = {w};
                float *wh[1] = {tmp};
                int rl[1] = {(int)rows};
                double alpha = 0;
                rc = nl_awq_search(cap.x[site], cap.n, (int)cols, 1, wl, rl, &o, sc, wh, &alpha, NULL, NULL, NULL);
                if (rc) break;
                alpha_sum += alpha;
                alpha_n++;
                memcpy(w, tmp, (size_t)(rows * cols) * sizeof(float));
                nl_layer_weights *lw = &m->w.layers[l];
                if (site == SITE_QKV)
                    for (int64_t j = 0; j < cols; j++) lw->rms_att[j] /= sc[j];
                else if (site == SITE_GATE_UP)
                    for (int64_t j = 0; j < cols; j++) lw->rms_ffn[j] /= sc[j];
                else if (site == SITE_O) {
                    scale_rows_inv(lw->wv, m->KVH * m->hd, m->C, sc);
                    if (lw->bqkv) scale_rows_inv(lw->bqkv + (m->NH + m->KVH) * m->hd, m->KVH * m->hd, 1, sc);
                } else
                    scale_rows_inv(lw->w3, m->H, m->C, sc);
            }
        }
    }
    if (alpha_n) rt->awq_alpha_mean = alpha_sum / alpha_n;
    for (int site = 0; site < NL_QM_SITES; site++) nl_free(cap.x[site]);
    nl_free(tmp);
    nl_free(sc);
    if (rc == NL_ERR_NOMEM)
        return nl_fail(rc, "quantize %s: out of memory for %lld calibration tokens", s->name, (long long)n_tok);
    return rc;
}

static nl_status apply_smoothquant(nl_model *m, const nl_qm_scheme *s, const nl_qm_calib *c) {
    float *absmax = NULL, *sc = nl_malloc((size_t)m->C * sizeof(float), "smoothquant scales");
    int64_t stride;
    if (!sc) return NL_ERR_NOMEM;
    nl_status rc = absmax_stats(m, c, &absmax, &stride);
    for (int l = 0; l < m->L && !rc; l++) {
        nl_layer_weights *lw = &m->w.layers[l];
        for (int k = 0; k < 2 && !rc; k++) {
            int site = k ? SITE_GATE_UP : SITE_QKV;
            float *w;
            int64_t rows, cols;
            site_weight(m, l, site, &w, &rows, &cols);
            const float *wl[1] = {w};
            int rl[1] = {(int)rows};
            rc = nl_smoothquant_scales(absmax + (l * NL_QM_SITES + site) * stride, (int)cols, 1, wl, rl, s->param, sc);
            if (!rc) nl_smoothquant_apply(w, (int)rows, (int)cols, sc, k ? lw->rms_ffn : lw->rms_att);
        }
    }
    nl_free(absmax);
    nl_free(sc);
    return rc;
}

static nl_status outlier_stats(nl_model *m, const nl_qm_calib *c, float threshold, nl_qm_runtime *rt) {
    float *absmax;
    int64_t stride;
    NL_TRY(absmax_stats(m, c, &absmax, &stride));
    rt->calib_outliers = nl_calloc((size_t)(m->L * NL_QM_SITES), sizeof(int), "outlier report");
    if (!rt->calib_outliers) {
        nl_free(absmax);
        return NL_ERR_NOMEM;
    }
    for (int l = 0; l < m->L; l++)
        for (int s = 0; s < NL_QM_SITES; s++) {
            const float *a = absmax + (l * NL_QM_SITES + s) * stride;
            int cnt = 0;
            for (int64_t j = 0; j < site_in_dim(m, s); j++) cnt += a[j] > threshold;
            rt->calib_outliers[l * NL_QM_SITES + s] = cnt;
        }
    nl_free(absmax);
    return NL_OK;
}

nl_status nl_qm_apply(nl_model *m, const nl_qm_scheme *s, const nl_qm_calib *c, nl_qm_runtime *rt) {
    memset(rt, 0, sizeof *rt);
    rt->m = m;
    for (int site = 0; site < NL_QM_SITES; site++) rt->site_dim[site] = (int)site_in_dim(m, site);
    int needs_calib = s->method == NL_QM_GPTQ || s->method == NL_QM_AWQ || s->method == NL_QM_SMOOTHQUANT ||
                      s->method == NL_QM_LLMINT8;
    if (needs_calib) {
        if (!c || !c->tokens || c->T <= 0 || c->B <= 0 || c->n < c->T)
            return nl_fail(NL_ERR_INVALID, "quantize %s: needs calibration text of at least one window (%lld tokens)",
                           s->name, c ? (long long)c->T : 0LL);
        const int64_t mB = m->train ? m->train->B : 0, mT = m->train ? m->train->T : 0;
        if (c->B > mB || c->T > mT)
            return nl_fail(NL_ERR_INVALID,
                           "quantize %s: calibration windows (%lld, %lld) exceed the model's activation "
                           "buffers (%lld, %lld)",
                           s->name, (long long)c->B, (long long)c->T, (long long)mB, (long long)mT);
    }
    nl_status rc = NL_OK;
    switch (s->method) {
    case NL_QM_FP32: break;
    case NL_QM_RTN: rc = apply_rtn(m, s); break;
    case NL_QM_GPTQ:
    case NL_QM_AWQ: rc = apply_sequential(m, s, c, rt); break;
    case NL_QM_SMOOTHQUANT:
        rc = apply_smoothquant(m, s, c);
        if (!rc) rc = install_w8a8(m, rt, INFINITY);
        break;
    case NL_QM_W8A8: rc = install_w8a8(m, rt, INFINITY); break;
    case NL_QM_LLMINT8:
        rc = outlier_stats(m, c, (float)s->param, rt);
        if (!rc) rc = install_w8a8(m, rt, (float)s->param);
        break;
    }
    if (rc == NL_ERR_NOMEM) nl_fail(rc, "quantize %s: out of memory", s->name);
    return rc;
}

int64_t nl_qm_model_bytes(const nl_model *m, const nl_qm_scheme *s) {
    int64_t total = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const nl_param_info *p = &m->table[i];
        int linear = p->kind == NL_PARAM_WQ || p->kind == NL_PARAM_WK || p->kind == NL_PARAM_WV ||
                     p->kind == NL_PARAM_WO || p->kind == NL_PARAM_W1 || p->kind == NL_PARAM_W3 ||
                     p->kind == NL_PARAM_W2;
        if (!linear || s->method == NL_QM_FP32) {
            total += (int64_t)p->numel * 4;
            continue;
        }
        int64_t rows = p->shape[0], cols = p->shape[1];
        if (s->act_bits == 8) /* int8 codes + one fp32 scale per output channel */
            total += rows * cols + rows * 4;
        else /* packed codes + (fp32 scale, uint8 zero) per group */
            total += (rows * cols * s->bits + 7) / 8 + rows * nl_qgrid_n_groups(cols, s->group) * 5;
    }
    return total;
}
