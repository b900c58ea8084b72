/*
 * NanoLM inference: one token at a time with a KV cache (llama2.c's `forward`), and sampling
 * (include/nanolm/infer.h). Uses the same RMSNorm / RoPE / SwiGLU kernels and the same
 * nl_linear_forward hook as training.
 */
#include <math.h>
#include <string.h>

#include "nanolm/formats.h"
#include "nanolm/infer.h"
#include "model_internal.h"
#include "numerics/vexp.h"

nl_status nl_decode_state_init(nl_decode_state *st, const nl_model *m, nl_kv_dtype dt) {
    memset(st, 0, sizeof *st);
    if (m->moe)
        return nl_fail(NL_ERR_UNSUPPORTED, "arch %s: KV-cache generation has no mixture-of-experts layers",
                       m->arch.name);
    if (m->no_embed || m->no_tail)
        return nl_fail(NL_ERR_UNSUPPORTED, "arch %s: KV-cache generation needs the whole model, not a part",
                       m->arch.name);
    if (dt != NL_KV_FP32 && dt != NL_KV_INT8) return nl_fail(NL_ERR_INVALID, "unknown KV cache type %d", (int)dt);
    int64_t S = m->arch.seq_len, kvd = m->KVH * m->hd;
    st->L = m->L, st->seq_len = S, st->C = m->C, st->NH = m->NH, st->KVH = m->KVH, st->hd = m->hd;
    st->H = m->H, st->V = m->V, st->QKV = m->QKV;
    size_t n_kv = (size_t)(m->L * 2 * S * kvd), n_scales = (size_t)(m->L * 2 * S * m->KVH);
    size_t cache = dt == NL_KV_FP32 ? n_kv : 0;
    int64_t lp = m->C > m->NH * m->hd ? m->C : m->NH * m->hd;
    if (m->H > lp) lp = m->H;
    size_t bufs = (size_t)(m->C + m->C + m->QKV + m->NH * S + m->NH * m->hd + 3 * m->H + m->V + lp);
    if (dt == NL_KV_INT8) {
        /* codes, then the fp16 scales (2-byte aligned: n_kv is even) */
        st->kv_codes = nl_calloc(n_kv + n_scales * sizeof(uint16_t), 1, "int8 KV cache");
        if (!st->kv_codes) return NL_ERR_NOMEM;
        st->kv_scales = (uint16_t *)(void *)(st->kv_codes + n_kv);
        st->kv_bytes = n_kv + n_scales * sizeof(uint16_t);
    } else {
        st->kv_bytes = n_kv * sizeof(float);
    }
    st->mem = nl_calloc(cache + bufs, sizeof(float), "KV cache");
    if (!st->mem) {
        nl_decode_state_free(st);
        return NL_ERR_NOMEM;
    }
    st->kv_dtype = dt;
    st->kv_cache = dt == NL_KV_FP32 ? st->mem : NULL;
    float *p = st->mem + cache;
    st->x = p;
    p += m->C;
    st->xb = p;
    p += m->C;
    st->q = p;
    p += m->QKV;
    st->att = p;
    p += m->NH * S;
    st->hb = p;
    p += m->NH * m->hd + 3 * m->H;
    st->logits = p;
    p += m->V;
    st->lp = p;
    return NL_OK;
}

