/*
 * NanoLM inference: one token at a time with a KV cache (llama2.c's `forward`), and sampling.
 * Uses the same RMSNorm / RoPE / SwiGLU kernels and the same nl_linear_forward hook as training.
 */
#include <math.h>
#include <string.h>

#include "nanolm/model.h"

nl_status nl_model_alloc_kv(nl_model *m) {
    if (m->kv_cache) return NL_OK;
    int64_t S = m->arch.seq_len, kvd = m->KVH * m->hd;
    size_t cache = (size_t)(m->L * 2 * S * kvd);
    size_t bufs = (size_t)(m->C + m->C + m->QKV + m->NH * S + m->NH * m->hd + 3 * m->H + m->V);
    m->kv_cache = nl_calloc(cache + bufs, sizeof(float), "KV cache");
    if (!m->kv_cache) return NL_ERR_NOMEM;
    float *p = m->kv_cache + cache;
    m->inf_x = p; p += m->C;         /* (C) residual stream */
    m->inf_xb = p; p += m->C;        /* (C) normed input / matmul output */
    m->inf_q = p; p += m->QKV;       /* (QKV) q | k | v of this token */
    m->inf_att = p; p += m->NH * S;  /* (NH, S) scores */
    m->inf_hb = p; p += m->NH * m->hd + 3 * m->H; /* (NH*hd) attention out, then (2H) gate|up + (H) */
    m->inf_logits = p;               /* (V) */
    return NL_OK;
}

float *nl_model_step(nl_model *m, int32_t token, int64_t pos) {
    int64_t C = m->C, NH = m->NH, KVH = m->KVH, hd = m->hd, H = m->H, S = m->arch.seq_len, QKV = m->QKV;
    int64_t kvd = KVH * hd, group = NH / KVH, half = hd / 2;
    float eps = (float)m->arch.norm_eps, rstd;
    float *x = m->inf_x, *xb = m->inf_xb, *q = m->inf_q, *atty = m->inf_hb, *h13 = m->inf_hb + NH * hd;
    float *hact = h13 + 2 * H;
    memcpy(x, m->w.embed + (int64_t)token * C, (size_t)C * sizeof(float));
    for (int64_t l = 0; l < m->L; l++) {
        nl_layer_weights *lw = &m->w.layers[l];
        float *kc = m->kv_cache + (l * 2) * S * kvd, *vc = m->kv_cache + (l * 2 + 1) * S * kvd;
        nl_rmsnorm_forward(xb, &rstd, x, lw->rms_att, 1, C, eps);
        nl_linear_site s = {NL_LIN_QKV, (int)l, (size_t)(lw->wq - m->params)};
        nl_linear_forward(m, &s, q, xb, lw->wq, 1, C, QKV);
        /* RoPE at position pos on q and k */
        const float *c = m->rope_cos + pos * half, *sn = m->rope_sin + pos * half;
        for (int64_t h = 0; h < NH + KVH; h++)
            for (int64_t i = 0; i < half; i++) {
                float *v = q + h * hd + 2 * i, x0 = v[0], x1 = v[1];
                v[0] = x0 * c[i] - x1 * sn[i];
                v[1] = x0 * sn[i] + x1 * c[i];
            }
        memcpy(kc + pos * kvd, q + NH * hd, (size_t)kvd * sizeof(float));
        memcpy(vc + pos * kvd, q + (NH + KVH) * hd, (size_t)kvd * sizeof(float));
        float scale = 1.0f / sqrtf((float)hd);
        for (int64_t h = 0; h < NH; h++) {
            int64_t kh = h / group;
            const float *qh = q + h * hd;
            float *a = m->inf_att + h * S, mx = -INFINITY, sum = 0.0f;
            for (int64_t t = 0; t <= pos; t++) {
                const float *k = kc + t * kvd + kh * hd;
                float sc = 0.0f;
                for (int64_t i = 0; i < hd; i++) sc += qh[i] * k[i];
                a[t] = sc * scale;
                if (a[t] > mx) mx = a[t];
            }
            for (int64_t t = 0; t <= pos; t++) {
                a[t] = expf(a[t] - mx);
                sum += a[t];
            }
            float *o = atty + h * hd;
            for (int64_t i = 0; i < hd; i++) o[i] = 0.0f;
            for (int64_t t = 0; t <= pos; t++) {
                const float *v = vc + t * kvd + kh * hd;
                float p = a[t] / sum;
                for (int64_t i = 0; i < hd; i++) o[i] += p * v[i];
            }
        }
        s = (nl_linear_site){NL_LIN_O, (int)l, (size_t)(lw->wo - m->params)};
        nl_linear_forward(m, &s, xb, atty, lw->wo, 1, NH * hd, C);
        for (int64_t i = 0; i < C; i++) x[i] += xb[i];
        nl_rmsnorm_forward(xb, &rstd, x, lw->rms_ffn, 1, C, eps);
        s = (nl_linear_site){NL_LIN_GATE_UP, (int)l, (size_t)(lw->w1 - m->params)};
        nl_linear_forward(m, &s, h13, xb, lw->w1, 1, C, 2 * H);
        nl_swiglu_forward(hact, h13, 1, H);
        s = (nl_linear_site){NL_LIN_DOWN, (int)l, (size_t)(lw->w2 - m->params)};
        nl_linear_forward(m, &s, xb, hact, lw->w2, 1, H, C);
        for (int64_t i = 0; i < C; i++) x[i] += xb[i];
    }
    nl_rmsnorm_forward(xb, &rstd, x, m->w.rms_final, 1, C, eps);
    nl_linear_site s = {NL_LIN_CLS, -1, (size_t)(m->w.cls - m->params)};
    nl_linear_forward(m, &s, m->inf_logits, xb, m->w.cls, 1, C, m->V);
    return m->inf_logits;
}

int32_t nl_model_sample(float *logits, int64_t V, float temperature, nl_rng *rng) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (temperature <= 0.0f) return (int32_t)best;
    float mx = logits[best];
    double sum = 0.0;
    for (int64_t v = 0; v < V; v++) {
        logits[v] = expf((logits[v] - mx) / temperature);
        sum += logits[v];
    }
    double r = nl_rng_double(rng) * sum, acc = 0.0;
    for (int64_t v = 0; v < V; v++) {
        acc += logits[v];
        if (r < acc) return (int32_t)v;
    }
    return (int32_t)(V - 1);
}
