/*
 * NanoLM inference: one token at a time with a KV cache (llama2.c's `forward`), and sampling.
 * Uses the same RMSNorm / RoPE / SwiGLU kernels and the same nl_linear_forward hook as training.
 */
#include <math.h>
#include <string.h>

#include "nanolm/formats.h"
#include "nanolm/model.h"
#include "numerics/vexp.h"

nl_status nl_model_alloc_kv(nl_model *m) { return nl_model_alloc_kv_dtype(m, NL_KV_FP32); }

nl_status nl_model_alloc_kv_dtype(nl_model *m, nl_kv_dtype dt) {
    if (m->moe)
        return nl_fail(NL_ERR_UNSUPPORTED, "arch %s: KV-cache generation has no mixture-of-experts layers",
                       m->arch.name);
    if (dt != NL_KV_FP32 && dt != NL_KV_INT8) return nl_fail(NL_ERR_INVALID, "unknown KV cache type %d", (int)dt);
    if (m->kv_cache && m->kv_dtype == (int)dt) return NL_OK;
    nl_free(m->kv_cache);
    nl_free(m->kv_codes);
    m->kv_cache = NULL;
    m->kv_codes = NULL;
    m->kv_scales = NULL;
    int64_t S = m->arch.seq_len, kvd = m->KVH * m->hd;
    size_t n_kv = (size_t)(m->L * 2 * S * kvd), n_scales = (size_t)(m->L * 2 * S * m->KVH);
    size_t cache = dt == NL_KV_FP32 ? n_kv : 0;
    size_t bufs = (size_t)(m->C + m->C + m->QKV + m->NH * S + m->NH * m->hd + 3 * m->H + m->V);
    if (dt == NL_KV_INT8) {
        /* codes, then the fp16 scales (2-byte aligned: n_kv is even) */
        m->kv_codes = nl_calloc(n_kv + n_scales * sizeof(uint16_t), 1, "int8 KV cache");
        if (!m->kv_codes) return NL_ERR_NOMEM;
        m->kv_scales = (uint16_t *)(void *)(m->kv_codes + n_kv);
        m->kv_bytes = n_kv + n_scales * sizeof(uint16_t);
    } else {
        m->kv_bytes = n_kv * sizeof(float);
    }
    m->kv_cache = nl_calloc(cache + bufs, sizeof(float), "KV cache");
    if (!m->kv_cache) {
        nl_free(m->kv_codes);
        m->kv_codes = NULL;
        m->kv_scales = NULL;
        return NL_ERR_NOMEM;
    }
    m->kv_dtype = (int)dt;
    float *p = m->kv_cache + cache;
    m->inf_x = p;
    p += m->C; /* (C) residual stream */
    m->inf_xb = p;
    p += m->C; /* (C) normed input / matmul output */
    m->inf_q = p;
    p += m->QKV; /* (QKV) q | k | v of this token */
    m->inf_att = p;
    p += m->NH * S; /* (NH, S) scores */
    m->inf_hb = p;
    p += m->NH * m->hd + 3 * m->H; /* (NH*hd) attention out, then (2H) gate|up + (H) */
    m->inf_logits = p;             /* (V) */
    return NL_OK;
}

void nl_kv_quantize_token(int8_t *codes, uint16_t *scales, const float *x, int64_t KVH, int64_t hd) {
    for (int64_t h = 0; h < KVH; h++) {
        const float *xh = x + h * hd;
        float amax = 0.0f;
        for (int64_t i = 0; i < hd; i++) amax = fmaxf(amax, fabsf(xh[i]));
        uint32_t code = 0;
        if (nl_fmt_encode(NL_FMT_FP16, amax / 127.0f, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_SATURATE, 0, &code))
            code = 0x7BFFu; /* NaN/inf activations: the largest fp16 (they poison the output anyway) */
        scales[h] = (uint16_t)code;
        float s = nl_fmt_decode(NL_FMT_FP16, code), inv = s > 0.0f ? 1.0f / s : 0.0f;
        for (int64_t i = 0; i < hd; i++) {
            float q = rintf(xh[i] * inv);
            codes[h * hd + i] = (int8_t)(q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q);
        }
    }
}

/* a[t] = exp(a[t] - mx) for t < n (the softmax numerators of one score row, nl_vexpf's exps, which
 * vectorize); returns their sum, taken in position order. */
static float exp_shifted(float *a, int64_t n, float mx) {
    for (int64_t t = 0; t < n; t++) a[t] = nl_vexpf(a[t] - mx);
    float sum = 0.0f;
    for (int64_t t = 0; t < n; t++) sum += a[t];
    return sum;
}

