/*
 * Emulated FP8 GEMM: quantization with per-tensor / delayed / per-block / MX scales, and an
 * fp32 or limited (k-bit, truncating) accumulator with promotion to fp32. See nanolm/fp8.h for
 * the exact model; DeepSeek-V3 (2024) §3.3.1-3.3.2 for the recipe it emulates.
 */
#include "nanolm/fp8.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#include <strings.h>

#define LANES 16 /* output columns one kernel call computes side by side (SIMD lanes) */
#define DEFAULT_GROUP 32

/* ---- names ----------------------------------------------------------------------------------- */

static const char *const scaling_names[NL_FP8_SCALE_COUNT] = {"tensor", "delayed", "block", "mx"};

const char *nl_fp8_scaling_name(nl_fp8_scaling s) {
    return (s >= 0 && s < NL_FP8_SCALE_COUNT) ? scaling_names[s] : "?";
}

nl_status nl_fp8_scaling_from_name(const char *name, nl_fp8_scaling *out) {
    if (!name || !out) return nl_fail(NL_ERR_INVALID, "fp8 scaling: NULL name");
    for (int i = 0; i < NL_FP8_SCALE_COUNT; i++)
        if (!strcasecmp(name, scaling_names[i])) {
            *out = (nl_fp8_scaling)i;
            return NL_OK;
        }
    return nl_fail(NL_ERR_INVALID, "unknown fp8 scaling '%s' (valid: tensor, delayed, block, mx)", name);
}

nl_status nl_fp8_format_from_name(const char *name, nl_format *out) {
    if (!name || !out) return nl_fail(NL_ERR_INVALID, "fp8 format: NULL name");
    nl_format f;
    if (nl_fmt_from_name(name, &f) != NL_OK || (f != NL_FMT_E4M3 && f != NL_FMT_E5M2))
        return nl_fail(NL_ERR_INVALID, "unsupported fp8 format '%s' (valid: e4m3, e5m2)", name);
    *out = f;
    return NL_OK;
}

/* ---- delayed scaling (Transformer Engine DelayedScaling, amax_compute_algo = "max") ---------- */

nl_status nl_fp8_delayed_init(nl_fp8_delayed *d, int history_len, int margin) {
    if (!d) return nl_fail(NL_ERR_INVALID, "fp8 delayed scaling: NULL state");
    if (history_len < 1 || history_len > NL_FP8_HISTORY_MAX)
        return nl_fail(NL_ERR_INVALID, "fp8 delayed scaling: history length %d outside 1..%d",
                       history_len, NL_FP8_HISTORY_MAX);
    if (margin < 0) return nl_fail(NL_ERR_INVALID, "fp8 delayed scaling: margin %d < 0", margin);
    memset(d, 0, sizeof *d);
    d->history_len = history_len;
    d->margin = margin;
    d->scale = 1.0f;
    return NL_OK;
}

nl_status nl_fp8_delayed_update(nl_fp8_delayed *d, float amax, double fmax_v) {
    if (!d || d->history_len < 1 || d->history_len > NL_FP8_HISTORY_MAX)
        return nl_fail(NL_ERR_INVALID, "fp8 delayed scaling: state not initialised");
    if (!(amax >= 0.0f)) return nl_fail(NL_ERR_INVALID, "fp8 delayed scaling: amax %g is negative or NaN", amax);
    d->amax_history[d->steps % d->history_len] = amax;
    d->steps++;
    float w = 0.0f;
    for (int i = 0; i < d->history_len; i++) w = fmaxf(w, d->amax_history[i]);
    if (w > 0.0f && isfinite(w)) {
        double s = fmax_v / (double)w / ldexp(1.0, d->margin);
        if (isfinite((float)s) && s > 0.0) d->scale = (float)s;
    }
    return NL_OK;
}

/* ---- accumulator ------------------------------------------------------------------------------ */

