/*
 * NanoLM building blocks: each layer is a pair xxx_forward / xxx_backward on plain float
 * arrays (outputs first, then inputs, then sizes), as in llm.c. Backward accumulates (+=) into
 * parameter gradients; activation gradients are documented per function.
 */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "nanolm/model.h"
#include "vexp.h"

/* ---- RMSNorm --------------------------------------------------------------------------------
 * out (N, C) = x / sqrt(mean(x^2) + eps) * w;  rstd (N) saved for backward. */
void nl_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int64_t N, int64_t C,
                        float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C;
        float *o = out + n * C;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
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
#pragma omp simd reduction(+ : dot)
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

/* Per-head GEMMs smaller than this (T*T*hd multiply-adds) run in parallel over heads, one
 * single-threaded sgemm each; larger ones run one after another and OpenBLAS threads each. */
#define NL_ATT_PAR_HEADS_MAX (1 << 20)

/* ---- causal grouped-query attention -------------------------------------------------------------
 * qkv (B, T, QKV) rows [q (NH*hd) | k (KVH*hd) | v (KVH*hd)]; query head h reads kv head
 * h / (NH/KVH). out (B, T, NH*hd); att (B, NH, T, T) softmax probabilities (row t: columns
 * 0..t, the rest zero). Three phases: S = Q K^T / sqrt(hd) per (b, h) with cblas_sgemm (the
 * full square; the causal half is masked), a causal softmax over all B*NH*T rows, then
 * O = P V per (b, h); for small heads each phase runs its (b, h) in parallel with OpenMP (one
 * sgemm per head; results do not depend on the thread count). */
void nl_attention_forward(float *out, float *att, const float *qkv, int64_t B, int64_t T, int64_t NH,
                          int64_t KVH, int64_t hd) {
    int64_t QKV = (NH + 2 * KVH) * hd, group = NH / KVH;
    float scale = 1.0f / sqrtf((float)hd);
    int par_heads = T * T * hd < NL_ATT_PAR_HEADS_MAX;
#pragma omp parallel for collapse(2) schedule(static) if (par_heads)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++) {
            const float *q = qkv + b * T * QKV + h * hd, *k = qkv + b * T * QKV + (NH + h / group) * hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)hd, scale, q, (int)QKV, k,
                        (int)QKV, 0.0f, att + (b * NH + h) * T * T, (int)T);
        }
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < B * NH * T; row++) {
        int64_t t = row % T;
        float *a = att + row * T, mx = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : mx)
        for (int64_t t2 = 0; t2 <= t; t2++) mx = a[t2] > mx ? a[t2] : mx;
#pragma omp simd reduction(+ : sum)
        for (int64_t t2 = 0; t2 <= t; t2++) {
            a[t2] = nl_vexpf(a[t2] - mx);
            sum += a[t2];
        }
        float inv = 1.0f / sum;
#pragma omp simd
        for (int64_t t2 = 0; t2 <= t; t2++) a[t2] *= inv;
        for (int64_t t2 = t + 1; t2 < T; t2++) a[t2] = 0.0f;
    }
#pragma omp parallel for collapse(2) schedule(static) if (par_heads)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++) {
            const float *v = qkv + b * T * QKV + (NH + KVH + h / group) * hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)hd, (int)T, 1.0f,
                        att + (b * NH + h) * T * T, (int)T, v, (int)QKV, 0.0f, out + b * T * NH * hd + h * hd,
                        (int)(NH * hd));
        }
}

/* dqkv (B, T, QKV) = d/dqkv (overwritten) from dout (B, T, NH*hd); datt (B, NH, T, T) scratch.
 * dP = dO V^T; dS = P * (dP - rowsum(P * dP)) / sqrt(hd); dQ = dS K; dK += dS^T Q; dV += P^T dO
 * (K and V gradients of a GQA group accumulate over its query heads, so the parallel loops run
 * over (b, kv head) and the heads of a group in order). O(T^2 hd) per head. */
