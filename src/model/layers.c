/*
 * NanoLM building blocks: each layer is a pair xxx_forward / xxx_backward on plain float
 * arrays (outputs first, then inputs, then sizes), as in llm.c. Backward accumulates (+=) into
 * parameter gradients; activation gradients are documented per function.
 */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "nanolm/model.h"

/* ---- RMSNorm --------------------------------------------------------------------------------
 * out (N, C) = x / sqrt(mean(x^2) + eps) * w;  rstd (N) saved for backward. */
void nl_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int64_t N, int64_t C,
                        float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C;
        float *o = out + n * C;
        float ss = 0.0f;
        for (int64_t i = 0; i < C; i++) ss += xr[i] * xr[i];
        float r = 1.0f / sqrtf(ss / (float)C + eps);
        rstd[n] = r;
        for (int64_t i = 0; i < C; i++) o[i] = xr[i] * r * w[i];
    }
}

/* dx (N, C) += d/dx, dw (C) += d/dw, given dout (N, C), the forward input x and saved rstd. */
void nl_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                         const float *rstd, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C, *d = dout + n * C;
        float r = rstd[n];
        float dot = 0.0f; /* sum_i dout_i w_i xhat_i */
        for (int64_t i = 0; i < C; i++) dot += d[i] * w[i] * xr[i] * r;
        dot /= (float)C;
        float *dxr = dx + n * C;
        for (int64_t i = 0; i < C; i++) dxr[i] += r * (d[i] * w[i] - xr[i] * r * dot);
    }
    /* dw: columns in parallel so the sum order does not depend on the thread count */
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < C; i++) {
        float s = 0.0f;
        for (int64_t n = 0; n < N; n++) s += dout[n * C + i] * x[n * C + i] * rstd[n];
        dw[i] += s;
    }
}

/* ---- RoPE -------------------------------------------------------------------------------------
 * x: rows (B, T) with `nh` heads of size hd starting at the row start, row stride `stride`.
 * Pair (2i, 2i+1) of a head at position t is rotated by angle t * theta^(-2i/hd) (tables
 * cos_t/sin_t (T, hd/2)). inverse = 1 rotates by the negative angle (the backward pass). */
void nl_rope_apply(float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T, int64_t nh,
                   int64_t hd, int64_t stride, int inverse) {
    int64_t half = hd / 2;
    float sgn = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t t = bt % T;
        const float *c = cos_t + t * half, *s = sin_t + t * half;
        float *row = x + bt * stride;
        for (int64_t h = 0; h < nh; h++) {
            float *v = row + h * hd;
            for (int64_t i = 0; i < half; i++) {
                float x0 = v[2 * i], x1 = v[2 * i + 1];
                float si = sgn * s[i];
                v[2 * i] = x0 * c[i] - x1 * si;
                v[2 * i + 1] = x0 * si + x1 * c[i];
            }
        }
    }
}

/* ---- causal grouped-query attention -------------------------------------------------------------
 * qkv (B, T, QKV) rows [q (NH*hd) | k (KVH*hd) | v (KVH*hd)]; query head h reads kv head
 * h / (NH/KVH). out (B, T, NH*hd); att (B, NH, T, T) softmax probabilities (row t uses 0..t). */
void nl_attention_forward(float *out, float *att, const float *qkv, int64_t B, int64_t T, int64_t NH,
                          int64_t KVH, int64_t hd) {
    int64_t QKV = (NH + 2 * KVH) * hd, group = NH / KVH;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++) {
            int64_t kh = h / group;
            const float *base = qkv + b * T * QKV;
            for (int64_t t = 0; t < T; t++) {
                const float *q = base + t * QKV + h * hd;
                float *a = att + ((b * NH + h) * T + t) * T;
                float mx = -INFINITY;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    const float *k = base + t2 * QKV + NH * hd + kh * hd;
                    float s = 0.0f;
                    for (int64_t i = 0; i < hd; i++) s += q[i] * k[i];
                    s *= scale;
                    a[t2] = s;
                    if (s > mx) mx = s;
                }
                float sum = 0.0f;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    a[t2] = expf(a[t2] - mx);
                    sum += a[t2];
                }
                float inv = 1.0f / sum;
                float *o = out + (b * T + t) * NH * hd + h * hd;
                for (int64_t i = 0; i < hd; i++) o[i] = 0.0f;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    a[t2] *= inv;
                    const float *v = base + t2 * QKV + (NH + KVH) * hd + kh * hd;
                    float p = a[t2];
                    for (int64_t i = 0; i < hd; i++) o[i] += p * v[i];
                }
            }
        }
}