nl_status nl_fp8_acc_validate(const nl_fp8_acc *acc) {
    if (!acc) return nl_fail(NL_ERR_INVALID, "fp8 accumulator: NULL");
    if (acc->bits != 0 && (acc->bits < 2 || acc->bits > 24))
        return nl_fail(NL_ERR_INVALID, "fp8 accumulator: bits %d (valid: 0 = fp32, or 2..24)", acc->bits);
    if (acc->group < 0) return nl_fail(NL_ERR_INVALID, "fp8 accumulator: group %d < 1", acc->group);
    int g = acc->group ? acc->group : DEFAULT_GROUP;
    if (acc->promote < 0) return nl_fail(NL_ERR_INVALID, "fp8 accumulator: promote %d < 0", acc->promote);
    if (acc->bits && acc->promote % g)
        return nl_fail(NL_ERR_INVALID,
                       "fp8 accumulator: promote interval %d is not a multiple of the group size %d",
                       acc->promote, g);
    if (acc->round != NL_FP8_ACC_TRUNCATE && acc->round != NL_FP8_ACC_NEAREST)
        return nl_fail(NL_ERR_INVALID, "fp8 accumulator: unknown rounding %d", (int)acc->round);
    return NL_OK;
}

static inline uint64_t dbits(double x) {
    uint64_t u;
    memcpy(&u, &x, 8);
    return u;
}
static inline double dfrom(uint64_t u) {
    double x;
    memcpy(&x, &u, 8);
    return x;
}
/* floor(log2 |x|) for a normal double (or a large negative number for 0). */
static inline int64_t dexp(double x) { return (int64_t)((dbits(x) >> 52) & 0x7FF) - 1023; }
/* 2^e for -1022 <= e <= 1023. */
static inline double pow2(int64_t e) { return dfrom((uint64_t)(e + 1023) << 52); }

/*
 * The limited-accumulator kernel for one row i of A and LANES consecutive columns of B.
 *   a      (K)        the row of A: FP8 values (unscaled; MX: exact q * 2^X)
 *   b      (K, ldb)   B's FP8 values, b[k * ldb + w] for lane w
 *   inv    (LANES)    filled by scale_at(k_window_start) before each promotion
 *   out    (LANES)    the fp32 results
 * Promotion every `promote` products (0 = only at the end); scale_cb gives, for the window
 * that starts at k, 1/(s_a s_b) per lane.
 */
typedef struct kernel_scales {
    const double *inv_a; int64_t bk_a, bo_a, nob_a; /* A block (kb, ob): inv_a[kb * nob_a + ob] */
    const double *inv_b; int64_t bk_b, bo_b, nob_b;
    int64_t ncols; /* N: padding lanes past it use the last column's scale */
} kernel_scales;

