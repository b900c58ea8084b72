/* Decode kernels: y (M, N) = x (M, K) . W^T for fp32 / bf16 / int8 / int4 weights (see matvec.h). */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "nanolm/formats.h"
#include "nanolm/matvec.h"
#include "nanolm/quant.h"

#define TGT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define TGT_AVX2   __attribute__((target("avx2,fma")))
#define INLINE     static inline __attribute__((always_inline))

enum {
    MV_RB = 4,    /* weight rows per register tile */
    MV_TB = 4,    /* tokens per register tile */
    MV_ROWS = 16, /* rows per thread work item (a multiple of MV_RB) */
    MV_TOK = 64   /* tokens per cache tile: their activations stay in L2 while W streams */
};

/* ---- names and paths ----------------------------------------------------------------------- */

const char *nl_wfmt_name(nl_wfmt f) {
    switch (f) {
    case NL_WFMT_AUTO: return "auto";
    case NL_WFMT_FP32: return "fp32";
    case NL_WFMT_BF16: return "bf16";
    case NL_WFMT_INT8: return "int8";
    case NL_WFMT_INT4: return "int4";
    default: return NULL;
    }
}

nl_status nl_wfmt_parse(const char *s, nl_wfmt *out) {
    for (int f = NL_WFMT_AUTO; f < NL_WFMT_COUNT; f++)
        if (s && !strcmp(s, nl_wfmt_name((nl_wfmt)f))) {
            *out = (nl_wfmt)f;
            return NL_OK;
        }
    return nl_fail(NL_ERR_INVALID, "unknown weight format '%s' (known: fp32, bf16, int8, int4, auto)",
                   s ? s : "(null)");
}

const char *nl_mv_path_name(nl_mv_path p) {
    switch (p) {
    case NL_MV_AUTO: return "auto";
    case NL_MV_PORTABLE: return "portable";
    case NL_MV_AVX2: return "avx2";
    case NL_MV_AVX512: return "avx512";
    default: return "?";
    }
}

int nl_mv_available(nl_mv_path p) {
    __builtin_cpu_init();
    switch (p) {
    case NL_MV_AUTO:
    case NL_MV_PORTABLE: return 1;
    case NL_MV_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case NL_MV_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
    default: return 0;
    }
}

nl_mv_path nl_mv_auto(void) {
    if (nl_mv_available(NL_MV_AVX512)) return NL_MV_AVX512;
    if (nl_mv_available(NL_MV_AVX2)) return NL_MV_AVX2;
    return NL_MV_PORTABLE;
}

/* ---- the weight ------------------------------------------------------------------------------ */

static nl_status q4_init(nl_mv_weight *wt, const float *w, int64_t N, int64_t K);

/* Puts a BF16 weight's full 4-row groups into the AVX-512 tiles' interleaved order (pack = 1, when
 * 32 divides K) or back into rows (pack = 0). Only the order of the values changes. */
static nl_status bf16_pack(nl_mv_weight *wt, int pack) {
    const int64_t K = wt->cols, groups = wt->rows / 4, chunks = K / 32;
    pack = pack && K % 32 == 0 && groups > 0;
    if (wt->fmt != NL_WFMT_BF16 || pack == wt->bf16_packed) return NL_OK;
    uint16_t *tmp = nl_malloc((size_t)(4 * K) * sizeof(uint16_t), "bf16 matvec repack");
    if (!tmp) return NL_ERR_NOMEM;
    for (int64_t g = 0; g < groups; g++) {
        uint16_t *grp = wt->bf16 + g * 4 * K;
        memcpy(tmp, grp, (size_t)(4 * K) * sizeof(uint16_t));
        for (int64_t j = 0; j < chunks; j++)
            for (int64_t r = 0; r < 4; r++) {
                const int64_t in_rows = r * K + j * 32, interleaved = (j * 4 + r) * 32;
                memcpy(grp + (pack ? interleaved : in_rows), tmp + (pack ? in_rows : interleaved),
                       32 * sizeof(uint16_t));
            }
    }
    nl_free(tmp);
    wt->bf16_packed = pack;
    return NL_OK;
}

/* FP32 on AVX-512: W (N, K) copied into panels of NL_MV_PANEL (48) rows (f32_panels), or the
 * copy freed (pack = 0). Panel p holds rows 48p .. 48p + 47 column by column: for each k the 48
 * values W[48p + j][k], j = 0..47, side by side (rows past N are zero). A tile walks one panel
 * front to back, one sequential stream, and for each k multiplies 3 vectors of 16 rows by each
 * token's
 * x[k] broadcast: every (row, token) output is one fused multiply-add chain over k = 0, 1, ..,
 * K - 1, in every tile shape, with no sum across lanes. */
static nl_status f32_pack(nl_mv_weight *wt, int pack) {
    if (wt->fmt != NL_WFMT_FP32 || !pack == !wt->f32_panels) return NL_OK;
    if (!pack) {
        nl_free(wt->f32_panels);
        wt->f32_panels = NULL;
        return NL_OK;
    }
    const int64_t N = wt->rows, K = wt->cols, np = (N + NL_MV_PANEL - 1) / NL_MV_PANEL;
    size_t n;
    if (nl_mul_overflows((size_t)(np * NL_MV_PANEL), (size_t)K * sizeof(float), &n))
        return nl_fail(NL_ERR_NOMEM, "fp32 matvec panels: %lld x %lld is too large", (long long)N, (long long)K);
    float *p = nl_malloc_huge(n, "fp32 matvec weight panels");
    if (!p) return NL_ERR_NOMEM;
    for (int64_t b = 0; b < np; b++)
        for (int64_t j = 0; j < NL_MV_PANEL; j++) {
            const int64_t r = b * NL_MV_PANEL + j;
            float *d = p + b * K * NL_MV_PANEL + j;
            if (r >= N)
                for (int64_t k = 0; k < K; k++) d[k * NL_MV_PANEL] = 0.0f;
            else
                for (int64_t k = 0; k < K; k++) d[k * NL_MV_PANEL] = wt->f32[r * K + k];
        }
    wt->f32_panels = p;
    return NL_OK;
}

nl_status nl_mv_weight_init(nl_mv_weight *wt, nl_wfmt fmt, const float *w, int64_t N, int64_t K, int copy) {
    memset(wt, 0, sizeof *wt);
    if (N < 1 || K < 1)
        return nl_fail(NL_ERR_INVALID, "matvec weight shape (%lld, %lld): both must be positive", (long long)N,
                       (long long)K);
    wt->rows = N;
    wt->cols = K;
    wt->fmt = fmt;
    wt->path = nl_mv_auto();
    size_t n = (size_t)N * (size_t)K;
    switch (fmt) {
    case NL_WFMT_FP32:
        if (!copy) {
            wt->f32 = w;
        } else {
            wt->owned_f32 = nl_malloc(n * sizeof(float), "fp32 matvec weight");
            if (!wt->owned_f32) return NL_ERR_NOMEM;
            memcpy(wt->owned_f32, w, n * sizeof(float));
            wt->f32 = wt->owned_f32;
        }
        {
            nl_status rc = f32_pack(wt, wt->path == NL_MV_AVX512);
            if (rc) nl_mv_weight_free(wt);
            return rc;
        }
    case NL_WFMT_BF16:
        NL_TRY(nl_quant_check_finite(w, n, "bf16 matvec weight"));
        wt->bf16 = nl_malloc(n * sizeof(uint16_t), "bf16 matvec weight");
        if (!wt->bf16) return NL_ERR_NOMEM;
        for (size_t i = 0; i < n; i++) wt->bf16[i] = nl_bf16_from_f32(w[i]);
        return bf16_pack(wt, wt->path == NL_MV_AVX512);
    case NL_WFMT_INT8: return nl_qlinear_init(&wt->q8, w, N, K, NL_QLINEAR_W8A8);
    case NL_WFMT_INT4: return q4_init(wt, w, N, K);
    default: return nl_fail(NL_ERR_INVALID, "matvec weight: unknown format %d", (int)fmt);
    }
}