/* dqkv (B, T, QKV) = d/dqkv (overwritten) from dout (B, T, NH*hd). O(T^2 hd) per head.
 * datt (B, NH, T) is scratch. Parallel over (b, kv head) so that GQA heads sharing k/v do not
 * race on dk/dv. */
void nl_attention_backward(float *dqkv, float *datt, const float *dout, const float *att,
                           const float *qkv, int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t hd) {
    int64_t QKV = (NH + 2 * KVH) * hd, group = NH / KVH;
    float scale = 1.0f / sqrtf((float)hd);
    memset(dqkv, 0, (size_t)(B * T * QKV) * sizeof(float));
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t kh = 0; kh < KVH; kh++) {
            const float *base = qkv + b * T * QKV;
            float *dbase = dqkv + b * T * QKV;
            for (int64_t h = kh * group; h < (kh + 1) * group; h++) {
                float *da = datt + (b * NH + h) * T;
                for (int64_t t = 0; t < T; t++) {
                    const float *a = att + ((b * NH + h) * T + t) * T;
                    const float *d = dout + (b * T + t) * NH * hd + h * hd;
                    /* d(prob) and dv */
                    float dot = 0.0f;
                    for (int64_t t2 = 0; t2 <= t; t2++) {
                        const float *v = base + t2 * QKV + (NH + KVH) * hd + kh * hd;
                        float *dv = dbase + t2 * QKV + (NH + KVH) * hd + kh * hd;
                        float s = 0.0f, p = a[t2];
                        for (int64_t i = 0; i < hd; i++) {
                            s += d[i] * v[i];
                            dv[i] += p * d[i];
                        }
                        da[t2] = s;
                        dot += p * s;
                    }
                    /* softmax backward, then the scores q.k */
                    const float *q = base + t * QKV + h * hd;
                    float *dq = dbase + t * QKV + h * hd;
                    for (int64_t t2 = 0; t2 <= t; t2++) {
                        float ds = a[t2] * (da[t2] - dot) * scale;
                        const float *k = base + t2 * QKV + NH * hd + kh * hd;
                        float *dk = dbase + t2 * QKV + NH * hd + kh * hd;
                        for (int64_t i = 0; i < hd; i++) {
                            dq[i] += ds * k[i];
                            dk[i] += ds * q[i];
                        }
                    }
                }
            }
        }
}

/* ---- SwiGLU -------------------------------------------------------------------------------------
 * h13 (N, 2H) rows [gate | up]; out (N, H) = silu(gate) * up. */
void nl_swiglu_forward(float *out, const float *h13, int64_t N, int64_t H) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *g = h13 + n * 2 * H, *u = g + H;
        float *o = out + n * H;
        for (int64_t i = 0; i < H; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* dh13 (N, 2H) = d/dh13 (overwritten) from dout (N, H). */
void nl_swiglu_backward(float *dh13, const float *dout, const float *h13, int64_t N, int64_t H) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *g = h13 + n * 2 * H, *u = g + H, *d = dout + n * H;
        float *dg = dh13 + n * 2 * H, *du = dg + H;
        for (int64_t i = 0; i < H; i++) {
            float sig = 1.0f / (1.0f + expf(-g[i]));
            float silu = g[i] * sig;
            du[i] = d[i] * silu;
            dg[i] = d[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
        }
    }
}