static void limited_lanes(const nl_fp8_acc *acc, const double *a, const double *b, int64_t ldb,
                          int64_t K, int64_t row, int64_t col0, const kernel_scales *ks,
                          float *out) {
    const int kbits = acc->bits;
    const int64_t g = acc->group ? acc->group : DEFAULT_GROUP;
    const int64_t promote = acc->promote;
    const uint64_t keep_mask = ~((UINT64_C(1) << (53 - kbits)) - 1); /* k significant bits */
    double part[LANES], mx[LANES], sum[LANES], sc[LANES], unsc[LANES];
    float acc32[LANES];
    for (int w = 0; w < LANES; w++) { part[w] = 0.0; acc32[w] = 0.0f; }
    int64_t window_start = 0;
    for (int64_t k0 = 0; k0 < K; k0 += g) {
        const int64_t k1 = k0 + g < K ? k0 + g : K;
        if (acc->round == NL_FP8_ACC_TRUNCATE) {
            /* 1. the largest exponent among the partial sum and the group's products */
            for (int w = 0; w < LANES; w++) mx[w] = fabs(part[w]);
            for (int64_t k = k0; k < k1; k++) {
                const double ak = a[k];
                const double *bk = b + k * ldb;
#pragma omp simd
                for (int w = 0; w < LANES; w++) {
                    const double v = fabs(ak * bk[w]);
                    mx[w] = mx[w] > v ? mx[w] : v;
                }
            }
            /* 2. align to 2^(e - k + 1), truncate toward zero, sum exactly */
#pragma omp simd
            for (int w = 0; w < LANES; w++) {
                int64_t e = dexp(mx[w]);
                if (e < -900) e = -900; /* all zero: any alignment works */
                const int64_t s = e - kbits + 1;
                sc[w] = pow2(-s);
                unsc[w] = pow2(s);
                sum[w] = (double)(int32_t)(part[w] * sc[w]);
            }
            for (int64_t k = k0; k < k1; k++) {
                const double ak = a[k];
                const double *bk = b + k * ldb;
#pragma omp simd
                for (int w = 0; w < LANES; w++) sum[w] += (double)(int32_t)(ak * bk[w] * sc[w]); /* |.| < 2^k: exact truncation */
            }
            /* 3. the sum keeps k significant bits (truncated) */
#pragma omp simd
            for (int w = 0; w < LANES; w++) part[w] = dfrom(dbits(sum[w]) & keep_mask) * unsc[w];
        } else {
            for (int w = 0; w < LANES; w++) sum[w] = part[w];
            for (int64_t k = k0; k < k1; k++) {
                const double ak = a[k];
                const double *bk = b + k * ldb;
#pragma omp simd
                for (int w = 0; w < LANES; w++) sum[w] += ak * bk[w];
            }
#pragma omp simd
            for (int w = 0; w < LANES; w++) {
                int64_t e = dexp(sum[w]);
                if (e < -900) e = -900;
                const int64_t s = e - kbits + 1;
                part[w] = nearbyint(sum[w] * pow2(-s)) * pow2(s);
            }
        }
        /* 4. promotion: scales multiplied in, added to the fp32 accumulator */
        const int at_end = (k1 == K);
        if (at_end || (promote > 0 && k1 - window_start >= promote)) {
            const int64_t kb_a = window_start / ks->bk_a, kb_b = window_start / ks->bk_b;
            const double ia = ks->inv_a[kb_a * ks->nob_a + row / ks->bo_a];
            for (int w = 0; w < LANES; w++) {
                const int64_t col = col0 + w < ks->ncols ? col0 + w : ks->ncols - 1;
                const double ib = ks->inv_b[kb_b * ks->nob_b + col / ks->bo_b];
                acc32[w] += (float)part[w] * (float)(ia * ib);
                part[w] = 0.0;
            }
            window_start = k1;
        }
    }
    for (int w = 0; w < LANES; w++) out[w] = acc32[w];
}

nl_status nl_fp8_acc_sum(const nl_fp8_acc *acc, const double *terms, int64_t n, float *out_sum) {
    NL_TRY(nl_fp8_acc_validate(acc));
    if (!out_sum || (n > 0 && !terms)) return nl_fail(NL_ERR_INVALID, "fp8 accumulator sum: NULL pointer");
    if (n < 0) return nl_fail(NL_ERR_INVALID, "fp8 accumulator sum: n = %lld < 0", (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(terms[i]))
            return nl_fail(NL_ERR_INVALID, "fp8 accumulator sum: term %lld is not finite", (long long)i);
    if (n == 0) {
        *out_sum = 0.0f;
        return NL_OK;
    }
    if (acc->bits == 0) {
        float s = 0.0f;
        for (int64_t i = 0; i < n; i++) s += (float)terms[i];
        *out_sum = s;
        return NL_OK;
    }
    /* The same kernel as the GEMM: A = terms (1, n), B = (n, LANES) with 1 in lane 0. */
    double *b = nl_calloc((size_t)n * LANES, sizeof(double), "fp8 accumulator ones");
    if (!b) return NL_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++) b[i * LANES] = 1.0;
    const double one = 1.0;
    kernel_scales ks = {&one, n, 1, 1, &one, n, 1, 1, 1};
    float out[LANES];
    limited_lanes(acc, terms, b, LANES, n, 0, 0, &ks, out);
    nl_free(b);
    *out_sum = out[0];
    return NL_OK;
}

/* ---- quantization ------------------------------------------------------------------------------ */

/* Geometry of the scale blocks of an operand viewed as (nk along K) x (no other). */
typedef struct qgeom { int64_t bk, bo, nkb, nob; } qgeom;

static qgeom geometry(nl_fp8_scaling sc, int64_t nk, int64_t no, int is_a) {
    qgeom g;
    switch (sc) {
    case NL_FP8_SCALE_BLOCK: g.bk = NL_FP8_BLOCK; g.bo = is_a ? 1 : NL_FP8_BLOCK; break;
    case NL_FP8_SCALE_MX: g.bk = NL_FP8_MX_BLOCK; g.bo = 1; break;
    default: g.bk = nk; g.bo = no; break;
    }
    g.nkb = (nk + g.bk - 1) / g.bk;
    g.nob = (no + g.bo - 1) / g.bo;
    return g;
}

