/* Quantization-aware training: fake-quantized linears with the straight-through estimator
 * (see nanolm/qat.h). */
#include "nanolm/qat.h"
#include "nanolm/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

nl_status nl_qat_parse(const char *name, nl_quant_spec *spec) {
    if (!name || !spec) return nl_fail(NL_ERR_INVALID, "qat: NULL scheme");
    memset(spec, 0, sizeof *spec);
    spec->kind = NL_QUANT_SYMMETRIC;
    int bits = 0, n = 0;
    long long g = 0;
    if (sscanf(name, "int%d-g%lld%n", &bits, &g, &n) == 2 && name[n] == '\0' && g > 0) {
        spec->gran = NL_QUANT_PER_BLOCK;
        spec->block = g;
    } else if ((n = 0, sscanf(name, "int%d-channel%n", &bits, &n)) == 1 && n > 0 && name[n] == '\0') {
        spec->gran = NL_QUANT_PER_CHANNEL;
    } else {
        return nl_fail(NL_ERR_INVALID, "unknown QAT scheme '%s' (known: int<b>-g<G> e.g. int4-g32, int<b>-channel)",
                       name);
    }
    if (bits < 2 || bits > 8) return nl_fail(NL_ERR_INVALID, "QAT scheme '%s': bits must be 2..8", name);
    spec->bits = bits;
    return NL_OK;
}

static int qat_site(const nl_linear_site *s) { return s->kind != NL_LIN_CLS && s->layer >= 0; }

static void qat_forward(void *user, const nl_linear_site *s, float *out, const float *in, const float *w, int64_t n,
                        int64_t in_dim, int64_t out_dim) {
    nl_qat *q = user;
    if (!qat_site(s)) {
        nl_linear_hook_forward_prev(&q->hook, s, out, in, w, n, in_dim, out_dim); /* the previous hook */
        return;
    }
    nl_qtensor *qt = &q->qt[(int64_t)s->layer * 4 + (int64_t)s->kind];
    float *wq = q->wq + s->weight_offset;
    nl_status rc = NL_OK;
    if (qt->rows != out_dim || qt->cols != in_dim)
        rc = nl_fail(NL_ERR_INVALID, "shape (%lld, %lld) differs from the installed (%lld, %lld)", (long long)out_dim,
                     (long long)in_dim, (long long)qt->rows, (long long)qt->cols);
    if (!rc) rc = nl_quant_absmax_into(w, qt);
    if (!rc) rc = nl_quant_dequantize(qt, wq);
    if (rc) {
        if (q->status == NL_OK) {
            q->status = rc;
            snprintf(q->error, sizeof q->error, "qat: layer %d linear %d: %s", s->layer, (int)s->kind, nl_last_error());
        }
        for (int64_t i = 0; i < n * out_dim; i++) out[i] = NAN;
        return;
    }
    q->fake_quant_calls++;
    nl_linear_hook_forward_prev(&q->hook, s, out, in, wq, n, in_dim, out_dim);
}

static void qat_backward(void *user, const nl_linear_site *s, float *din, float *dw, const float *dout, const float *in,
                         const float *w, int64_t n, int64_t in_dim, int64_t out_dim) {
    nl_qat *q = user;
    /* STE: the input gradient uses the weights forward used (w^, still in q->wq: no update
     * happens between a forward and its backward); the weight gradient dy^T . x does not
     * depend on the weights and is accumulated into the master weights' gradient as is. */
    const float *wb = qat_site(s) ? q->wq + s->weight_offset : w;
    nl_linear_hook_backward_prev(&q->hook, s, din, dw, dout, in, wb, n, in_dim, out_dim);
}