/* Attention of one query row over positions 0..pos of an fp32 cache layer. */
static void attend_fp32(nl_model *m, float *atty, const float *q, const float *kc, const float *vc, int64_t pos) {
    int64_t NH = m->NH, KVH = m->KVH, hd = m->hd, S = m->arch.seq_len, kvd = KVH * hd, group = NH / KVH;
    float scale = 1.0f / sqrtf((float)hd);
    for (int64_t h = 0; h < NH; h++) {
        int64_t kh = h / group;
        const float *qh = q + h * hd;
        float *a = m->inf_att + h * S, mx = -INFINITY;
        for (int64_t t = 0; t <= pos; t++) {
            const float *k = kc + t * kvd + kh * hd;
            float sc = 0.0f;
            for (int64_t i = 0; i < hd; i++) sc += qh[i] * k[i];
            a[t] = sc * scale;
            if (a[t] > mx) mx = a[t];
        }
        float sum = exp_shifted(a, pos + 1, mx);
        float *o = atty + h * hd;
        for (int64_t i = 0; i < hd; i++) o[i] = 0.0f;
        for (int64_t t = 0; t <= pos; t++) {
            const float *v = vc + t * kvd + kh * hd;
            float p = a[t] / sum;
            for (int64_t i = 0; i < hd; i++) o[i] += p * v[i];
        }
    }
}

/* Attention of one query row over positions 0..pos of an int8 cache layer. */
static void attend_int8(nl_model *m, float *atty, const float *q, const int8_t *kc, const uint16_t *ks,
                        const int8_t *vc, const uint16_t *vs, int64_t pos) {
    int64_t NH = m->NH, KVH = m->KVH, hd = m->hd, S = m->arch.seq_len, kvd = KVH * hd, group = NH / KVH;
    float scale = 1.0f / sqrtf((float)hd);
    for (int64_t h = 0; h < NH; h++) {
        int64_t kh = h / group;
        const float *qh = q + h * hd;
        float *a = m->inf_att + h * S, mx = -INFINITY;
        for (int64_t t = 0; t <= pos; t++) {
            const int8_t *k = kc + t * kvd + kh * hd;
            float sc = 0.0f;
            for (int64_t i = 0; i < hd; i++) sc += qh[i] * (float)k[i];
            a[t] = sc * nl_fmt_decode(NL_FMT_FP16, ks[t * KVH + kh]) * scale;
            if (a[t] > mx) mx = a[t];
        }
        float sum = exp_shifted(a, pos + 1, mx);
        float *o = atty + h * hd;
        for (int64_t i = 0; i < hd; i++) o[i] = 0.0f;
        for (int64_t t = 0; t <= pos; t++) {
            const int8_t *v = vc + t * kvd + kh * hd;
            float p = a[t] / sum * nl_fmt_decode(NL_FMT_FP16, vs[t * KVH + kh]);
            for (int64_t i = 0; i < hd; i++) o[i] += p * (float)v[i];
        }
    }
}

float *nl_model_step(nl_model *m, int32_t token, int64_t pos) {
    int64_t C = m->C, NH = m->NH, KVH = m->KVH, hd = m->hd, H = m->H, S = m->arch.seq_len, QKV = m->QKV;
    int64_t kvd = KVH * hd, half = hd / 2;
    float eps = (float)m->arch.norm_eps, rstd;
    float *x = m->inf_x, *xb = m->inf_xb, *q = m->inf_q, *atty = m->inf_hb, *h13 = m->inf_hb + NH * hd;
    float *hact = h13 + 2 * H;
    memcpy(x, m->w.embed + (int64_t)token * C, (size_t)C * sizeof(float));
    for (int64_t l = 0; l < m->L; l++) {
        nl_layer_weights *lw = &m->w.layers[l];
        nl_rmsnorm_forward(xb, &rstd, x, lw->rms_att, 1, C, eps);
        nl_linear_site s = {NL_LIN_QKV, (int)l, (size_t)(lw->wq - m->params)};
        nl_linear_forward(m, &s, q, xb, lw->wq, 1, C, QKV);
        if (lw->bqkv) nl_add_bias(q, lw->bqkv, 1, QKV);
        /* RoPE at position pos on q and k */
        const float *c = m->rope_cos + pos * half, *sn = m->rope_sin + pos * half;
        for (int64_t h = 0; h < NH + KVH; h++)
            for (int64_t i = 0; i < half; i++) {
                float *v = q + h * hd + 2 * i, x0 = v[0], x1 = v[1];
                v[0] = x0 * c[i] - x1 * sn[i];
                v[1] = x0 * sn[i] + x1 * c[i];
            }
        if (m->kv_dtype == NL_KV_INT8) {
            int8_t *kq = m->kv_codes + (l * 2) * S * kvd, *vq = m->kv_codes + (l * 2 + 1) * S * kvd;
            uint16_t *ks = m->kv_scales + (l * 2) * S * KVH, *vs = m->kv_scales + (l * 2 + 1) * S * KVH;
            nl_kv_quantize_token(kq + pos * kvd, ks + pos * KVH, q + NH * hd, KVH, hd);
            nl_kv_quantize_token(vq + pos * kvd, vs + pos * KVH, q + (NH + KVH) * hd, KVH, hd);
            attend_int8(m, atty, q, kq, ks, vq, vs, pos);
        } else {
            float *kc = m->kv_cache + (l * 2) * S * kvd, *vc = m->kv_cache + (l * 2 + 1) * S * kvd;
            memcpy(kc + pos * kvd, q + NH * hd, (size_t)kvd * sizeof(float));
            memcpy(vc + pos * kvd, q + (NH + KVH) * hd, (size_t)kvd * sizeof(float));
            attend_fp32(m, atty, q, kc, vc, pos);
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