nl_status nl_mv_weight_init_int8(nl_mv_weight *wt, const int8_t *codes, const float *scales, int64_t N, int64_t K) {
    memset(wt, 0, sizeof *wt);
    wt->rows = N;
    wt->cols = K;
    wt->fmt = NL_WFMT_INT8;
    wt->path = nl_mv_auto();
    return nl_qlinear_init_codes(&wt->q8, codes, scales, N, K, NL_QLINEAR_W8A8);
}

void nl_mv_weight_free(nl_mv_weight *wt) {
    if (!wt) return;
    nl_free(wt->owned_f32);
    nl_free(wt->f32_panels);
    nl_free(wt->bf16);
    nl_qlinear_free(&wt->q8);
    nl_free(wt->q4);
    nl_free(wt->q4_d);
    memset(wt, 0, sizeof *wt);
}

nl_status nl_mv_weight_set_path(nl_mv_weight *wt, nl_mv_path p) {
    if (p == NL_MV_AUTO) p = nl_mv_auto();
    if ((unsigned)p >= NL_MV_COUNT) return nl_fail(NL_ERR_INVALID, "unknown matvec kernel path %d", (int)p);
    if (!nl_mv_available(p))
        return nl_fail(NL_ERR_UNSUPPORTED, "matvec kernel path '%s' is not available on this CPU", nl_mv_path_name(p));
    NL_TRY(bf16_pack(wt, p == NL_MV_AVX512));
    NL_TRY(f32_pack(wt, p == NL_MV_AVX512));
    wt->path = p;
    return NL_OK;
}

size_t nl_mv_weight_bytes(const nl_mv_weight *wt) {
    size_t n = (size_t)wt->rows * (size_t)wt->cols;
    switch (wt->fmt) {
    case NL_WFMT_FP32: return n * 4;
    case NL_WFMT_BF16: return n * 2;
    case NL_WFMT_INT8: return nl_qlinear_bytes(&wt->q8);
    case NL_WFMT_INT4: return (size_t)(wt->rows * wt->groups) * (16 + sizeof(uint16_t));
    default: return 0;
    }
}

/* ---- reference ------------------------------------------------------------------------------- */

void nl_mv_reference(float *y, const float *x, const float *w, int64_t M, int64_t N, int64_t K, int bf16) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0.0;
            for (int64_t k = 0; k < K; k++) {
                float wv = w[n * K + k];
                if (bf16) wv = nl_f32_from_bf16(nl_bf16_from_f32(wv));
                s += (double)x[m * K + k] * (double)wv;
            }
            y[m * N + n] = (float)s;
        }
}

/* ---- tile kernels ---------------------------------------------------------------------------
 * A tile is R weight rows x T tokens; every (row, token) pair has one accumulator walking k in
 * the same order in every tile shape, so a pair's result never depends on R or T. */

typedef struct mv_args {
    const float *x;     /* (M, K) */
    float *y;           /* (M, N) */
    const float *wf;    /* fp32 (N, K) */
    const uint16_t *wb; /* or bf16 (N, K) */
    const float *xp;    /* bf16 on AVX-512: x de-interleaved (M, K32), see tile512_bf */
    int64_t M, N, K, K32;
    int64_t packed_rows; /* bf16: rows 0 .. packed_rows - 1 are in 4-row interleaved groups */
} mv_args;

/* portable: 8 scalar accumulators per pair (lane j takes k = j mod 8), summed pairwise. */
INLINE float portable_sum8(const float *s) { return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7])); }

static void tile_portable(const mv_args *a, int64_t n0, int R, int64_t m0, int T) {
    const int64_t K = a->K, K8 = K & ~(int64_t)7;
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            const float *x = a->x + (m0 + t) * K;
            float s[8] = {0};
            if (a->wf) {
                const float *w = a->wf + (n0 + r) * K;
                for (int64_t k = 0; k < K8; k += 8)
                    for (int j = 0; j < 8; j++) s[j] += w[k + j] * x[k + j];
                for (int64_t k = K8; k < K; k++) s[k - K8] += w[k] * x[k];
            } else {
                const uint16_t *w = a->wb + (n0 + r) * K;
                for (int64_t k = 0; k < K8; k += 8)
                    for (int j = 0; j < 8; j++) s[j] += nl_f32_from_bf16(w[k + j]) * x[k + j];
                for (int64_t k = K8; k < K; k++) s[k - K8] += nl_f32_from_bf16(w[k]) * x[k];
            }
            a->y[(m0 + t) * a->N + n0 + r] = portable_sum8(s);
        }
}

/* Tiles of several rows read R short streams at once, which the hardware prefetchers pick up
 * late at every new tile; the tile prefetches the same columns of the next R rows. */
INLINE void prefetch_next(const mv_args *a, int64_t n, int R, int64_t k) {
    for (int r = 0; r < R && n + r < a->N; r++) {
        const char *p = a->wf ? (const char *)(a->wf + (n + r) * a->K + k) : (const char *)(a->wb + (n + r) * a->K + k);
        _mm_prefetch(p, _MM_HINT_T0);
    }
}

/* AVX-512, bf16 weights (fp32 weights read their panel copy: tile_panel below). One tile is R
 * weight rows x T tokens with R * T accumulators held in registers (R <= 4, T <= 6: 24
 * accumulators, 4 weight vectors and one activation vector of the 32 registers). R and T are
 * compile-time constants of each instance (the loops unroll fully and nothing spills). */
enum { MV_T512 = 6 }; /* tokens per AVX-512 register tile */

/* The pieces every AVX-512 tile shares: acc[r][t] = 0; acc[r][t] += wv[r] * (token t's 16
 * activations at x + t * xs), one load per token (the empty asm keeps it in a register: GCC
 * would fold the load into each of the R FMAs); y[t * N + r] = the sum of acc[r][t]'s lanes. */
TGT_AVX512 INLINE void tile_zero(__m512 acc[4][MV_T512], const int R, const int T) {
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
}
TGT_AVX512 INLINE void tile_fma(__m512 acc[4][MV_T512], const __m512 wv[4], const float *x, int64_t xs, const int R,
                                const int T) {
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) {
        __m512 xv = _mm512_loadu_ps(x + t * xs);
        __asm__("" : "+v"(xv));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
}
TGT_AVX512 INLINE void tile_store(__m512 acc[4][MV_T512], float *y, int64_t N, const int R, const int T) {
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) y[t * N + r] = _mm512_reduce_add_ps(acc[r][t]);
}

/* bf16 on AVX-512: 32 columns per step. One 64-byte load of 32 bf16 weights gives the even
 * columns as fp32 by a shift (w << 16) and the odd columns by a mask (w & 0xffff0000), with no
 * lane-crossing widening; the activations were stored de-interleaved the same way by
 * nl_mv_act_prepare (per 32 columns: the 16 even, then the 16 odd; zero past K). A (row, token)
 * pair's one accumulator takes the even half then the odd half of every 32 columns, the same
 * order in every tile shape. Columns past K load as zero weights (masked). */