void nl_decode_state_free(nl_decode_state *st) {
    nl_free(st->mem);
    nl_free(st->kv_codes);
    memset(st, 0, sizeof *st);
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
static void attend_fp32(nl_decode_state *st, float *atty, const float *q, const float *kc, const float *vc,
                        int64_t pos) {
    int64_t NH = st->NH, KVH = st->KVH, hd = st->hd, S = st->seq_len, kvd = KVH * hd, group = NH / KVH;
    float scale = 1.0f / sqrtf((float)hd);
    for (int64_t h = 0; h < NH; h++) {
        int64_t kh = h / group;
        const float *qh = q + h * hd;
        float *a = st->att + h * S, mx = -INFINITY;
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
static void attend_int8(nl_decode_state *st, float *atty, const float *q, const int8_t *kc, const uint16_t *ks,
                        const int8_t *vc, const uint16_t *vs, int64_t pos) {
    int64_t NH = st->NH, KVH = st->KVH, hd = st->hd, S = st->seq_len, kvd = KVH * hd, group = NH / KVH;
    float scale = 1.0f / sqrtf((float)hd);
    for (int64_t h = 0; h < NH; h++) {
        int64_t kh = h / group;
        const float *qh = q + h * hd;
        float *a = st->att + h * S, mx = -INFINITY;
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

/* The shape st was made for is m's. */
static int same_shape(const nl_model *m, const nl_decode_state *st) {
    return st->mem && st->L == m->L && st->seq_len == m->arch.seq_len && st->C == m->C && st->NH == m->NH &&
           st->KVH == m->KVH && st->hd == m->hd && st->H == m->H && st->V == m->V && st->QKV == m->QKV;
}

float *nl_model_step(const nl_model *m, nl_decode_state *st, int32_t token, int64_t pos) {
    if (!same_shape(m, st)) {
        nl_fail(NL_ERR_INVALID, "decode step: the decode state was not made for arch %s's shape (nl_decode_state_init)",
                m->arch.name);
        return NULL;
    }
    if (token < 0 || token >= m->V) {
        nl_fail(NL_ERR_INVALID, "decode step: token %d is outside the vocabulary [0, %lld)", token, (long long)m->V);
        return NULL;
    }
    if (pos < 0 || pos >= m->arch.seq_len) {
        nl_fail(NL_ERR_INVALID, "decode step: position %lld is outside [0, seq_len %lld)", (long long)pos,
                (long long)m->arch.seq_len);
        return NULL;
    }
    int64_t C = m->C, NH = m->NH, KVH = m->KVH, hd = m->hd, H = m->H, S = m->arch.seq_len, QKV = m->QKV;
    int64_t kvd = KVH * hd, half = hd / 2;
    float eps = (float)m->arch.norm_eps, rstd;
    float *x = st->x, *xb = st->xb, *q = st->q, *atty = st->hb, *h13 = st->hb + NH * hd;
    float *hact = h13 + 2 * H;
    memcpy(x, m->w.embed + (int64_t)token * C, (size_t)C * sizeof(float));
    for (int64_t l = 0; l < m->L; l++) {
        const nl_layer_weights *lw = &m->w.layers[l];
        nl_rmsnorm_forward(xb, &rstd, x, lw->rms_att, 1, C, eps);
        nl_linear_site s = {NL_LIN_QKV, (int)l, (size_t)(lw->wq - m->params)};
        nl_linear_forward_lp(m, &s, q, xb, lw->wq, 1, C, QKV, st->lp);
        if (lw->bqkv) nl_add_bias(q, lw->bqkv, 1, QKV);
        /* RoPE at position pos on q and k */
        const float *c = m->rope_cos + pos * half, *sn = m->rope_sin + pos * half;
        for (int64_t h = 0; h < NH + KVH; h++)
            for (int64_t i = 0; i < half; i++) {
                float *v = q + h * hd + 2 * i, x0 = v[0], x1 = v[1];
                v[0] = x0 * c[i] - x1 * sn[i];
                v[1] = x0 * sn[i] + x1 * c[i];
            }
        if (st->kv_dtype == NL_KV_INT8) {
            int8_t *kq = st->kv_codes + (l * 2) * S * kvd, *vq = st->kv_codes + (l * 2 + 1) * S * kvd;
            uint16_t *ks = st->kv_scales + (l * 2) * S * KVH, *vs = st->kv_scales + (l * 2 + 1) * S * KVH;
            nl_kv_quantize_token(kq + pos * kvd, ks + pos * KVH, q + NH * hd, KVH, hd);
            nl_kv_quantize_token(vq + pos * kvd, vs + pos * KVH, q + (NH + KVH) * hd, KVH, hd);
            attend_int8(st, atty, q, kq, ks, vq, vs, pos);
        } else {
            float *kc = st->kv_cache + (l * 2) * S * kvd, *vc = st->kv_cache + (l * 2 + 1) * S * kvd;
            memcpy(kc + pos * kvd, q + NH * hd, (size_t)kvd * sizeof(float));
            memcpy(vc + pos * kvd, q + (NH + KVH) * hd, (size_t)kvd * sizeof(float));
            attend_fp32(st, atty, q, kc, vc, pos);
        }
        s = (nl_linear_site){NL_LIN_O, (int)l, (size_t)(lw->wo - m->params)};
        nl_linear_forward_lp(m, &s, xb, atty, lw->wo, 1, NH * hd, C, st->lp);
        for (int64_t i = 0; i < C; i++) x[i] += xb[i];
        nl_rmsnorm_forward(xb, &rstd, x, lw->rms_ffn, 1, C, eps);
        s = (nl_linear_site){NL_LIN_GATE_UP, (int)l, (size_t)(lw->w1 - m->params)};
        nl_linear_forward_lp(m, &s, h13, xb, lw->w1, 1, C, 2 * H, st->lp);
        nl_swiglu_forward(hact, h13, 1, H);
        s = (nl_linear_site){NL_LIN_DOWN, (int)l, (size_t)(lw->w2 - m->params)};
        nl_linear_forward_lp(m, &s, xb, hact, lw->w2, 1, H, C, st->lp);
        for (int64_t i = 0; i < C; i++) x[i] += xb[i];
    }
    nl_rmsnorm_forward(xb, &rstd, x, m->w.rms_final, 1, C, eps);
    nl_linear_site s = {NL_LIN_CLS, -1, (size_t)(m->w.cls - m->params)};
    nl_linear_forward_lp(m, &s, st->logits, xb, m->w.cls, 1, C, m->V, st->lp);
    return st->logits;
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