nl_status nl_qat_install(nl_qat *q, nl_model *m, const nl_quant_spec *spec) {
    if (!q || !m || !spec) return nl_fail(NL_ERR_INVALID, "qat: NULL argument");
    memset(q, 0, sizeof *q);
    if (spec->kind != NL_QUANT_SYMMETRIC || (spec->gran != NL_QUANT_PER_BLOCK && spec->gran != NL_QUANT_PER_CHANNEL))
        return nl_fail(NL_ERR_INVALID, "qat: needs a symmetric (absmax) per-channel or per-block scheme");
    NL_TRY(nl_quant_check_spec(spec));
    if (m->moe) return nl_fail(NL_ERR_UNSUPPORTED, "qat: arch %s has mixture-of-experts layers", m->arch.name);
    if (m->precision != NL_PREC_FP32)
        return nl_fail(NL_ERR_INVALID,
                       "qat: the model must run in fp32 precision (bf16/fp16 read their own weight copy)");
    q->model = m;
    q->spec = *spec;
    q->qt = nl_calloc((size_t)(m->L * 4), sizeof(nl_qtensor), "qat tensors");
    q->wq = nl_calloc(m->n_params, sizeof(float), "qat fake-quantized weights");
    if (!q->qt || !q->wq) {
        nl_qat_remove(q);
        return NL_ERR_NOMEM;
    }
    for (int64_t l = 0; l < m->L; l++) {
        const int64_t shape[4][2] = {{m->QKV, m->C}, {m->C, m->NH * m->hd}, {2 * m->H, m->C}, {m->C, m->H}};
        for (int k = 0; k < 4; k++) {
            nl_status rc = nl_qtensor_alloc(&q->qt[l * 4 + k], spec, shape[k][0], shape[k][1]);
            if (rc) {
                nl_qat_remove(q);
                return rc;
            }
        }
    }
    nl_linear_hook_install(&q->hook, m, qat_forward, qat_backward, q);
    return NL_OK;
}

void nl_qat_remove(nl_qat *q) {
    if (!q) return;
    nl_linear_hook_remove(&q->hook);
    if (q->qt && q->model)
        for (int64_t i = 0; i < q->model->L * 4; i++) nl_qtensor_free(&q->qt[i]);
    nl_free(q->qt);
    nl_free(q->wq);
    q->qt = NULL;
    q->wq = NULL;
    q->model = NULL;
}

nl_status nl_qat_status(const nl_qat *q) { return q ? q->status : NL_ERR_INVALID; }

nl_status nl_qat_rtn_inplace(nl_model *m, const nl_quant_spec *spec) {
    NL_TRY(nl_quant_check_spec(spec));
    for (int i = 0; i < m->n_tensors; i++) {
        const nl_param_info *p = &m->table[i];
        if (p->layer < 0 || p->ndim != 2 || p->kind == NL_PARAM_ROUTER || p->kind >= NL_PARAM_SHARED_W1) continue;
        nl_qtensor qt;
        memset(&qt, 0, sizeof qt);
        float *w = m->params + p->offset;
        nl_status rc = nl_qtensor_alloc(&qt, spec, p->shape[0], p->shape[1]);
        if (!rc) rc = nl_quant_absmax_into(w, &qt);
        if (!rc) rc = nl_quant_dequantize(&qt, w);
        nl_qtensor_free(&qt);
        if (rc) {
            char msg[200];
            snprintf(msg, sizeof msg, "%s", nl_last_error());
            return nl_fail(rc, "%s: %s", p->name, msg);
        }
    }
    return NL_OK;
}

nl_qat_recovery nl_qat_recovered(double fp32_start, double rtn_start, double qat_end, double fp32_end) {
    nl_qat_recovery r = {.rtn_delta = rtn_start - fp32_start, .fp32_drift = fp32_end - fp32_start, .fraction = NAN};
    if (!isfinite(fp32_start) || !isfinite(rtn_start) || !isfinite(qat_end) || !isfinite(fp32_end))
        r.why = "a validation loss is not finite";
    else if (r.rtn_delta < NL_QAT_MIN_RTN_DELTA)
        r.why = "RTN does not raise the loss at the start, so there is nothing to recover";
    else if (fabs(r.fp32_drift) > r.rtn_delta)
        r.why = "training moved the fp32 loss by more than RTN's delta (start from trained weights)";
    else
        r.fraction = (rtn_start - qat_end) / r.rtn_delta;
    return r;
}

nl_status nl_qat_begin(nl_qat *q, nl_model *m, const nl_quant_spec *spec, const nl_data *d, int64_t B, int64_t T,
                       int64_t windows, nl_qat_losses *l) {
    NL_TRY(nl_eval_loss(m, d, NL_DATA_VAL, B, T, windows, &l->fp32_start, NULL));
    NL_TRY(nl_qat_install(q, m, spec));
    return nl_eval_loss(m, d, NL_DATA_VAL, B, T, windows, &l->rtn_start, NULL);
}

nl_status nl_qat_end(nl_qat *q, const nl_data *d, int64_t B, int64_t T, int64_t windows, nl_qat_losses *l) {
    nl_model *m = q->model;
    if (!m) return nl_fail(NL_ERR_INVALID, "qat: not installed");
    nl_status rc = nl_eval_loss(m, d, NL_DATA_VAL, B, T, windows, &l->end, NULL);
    nl_qat_remove(q);
    if (!rc) rc = nl_eval_loss(m, d, NL_DATA_VAL, B, T, windows, &l->fp32_end, NULL);
    return rc;
}