TGT_AVX512 INLINE void tile512_bf(const uint16_t *wb, int64_t rs, int64_t cs, const float *xp, float *y, int64_t K,
                                  int64_t K32, int64_t N, const int R, const int T, int pf) {
    __m512 acc[4][MV_T512];
    tile_zero(acc, R, T);
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    const uint16_t *pnext = wb + R * K; /* the next R rows (a packed group lies 4 K further too) */
    for (int64_t k = 0, c = 0; k < K; k += 32, c += cs) {
        const __mmask32 mk = K - k >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << (K - k)) - 1u);
        __m512i raw[4];
        __m512 wv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) raw[r] = _mm512_maskz_loadu_epi16(mk, wb + r * rs + c);
        if (pf)
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) _mm_prefetch((const char *)(pnext + r * rs + c), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) wv[r] = _mm512_castsi512_ps(_mm512_slli_epi32(raw[r], 16));
        tile_fma(acc, wv, xp + k, K32, R, T);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) wv[r] = _mm512_castsi512_ps(_mm512_and_si512(raw[r], hi));
        tile_fma(acc, wv, xp + k + 16, K32, R, T);
    }
    tile_store(acc, y, N, R, T);
}

typedef void (*tile512_fn)(const mv_args *, int64_t n, int64_t m, int pf);
/* Where row n of a bf16 weight starts, and how far its next row (rs) and its next 32 columns (cs)
 * lie: in a packed group 32 and 128 elements, else K and 32. */
INLINE const uint16_t *bf_row(const mv_args *a, int64_t n, int64_t *rs, int64_t *cs) {
    if (n < a->packed_rows) {
        *rs = 32, *cs = 128;
        return a->wb + (n & ~(int64_t)3) * a->K + (n & 3) * 32;
    }
    *rs = a->K, *cs = 32;
    return a->wb + n * a->K;
}
#define TILE512_BF(R, T)                                                                                               \
    TGT_AVX512 static void tile512bf_##R##x##T(const mv_args *a, int64_t n, int64_t m, int pf) {                       \
        int64_t rs, cs;                                                                                                \
        const uint16_t *w = bf_row(a, n, &rs, &cs);                                                                    \
        tile512_bf(w, rs, cs, a->xp + m * a->K32, a->y + m * a->N + n, a->K, a->K32, a->N, R, T, pf);                  \
    }
TILE512_BF(4, 1)
TILE512_BF(4, 2)
TILE512_BF(4, 3)
TILE512_BF(4, 4)
TILE512_BF(4, 5)
TILE512_BF(4, 6)
TILE512_BF(1, 1)
TILE512_BF(1, 2)
TILE512_BF(1, 3)
TILE512_BF(1, 4)
TILE512_BF(1, 5)
TILE512_BF(1, 6)
static const tile512_fn tiles512bf[2][MV_T512] = {
    {tile512bf_1x1, tile512bf_1x2, tile512bf_1x3, tile512bf_1x4, tile512bf_1x5, tile512bf_1x6},
    {tile512bf_4x1, tile512bf_4x2, tile512bf_4x3, tile512bf_4x4, tile512bf_4x5, tile512bf_4x6}};

/* FP32 on AVX-512, one panel (see f32_pack) against T <= 8 tokens: per column k, the panel's 3
 * vectors of 16 rows are loaded once and multiplied by each token's x[k] (broadcast) into that
 * token's 3 accumulators (24 of the 32 registers at T = 8): 3 loads and T broadcasts per 3T
 * FMAs, so 8 tokens (a batch of 8 decodes) take one pass over the panel while it streams from
 * memory. Outputs are stored straight from the accumulators, the lanes of rows lo .. hi - 1 of
 * the panel only. pf: prefetch MV_PF floats ahead in the panel (the first token tile of a panel
 * streams it from memory; the panels of a thread's rows lie back to back, so this runs on into
 * the next one). */
enum { MV_PZ = NL_MV_PANEL / 16, MV_PT = 8, MV_PF = 1024 };
TGT_AVX512 INLINE void tile_panel(const float *wp, const float *x, float *y, int64_t K, int64_t N, const int T, int lo,
                                  int hi, int pf) {
    __m512 acc[MV_PT][MV_PZ];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
#pragma GCC unroll 3
        for (int j = 0; j < MV_PZ; j++) acc[t][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const float *wk = wp + k * NL_MV_PANEL;
        __m512 wv[MV_PZ];
#pragma GCC unroll 3
        for (int j = 0; j < MV_PZ; j++) wv[j] = _mm512_load_ps(wk + 16 * j);
        if (pf)
#pragma GCC unroll 3
            for (int j = 0; j < MV_PZ; j++) _mm_prefetch((const char *)(wk + MV_PF + 16 * j), _MM_HINT_T0);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const __m512 xb = _mm512_set1_ps(x[t * K + k]);
#pragma GCC unroll 3
            for (int j = 0; j < MV_PZ; j++) acc[t][j] = _mm512_fmadd_ps(wv[j], xb, acc[t][j]);
        }
    }
    if (lo == 0 && hi == NL_MV_PANEL) {
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
#pragma GCC unroll 3
            for (int j = 0; j < MV_PZ; j++) _mm512_storeu_ps(y + t * N + 16 * j, acc[t][j]);
        return;
    }
    for (int j = 0; j < MV_PZ; j++) {
        const int a = lo > 16 * j ? lo - 16 * j : 0, b = hi < 16 * j + 16 ? hi - 16 * j : 16;
        if (a >= b) continue;
        const __mmask16 mk = (__mmask16)(((1u << b) - 1u) & ~((1u << a) - 1u));
        for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y + t * N + 16 * j, mk, acc[t][j]);
    }
}
typedef void (*tile_panel_fn)(const float *wp, const float *x, float *y, int64_t K, int64_t N, int lo, int hi, int pf);
#define TILE_PANEL(T)                                                                                                  \
    TGT_AVX512 static void tile_panel_##T(const float *wp, const float *x, float *y, int64_t K, int64_t N, int lo,     \
                                          int hi, int pf) {                                                            \
        tile_panel(wp, x, y, K, N, T, lo, hi, pf);                                                                     \
    }
TILE_PANEL(1)
TILE_PANEL(2)
TILE_PANEL(3)
TILE_PANEL(4)
TILE_PANEL(5)
TILE_PANEL(6)
TILE_PANEL(7)
TILE_PANEL(8)
static const tile_panel_fn tiles_panel[MV_PT] = {tile_panel_1, tile_panel_2, tile_panel_3, tile_panel_4,
                                                 tile_panel_5, tile_panel_6, tile_panel_7, tile_panel_8};

/* Two adjacent whole panels (wp, then wp + K * NL_MV_PANEL) against T <= 4 tokens: the same
 * operations for each output as tile_panel, with two sequential streams in flight instead of
 * one. A single stream per core left bandwidth unused: the 85M model's 48 linears at one token,
 * out of cache, best of 7, three interleaved runs, read 23.0-24.8 GB/s on one thread and
 * 42.8-48.8 on two one panel at a time, 30.5-31.7 and 53.6-61.0 two at a time (four at a time:
 * no better than two). */
