/*
 * Emulated FP8 GEMM: quantization with per-tensor / delayed / per-block / MX scales, and an
 * fp32 or limited (k-bit, truncating) accumulator with promotion to fp32. See nanolm/fp8.h for
 * the exact model; DeepSeek-V3 (2024) §3.3.1-3.3.2 for the recipe it emulates.
 */
#include "nanolm/fp8.h"
#include "nanolm/isa.h"

#include <cblas.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define FP8_X86 1
#endif
#include <math.h>
#include <stdio.h>
#include <omp.h>
#include <string.h>
#include <strings.h>

#define LANES         16 /* output columns one kernel call computes side by side (SIMD lanes) */
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
        return nl_fail(NL_ERR_INVALID, "fp8 delayed scaling: history length %d outside 1..%d", history_len,
                       NL_FP8_HISTORY_MAX);
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

const char *nl_fp8_acc_name(const nl_fp8_acc *acc, char *buf, size_t n) {
    if (acc->bits == 0)
        snprintf(buf, n, "fp32");
    else if (acc->promote == 0)
        snprintf(buf, n, "%d-bit, never promoted", acc->bits);
    else
        snprintf(buf, n, "%d-bit, promote every %d", acc->bits, acc->promote);
    return buf;
}

nl_status nl_fp8_acc_validate(const nl_fp8_acc *acc) {
    if (!acc) return nl_fail(NL_ERR_INVALID, "fp8 accumulator: NULL");
    if (acc->bits != 0 && (acc->bits < 2 || acc->bits > 24))
        return nl_fail(NL_ERR_INVALID, "fp8 accumulator: bits %d (valid: 0 = fp32, or 2..24)", acc->bits);
    if (acc->group < 0) return nl_fail(NL_ERR_INVALID, "fp8 accumulator: group %d < 1", acc->group);
    int g = acc->group ? acc->group : DEFAULT_GROUP;
    if (acc->promote < 0) return nl_fail(NL_ERR_INVALID, "fp8 accumulator: promote %d < 0", acc->promote);
    if (acc->bits && acc->promote % g)
        return nl_fail(NL_ERR_INVALID, "fp8 accumulator: promote interval %d is not a multiple of the group size %d",
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
/* 2^e for -1022 <= e <= 1023. */
static inline double pow2(int64_t e) { return dfrom((uint64_t)(e + 1023) << 52); }
/* x truncated toward zero to k significant bits (x a normal double or 0; sign-magnitude, so
 * clearing the low mantissa bits drops magnitude). */
static inline double trunc_sig(double x, int k) { return dfrom(dbits(x) & ~((UINT64_C(1) << (53 - k)) - 1)); }
/* x rounded to nearest-even at k significant bits. */
static double round_sig_nearest(double x, int k) {
    if (x == 0.0) return 0.0;
    const int s = ilogb(x) - k + 1;
    return ldexp(nearbyint(ldexp(x, -s)), s);
}

/*
 * ---- the limited accumulator, scalar reference ----------------------------------------------
 * Written for clarity on arbitrary finite double terms (products of FP8 values in the GEMM).
 * The fast GEMM kernel below must agree with it bit for bit (tests/test_fp8.c).
 */

/* The value one group of products contributes (TRUNCATE): e = the largest floor(log2 |p|)
 * among the group's nonzero products; each product is kept as the k-bit two's-complement
 * integer floor(p / 2^(e-k+2)) (1 sign bit + k-1 bits below 2^(e+1); floor = the sign-filling
 * right shift of the hardware: a negative remainder rounds away from zero); the integers are
 * summed exactly. Returns sum * 2^(e-k+2) (exact in double). */
static double group_value_ref(const double *p, int64_t n, int k) {
    int e = INT32_MIN;
    for (int64_t j = 0; j < n; j++)
        if (p[j] != 0.0 && ilogb(p[j]) > e) e = ilogb(p[j]);
    if (e == INT32_MIN) return 0.0;
    double sum = 0.0; /* an exact integer: |sum| < n * 2^(k-1) */
    for (int64_t j = 0; j < n; j++) {
        const double v = ldexp(p[j], k - 2 - e); /* exact unless it underflows below 2^-1074 */
        double q = floor(v);
        if (q == 0.0 && p[j] < 0.0) q = -1.0; /* a negative value that underflowed still floors to -1 */
        sum += q;
    }
    return ldexp(sum, e - k + 2);
}

/* r + x computed exactly, then truncated toward zero to k significant bits (the register). */
static double add_trunc_ref(double r, double x, int k) {
    if (x == 0.0) return r;
    if (r == 0.0) return trunc_sig(x, k);
    /* both as 53-bit integers m * 2^e */
    int er, ex;
    int64_t mr = (int64_t)ldexp(frexp(r, &er), 53), mx = (int64_t)ldexp(frexp(x, &ex), 53);
    er -= 53;
    ex -= 53;
    /* A term more than 64 binades below the other lies strictly between 0 and one unit of the
     * other's last bit: only its sign can change the truncated result, so it is replaced by
     * sign * 2^(hi - 64) (a sticky bit). */
    const int hi = er > ex ? er : ex;
    if (er < hi - 64) {
        mr = mr > 0 ? 1 : -1;
        er = hi - 64;
    }
    if (ex < hi - 64) {
        mx = mx > 0 ? 1 : -1;
        ex = hi - 64;
    }
    const int lo = er < ex ? er : ex;
    __extension__ typedef __int128 i128;
    __extension__ typedef unsigned __int128 u128;
    const i128 sum = (i128)mr * ((i128)1 << (er - lo)) + (i128)mx * ((i128)1 << (ex - lo)); /* |.| < 2^118 */
    if (sum == 0) return 0.0;
    u128 mag = sum < 0 ? (u128)(-sum) : (u128)sum;
    int msb = 127;
    while (!((mag >> msb) & 1)) msb--;
    if (msb >= k) mag &= ~(((u128)1 << (msb - k + 1)) - 1); /* keep the top k bits */
    const double v = ldexp((double)mag, lo);                /* exact: at most k nonzero bits */
    return sum < 0 ? -v : v;
}

/* The inverse scales 1/(s_a s_b) of the products of the promotion window that starts at k. */
typedef struct kernel_scales {
    const double *inv_a;
    int64_t bk_a, bo_a, nob_a; /* A block (kb, ob): inv_a[kb * nob_a + ob] */
    const double *inv_b;
    int64_t bk_b, bo_b, nob_b;
    int64_t ncols; /* N: padding lanes past it use the last column's scale */
} kernel_scales;

static inline double window_inv(const kernel_scales *ks, int64_t k, int64_t row, int64_t col) {
    if (col >= ks->ncols) col = ks->ncols - 1;
    return ks->inv_a[(k / ks->bk_a) * ks->nob_a + row / ks->bo_a] *
           ks->inv_b[(k / ks->bk_b) * ks->nob_b + col / ks->bo_b];
}

/* One output through the limited accumulator, scalar: terms[0..K) are the products of
 * output (row, col); groups of g, the register of k significant bits, promotion into fp32. */
static float acc_dot_ref(const nl_fp8_acc *acc, const double *terms, int64_t K, int64_t row, int64_t col,
                         const kernel_scales *ks) {
    const int kbits = acc->bits;
    const int64_t g = acc->group ? acc->group : DEFAULT_GROUP;
    double reg = 0.0;
    float acc32 = 0.0f;
    int64_t window_start = 0;
    for (int64_t k0 = 0; k0 < K; k0 += g) {
        const int64_t k1 = k0 + g < K ? k0 + g : K;
        if (acc->round == NL_FP8_ACC_TRUNCATE) {
            reg = add_trunc_ref(reg, group_value_ref(terms + k0, k1 - k0, kbits), kbits);
        } else {
            double s = reg; /* exact for the course's small examples; one rounding at the end */
            for (int64_t k = k0; k < k1; k++) s += terms[k];
            reg = round_sig_nearest(s, kbits);
        }
        if (k1 == K || (acc->promote > 0 && k1 - window_start >= acc->promote)) {
            acc32 += (float)reg * (float)window_inv(ks, window_start, row, col);
            reg = 0.0;
            window_start = k1;
        }
    }
    return acc32;
}

/*
 * ---- the limited accumulator, fast GEMM kernel (TRUNCATE) -------------------------------------
 * Every FP8 value (times its MX power of two) is an integer significand times a power of two:
 * v = m * 2^x with m in [8, 15] (E4M3: 4 significant bits; E5M2's 3 bits fit too) or m = 0.
 * A product is P * 2^(xa + xb) with P = ma * mb, |P| in [64, 225], so its floor(log2) is
 * xa + xb + 6 + (|P| >= 128). With e the group's largest one, the k-bit integer of a product is
 *   floor(P * 2^(xa + xb) / 2^(e - k + 2)) = (P * 2^(k-2)) >> (e - xa - xb)
 * with an arithmetic (sign-filling) shift, which is the hardware's own operation; shifts past
 * 31 give 0 or -1 just the same, so the count is clamped there. All in int32 SIMD lanes.
 * The group's integer sum S is then added to the register in double: s = reg + S * 2^(e-k+2)
 * with its rounding error from Knuth's TwoSum; truncating s to k bits equals truncating the
 * exact sum, except when s already sits on the k-bit grid and the error points toward zero:
 * then the exact sum lies just inside, and the result is one k-bit step toward zero.
 */
#define ZERO_EXP (-(1 << 20)) /* exponent of a zero value: below every real one, no overflow */

/* Splits FP8 values (doubles) into significand m and exponent x (x + 6 when `plus6`). */
static void split_fp8(const double *q, int64_t n, int32_t *m, int32_t *x, int plus6) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        if (q[i] == 0.0) {
            m[i] = 0;
            x[i] = ZERO_EXP;
        } else {
            const int l = ilogb(q[i]);
            m[i] = (int32_t)ldexp(q[i], 3 - l); /* exact: at most 4 significant bits */
            x[i] = l - 3 + (plus6 ? 6 : 0);
        }
    }
}

