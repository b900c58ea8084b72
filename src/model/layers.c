/*
 * NanoLM building blocks: each layer is a pair xxx_forward / xxx_backward on plain float
 * arrays (outputs first, then inputs, then sizes), as in llm.c. Backward accumulates (+=) into
 * parameter gradients; activation gradients are documented per function.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/model.h"
#include "blas_serial.h"
#include "model_internal.h"
#include "numerics/tile_gemm.h"
#include "numerics/vexp.h"
#include "numerics/vexp_simd.h"

/* ---- RMSNorm --------------------------------------------------------------------------------
 * out (N, C) = x / sqrt(mean(x^2) + eps) * w;  rstd (N) saved for backward. */

/* One row: o (C) = x * rstd * w; returns rstd. */
static inline float rmsnorm_row(float *o, const float *x, const float *w, int64_t C, float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < C; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)C + eps);
#pragma omp simd
    for (int64_t i = 0; i < C; i++) o[i] = x[i] * r * w[i];
    return r;
}

/* Element counts below which the row-wise ops below run on the calling thread: a decode step's
 * few rows take less time than waking the team. The arithmetic of a row is the same either way. */
enum { ROWWISE_PARALLEL_MIN = 16384 };

void nl_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (N * C >= ROWWISE_PARALLEL_MIN)
    for (int64_t n = 0; n < N; n++) rstd[n] = rmsnorm_row(out + n * C, x + n * C, w, C, eps);
}

/* x (N, C) += r (skipped when r is NULL), then out (N, C) = rmsnorm(x) * w and rstd (N) as
 * nl_rmsnorm_forward: a residual add and the norm that reads its sum in one pass. */
void nl_rmsnorm_residual_forward(float *out, float *rstd, float *x, const float *r, const float *w, int64_t N,
                                 int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (N * C >= ROWWISE_PARALLEL_MIN)
    for (int64_t n = 0; n < N; n++) {
        float *xr = x + n * C;
        if (r) {
            const float *rr = r + n * C;
#pragma omp simd
            for (int64_t i = 0; i < C; i++) xr[i] += rr[i];
        }
        rstd[n] = rmsnorm_row(out + n * C, xr, w, C, eps);
    }
}

/* dx (N, C) += d/dx, dw (C) += d/dw, given dout (N, C), the forward input x and saved rstd.
 * One OpenMP region: rows of dx, then blocks of columns of dw (no barrier between: they are
 * independent). dw[i] sums over the rows in order, whatever the thread count. The rows and the
 * column blocks are the two functions below (the fused backward in model.c calls them too, so
 * both paths run the same code: noinline keeps it one copy). */
__attribute__((noinline)) void nl_rmsnorm_backward_rows(float *dx, const float *dout, const float *x, const float *w,
                                                        const float *rstd, int64_t n0, int64_t n1, int64_t C) {
    for (int64_t n = n0; n < n1; n++) {
        const float *xr = x + n * C, *d = dout + n * C;
        float r = rstd[n];
        float dot = 0.0f; /* sum_i dout_i w_i xhat_i */
#pragma omp simd reduction(+ : dot)
        for (int64_t i = 0; i < C; i++) dot += d[i] * w[i] * xr[i] * r;
        dot /= (float)C;
        float *dxr = dx + n * C;
#pragma omp simd
        for (int64_t i = 0; i < C; i++) dxr[i] += r * (d[i] * w[i] - xr[i] * r * dot);
    }
}

__attribute__((noinline)) void nl_rmsnorm_backward_dw_cols(float *dw, const float *dout, const float *x,
                                                           const float *rstd, int64_t N, int64_t C, int64_t c0) {
    enum { CB = NL_RMSNORM_DW_BLOCK };
    int64_t nc = C - c0 < CB ? C - c0 : CB;
    float s[CB] = {0}; /* the partial sums stay in registers */
    for (int64_t n = 0; n < N; n++) {
        const float *d = dout + n * C + c0, *xr = x + n * C + c0;
        float r = rstd[n];
#pragma omp simd
        for (int64_t i = 0; i < nc; i++) s[i] += d[i] * xr[i] * r;
    }
    for (int64_t i = 0; i < nc; i++) dw[c0 + i] += s[i];
}