TGT_AVX512 INLINE void tile_panel2(const float *wp, const float *x, float *y, int64_t K, int64_t N, const int T) {
    __m512 acc[2][4][MV_PZ];
    const float *wq = wp + K * NL_MV_PANEL;
#pragma GCC unroll 2
    for (int p = 0; p < 2; p++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
#pragma GCC unroll 3
            for (int j = 0; j < MV_PZ; j++) acc[p][t][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m512 wv[2][MV_PZ];
#pragma GCC unroll 3
        for (int j = 0; j < MV_PZ; j++) {
            wv[0][j] = _mm512_load_ps(wp + k * NL_MV_PANEL + 16 * j);
            wv[1][j] = _mm512_load_ps(wq + k * NL_MV_PANEL + 16 * j);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const __m512 xb = _mm512_set1_ps(x[t * K + k]);
#pragma GCC unroll 2
            for (int p = 0; p < 2; p++)
#pragma GCC unroll 3
                for (int j = 0; j < MV_PZ; j++) acc[p][t][j] = _mm512_fmadd_ps(wv[p][j], xb, acc[p][t][j]);
        }
    }
#pragma GCC unroll 2
    for (int p = 0; p < 2; p++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
#pragma GCC unroll 3
            for (int j = 0; j < MV_PZ; j++) _mm512_storeu_ps(y + t * N + p * NL_MV_PANEL + 16 * j, acc[p][t][j]);
}
typedef void (*tile_panel2_fn)(const float *wp, const float *x, float *y, int64_t K, int64_t N);
#define TILE_PANEL2(T)                                                                                                 \
    TGT_AVX512 static void tile_panel2_##T(const float *wp, const float *x, float *y, int64_t K, int64_t N) {          \
        tile_panel2(wp, x, y, K, N, T);                                                                                \
    }
TILE_PANEL2(1)
TILE_PANEL2(2)
TILE_PANEL2(3)
TILE_PANEL2(4)
static const tile_panel2_fn tiles_panel2[4] = {tile_panel2_1, tile_panel2_2, tile_panel2_3, tile_panel2_4};

/* Rows [n0, n1) for tokens [m0, m1) of an fp32 weight on AVX-512: panel after panel, each against
 * the tokens in near-equal register tiles of at most 8. */
static void run_panels(const nl_mv_weight *wt, const float *x, float *y, int64_t n0, int64_t n1, int64_t m0,
                       int64_t m1) {
    const int64_t K = wt->cols, N = wt->rows, cnt = m1 - m0;
    const int64_t ntile = (cnt + MV_PT - 1) / MV_PT, base = cnt / ntile, extra = cnt % ntile;
    for (int64_t p = n0 / NL_MV_PANEL; p * NL_MV_PANEL < n1; p++) {
        const int64_t r0 = p * NL_MV_PANEL;
        const int lo = (int)(n0 > r0 ? n0 - r0 : 0), hi = (int)(n1 - r0 < NL_MV_PANEL ? n1 - r0 : NL_MV_PANEL);
        const float *wp = wt->f32_panels + r0 * K;
        if (cnt <= 4 && lo == 0 && r0 + 2 * NL_MV_PANEL <= n1) { /* this panel and the next, whole */
            tiles_panel2[cnt - 1](wp, x + m0 * K, y + m0 * N + r0, K, N);
            p++;
            continue;
        }
        int64_t m = m0;
        for (int64_t i = 0; i < ntile; i++) {
            const int64_t T = base + (i < extra);
            tiles_panel[T - 1](wp, x + m * K, y + m * N + r0, K, N, lo, hi, i == 0);
            m += T;
        }
    }
}

/* Rows [n0, n1) for tokens [m0, m1) of a bf16 weight on AVX-512: groups of 4 rows (then single
 * rows) against the tokens in near-equal register tiles of at most 6, also at M = 1: one
 * row's single accumulator chain (an FMA every 4 cycles behind the widening) reads ~33-38 GB/s
 * from L2 on one core, about the memory bandwidth, and 4 rows' four chains ~50 GB/s (thread CPU
 * time, weights in L2); fp32 reads twice the bytes per FMA and is not latency bound. The 4 rows
 * of a bf16 tile are stored interleaved (bf16_pack), so that they too are one sequential stream:
 * four streams of a few KB each, restarted every 4 rows, read slower (the 85M model's 48
 * linears out of cache, M = 1, three interleaved runs: 21.8-23.4 -> 26.8-27.8 GB/s on one
 * thread, 42.0-48.5 -> 53.1-53.9 on two). Either
 * way each (row, token) pair runs the same accumulation, so the choice changes no bits. */
static void run_block512(const mv_args *a, int64_t n0, int64_t n1, int64_t m0, int64_t m1) {
    const int64_t cnt = m1 - m0;
    const int64_t ntile = (cnt + MV_T512 - 1) / MV_T512, base = cnt / ntile, extra = cnt % ntile;
    for (int64_t n = n0; n < n1;) {
        const int four = n + 4 <= n1 && (n >= a->packed_rows || n % 4 == 0); /* not across packed groups */
        const int pf = four && n + 8 <= a->N;
        int64_t m = m0;
        for (int64_t i = 0; i < ntile; i++) {
            int64_t T = base + (i < extra);
            tiles512bf[four][T - 1](a, n, m, pf && i == 0);
            m += T;
        }
        n += four ? 4 : 1;
    }
}

/* AVX2: 8 lanes; the k tail (K mod 8) is summed in scalar after the horizontal sum. */
TGT_AVX2 INLINE float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
TGT_AVX2 INLINE __m256 load_f32_256(const mv_args *a, int64_t n, int64_t k) {
    return _mm256_loadu_ps(a->wf + n * a->K + k);
}
TGT_AVX2 INLINE __m256 load_bf16_256(const mv_args *a, int64_t n, int64_t k) {
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(a->wb + n * a->K + k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
INLINE float wscalar(const mv_args *a, int64_t n, int64_t k) {
    return a->wf ? a->wf[n * a->K + k] : nl_f32_from_bf16(a->wb[n * a->K + k]);
}

#define AVX2_TILE(NAME, R, T, LOADW)                                                                                   \
    TGT_AVX2 static void NAME(const mv_args *a, int64_t n0, int64_t m0) {                                              \
        const int64_t K = a->K, K8 = K & ~(int64_t)7;                                                                  \
        __m256 acc[R][T];                                                                                              \
        for (int r = 0; r < R; r++)                                                                                    \
            for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();                                               \
        for (int64_t k = 0; k < K8; k += 8) {                                                                          \
            __m256 xv[T];                                                                                              \
            for (int t = 0; t < T; t++) xv[t] = _mm256_loadu_ps(a->x + (m0 + t) * K + k);                              \
            if (R > 1) prefetch_next(a, n0 + R, R, k);                                                                 \
            for (int r = 0; r < R; r++) {                                                                              \
                __m256 wv = LOADW(a, n0 + r, k);                                                                       \
                for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);                         \
            }                                                                                                          \
        }                                                                                                              \
        for (int r = 0; r < R; r++)                                                                                    \
            for (int t = 0; t < T; t++) {                                                                              \
                float s = hsum256(acc[r][t]);                                                                          \
                for (int64_t k = K8; k < K; k++) s += wscalar(a, n0 + r, k) * a->x[(m0 + t) * K + k];                  \
                a->y[(m0 + t) * a->N + n0 + r] = s;                                                                    \
            }                                                                                                          \
    }

AVX2_TILE(f32_256_4x4, 4, 4, load_f32_256)
AVX2_TILE(f32_256_4x1, 4, 1, load_f32_256)
AVX2_TILE(f32_256_1x4, 1, 4, load_f32_256)
AVX2_TILE(f32_256_1x1, 1, 1, load_f32_256)
AVX2_TILE(bf16_256_4x4, 4, 4, load_bf16_256)
AVX2_TILE(bf16_256_4x1, 4, 1, load_bf16_256)
AVX2_TILE(bf16_256_1x4, 1, 4, load_bf16_256)
AVX2_TILE(bf16_256_1x1, 1, 1, load_bf16_256)

typedef void (*tile_fn)(const mv_args *, int64_t, int64_t);

/* Rows [n0, n1) for tokens [m0, m1): 4x4 tiles, then 4x1 / 1x4 / 1x1 for the edges. */
static void run_block(const mv_args *a, nl_mv_path path, int64_t n0, int64_t n1, int64_t m0, int64_t m1) {
    if (path == NL_MV_PORTABLE) {
        for (int64_t n = n0; n < n1; n += MV_RB)
            for (int64_t m = m0; m < m1; m += MV_TB)
                tile_portable(a, n, (int)(n1 - n < MV_RB ? n1 - n : MV_RB), m, (int)(m1 - m < MV_TB ? m1 - m : MV_TB));
        return;
    }
    if (path == NL_MV_AVX512) {
        run_block512(a, n0, n1, m0, m1);
        return;
    }
    const int bf = a->wb != NULL;
    tile_fn t44 = bf ? bf16_256_4x4 : f32_256_4x4;
    tile_fn t41 = bf ? bf16_256_4x1 : f32_256_4x1;
    tile_fn t14 = bf ? bf16_256_1x4 : f32_256_1x4;
    tile_fn t11 = bf ? bf16_256_1x1 : f32_256_1x1;
    int64_t n = n0;
    if (m1 - m0 < MV_TB) {
        /* decode (fewer tokens than a tile): row after row, one long sequential stream of W
         * that the prefetchers follow (measured ~3x the bandwidth of 4-row tiles at M = 1);
         * a row (a few KB) stays in L1 for the other tokens */
        for (; n < n1; n++)
            for (int64_t m = m0; m < m1; m++) t11(a, n, m);
        return;
    }
    for (; n + MV_RB <= n1; n += MV_RB) {
        int64_t m = m0;
        for (; m + MV_TB <= m1; m += MV_TB) t44(a, n, m);
        for (; m < m1; m++) t41(a, n, m);
    }
    for (; n < n1; n++) {
        int64_t m = m0;
        for (; m + MV_TB <= m1; m += MV_TB) t14(a, n, m);
        for (; m < m1; m++) t11(a, n, m);
    }
}

/* ---- int8 ----------------------------------------------------------------------------------
 * W8A8 on the layer's codes (N, k_pad), zero padded, and the tokens' codes (M, k_pad) of
 * nl_mv_act: one int32 accumulator per (row, token) pair (exact, so the order never matters),
 * then y = (float)sum * (token scale * row scale), the formula of nl_qlinear_forward. VNNI
 * (vpdpbusd) takes the activations as unsigned (codes + 128) and subtracts 128 * sum(row). */

#define TGT_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

#define VNNI_TILE(NAME, R, T)                                                                                          \
    TGT_VNNI static void NAME(const nl_qlinear *l, const nl_mv_act *a, float *y, int64_t n0, int64_t m0) {             \
        const int64_t kp = l->k_pad, N = l->out_features;                                                              \
        __m512i acc[R][T];                                                                                             \
        for (int r = 0; r < R; r++)                                                                                    \
            for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_si512();                                            \
        for (int64_t k = 0; k < kp; k += 64) {                                                                         \
            __m512i xv[T];                                                                                             \
            for (int t = 0; t < T; t++) xv[t] = _mm512_loadu_si512((const void *)(a->qu + (m0 + t) * kp + k));         \
            for (int r = 0; r < R; r++) {                                                                              \
                __m512i wv = _mm512_loadu_si512((const void *)(l->w + (n0 + r) * kp + k));                             \
                for (int t = 0; t < T; t++) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], xv[t], wv);                     \
            }                                                                                                          \
        }                                                                                                              \
        for (int r = 0; r < R; r++)                                                                                    \
            for (int t = 0; t < T; t++) {                                                                              \
                int32_t s = _mm512_reduce_add_epi32(acc[r][t]) - 128 * l->w_sum[n0 + r];                               \
                y[(m0 + t) * N + n0 + r] = (float)s * (a->scale[m0 + t] * l->w_scale[n0 + r]);                         \
            }                                                                                                          \
    }