/* Element (kk, oo) of an operand that is stored as (rows, cols) row-major, where K runs along
 * the columns (A, along_rows = 1) or along the rows (B). */
static inline int64_t elem_index(int64_t kk, int64_t oo, int64_t cols, int k_is_cols) {
    return k_is_cols ? oo * cols + kk : kk * cols + oo;
}

/*
 * Quantizes x (rows, cols) to FP8 values q (unscaled; MX: q * 2^X, exact) in the same layout,
 * with inv (nkb * nob) = 1 / s per block (MX: 1). Updates the delayed state.
 */
static nl_status quantize_operand(nl_format fmt, nl_fp8_scaling scaling, nl_fp8_delayed *dl,
                                  const char *what, int64_t rows, int64_t cols, int k_is_cols,
                                  const float *x, double *q, double *inv, qgeom *geom_out,
                                  nl_fp8_operand_stats *st) {
    const nl_format_info *fi = nl_fmt_info(fmt);
    const double fmax_v = fi->max_finite;
    const int emax_elem = (int)floor(log2(fmax_v));
    const int64_t nk = k_is_cols ? cols : rows, no = k_is_cols ? rows : cols;
    const qgeom g = geometry(scaling, nk, no, k_is_cols);
    *geom_out = g;
    const int64_t n = rows * cols;
    /* finite check, naming the first bad element */
    int64_t bad = INT64_MAX;
#pragma omp parallel for reduction(min : bad) schedule(static)
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]) && i < bad) bad = i;
    if (bad != INT64_MAX)
        return nl_fail(NL_ERR_INVALID, "fp8 gemm: %s[%lld][%lld] is %g (not finite)", what,
                       (long long)(bad / cols), (long long)(bad % cols), x[bad]);
    const int64_t nblocks = g.nkb * g.nob;
    double *scale = nl_malloc((size_t)nblocks * sizeof(double), "fp8 scales");
    float *tmp = nl_malloc((size_t)n * sizeof(float), "fp8 quantization buffer");
    if (!scale || !tmp) {
        nl_free(scale);
        nl_free(tmp);
        return NL_ERR_NOMEM;
    }
    float tensor_amax = 0.0f;
    /* per block: amax and scale */
#pragma omp parallel for schedule(static) reduction(max : tensor_amax)
    for (int64_t blk = 0; blk < nblocks; blk++) {
        const int64_t kb = blk / g.nob, ob = blk % g.nob;
        const int64_t k0 = kb * g.bk, k1 = k0 + g.bk < nk ? k0 + g.bk : nk;
        const int64_t o0 = ob * g.bo, o1 = o0 + g.bo < no ? o0 + g.bo : no;
        float am = 0.0f;
        for (int64_t oo = o0; oo < o1; oo++)
            for (int64_t kk = k0; kk < k1; kk++) {
                const float v = fabsf(x[elem_index(kk, oo, cols, k_is_cols)]);
                am = am > v ? am : v;
            }
        tensor_amax = fmaxf(tensor_amax, am);
        double s = 1.0;
        switch (scaling) {
        case NL_FP8_SCALE_TENSOR:
        case NL_FP8_SCALE_BLOCK:
            if (am > 0.0f) s = fmax_v / am;
            if (!isfinite((float)s)) s = 1.0; /* amax so small that fmax/amax overflows fp32 */
            break;
        case NL_FP8_SCALE_DELAYED: s = dl->scale; break;
        case NL_FP8_SCALE_MX: {
            int X = -127;
            if (am > 0.0f) X = ilogbf(am) - emax_elem;
            if (X < -127) X = -127;
            if (X > 127) X = 127;
            s = ldexp(1.0, -X);
            break;
        }
        default: break;
        }
        scale[blk] = s;
    }
    /* scale, count saturation, round to FP8 */
    int64_t sat = 0;