void nl_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                         int64_t N, int64_t C) {
#pragma omp parallel
    {
#pragma omp for schedule(static) nowait
        for (int64_t n = 0; n < N; n++) nl_rmsnorm_backward_rows(dx, dout, x, w, rstd, n, n + 1, C);
#pragma omp for schedule(static)
        for (int64_t c0 = 0; c0 < C; c0 += NL_RMSNORM_DW_BLOCK)
            nl_rmsnorm_backward_dw_cols(dw, dout, x, rstd, N, C, c0);
    }
}

/* ---- RoPE -------------------------------------------------------------------------------------
 * x: rows (B, T) with `nh` heads of size hd starting at the row start, row stride `stride`.
 * Pair (2i, 2i+1) of a head at position t is rotated by angle t * theta^(-2i/hd) (tables
 * cos_t/sin_t (T, hd/2)). inverse = 1 rotates by the negative angle (the backward pass). */
void nl_rope_row(float *row, const float *cos_t, const float *sin_t, int64_t nh, int64_t hd, int inverse) {
    const int64_t half = hd / 2;
    const float sgn = inverse ? -1.0f : 1.0f;
    for (int64_t h = 0; h < nh; h++) {
        float *v = row + h * hd;
        for (int64_t i = 0; i < half; i++) {
            float x0 = v[2 * i], x1 = v[2 * i + 1];
            float si = sgn * sin_t[i];
            v[2 * i] = x0 * cos_t[i] - x1 * si;
            v[2 * i + 1] = x0 * si + x1 * cos_t[i];
        }
    }
}

void nl_rope_apply(float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T, int64_t nh, int64_t hd,
                   int64_t stride, int inverse) {
    const int64_t half = hd / 2;
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t t = bt % T;
        nl_rope_row(x + bt * stride, cos_t + t * half, sin_t + t * half, nh, hd, inverse);
    }
}

/* ---- causal grouped-query attention -------------------------------------------------------------
 * qkv (B, T, QKV) rows [q (NH*hd) | k (KVH*hd) | v (KVH*hd)]; query head h reads kv head
 * h / (NH/KVH). out (B, T, NH*hd); att (B, NH, T, T) softmax probabilities (row t: columns
 * 0..t, the rest zero). One OpenMP task per (b, h), all three steps on the (T, T) block while
 * it is in cache: S = Q K^T / sqrt(hd) with one single-threaded cblas_sgemm (the full square;
 * the causal half is masked), a causal softmax over its T rows, then O = P V (OpenBLAS set to
 * one thread meanwhile: blas_serial.h). Results do not depend on the thread count. */

/* Causal softmax in place of row t of a (T, T) score block: columns 0..t, the rest set to 0. */
static void causal_softmax_row(float *a, int64_t t, int64_t T) {
    float mx = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : mx)
    for (int64_t t2 = 0; t2 <= t; t2++) mx = a[t2] > mx ? a[t2] : mx;
    nl_vexp_shift(a, a, mx, t + 1);
    for (int64_t t2 = 0; t2 <= t; t2++) sum += a[t2]; /* in order, as the scalar loop summed */
    float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t t2 = 0; t2 <= t; t2++) a[t2] *= inv;
    for (int64_t t2 = t + 1; t2 < T; t2++) a[t2] = 0.0f;
}

/* Softmax backward in place of row t of dP: dS = P * (dP - <P, dP>) * scale, columns 0..t. */
static void softmax_backward_row(float *dp, const float *pr, int64_t t, int64_t T, float scale) {
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t t2 = 0; t2 <= t; t2++) dot += pr[t2] * dp[t2];
#pragma omp simd
    for (int64_t t2 = 0; t2 <= t; t2++) dp[t2] = pr[t2] * (dp[t2] - dot) * scale;
    for (int64_t t2 = t + 1; t2 < T; t2++) dp[t2] = 0.0f;
}