/* One row against one token (decode): four accumulators over k, so four dpbusd chains overlap;
 * the int32 sums are exact, so their order changes nothing. Row after row, the weights are one
 * sequential stream. */
TGT_VNNI static void q8_vnni_row(const nl_qlinear *l, const nl_mv_act *a, float *y, int64_t n, int64_t m) {
    const int64_t kp = l->k_pad;
    const int8_t *w = l->w + n * kp;
    const uint8_t *x = a->qu + m * kp;
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    int64_t k = 0;
    for (; k + 256 <= kp; k += 256) {
        s0 = _mm512_dpbusd_epi32(s0, _mm512_loadu_si512((const void *)(x + k)),
                                 _mm512_loadu_si512((const void *)(w + k)));
        s1 = _mm512_dpbusd_epi32(s1, _mm512_loadu_si512((const void *)(x + k + 64)),
                                 _mm512_loadu_si512((const void *)(w + k + 64)));
        s2 = _mm512_dpbusd_epi32(s2, _mm512_loadu_si512((const void *)(x + k + 128)),
                                 _mm512_loadu_si512((const void *)(w + k + 128)));
        s3 = _mm512_dpbusd_epi32(s3, _mm512_loadu_si512((const void *)(x + k + 192)),
                                 _mm512_loadu_si512((const void *)(w + k + 192)));
    }
    for (; k < kp; k += 64)
        s0 = _mm512_dpbusd_epi32(s0, _mm512_loadu_si512((const void *)(x + k)),
                                 _mm512_loadu_si512((const void *)(w + k)));
    s0 = _mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(s2, s3));
    int32_t s = _mm512_reduce_add_epi32(s0) - 128 * l->w_sum[n];
    y[m * l->out_features + n] = (float)s * (a->scale[m] * l->w_scale[n]);
}

VNNI_TILE(q8_vnni_4x4, 4, 4)
VNNI_TILE(q8_vnni_4x1, 4, 1)
VNNI_TILE(q8_vnni_1x4, 1, 4)
VNNI_TILE(q8_vnni_1x1, 1, 1)

static void q8_portable(const nl_qlinear *l, const nl_mv_act *a, float *y, int64_t n, int64_t m) {
    const int64_t kp = l->k_pad;
    const int8_t *w = l->w + n * kp, *x = a->q + m * kp;
    int32_t s = 0;
    for (int64_t k = 0; k < kp; k++) s += (int32_t)w[k] * (int32_t)x[k];
    y[m * l->out_features + n] = (float)s * (a->scale[m] * l->w_scale[n]);
}

/* Rows [n0, n1) for tokens [m0, m1) of an int8 weight. */
static void run_block_int8(const nl_qlinear *l, const nl_mv_act *a, float *y, int64_t n0, int64_t n1, int64_t m0,
                           int64_t m1) {
    if (l->path != NL_QDOT_VNNI) {
        for (int64_t n = n0; n < n1; n++)
            for (int64_t m = m0; m < m1; m++) q8_portable(l, a, y, n, m);
        return;
    }
    int64_t n = n0;
    if (m1 - m0 < MV_TB) { /* decode: row after row (one sequential stream of the codes) */
        for (; n < n1; n++)
            for (int64_t m = m0; m < m1; m++) q8_vnni_row(l, a, y, n, m);
        return;
    }
    for (; n + MV_RB <= n1; n += MV_RB) {
        int64_t m = m0;
        for (; m + MV_TB <= m1; m += MV_TB) q8_vnni_4x4(l, a, y, n, m);
        for (; m < m1; m++) q8_vnni_4x1(l, a, y, n, m);
    }
    for (; n < n1; n++) {
        int64_t m = m0;
        for (; m + MV_TB <= m1; m += MV_TB) q8_vnni_1x4(l, a, y, n, m);
        for (; m < m1; m++) q8_vnni_1x1(l, a, y, n, m);
    }
}