#pragma omp parallel for schedule(static) reduction(+ : sat)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const int64_t kk = k_is_cols ? c : r, oo = k_is_cols ? r : c;
            const double s = scale[(kk / g.bk) * g.nob + oo / g.bo];
            const float v = (float)((double)x[r * cols + c] * s);
            if (fabsf(v) > fmax_v) sat++;
            tmp[r * cols + c] = v;
        }
    nl_status rc = NL_OK;
    const int64_t chunk = 1 << 16;
#pragma omp parallel for schedule(static)
    for (int64_t i0 = 0; i0 < n; i0 += chunk) {
        const int64_t len = i0 + chunk < n ? chunk : n - i0;
        nl_status r = nl_fmt_round_array(fmt, tmp + i0, (size_t)len);
        if (r != NL_OK) {
#pragma omp critical
            rc = r;
        }
    }
    if (rc != NL_OK) {
        nl_free(scale);
        nl_free(tmp);
        return rc;
    }
    int64_t flushed = 0;
#pragma omp parallel for schedule(static) reduction(+ : flushed)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const int64_t i = r * cols + c;
            if (tmp[i] == 0.0f && x[i] != 0.0f) flushed++;
            if (scaling == NL_FP8_SCALE_MX) {
                const int64_t kk = k_is_cols ? c : r, oo = k_is_cols ? r : c;
                q[i] = (double)tmp[i] / scale[(kk / g.bk) * g.nob + oo / g.bo]; /* exact: power of 2 */
            } else {
                q[i] = tmp[i];
            }
        }
    double smin = INFINITY, smax = 0.0;
    for (int64_t b = 0; b < nblocks; b++) {
        inv[b] = scaling == NL_FP8_SCALE_MX ? 1.0 : 1.0 / scale[b];
        smin = fmin(smin, scale[b]);
        smax = fmax(smax, scale[b]);
    }
    if (st) {
        st->amax = tensor_amax;
        st->saturated = sat;
        st->flushed = flushed;
        st->scale_min = smin;
        st->scale_max = smax;
    }
    nl_free(scale);
    nl_free(tmp);
    if (scaling == NL_FP8_SCALE_DELAYED) NL_TRY(nl_fp8_delayed_update(dl, tensor_amax, fmax_v));
    return NL_OK;
}

static nl_status check_fmt(nl_format f, const char *what) {
    if (f != NL_FMT_E4M3 && f != NL_FMT_E5M2)
        return nl_fail(NL_ERR_INVALID, "fp8 gemm: format of %s is %s, not e4m3 or e5m2", what, nl_fmt_name(f));
    return NL_OK;
}

nl_status nl_fp8_quantize(nl_format fmt, nl_fp8_scaling scaling, nl_fp8_delayed *delayed,
                          int64_t rows, int64_t cols, int along_rows, const float *x, float *out,
                          nl_fp8_operand_stats *stats) {
    NL_TRY(check_fmt(fmt, "the tensor"));
    if (scaling < 0 || scaling >= NL_FP8_SCALE_COUNT)
        return nl_fail(NL_ERR_INVALID, "fp8 quantize: unknown scaling %d", (int)scaling);
    if (scaling == NL_FP8_SCALE_DELAYED && !delayed)
        return nl_fail(NL_ERR_INVALID, "fp8 quantize: delayed scaling needs its state");
    if (rows < 1 || cols < 1) return nl_fail(NL_ERR_INVALID, "fp8 quantize: shape (%lld, %lld)", (long long)rows, (long long)cols);
    if (!x || !out) return nl_fail(NL_ERR_INVALID, "fp8 quantize: NULL pointer");
    const int64_t n = rows * cols;
    double *q = nl_malloc((size_t)n * sizeof(double), "fp8 quantized tensor");
    const int64_t nk = along_rows ? cols : rows, no = along_rows ? rows : cols;
    qgeom g = geometry(scaling, nk, no, along_rows);
    double *inv = nl_malloc((size_t)(g.nkb * g.nob) * sizeof(double), "fp8 inverse scales");
    if (!q || !inv) {
        nl_free(q);
        nl_free(inv);
        return NL_ERR_NOMEM;
    }
    nl_status rc = quantize_operand(fmt, scaling, delayed, "tensor", rows, cols, along_rows, x, q, inv, &g, stats);
    if (rc == NL_OK)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                const int64_t kk = along_rows ? c : r, oo = along_rows ? r : c;
                out[r * cols + c] = (float)(q[r * cols + c] * inv[(kk / g.bk) * g.nob + oo / g.bo]);
            }
    nl_free(q);
    nl_free(inv);
    return rc;
}