/* The AVX2 path (numerics/tile_gemm.h), when the CPU has it and T and hd are multiples of 16: the
 * same three steps on blocks of NL_TILE_MR rows, each product only over the blocks the causal mask leaves
 * (S: columns up to the block's last row, rounded up to 16; P V and dS K: k up to that row;
 * P^T dO and dS^T Q: k from the block's first row), so about half of OpenBLAS's full squares, and
 * no packing. K and V are copied transposed (hd, T) for S = Q K^T and dP = dO V^T. */
enum { ATT_TILE = 16 };

static int att_tiles(int64_t T, int64_t hd) { return T % ATT_TILE == 0 && hd % ATT_TILE == 0 && nl_tile_gemm_avx2(); }

/* Columns of S (or dP) a causal block of rows t0..t1-1 needs. */
static int64_t causal_cols(int64_t t1, int64_t T) {
    int64_t n = (t1 + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
    return n < T ? n : T;
}

/* Rows in the block starting at t0: NL_TILE_MR, the last one less (T % 16 == 0: 6, 4 or 2). */
static int64_t tile_rows(int64_t t0, int64_t T) { return T - t0 < NL_TILE_MR ? T - t0 : NL_TILE_MR; }

/* One (b, h): p (T, T) softmax probabilities, o rows (stride od) = P V. kt: (hd, T) scratch. */
static void attention_head_tiles(float *o, int64_t od, float *p, const float *q, const float *k, const float *v,
                                 int64_t T, int64_t hd, int64_t ld, float scale, float *kt) {
    nl_tile_transpose(kt, k, T, hd, ld);
    for (int64_t t0 = 0, m; t0 < T; t0 += m) {
        m = tile_rows(t0, T);
        nl_tile_gemm(p + t0 * T, T, m, q + t0 * ld, ld, 1, kt, T, causal_cols(t0 + m, T), hd, scale, 0);
        for (int64_t t = t0; t < t0 + m; t++) nl_vsoftmax_prefix(p + t * T, t + 1, T);
        nl_tile_gemm(o + t0 * od, od, m, p + t0 * T, T, 1, v, ld, hd, t0 + m, 1.0f, 0);
    }
}

/* One (b, h) of the backward (see nl_attention_backward); acc = 0 for the first head of a group. */
static void attention_head_tiles_backward(float *dq, float *dk, float *dv, float *ds, const float *d, int64_t od,
                                          const float *p, const float *q, const float *k, const float *v, int64_t T,
                                          int64_t hd, int64_t ld, float scale, int acc, float *vt) {
    nl_tile_transpose(vt, v, T, hd, ld);
    for (int64_t t0 = 0, m; t0 < T; t0 += m) {
        m = tile_rows(t0, T);
        nl_tile_gemm(ds + t0 * T, T, m, d + t0 * od, od, 1, vt, T, causal_cols(t0 + m, T), hd, 1.0f, 0);
        nl_tile_gemm(dv + t0 * ld, ld, m, p + t0 * T + t0, 1, T, d + t0 * od, od, hd, T - t0, 1.0f, acc);
        for (int64_t t = t0; t < t0 + m; t++) softmax_backward_row(ds + t * T, p + t * T, t, T, scale);
    }
    for (int64_t t0 = 0, m; t0 < T; t0 += m) {
        m = tile_rows(t0, T);
        nl_tile_gemm(dq + t0 * ld, ld, m, ds + t0 * T, T, 1, k, ld, hd, t0 + m, 1.0f, 0);
        nl_tile_gemm(dk + t0 * ld, ld, m, ds + t0 * T + t0, 1, T, q + t0 * ld, ld, hd, T - t0, 1.0f, acc);
    }
}

void nl_attention_forward(float *out, float *att, const float *qkv, int64_t B, int64_t T, int64_t NH, int64_t KVH,
                          int64_t hd) {
    int64_t QKV = (NH + 2 * KVH) * hd, group = NH / KVH;
    float scale = 1.0f / sqrtf((float)hd);
    float *scratch = att_tiles(T, hd) ? malloc((size_t)(omp_get_max_threads() * hd * T) * sizeof(float)) : NULL;
    if (scratch) { /* (without it, the OpenBLAS path below) */
#pragma omp parallel
        {
            float *kt = scratch + omp_get_thread_num() * hd * T;
#pragma omp for collapse(2) schedule(static)
            for (int64_t b = 0; b < B; b++)
                for (int64_t h = 0; h < NH; h++) {
                    const float *q = qkv + b * T * QKV + h * hd, *k = qkv + b * T * QKV + (NH + h / group) * hd;
                    const float *v = qkv + b * T * QKV + (NH + KVH + h / group) * hd;
                    attention_head_tiles(out + b * T * NH * hd + h * hd, NH * hd, att + (b * NH + h) * T * T, q, k, v,
                                         T, hd, QKV, scale, kt);
                }
        }
        free(scratch);
        return;
    }
    int nb = nl_blas_serial_begin();
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++) {
            const float *q = qkv + b * T * QKV + h * hd, *k = qkv + b * T * QKV + (NH + h / group) * hd;
            const float *v = qkv + b * T * QKV + (NH + KVH + h / group) * hd;
            float *p = att + (b * NH + h) * T * T; /* (T, T) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)hd, scale, q, (int)QKV, k,
                        (int)QKV, 0.0f, p, (int)T);
            for (int64_t t = 0; t < T; t++) causal_softmax_row(p + t * T, t, T);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)hd, (int)T, 1.0f, p, (int)T, v,
                        (int)QKV, 0.0f, out + b * T * NH * hd + h * hd, (int)(NH * hd));
        }
    nl_blas_serial_end(nb);
}

/* nl_attention_backward on the AVX2 path: the same loops, a head at a time in tiles. scratch:
 * (threads, hd, T). */
static void attention_backward_tiles(float *dqkv, float *datt, const float *dout, const float *att, const float *qkv,
                                     int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t hd, float *scratch) {
    int64_t QKV = (NH + 2 * KVH) * hd, group = NH / KVH, OD = NH * hd;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel
    {
        float *vt = scratch + omp_get_thread_num() * hd * T;
#pragma omp for collapse(2) schedule(static)
        for (int64_t b = 0; b < B; b++)
            for (int64_t kh = 0; kh < KVH; kh++) {
                const float *base = qkv + b * T * QKV;
                float *dbase = dqkv + b * T * QKV;
                for (int64_t h = kh * group; h < (kh + 1) * group; h++)
                    attention_head_tiles_backward(dbase + h * hd, dbase + (NH + kh) * hd, dbase + (NH + KVH + kh) * hd,
                                                  datt + (b * NH + h) * T * T, dout + b * T * OD + h * hd, OD,
                                                  att + (b * NH + h) * T * T, base + h * hd, base + (NH + kh) * hd,
                                                  base + (NH + KVH + kh) * hd, T, hd, QKV, scale, h != kh * group, vt);
            }
    }
}

/* dqkv (B, T, QKV) = d/dqkv (overwritten) from dout (B, T, NH*hd); datt (B, NH, T, T) scratch.
 * dP = dO V^T; dS = P * (dP - rowsum(P * dP)) / sqrt(hd); dQ = dS K; dK += dS^T Q; dV += P^T dO.
 * K and V gradients of a GQA group accumulate over its query heads, so the parallel loop runs
 * over (b, kv head) and the heads of a group in order; the first head of a group overwrites dK
 * and dV (beta 0), the others add. O(T^2 hd) per head. */
void nl_attention_backward(float *dqkv, float *datt, const float *dout, const float *att, const float *qkv, int64_t B,
                           int64_t T, int64_t NH, int64_t KVH, int64_t hd) {
    int64_t QKV = (NH + 2 * KVH) * hd, group = NH / KVH, OD = NH * hd;
    float scale = 1.0f / sqrtf((float)hd);
    float *scratch = att_tiles(T, hd) ? malloc((size_t)(omp_get_max_threads() * hd * T) * sizeof(float)) : NULL;
    if (scratch) { /* (without it, the OpenBLAS path below) */
        attention_backward_tiles(dqkv, datt, dout, att, qkv, B, T, NH, KVH, hd, scratch);
        free(scratch);
        return;
    }
    int nb = nl_blas_serial_begin();
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t kh = 0; kh < KVH; kh++) {
            const float *k = qkv + b * T * QKV + (NH + kh) * hd, *v = qkv + b * T * QKV + (NH + KVH + kh) * hd;
            float *dk = dqkv + b * T * QKV + (NH + kh) * hd, *dv = dqkv + b * T * QKV + (NH + KVH + kh) * hd;
            for (int64_t h = kh * group; h < (kh + 1) * group; h++) {
                const float *q = qkv + b * T * QKV + h * hd, *d = dout + b * T * OD + h * hd;
                const float *p = att + (b * NH + h) * T * T;
                float *ds = datt + (b * NH + h) * T * T, *dq = dqkv + b * T * QKV + h * hd;
                float beta = h == kh * group ? 0.0f : 1.0f;
                /* dP = dO V^T into ds; dV (+)= P^T dO */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)hd, 1.0f, d, (int)OD, v,
                            (int)QKV, 0.0f, ds, (int)T);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)T, (int)hd, (int)T, 1.0f, p, (int)T, d,
                            (int)OD, beta, dv, (int)QKV);
                /* softmax backward, row by row: dS = P * (dP - <P, dP>) / sqrt(hd) */
                for (int64_t t = 0; t < T; t++) softmax_backward_row(ds + t * T, p + t * T, t, T, scale);
                /* dQ = dS K; dK (+)= dS^T Q */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)hd, (int)T, 1.0f, ds, (int)T, k,
                            (int)QKV, 0.0f, dq, (int)QKV);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)T, (int)hd, (int)T, 1.0f, ds, (int)T, q,
                            (int)QKV, beta, dk, (int)QKV);
            }
        }
    nl_blas_serial_end(nb);
}