/* ---- int4 -----------------------------------------------------------------------------------
 * Q4_0-style weights (see matvec.h): per row, groups of 32 columns with one fp16 scale; codes + 8
 * two per byte (byte i of a group: column i low, column i + 16 high). Activations: int8 codes of
 * each token (nl_qlinear_quantize_tokens) padded to kp (a multiple of 512 columns, 16 groups) and
 * each group's code sum. One (row, token) pair is one call of q4_pair_* on every path and for
 * every M, tile and thread, so its bits never depend on them; the portable and VNNI pairs make
 * the same float operations in the same order:
 *   acc[j] (j < 16) += (float)isum_g * d_g for g = j, j + 16, ... (isum_g exact int32)
 *   y = tree16(acc) * s_x, tree16 = the halving tree (j + j^8, then j^4, j^2, j^1). */

enum { Q4_G = NL_MV_INT4_GROUP, Q4_CHUNK = 16 * NL_MV_INT4_GROUP }; /* columns per group, per 16 groups */

static nl_status grow_codes(nl_mv_act *a, size_t codes, int64_t M);

/* Where byte i (column i low, i + 16 high) of group g of a row with G groups is stored: groups go
 * in chunks of 16 (the last one ng = G mod 16 when short), and a chunk's bytes are 4 slices, slice
 * b holding bytes 4b..4b+3 of each of its groups in turn, so one 64-byte load of slice b puts
 * group j of the chunk in 32-bit lane j. */
static inline int64_t q4_byte_at(int64_t G, int64_t g, int i) {
    const int64_t c = g / 16, ng = G - 16 * c < 16 ? G - 16 * c : 16;
    return c * 256 + (i / 4) * 4 * ng + 4 * (g % 16) + i % 4;
}

/* fp16 scale of one group (absmax / 7, nearest even) and its value; NL_ERR_RANGE on overflow. */
static nl_status q4_scale(const float *src, int64_t cnt, int64_t n, int64_t c0, uint16_t *code, float *d) {
    float amax = 0.0f;
    for (int64_t i = 0; i < cnt; i++) amax = fabsf(src[i]) > amax ? fabsf(src[i]) : amax;
    uint32_t c = 0;
    NL_TRY(nl_fmt_encode(NL_FMT_FP16, amax / 7.0f, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_DEFAULT, 0, &c));
    *d = nl_fmt_decode(NL_FMT_FP16, c);
    if (isinf(*d))
        return nl_fail(NL_ERR_RANGE,
                       "int4 matvec weight: row %lld, columns %lld..%lld: absmax %g / 7 overflows the fp16 scale "
                       "(largest 65504)",
                       (long long)n, (long long)c0, (long long)(c0 + cnt - 1), (double)amax);
    *code = (uint16_t)c;
    return NL_OK;
}

/* Quantizes w (N, K) into wt->q4 / wt->q4_d (the layout above). */
static nl_status q4_init(nl_mv_weight *wt, const float *w, int64_t N, int64_t K) {
    NL_TRY(nl_quant_check_finite(w, (size_t)N * (size_t)K, "int4 matvec weight"));
    const int64_t G = (K + Q4_G - 1) / Q4_G;
    wt->groups = G;
    wt->q4 = nl_malloc((size_t)(N * G) * 16, "int4 matvec codes");
    wt->q4_d = nl_malloc((size_t)(N * G) * sizeof(uint16_t), "int4 matvec scales");
    if (!wt->q4 || !wt->q4_d) {
        nl_mv_weight_free(wt);
        return NL_ERR_NOMEM;
    }
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < G; g++) {
            const float *src = w + n * K + g * Q4_G;
            const int64_t cnt = K - g * Q4_G < Q4_G ? K - g * Q4_G : Q4_G;
            float d;
            nl_status rc = q4_scale(src, cnt, n, g * Q4_G, &wt->q4_d[n * G + g], &d);
            if (rc) {
                nl_mv_weight_free(wt);
                return rc;
            }
            int8_t q[Q4_G] = {0}; /* columns past K: code 0 */
            for (int64_t i = 0; d > 0.0f && i < cnt; i++) {
                float v = rintf(src[i] / d);
                q[i] = (int8_t)(v < -8.0f ? -8 : v > 7.0f ? 7 : (int)v);
            }
            uint8_t *row = wt->q4 + n * G * 16;
            for (int i = 0; i < 16; i++) row[q4_byte_at(G, g, i)] = (uint8_t)((q[i] + 8) | ((q[i + 16] + 8) << 4));
        }
    return NL_OK;
}

nl_status nl_mv_int4_dequantize(const nl_mv_weight *wt, float *w) {
    if (wt->fmt != NL_WFMT_INT4 || !wt->q4)
        return nl_fail(NL_ERR_INVALID, "int4 dequantize: the weight is %s, not int4",
                       nl_wfmt_name(wt->fmt) ? nl_wfmt_name(wt->fmt) : "not initialised");
    const int64_t K = wt->cols, G = wt->groups;
    for (int64_t n = 0; n < wt->rows; n++)
        for (int64_t k = 0; k < K; k++) {
            const int64_t g = k / Q4_G, i = k % Q4_G;
            const uint8_t b = wt->q4[n * G * 16 + q4_byte_at(G, g, (int)(i & 15))];
            const int q = (i < 16 ? b & 15 : b >> 4) - 8;
            w[n * K + k] = (float)q * nl_fmt_decode(NL_FMT_FP16, wt->q4_d[n * G + g]);
        }
    return NL_OK;
}

/* The lane tree both pairs end with: j + j^8, then j^4, j^2, j^1. */
static inline float q4_tree16(const float *a) {
    float s1[8], s2[4];
    for (int i = 0; i < 8; i++) s1[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) s2[i] = s1[i] + s1[i + 4];
    return (s2[0] + s2[2]) + (s2[1] + s2[3]);
}

/* One (row, token) pair in C: w the row's G groups, d its scales, x the token's codes in column
 * order. Groups past G (the VNNI path's zero padding) would add +0.0f to a lane, which never
 * changes it (a lane is never -0: it starts at +0 and x + (-x) rounds to +0). */
static float q4_pair_portable(const uint8_t *w, const uint16_t *d, int64_t G, const int8_t *x, float xs) {
    float acc[16] = {0};
    for (int64_t c0 = 0; c0 < G; c0 += 16) { /* chunks of 16 groups, bytes as q4_byte_at lays them */
        const int64_t ng = G - c0 < 16 ? G - c0 : 16;
        for (int64_t j = 0; j < ng; j++) {
            const int8_t *xg = x + (c0 + j) * Q4_G;
            const uint8_t *wj = w + c0 * 16 + 4 * j;
            int32_t s = 0;
            for (int b = 0; b < 4; b++)
                for (int r = 0; r < 4; r++) {
                    const int v = wj[b * 4 * ng + r], i = 4 * b + r;
                    s += ((v & 15) - 8) * xg[i] + ((v >> 4) - 8) * xg[i + 16];
                }
            acc[j] = acc[j] + (float)s * nl_fmt_decode(NL_FMT_FP16, d[c0 + j]);
        }
    }
    return q4_tree16(acc) * xs;
}

#define TGT_Q4 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

/* q4_tree16 on a register (the same additions). */
TGT_Q4 INLINE float q4_tree16_512(__m512 v) {
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E)); /* j + j^8 */
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1)); /* j^4 */
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));       /* j^2 */
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));       /* j^1 */
    return _mm512_cvtss_f32(v);
}

/* A tile of R rows (R <= 2; w, d: the first row's codes and scales, the next G groups on) x T
 * tokens (T <= 4, from token m0 of a) on AVX-512 VNNI, into y (the first output; the tile's are
 * y[t * N + r]). Per chunk of 16 groups each row's 4 slices (q4_byte_at: 32-bit lane j = group
 * j) are loaded once and split into low and high nibbles (unsigned 0..15); per token, 8 dpbusd
 * against its signed codes (nl_mv_act's q4x: slice b's low columns, then its high ones) in two
 * chains give every group's whole dot product in its lane, minus 8 x the group's code sum: the
 * exact isum_g; then acc += (float)isum_g * d_g lane by lane. A short last chunk loads 4 x ng
 * bytes per slice (zero codes and scales in the lanes past it). Every (row, token) pair makes
 * the same operations in every tile shape: the bits of q4_pair_portable. */