/* Row `row` of A (ma, xa6: x + 6, length K) times the panel of LANES columns of B (mb, xb:
 * (K, LANES)), out (LANES) = the fp32 accumulators after the last promotion. */
static void fast_lanes(int kbits, int64_t g, int64_t promote, const int32_t *ma, const int32_t *xa6, const int32_t *mb,
                       const int32_t *xb, int64_t K, int64_t row, int64_t col0, const kernel_scales *ks, float *out) {
    const uint64_t unit_k = UINT64_C(1) << (53 - kbits);
    const int32_t pre = 1 << (kbits - 2);
    int32_t P[DEFAULT_GROUP * 2][LANES], X[DEFAULT_GROUP * 2][LANES]; /* g <= 64 here */
    double reg[LANES];
    float acc32[LANES];
    for (int w = 0; w < LANES; w++) {
        reg[w] = 0.0;
        acc32[w] = 0.0f;
    }
    int64_t window_start = 0;
    for (int64_t k0 = 0; k0 < K; k0 += g) {
        const int64_t n = k0 + g < K ? g : K - k0;
        int32_t e[LANES], S[LANES]; /* e: the group's largest product exponent, + 6 */
        for (int w = 0; w < LANES; w++) e[w] = INT32_MIN / 2;
        for (int64_t j = 0; j < n; j++) {
            const int32_t a = ma[k0 + j] * pre, xa = xa6[k0 + j];
            const int32_t *bm = mb + (k0 + j) * LANES, *bx = xb + (k0 + j) * LANES;
#pragma omp simd
            for (int w = 0; w < LANES; w++) {
                const int32_t p = a * bm[w], x = xa + bx[w]; /* x = xa + xb + 6 */
                const int32_t ap = p < 0 ? -p : p;
                const int32_t ef = x + (ap >= (128 * pre)); /* floor(log2 |product|) */
                P[j][w] = p;
                X[j][w] = x;
                e[w] = e[w] > ef ? e[w] : ef;
            }
        }
        for (int w = 0; w < LANES; w++) {
            S[w] = 0;
            e[w] += 6; /* now e - X = e_group - xa - xb, the shift */
        }
        for (int64_t j = 0; j < n; j++) {
#pragma omp simd
            for (int w = 0; w < LANES; w++) {
                int32_t t = e[w] - X[j][w];
                t = t < 31 ? t : 31;
                S[w] += P[j][w] >> t;
            }
        }
#pragma omp simd
        for (int w = 0; w < LANES; w++) {
            if (S[w] != 0) {
                const double x = (double)S[w] * pow2((int64_t)e[w] - 6 - kbits + 2);
                const double r = reg[w];
                const double s = r + x, bb = s - r, err = (r - (s - bb)) + (x - bb);
                uint64_t tb = dbits(s) & ~(unit_k - 1);
                if (tb == dbits(s) && err != 0.0 && ((err < 0.0) != (s < 0.0))) tb -= unit_k;
                reg[w] = dfrom(tb);
            }
        }
        const int64_t k1 = k0 + n;
        if (k1 == K || (promote > 0 && k1 - window_start >= promote)) {
            for (int w = 0; w < LANES; w++) {
                acc32[w] += (float)reg[w] * (float)window_inv(ks, window_start, row, col0 + w);
                reg[w] = 0.0;
            }
            window_start = k1;
        }
    }
    for (int w = 0; w < LANES; w++) out[w] = acc32[w];
}