/* ---- SwiGLU -------------------------------------------------------------------------------------
 * h13 (N, 2H) rows [gate | up]; out (N, H) = silu(gate) * up.
 * A row goes in pieces of SWIGLU_PIECE: first exp(-gate) of the piece into a buffer
 * (nl_vexp_neg: 8 lanes at a time, vexp_simd.h), then the rest, which the compiler vectorizes.
 * Written as one loop, GCC kept it scalar ("control flow in loop": nl_vexpf's selects); the
 * operations and their order are the same, so the bits are too. */
enum { SWIGLU_PIECE = 256 };

void nl_swiglu_forward(float *out, const float *h13, int64_t N, int64_t H) {
#pragma omp parallel for schedule(static) if (N * H >= ROWWISE_PARALLEL_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *g = h13 + n * 2 * H, *u = g + H;
        float *o = out + n * H;
        float e[SWIGLU_PIECE];
        for (int64_t i0 = 0; i0 < H; i0 += SWIGLU_PIECE) {
            int64_t k = H - i0 < SWIGLU_PIECE ? H - i0 : SWIGLU_PIECE;
            nl_vexp_neg(e, g + i0, k);
#pragma omp simd
            for (int64_t i = 0; i < k; i++) o[i0 + i] = g[i0 + i] / (1.0f + e[i]) * u[i0 + i];
        }
    }
}

/* dh13 (N, 2H) = d/dh13 (overwritten) from dout (N, H). */
void nl_swiglu_backward(float *dh13, const float *dout, const float *h13, int64_t N, int64_t H) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *g = h13 + n * 2 * H, *u = g + H, *d = dout + n * H;
        float *dg = dh13 + n * 2 * H, *du = dg + H;
        float e[SWIGLU_PIECE];
        for (int64_t i0 = 0; i0 < H; i0 += SWIGLU_PIECE) {
            int64_t k = H - i0 < SWIGLU_PIECE ? H - i0 : SWIGLU_PIECE;
            nl_vexp_neg(e, g + i0, k);
#pragma omp simd
            for (int64_t j = 0; j < k; j++) {
                int64_t i = i0 + j;
                float sig = 1.0f / (1.0f + e[j]);
                float silu = g[i] * sig;
                du[i] = d[i] * silu;
                dg[i] = d[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
            }
        }
    }
}