TGT_Q4 INLINE void q4_tile(const uint8_t *w, const uint16_t *d, int64_t G, const nl_mv_act *a, int64_t m0, float *y,
                           int64_t N, const int R, const int T) {
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    const int64_t kp = a->kp, g16 = kp / Q4_G;
    __m512 acc[2][4];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g += 16) {
        const int64_t ng = G - g < 16 ? G - g : 16;
        const __mmask64 mk = ng == 16 ? ~(__mmask64)0 : ((__mmask64)1 << (4 * ng)) - 1;
        __m512i wl[2][4], wh[2][4];
        __m512 dv[2];
        for (int r = 0; r < R; r++) {
            const uint8_t *wc = w + (r * G + g) * 16;
            for (int b = 0; b < 4; b++) {
                /* masked loads measured slower here: whole vectors where the chunk allows */
                __m512i wv =
                    ng == 16  ? _mm512_loadu_si512((const void *)(wc + 64 * b))
                    : ng == 8 ? _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(wc + 32 * b)))
                              : _mm512_maskz_loadu_epi8(mk, wc + b * 4 * ng);
                wl[r][b] = _mm512_and_si512(wv, lo4);
                wh[r][b] = _mm512_and_si512(_mm512_srli_epi16(wv, 4), lo4);
            }
            const uint16_t *dc = d + r * G + g;
            dv[r] =
                _mm512_cvtph_ps(ng == 16  ? _mm256_loadu_si256((const __m256i *)(const void *)dc)
                                : ng == 8 ? _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)dc))
                                          : _mm256_maskz_loadu_epi16((__mmask16)((1u << ng) - 1u), dc));
        }
        for (int t = 0; t < T; t++) {
            const int8_t *xp = a->q4x + (m0 + t) * kp + g * Q4_G;
            __m512i sl[2], sh[2];
            for (int r = 0; r < R; r++) sl[r] = sh[r] = _mm512_setzero_si512();
            for (int b = 0; b < 4; b++) {
                __m512i xl = _mm512_loadu_si512((const void *)(xp + 128 * b));
                __m512i xh = _mm512_loadu_si512((const void *)(xp + 128 * b + 64));
                for (int r = 0; r < R; r++) {
                    sl[r] = _mm512_dpbusd_epi32(sl[r], wl[r][b], xl);
                    sh[r] = _mm512_dpbusd_epi32(sh[r], wh[r][b], xh);
                }
            }
            __m512i xs8 = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(a->xsum + (m0 + t) * g16 + g)), 3);
            for (int r = 0; r < R; r++) {
                __m512i s = _mm512_sub_epi32(_mm512_add_epi32(sl[r], sh[r]), xs8);
                acc[r][t] = _mm512_add_ps(acc[r][t], _mm512_mul_ps(_mm512_cvtepi32_ps(s), dv[r]));
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) y[t * N + r] = q4_tree16_512(acc[r][t]) * a->scale[m0 + t];
}

typedef void (*q4_tile_fn)(const nl_mv_weight *, const nl_mv_act *, int64_t n, int64_t m, float *y);
#define Q4_TILE(R, T)                                                                                                  \
    TGT_Q4 static void q4_tile_##R##x##T(const nl_mv_weight *wt, const nl_mv_act *a, int64_t n, int64_t m, float *y) { \
        q4_tile(wt->q4 + n * wt->groups * 16, wt->q4_d + n * wt->groups, wt->groups, a, m, y + m * wt->rows + n,       \
                wt->rows, R, T);                                                                                       \
    }
Q4_TILE(2, 1)
Q4_TILE(1, 1)
Q4_TILE(1, 2)
Q4_TILE(1, 3)
Q4_TILE(1, 4)
Q4_TILE(2, 2)
Q4_TILE(2, 3)
static const q4_tile_fn q4_tiles_1xT[4] = {q4_tile_1x1, q4_tile_1x2, q4_tile_1x3, q4_tile_1x4};

/* 1 when an int4 weight on path `path` runs the VNNI pair here. */
static int q4_vnni(nl_mv_path path) { return path == NL_MV_AVX512 && nl_qdot_available(NL_QDOT_VNNI); }

/* Rows [n0, n1) for tokens [m0, m1): rows one after another (one sequential stream of the
 * codes). On VNNI two rows (adjacent in memory) at a time against tiles of up to 3 tokens (their
 * codes split into nibbles once per tile, each activation load shared by the two rows), an odd
 * last row against tiles of up to 4; the rows' bytes stay in L1 for the tiles after the first. */
static void run_block_int4(const nl_mv_weight *wt, const nl_mv_act *a, float *y, int64_t n0, int64_t n1, int64_t m0,
                           int64_t m1) {
    const int64_t G = wt->groups, N = wt->rows, kp = a->kp;
    if (!q4_vnni(wt->path)) {
        for (int64_t n = n0; n < n1; n++)
            for (int64_t m = m0; m < m1; m++)
                y[m * N + n] = q4_pair_portable(wt->q4 + n * G * 16, wt->q4_d + n * G, G, a->q + m * kp, a->scale[m]);
        return;
    }
    int64_t n = n0;
    if (m1 - m0 == 1)
        for (; n + 2 <= n1; n += 2) q4_tile_2x1(wt, a, n, m0, y);
    else
        for (; n + 2 <= n1; n += 2) {
            int64_t m = m0;
            for (; m + 3 <= m1; m += 3) q4_tile_2x3(wt, a, n, m, y);
            if (m1 - m == 2) q4_tile_2x2(wt, a, n, m, y);
            if (m1 - m == 1) q4_tile_2x1(wt, a, n, m, y);
        }
    for (; n < n1; n++)
        for (int64_t m = m0; m < m1; m += 4) q4_tiles_1xT[(m1 - m < 4 ? m1 - m : 4) - 1](wt, a, n, m, y);
}

/* INT4 inputs: codes q (M, kp) in column order (kp = the groups rounded up to 16, x 32), each
 * group's code sum xsum (M, kp / 32), and on VNNI the codes again in q4x's order: per chunk of 16
 * groups, for slice b = 0..3 the 4 columns 4b.. of each group (lane j = group j), then its
 * columns 16 + 4b.. (the columns the slice's low and high nibbles hold). */
static nl_status q4_act(nl_mv_act *a, const nl_mv_weight *wt, const float *x, int64_t M) {
    const int64_t kp = (wt->groups + 15) / 16 * Q4_CHUNK, g16 = kp / Q4_G;
    const size_t codes = (size_t)M * (size_t)kp;
    a->kp = kp;
    NL_TRY(grow_codes(a, codes, M));
    if (codes > a->cap_q4) {
        nl_free(a->q4x);
        nl_free(a->xsum);
        a->q4x = nl_malloc(codes, "matvec int4 activation codes (kernel order)");
        a->xsum = nl_malloc(codes / Q4_G * sizeof(int32_t), "matvec int4 group sums");
        a->cap_q4 = a->q4x && a->xsum ? codes : 0;
        if (!a->cap_q4) return NL_ERR_NOMEM;
    }
    NL_TRY(nl_qlinear_quantize_tokens(x, M, wt->cols, kp, a->q, NULL, a->scale));
    const int vnni = q4_vnni(wt->path);
    for (int64_t m = 0; m < M; m++) {
        const int8_t *q = a->q + m * kp;
        for (int64_t g = 0; g < g16; g++) {
            int32_t s = 0;
            for (int i = 0; i < Q4_G; i++) s += q[g * Q4_G + i];
            a->xsum[m * g16 + g] = s;
        }
        if (!vnni) continue;
        int8_t *o = a->q4x + m * kp; /* per chunk: slice b low, slice b high; lane j = group j */
        for (int64_t c = 0; c < kp; c += Q4_CHUNK)
            for (int b = 0; b < 4; b++)
                for (int h = 0; h < 2; h++)
                    for (int j = 0; j < 16; j++)
                        memcpy(o + c + (2 * b + h) * 64 + 4 * j, q + c + 32 * j + 16 * h + 4 * b, 4);
    }
    return NL_OK;
}