#ifdef FP8_X86
/* The same kernel in AVX-512: the 16 lanes are one register of int32 (two of double for the
 * register adds); vpsravd's counts past 31 fill with the sign, as needed, so no clamp. Chosen at
 * run time (nl_isa_has), so a build for any x86-64 carries it. */
__attribute__((target("avx512f,avx512dq,avx512bw,avx512vl"))) static void
fast_lanes_avx512(int kbits, int64_t g, int64_t promote, const int32_t *ma, const int32_t *xa6, const int32_t *mb,
                  const int32_t *xb, int64_t K, int64_t row, int64_t col0, const kernel_scales *ks, float *out) {
    const int32_t pre = 1 << (kbits - 2);
    const __m512i thr = _mm512_set1_epi32(128 * pre - 1), one = _mm512_set1_epi32(1);
    const __m512i six = _mm512_set1_epi32(6), bias = _mm512_set1_epi32(1023 - kbits + 2);
    const __m512i unit = _mm512_set1_epi64((int64_t)1 << (53 - kbits));
    const __m512i keep = _mm512_set1_epi64(~(((int64_t)1 << (53 - kbits)) - 1));
    const __m512d zero = _mm512_setzero_pd();
    __m512i P[2 * DEFAULT_GROUP], X[2 * DEFAULT_GROUP];
    __m512d reg[2] = {zero, zero};
    float acc32[LANES] = {0};
    int64_t window_start = 0;
    for (int64_t k0 = 0; k0 < K; k0 += g) {
        const int64_t n = k0 + g < K ? g : K - k0;
        __m512i e = _mm512_set1_epi32(INT32_MIN / 2);
        for (int64_t j = 0; j < n; j++) {
            const __m512i a = _mm512_set1_epi32(ma[k0 + j] * pre), xa = _mm512_set1_epi32(xa6[k0 + j]);
            const __m512i p = _mm512_mullo_epi32(a, _mm512_load_si512((const void *)(mb + (k0 + j) * LANES)));
            const __m512i x = _mm512_add_epi32(xa, _mm512_load_si512((const void *)(xb + (k0 + j) * LANES)));
            const __mmask16 big = _mm512_cmpgt_epi32_mask(_mm512_abs_epi32(p), thr);
            e = _mm512_max_epi32(e, _mm512_mask_add_epi32(x, big, x, one));
            P[j] = p;
            X[j] = x;
        }
        const __m512i e6 = _mm512_add_epi32(e, six);
        __m512i S = _mm512_setzero_si512();
        for (int64_t j = 0; j < n; j++) S = _mm512_add_epi32(S, _mm512_srav_epi32(P[j], _mm512_sub_epi32(e6, X[j])));
        const __mmask16 nz = _mm512_test_epi32_mask(S, S);
        if (nz) {
            const __m512i be = _mm512_add_epi32(e, bias); /* biased exponent of the unit 2^(e-k+2) */
            for (int h = 0; h < 2; h++) {
                const __mmask8 m = (__mmask8)(nz >> (8 * h));
                const __m256i Sh = h ? _mm512_extracti64x4_epi64(S, 1) : _mm512_castsi512_si256(S);
                const __m256i bh = h ? _mm512_extracti64x4_epi64(be, 1) : _mm512_castsi512_si256(be);
                const __m512d u = _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_cvtepi32_epi64(bh), 52));
                const __m512d x = _mm512_maskz_mul_pd(m, _mm512_cvtepi32_pd(Sh), u);
                const __m512d r = reg[h];
                const __m512d s = _mm512_add_pd(r, x), bb = _mm512_sub_pd(s, r);
                const __m512d err = _mm512_add_pd(_mm512_sub_pd(r, _mm512_sub_pd(s, bb)), _mm512_sub_pd(x, bb));
                const __m512i sb = _mm512_castpd_si512(s);
                const __m512i tb = _mm512_and_si512(sb, keep);
                const __mmask8 on_grid = _mm512_cmpeq_epi64_mask(tb, sb);
                const __mmask8 err_nz = _mm512_cmp_pd_mask(err, zero, _CMP_NEQ_OQ);
                const __mmask8 opposite = _mm512_movepi64_mask(_mm512_xor_si512(_mm512_castpd_si512(err), sb));
                reg[h] = _mm512_castsi512_pd(_mm512_mask_sub_epi64(tb, on_grid & err_nz & opposite, tb, unit));
            }
        }
        const int64_t k1 = k0 + n;
        if (k1 == K || (promote > 0 && k1 - window_start >= promote)) {
            double rv[LANES];
            _mm512_storeu_pd(rv, reg[0]);
            _mm512_storeu_pd(rv + 8, reg[1]);
            for (int w = 0; w < LANES; w++)
                acc32[w] += (float)rv[w] * (float)window_inv(ks, window_start, row, col0 + w);
            reg[0] = reg[1] = zero;
            window_start = k1;
        }
    }
    memcpy(out, acc32, sizeof acc32);
}
#endif

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
    const double one = 1.0;
    const kernel_scales ks = {&one, n, 1, 1, &one, n, 1, 1, 1};
    *out_sum = acc_dot_ref(acc, terms, n, 0, 0, &ks);
    return NL_OK;
}