void nl_attention_backward(float *dqkv, float *datt, const float *dout, const float *att,
                           const float *qkv, int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t hd) {
    int64_t QKV = (NH + 2 * KVH) * hd, group = NH / KVH, OD = NH * hd;
    float scale = 1.0f / sqrtf((float)hd);
    int par_heads = T * T * hd < NL_ATT_PAR_HEADS_MAX;
    memset(dqkv, 0, (size_t)(B * T * QKV) * sizeof(float));
#pragma omp parallel for collapse(2) schedule(static) if (par_heads)
    for (int64_t b = 0; b < B; b++)
        for (int64_t kh = 0; kh < KVH; kh++)
        for (int64_t h = kh * group; h < (kh + 1) * group; h++) {
            const float *v = qkv + b * T * QKV + (NH + KVH + h / group) * hd;
            const float *d = dout + b * T * OD + h * hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)hd, 1.0f, d, (int)OD, v,
                        (int)QKV, 0.0f, datt + (b * NH + h) * T * T, (int)T);
            /* dV += P^T dO */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)T, (int)hd, (int)T, 1.0f,
                        att + (b * NH + h) * T * T, (int)T, d, (int)OD, 1.0f,
                        dqkv + b * T * QKV + (NH + KVH + h / group) * hd, (int)QKV);
        }
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < B * NH * T; row++) {
        int64_t t = row % T;
        const float *p = att + row * T;
        float *dp = datt + row * T, dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t t2 = 0; t2 <= t; t2++) dot += p[t2] * dp[t2];
#pragma omp simd
        for (int64_t t2 = 0; t2 <= t; t2++) dp[t2] = p[t2] * (dp[t2] - dot) * scale;
        for (int64_t t2 = t + 1; t2 < T; t2++) dp[t2] = 0.0f;
    }
#pragma omp parallel for collapse(2) schedule(static) if (par_heads)
    for (int64_t b = 0; b < B; b++)
        for (int64_t kh = 0; kh < KVH; kh++)
        for (int64_t h = kh * group; h < (kh + 1) * group; h++) {
            const float *ds = datt + (b * NH + h) * T * T;
            const float *q = qkv + b * T * QKV + h * hd, *k = qkv + b * T * QKV + (NH + h / group) * hd;
            float *dq = dqkv + b * T * QKV + h * hd, *dk = dqkv + b * T * QKV + (NH + h / group) * hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)hd, (int)T, 1.0f, ds, (int)T, k,
                        (int)QKV, 0.0f, dq, (int)QKV);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)T, (int)hd, (int)T, 1.0f, ds, (int)T, q,
                        (int)QKV, 1.0f, dk, (int)QKV);
        }
}

/* ---- SwiGLU -------------------------------------------------------------------------------------
 * h13 (N, 2H) rows [gate | up]; out (N, H) = silu(gate) * up. */
void nl_swiglu_forward(float *out, const float *h13, int64_t N, int64_t H) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *g = h13 + n * 2 * H, *u = g + H;
        float *o = out + n * H;
#pragma omp simd
        for (int64_t i = 0; i < H; i++) o[i] = g[i] / (1.0f + nl_vexpf(-g[i])) * u[i];
    }
}

/* dh13 (N, 2H) = d/dh13 (overwritten) from dout (N, H). */
void nl_swiglu_backward(float *dh13, const float *dout, const float *h13, int64_t N, int64_t H) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *g = h13 + n * 2 * H, *u = g + H, *d = dout + n * H;
        float *dg = dh13 + n * 2 * H, *du = dg + H;
#pragma omp simd
        for (int64_t i = 0; i < H; i++) {
            float sig = 1.0f / (1.0f + nl_vexpf(-g[i]));
            float silu = g[i] * sig;
            du[i] = d[i] * silu;
            dg[i] = d[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
        }
    }
}