/* ---- the GEMM ------------------------------------------------------------------------------------ */

void nl_fp8_gemm_opts_default(nl_fp8_gemm_opts *o) {
    memset(o, 0, sizeof *o);
    o->fmt_a = o->fmt_b = NL_FMT_E4M3;
    o->scaling = NL_FP8_SCALE_BLOCK;
    o->acc.bits = 14;
    o->acc.group = DEFAULT_GROUP;
    o->acc.promote = 128;
    o->acc.round = NL_FP8_ACC_TRUNCATE;
}

void nl_fp8_gemm_ref_f64(int64_t M, int64_t N, int64_t K, const float *A, const float *B, double *C) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < M; i++) {
        double *c = C + i * N;
        for (int64_t j = 0; j < N; j++) c[j] = 0.0;
        for (int64_t k = 0; k < K; k++) {
            const double a = A[i * K + k];
            const float *b = B + k * N;
            for (int64_t j = 0; j < N; j++) c[j] += a * (double)b[j];
        }
    }
}

void nl_fp8_rel_error(int64_t n, const float *c, const double *ref, double *max_rel, double *fro_rel) {
    double emax = 0.0, rmax = 0.0, e2 = 0.0, r2 = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)c[i] - ref[i]);
        emax = fmax(emax, e);
        rmax = fmax(rmax, fabs(ref[i]));
        e2 += e * e;
        r2 += ref[i] * ref[i];
    }
    if (max_rel) *max_rel = rmax > 0.0 ? emax / rmax : (emax > 0.0 ? INFINITY : 0.0);
    if (fro_rel) *fro_rel = r2 > 0.0 ? sqrt(e2 / r2) : (e2 > 0.0 ? INFINITY : 0.0);
}

/* Copy of a stored operand in its logical layout (rows, cols); transposes when `trans`. */
static float *logical_copy(const float *src, int64_t rows, int64_t cols, int trans, const char *what) {
    float *d = nl_malloc((size_t)(rows * cols) * sizeof(float), what);
    if (!d) return NULL;
    if (!trans) {
        memcpy(d, src, (size_t)(rows * cols) * sizeof(float));
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) d[r * cols + c] = src[c * rows + r];
    }
    return d;
}