/* ---- quantization ------------------------------------------------------------------------------ */

/* Geometry of the scale blocks of an operand viewed as (nk along K) x (no other). */
typedef struct qgeom {
    int64_t bk, bo, nkb, nob;
} qgeom;

static qgeom geometry(nl_fp8_scaling sc, int64_t nk, int64_t no, int is_a) {
    qgeom g;
    switch (sc) {
    case NL_FP8_SCALE_BLOCK:
        g.bk = NL_FP8_BLOCK;
        g.bo = is_a ? 1 : NL_FP8_BLOCK;
        break;
    case NL_FP8_SCALE_MX:
        g.bk = NL_FP8_MX_BLOCK;
        g.bo = 1;
        break;
    default:
        g.bk = nk;
        g.bo = no;
        break;
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
static nl_status quantize_operand(nl_format fmt, nl_fp8_scaling scaling, nl_fp8_delayed *dl, const char *what,
                                  int64_t rows, int64_t cols, int k_is_cols, const float *x, double *q, double *inv,
                                  qgeom *geom_out, nl_fp8_operand_stats *st) {
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
        return nl_fail(NL_ERR_INVALID, "fp8 gemm: %s[%lld][%lld] is %g (not finite)", what, (long long)(bad / cols),
                       (long long)(bad % cols), x[bad]);
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

nl_status nl_fp8_quantize(nl_format fmt, nl_fp8_scaling scaling, nl_fp8_delayed *delayed, int64_t rows, int64_t cols,
                          int along_rows, const float *x, float *out, nl_fp8_operand_stats *stats) {
    NL_TRY(check_fmt(fmt, "the tensor"));
    if (scaling < 0 || scaling >= NL_FP8_SCALE_COUNT)
        return nl_fail(NL_ERR_INVALID, "fp8 quantize: unknown scaling %d", (int)scaling);
    if (scaling == NL_FP8_SCALE_DELAYED && !delayed)
        return nl_fail(NL_ERR_INVALID, "fp8 quantize: delayed scaling needs its state");
    if (rows < 1 || cols < 1)
        return nl_fail(NL_ERR_INVALID, "fp8 quantize: shape (%lld, %lld)", (long long)rows, (long long)cols);
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

/* The limited accumulator over the quantized operands qa (M, K), qb (K, N) into cw (M, ldc). */
static nl_status limited_gemm(const nl_fp8_gemm_opts *o, int64_t M, int64_t N, int64_t K, const double *qa,
                              const double *qb, const double *inva, const double *invb, const qgeom *ga,
                              const qgeom *gb, float *cw, int64_t ldc) {
    const kernel_scales ks = {inva, ga->bk, ga->bo, ga->nob, invb, gb->bk, gb->bo, gb->nob, N};
    const int64_t g = o->acc.group ? o->acc.group : DEFAULT_GROUP;
    if (o->reference == 1 || o->acc.round != NL_FP8_ACC_TRUNCATE || g > 2 * DEFAULT_GROUP) {
        /* scalar reference: one output at a time from its products */
        nl_status rc = NL_OK;
#pragma omp parallel
        {
            double *terms = nl_malloc((size_t)K * sizeof(double), "fp8 gemm products");
            if (!terms) {
#pragma omp critical
                rc = NL_ERR_NOMEM;
            }
#pragma omp for schedule(static)
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N && terms; j++) {
                    for (int64_t k = 0; k < K; k++) terms[k] = qa[i * K + k] * qb[k * N + j];
                    cw[i * ldc + j] = acc_dot_ref(&o->acc, terms, K, i, j, &ks);
                }
            nl_free(terms);
        }
        return rc;
    }
    /* fast kernel: significands and exponents; B repacked into panels of LANES columns,
     * (nchunks, K, LANES), zero past N, so that a panel streams contiguously from cache while
     * every row of A goes through it */
    const int64_t nchunks = (N + LANES - 1) / LANES;
    int32_t *ma = nl_malloc((size_t)(M * K) * sizeof(int32_t), "fp8 gemm A significands");
    int32_t *xa = nl_malloc((size_t)(M * K) * sizeof(int32_t), "fp8 gemm A exponents");
    int32_t *mbr = nl_malloc((size_t)(K * N) * sizeof(int32_t), "fp8 gemm B significands");
    int32_t *xbr = nl_malloc((size_t)(K * N) * sizeof(int32_t), "fp8 gemm B exponents");
    int32_t *mb = nl_malloc((size_t)(nchunks * K * LANES) * sizeof(int32_t), "fp8 gemm B panels");
    int32_t *xb = nl_malloc((size_t)(nchunks * K * LANES) * sizeof(int32_t), "fp8 gemm B panel exponents");
    nl_status rc = NL_OK;
    if (!ma || !xa || !mbr || !xbr || !mb || !xb) {
        rc = NL_ERR_NOMEM;
        goto out;
    }
    split_fp8(qa, M * K, ma, xa, 1);
    split_fp8(qb, K * N, mbr, xbr, 0);
#pragma omp parallel for schedule(static)
    for (int64_t jc = 0; jc < nchunks; jc++)
        for (int64_t k = 0; k < K; k++)
            for (int64_t w = 0; w < LANES; w++) {
                const int64_t j = jc * LANES + w, d = (jc * K + k) * LANES + w;
                mb[d] = j < N ? mbr[k * N + j] : 0;
                xb[d] = j < N ? xbr[k * N + j] : ZERO_EXP;
            }
    void (*kernel)(int, int64_t, int64_t, const int32_t *, const int32_t *, const int32_t *, const int32_t *, int64_t,
                   int64_t, int64_t, const kernel_scales *, float *) = fast_lanes;
#ifdef FP8_X86
    if (o->reference != 2 && nl_isa_has(NL_ISA_AVX512)) kernel = fast_lanes_avx512;
#endif
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < nchunks * M; t++) {
        const int64_t jc = t / M, i = t % M;
        float res[LANES];
        kernel(o->acc.bits, g, o->acc.promote, ma + i * K, xa + i * K, mb + jc * K * LANES, xb + jc * K * LANES, K, i,
               jc * LANES, &ks, res);
        memcpy(cw + i * ldc + jc * LANES, res, sizeof res);
    }
out:
    nl_free(ma);
    nl_free(xa);
    nl_free(mbr);
    nl_free(xbr);
    nl_free(mb);
    nl_free(xb);
    return rc;
}

nl_status nl_fp8_gemm(const nl_fp8_gemm_opts *o, int64_t M, int64_t N, int64_t K, const float *A, const float *B,
                      float *C, nl_fp8_stats *stats) {
    if (!o) return nl_fail(NL_ERR_INVALID, "fp8 gemm: NULL options");
    if (M < 1 || N < 1 || K < 1)
        return nl_fail(NL_ERR_INVALID, "fp8 gemm: shape M=%lld N=%lld K=%lld (each must be >= 1)", (long long)M,
                       (long long)N, (long long)K);
    if (!A || !B || !C) return nl_fail(NL_ERR_INVALID, "fp8 gemm: NULL matrix");
    NL_TRY(check_fmt(o->fmt_a, "A"));
    NL_TRY(check_fmt(o->fmt_b, "B"));
    if (o->scaling < 0 || o->scaling >= NL_FP8_SCALE_COUNT)
        return nl_fail(NL_ERR_INVALID, "fp8 gemm: unknown scaling %d", (int)o->scaling);
    NL_TRY(nl_fp8_acc_validate(&o->acc));
    if (o->scaling == NL_FP8_SCALE_DELAYED && (!o->delayed_a || !o->delayed_b))
        return nl_fail(NL_ERR_INVALID, "fp8 gemm: delayed scaling needs state for A and B");
    if (o->scaling == NL_FP8_SCALE_BLOCK && o->acc.bits && (o->acc.promote == 0 || NL_FP8_BLOCK % o->acc.promote))
        return nl_fail(NL_ERR_INVALID,
                       "fp8 gemm: block scaling applies its scales at promotion, so promote must "
                       "divide %d (got %d%s)",
                       NL_FP8_BLOCK, o->acc.promote, o->acc.promote == 0 ? " = never" : "");

    nl_status rc = NL_OK;
    const int64_t Np = (N + LANES - 1) / LANES * LANES;
    float *Al = logical_copy(A, M, K, o->trans_a, "fp8 gemm A copy");
    float *Bl = logical_copy(B, K, N, o->trans_b, "fp8 gemm B copy");
    double *qa = nl_malloc((size_t)(M * K) * sizeof(double), "fp8 gemm A values");
    double *qb = nl_malloc((size_t)(K * N) * sizeof(double), "fp8 gemm B values");
    qgeom ga = geometry(o->scaling, K, M, 1), gb = geometry(o->scaling, K, N, 0);
    double *inva = nl_malloc((size_t)(ga.nkb * ga.nob) * sizeof(double), "fp8 gemm A scales");
    double *invb = nl_malloc((size_t)(gb.nkb * gb.nob) * sizeof(double), "fp8 gemm B scales");
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
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)K, 1.0f, Al, (int)K, Bl, (int)N,
                    0.0f, cw, (int)Np);
    } else {
        rc = limited_gemm(o, M, N, K, qa, qb, inva, invb, &ga, &gb, cw, Np);
        if (rc) goto done;
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
    nl_free(cw);
    return rc;
}