/* ---- activations and the two drivers ---------------------------------------------------------- */

/* Grows the int8 code buffers q and qu to `codes` bytes and the token scales to M. */
static nl_status grow_codes(nl_mv_act *a, size_t codes, int64_t M) {
    if (codes > a->cap_codes) {
        nl_free(a->q);
        nl_free(a->qu);
        a->q = nl_malloc(codes, "matvec int8 activation codes");
        a->qu = nl_malloc(codes, "matvec unsigned activation codes");
        a->cap_codes = a->q && a->qu ? codes : 0;
        if (!a->cap_codes) return NL_ERR_NOMEM;
    }
    if ((size_t)M > a->cap_tokens) {
        nl_free(a->scale);
        a->scale = nl_malloc((size_t)M * sizeof(float), "matvec token scales");
        a->cap_tokens = a->scale ? (size_t)M : 0;
        if (!a->scale) return NL_ERR_NOMEM;
    }
    return NL_OK;
}

/* a->xp (M, k32): per 32 columns of each token, its 16 even columns then its 16 odd ones, zero
 * past K (the order tile512_bf multiplies in). */
static nl_status deinterleave(nl_mv_act *a, const float *x, int64_t M, int64_t K) {
    a->k32 = (K + 31) & ~(int64_t)31;
    size_t n = (size_t)M * (size_t)a->k32;
    if (n > a->cap_xp) {
        nl_free(a->xp);
        a->xp = nl_malloc(n * sizeof(float), "matvec bf16 activations");
        a->cap_xp = a->xp ? n : 0;
        if (!a->xp) return NL_ERR_NOMEM;
    }
    for (int64_t m = 0; m < M; m++) {
        const float *xm = x + m * K;
        float *d = a->xp + m * a->k32;
        for (int64_t c = 0; c < a->k32; c += 32)
            for (int64_t j = 0; j < 16; j++) {
                d[c + j] = c + 2 * j < K ? xm[c + 2 * j] : 0.0f;
                d[c + 16 + j] = c + 2 * j + 1 < K ? xm[c + 2 * j + 1] : 0.0f;
            }
    }
    return NL_OK;
}

nl_status nl_mv_act_prepare(nl_mv_act *a, const nl_mv_weight *wt, const float *x, int64_t M) {
    if (M < 1) return nl_fail(NL_ERR_INVALID, "matvec: M must be positive, got %lld", (long long)M);
    if (wt->fmt != NL_WFMT_FP32 && wt->fmt != NL_WFMT_BF16 && wt->fmt != NL_WFMT_INT8 && wt->fmt != NL_WFMT_INT4)
        return nl_fail(NL_ERR_INVALID, "matvec: weight not initialised (format %d)", (int)wt->fmt);
    a->x = x;
    a->M = M;
    a->K = wt->cols;
    a->kp = wt->cols;
    if (wt->fmt == NL_WFMT_BF16 && wt->path == NL_MV_AVX512) return deinterleave(a, x, M, wt->cols);
    if (wt->fmt == NL_WFMT_INT4) return q4_act(a, wt, x, M);
    if (wt->fmt != NL_WFMT_INT8) return NL_OK;
    const nl_qlinear *l = &wt->q8;
    a->kp = l->k_pad;
    NL_TRY(grow_codes(a, (size_t)M * (size_t)l->k_pad, M));
    return nl_qlinear_quantize_tokens(x, M, wt->cols, l->k_pad, a->q, l->path == NL_QDOT_VNNI ? a->qu : NULL, a->scale);
}

void nl_mv_act_free(nl_mv_act *a) {
    if (!a) return;
    nl_free(a->q);
    nl_free(a->qu);
    nl_free(a->scale);
    nl_free(a->xp);
    nl_free(a->q4x);
    nl_free(a->xsum);
    memset(a, 0, sizeof *a);
}

enum { MV_RANGE_ROWS = 64 }; /* rows whose weights stay in L2 while the tokens stream past */

void nl_mv_forward_range(const nl_mv_weight *wt, const nl_mv_act *act, float *y, int64_t n0, int64_t n1) {
    const int64_t M = act->M;
    mv_args a = {.x = act->x,
                 .y = y,
                 .wf = wt->fmt == NL_WFMT_FP32 ? wt->f32 : NULL,
                 .wb = wt->fmt == NL_WFMT_BF16 ? wt->bf16 : NULL,
                 .xp = act->xp,
                 .M = M,
                 .N = wt->rows,
                 .K = wt->cols,
                 .K32 = act->k32,
                 .packed_rows = wt->bf16_packed ? wt->rows / 4 * 4 : 0};
    if (wt->fmt == NL_WFMT_FP32 && wt->f32_panels && wt->path == NL_MV_AVX512) {
        /* a panel's tiles read it from memory once, then from L2 (48 rows x K x 4 bytes) */
        run_panels(wt, act->x, y, n0, n1, 0, M);
        return;
    }
    /* an fp32 weight on AVX-512 always has its panels (init and set_path build them); without
     * them the AVX-512 tiles here are bf16's only, so the AVX2 ones would serve */
    const nl_mv_path path = a.wf && wt->path == NL_MV_AVX512 ? NL_MV_AVX2 : wt->path;
    for (int64_t nb = n0; nb < n1; nb += MV_RANGE_ROWS) {
        int64_t ne = n1 - nb < MV_RANGE_ROWS ? n1 : nb + MV_RANGE_ROWS;
        for (int64_t m0 = 0; m0 < M; m0 += MV_TOK) {
            int64_t m1 = M - m0 < MV_TOK ? M : m0 + MV_TOK;
            if (wt->fmt == NL_WFMT_INT8)
                run_block_int8(&wt->q8, act, y, nb, ne, m0, m1);
            else if (wt->fmt == NL_WFMT_INT4)
                run_block_int4(wt, act, y, nb, ne, m0, m1);
            else
                run_block(&a, path, nb, ne, m0, m1);
        }
    }
}

nl_status nl_mv_forward_act(const nl_mv_weight *wt, nl_mv_act *act, const float *x, int64_t M, float *y, int threads) {
    NL_TRY(nl_mv_act_prepare(act, wt, x, M));
    /* fp32 panels are split two whole ones at a time (a thread's panels lie back to back; up to
     * 4 tokens read two of them at once) */
    const int64_t rows = wt->f32_panels && wt->path == NL_MV_AVX512 ? 2 * NL_MV_PANEL : MV_ROWS;
    const int64_t N = wt->rows, nblocks = (N + rows - 1) / rows;
    int nt = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t b = 0; b < nblocks; b++)
        nl_mv_forward_range(wt, act, y, b * rows, (b + 1) * rows < N ? (b + 1) * rows : N);
    return NL_OK;
}

nl_status nl_mv_forward(const nl_mv_weight *wt, const float *x, int64_t M, float *y, int threads) {
    nl_mv_act act;
    memset(&act, 0, sizeof act);
    nl_status rc = nl_mv_forward_act(wt, &act, x, M, y, threads);
    nl_mv_act_free(&act);
    return rc;
}