nl_status nl_fp8_gemm(const nl_fp8_gemm_opts *o, int64_t M, int64_t N, int64_t K, const float *A,
                      const float *B, float *C, nl_fp8_stats *stats) {
    if (!o) return nl_fail(NL_ERR_INVALID, "fp8 gemm: NULL options");
    if (M < 1 || N < 1 || K < 1)
        return nl_fail(NL_ERR_INVALID, "fp8 gemm: shape M=%lld N=%lld K=%lld (each must be >= 1)",
                       (long long)M, (long long)N, (long long)K);
    if (!A || !B || !C) return nl_fail(NL_ERR_INVALID, "fp8 gemm: NULL matrix");
    NL_TRY(check_fmt(o->fmt_a, "A"));
    NL_TRY(check_fmt(o->fmt_b, "B"));
    if (o->scaling < 0 || o->scaling >= NL_FP8_SCALE_COUNT)
        return nl_fail(NL_ERR_INVALID, "fp8 gemm: unknown scaling %d", (int)o->scaling);
    NL_TRY(nl_fp8_acc_validate(&o->acc));
    if (o->scaling == NL_FP8_SCALE_DELAYED && (!o->delayed_a || !o->delayed_b))
        return nl_fail(NL_ERR_INVALID, "fp8 gemm: delayed scaling needs state for A and B");
    if (o->scaling == NL_FP8_SCALE_BLOCK && o->acc.bits &&
        (o->acc.promote == 0 || NL_FP8_BLOCK % o->acc.promote))
        return nl_fail(NL_ERR_INVALID,
                       "fp8 gemm: block scaling applies its scales at promotion, so promote must "
                       "divide %d (got %d%s)", NL_FP8_BLOCK, o->acc.promote,
                       o->acc.promote == 0 ? " = never" : "");

    nl_status rc = NL_OK;
    const int64_t Np = (N + LANES - 1) / LANES * LANES;
    float *Al = logical_copy(A, M, K, o->trans_a, "fp8 gemm A copy");
    float *Bl = logical_copy(B, K, N, o->trans_b, "fp8 gemm B copy");
    double *qa = nl_malloc((size_t)(M * K) * sizeof(double), "fp8 gemm A values");
    double *qb = nl_malloc((size_t)(K * N) * sizeof(double), "fp8 gemm B values");
    qgeom ga = geometry(o->scaling, K, M, 1), gb = geometry(o->scaling, K, N, 0);
    double *inva = nl_malloc((size_t)(ga.nkb * ga.nob) * sizeof(double), "fp8 gemm A scales");
    double *invb = nl_malloc((size_t)(gb.nkb * gb.nob) * sizeof(double), "fp8 gemm B scales");
    double *bp = NULL;
    float *cw = NULL;
    nl_fp8_stats st_local;
    nl_fp8_stats *st = stats ? stats : &st_local;
    if (!Al || !Bl || !qa || !qb || !inva || !invb) {
        rc = NL_ERR_NOMEM;
        goto done;
    }
    rc = quantize_operand(o->fmt_a, o->scaling, o->delayed_a, "A", M, K, 1, Al, qa, inva, &ga, &st->a);
    if (rc) goto done;
    rc = quantize_operand(o->fmt_b, o->scaling, o->delayed_b, "B", K, N, 0, Bl, qb, invb, &gb, &st->b);
    if (rc) goto done;

    cw = nl_malloc((size_t)(M * Np) * sizeof(float), "fp8 gemm result");
    if (!cw) {
        rc = NL_ERR_NOMEM;
        goto done;
    }
    if (o->acc.bits == 0) {
        /* fp32 accumulation: sgemm on the dequantized operands (reuse the fp32 copies) */
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < M; i++)
            for (int64_t k = 0; k < K; k++)
                Al[i * K + k] = (float)(qa[i * K + k] * inva[(k / ga.bk) * ga.nob + i / ga.bo]);
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < N; j++)
                Bl[k * N + j] = (float)(qb[k * N + j] * invb[(k / gb.bk) * gb.nob + j / gb.bo]);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)K, 1.0f, Al,
                    (int)K, Bl, (int)N, 0.0f, cw, (int)Np);
    } else {
        /* limited accumulator: B repacked into panels of LANES columns, (nchunks, K, LANES),
         * zero-padded past N, so that one panel streams contiguously and stays in cache while
         * every row of A goes through it */
        const int64_t nchunks = Np / LANES;
        bp = nl_calloc((size_t)(K * Np), sizeof(double), "fp8 gemm B panels");
        if (!bp) {
            rc = NL_ERR_NOMEM;
            goto done;
        }
#pragma omp parallel for schedule(static)
        for (int64_t jc = 0; jc < nchunks; jc++)
            for (int64_t k = 0; k < K; k++)
                for (int64_t w = 0; w < LANES && jc * LANES + w < N; w++)
                    bp[(jc * K + k) * LANES + w] = qb[k * N + jc * LANES + w];
        const kernel_scales ks = {inva, ga.bk, ga.bo, ga.nob, invb, gb.bk, gb.bo, gb.nob, N};
#pragma omp parallel for schedule(static)
        for (int64_t t = 0; t < nchunks * M; t++) {
            const int64_t jc = t / M, i = t % M;
            float out[LANES];
            limited_lanes(&o->acc, qa + i * K, bp + jc * K * LANES, LANES, K, i, jc * LANES, &ks, out);
            memcpy(cw + i * Np + jc * LANES, out, sizeof out);
        }
    }
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) C[i * N + j] = o->accumulate ? C[i * N + j] + cw[i * Np + j] : cw[i * Np + j];
done:
    nl_free(Al);
    nl_free(Bl);
    nl_free(qa);
    nl_free(qb);
    nl_free(inva);
    nl_free(invb);
    nl_free(bp);
    nl_free(cw);
    return rc;
}
