/* Decode kernels: y (M, N) = x (M, K) . W^T for fp32 / bf16 / int8 / int4 weights (see matvec.h). */
#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif
#include <math.h>
#include <omp.h>
#include <string.h>

#include "nanolm/formats.h"
#include "nanolm/isa.h"
#include "nanolm/matvec.h"
#include "nanolm/quant.h"
#include "matvec_internal.h"

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
    case NL_MV_NEON: return "neon";
    default: return "?";
    }
}

int nl_mv_available(nl_mv_path p) {
    switch (p) {
    case NL_MV_AUTO:
    case NL_MV_PORTABLE: return 1;
    case NL_MV_AVX2: return nl_isa_has(NL_ISA_AVX2);
    case NL_MV_AVX512: return nl_isa_has(NL_ISA_AVX512);
    case NL_MV_NEON: return nl_isa_has(NL_ISA_NEON);
    default: return 0;
    }
}

nl_mv_path nl_mv_auto(void) {
    if (nl_mv_available(NL_MV_AVX512)) return NL_MV_AVX512;
    if (nl_mv_available(NL_MV_AVX2)) return NL_MV_AVX2;
    if (nl_mv_available(NL_MV_NEON)) return NL_MV_NEON;
    return NL_MV_PORTABLE;
}

/* ---- the weight ------------------------------------------------------------------------------ */

static nl_status q4_init(nl_mv_weight *wt, const float *w, int64_t N, int64_t K);

/* Panels (fp32 and bf16 on every SIMD path, int8 on AVX-512 VNNI): W (N, K) in blocks of NL_MV_PANEL (48) rows, each
 * stored column by column, so that a tile walks one panel front to back, one sequential stream,
 * and for each column k multiplies 3 vectors of 16 rows by each token's x[k] (broadcast): every
 * (row, token) output is one fused multiply-add chain over k = 0, 1, .., K - 1 from +0, in every
 * tile shape, with no sum across lanes.
 *   FP32: for each k the 48 rows' W[48p + j][k] side by side (192 bytes); a copy beside the
 *         borrowed or owned original (f32_panels), which the other paths read.
 *   BF16: by pairs of columns, for each pair (2i, 2i + 1) the 48 rows' two values side by side,
 *         one 32-bit lane per row with column 2i in its low half (192 bytes): a shift
 *         (lane << 16) gives column 2i as fp32 and a mask (lane & 0xffff0000) column 2i + 1,
 *         with no lane-crossing widening. K odd: the last pair's high halves are zero. The bf16
 *         weight lives here only (bf16_panels; bf16 NULL) and moves back into rows for another
 *         path.
 *   INT8 (on VNNI): by groups of 4 columns of the padded codes (k_pad), for each group the 48
 *         rows' 4 codes side by side, one 32-bit lane per row (192 bytes), so that one dpbusd per
 *         vector adds the group's 4 products into each row's int32 lane. The codes live here only
 *         (q8_panels; q8.w NULL) and move back into rows for another path.
 * Rows past N are zero. pack = 0 undoes it. */
static nl_status panel_alloc(const nl_mv_weight *wt, int64_t kp, size_t esz, void **out) {
    const int64_t np = (wt->rows + NL_MV_PANEL - 1) / NL_MV_PANEL;
    size_t n;
    if (nl_mul_overflows((size_t)(np * NL_MV_PANEL), (size_t)kp * esz, &n))
        return nl_fail(NL_ERR_NOMEM, "matvec panels: %lld x %lld is too large", (long long)wt->rows,
                       (long long)wt->cols);
    *out = nl_malloc_huge(n, "matvec weight panels");
    return *out ? NL_OK : NL_ERR_NOMEM;
}

/* One element of esz bytes (1, 2 or 4) from s to d, or zero (s NULL); memcpy of a constant
 * size is one move, and says nothing of the element's type. */
static inline void panel_el(void *d, const void *s, size_t esz) {
    static const char zero[4];
    switch (esz) {
    case 1: memcpy(d, s ? s : zero, 1); break;
    case 2: memcpy(d, s ? s : zero, 2); break;
    default: memcpy(d, s ? s : zero, 4); break;
    }
}

/* Copies rows (N rows of rs elements, the first K used) into panels of kp columns (pack = 1:
 * from src to dst, zero past K and N) or panels back into rows (pack = 0), elements of esz bytes,
 * 4 / esz of them per 32-bit lane (fp32 one column, bf16 a pair, int8 a group of 4: see above). */
static void panel_copy(const char *src, char *dst, int64_t rs, int64_t N, int64_t K, int64_t kp, size_t esz, int pack) {
    const int64_t v = 4 / (int64_t)esz, np = (N + NL_MV_PANEL - 1) / NL_MV_PANEL;
    for (int64_t b = 0; b < np; b++)
        for (int64_t j = 0; j < NL_MV_PANEL; j++) {
            const int64_t r = b * NL_MV_PANEL + j;
            for (int64_t k = 0; k < kp; k++) {
                /* row j's lane of step k / v in panel b, and the element in its row */
                const size_t at_pan = (size_t)(b * kp * NL_MV_PANEL + (k / v) * v * NL_MV_PANEL + v * j + k % v) * esz;
                const int in_rows = r < N && k < K;
                const size_t at_row = in_rows ? (size_t)(r * rs + k) * esz : 0;
                if (pack)
                    panel_el(dst + at_pan, in_rows ? src + at_row : NULL, esz);
                else if (in_rows)
                    panel_el(dst + at_row, src + at_pan, esz);
            }
        }
}

static nl_status f32_pack(nl_mv_weight *wt, int pack) {
    if (wt->fmt != NL_WFMT_FP32 || !pack == !wt->f32_panels) return NL_OK;
    if (!pack) {
        if (!wt->f32) { /* detached: the panels are the only copy, so the rows come back from them */
            wt->owned_f32 = nl_malloc((size_t)wt->rows * (size_t)wt->cols * sizeof(float), "fp32 matvec weight");
            if (!wt->owned_f32) return NL_ERR_NOMEM;
            panel_copy((const char *)wt->f32_panels, (char *)wt->owned_f32, wt->cols, wt->rows, wt->cols, wt->cols,
                       sizeof(float), 0);
            wt->f32 = wt->owned_f32;
        }
        nl_free(wt->f32_panels);
        wt->f32_panels = NULL;
        return NL_OK;
    }
    void *mem = NULL;
    NL_TRY(panel_alloc(wt, wt->cols, sizeof(float), &mem));
    panel_copy((const char *)wt->f32, mem, wt->cols, wt->rows, wt->cols, wt->cols, sizeof(float), 1);
    wt->f32_panels = mem;
    return NL_OK;
}

/* bf16 and int8: the values move between their rows (*rows, allocated as `what`, freed after
 * packing) and their panels (*pan, freed after unpacking). */
static nl_status move_pack(const nl_mv_weight *wt, void **rows, void **pan, int64_t rs, int64_t K, int64_t kp,
                           size_t esz, int pack, const char *what) {
    void *mem = NULL;
    if (pack)
        NL_TRY(panel_alloc(wt, kp, esz, &mem));
    else if (!(mem = nl_calloc((size_t)wt->rows, (size_t)rs * esz, what)))
        return NL_ERR_NOMEM;
    panel_copy(pack ? *rows : *pan, mem, rs, wt->rows, K, kp, esz, pack);
    nl_free(pack ? *rows : *pan);
    *rows = pack ? NULL : mem;
    *pan = pack ? mem : NULL;
    return NL_OK;
}

static nl_status bf16_pack(nl_mv_weight *wt, int pack) {
    if (wt->fmt != NL_WFMT_BF16 || !pack == !wt->bf16_panels) return NL_OK;
    const int64_t K = wt->cols;
    void *rows = wt->bf16, *pan = wt->bf16_panels;
    NL_TRY(move_pack(wt, &rows, &pan, K, K, K + (K & 1), sizeof(uint16_t), pack, "bf16 matvec weight"));
    wt->bf16 = rows;
    wt->bf16_panels = pan;
    return NL_OK;
}

static nl_status q8_pack(nl_mv_weight *wt, int pack) {
    if (wt->fmt != NL_WFMT_INT8 || !pack == !wt->q8_panels) return NL_OK;
    const int64_t kp = wt->q8.k_pad;
    void *rows = wt->q8.w, *pan = wt->q8_panels;
    NL_TRY(move_pack(wt, &rows, &pan, kp, kp, kp, 1, pack, "QuantizedLinear weights"));
    wt->q8.w = rows;
    wt->q8_panels = pan;
    return NL_OK;
}

/* Whether fp32 and bf16 weights are kept in panels on path p: every SIMD path reads them. */
static int panel_path(nl_mv_path p) { return p == NL_MV_AVX512 || p == NL_MV_AVX2 || p == NL_MV_NEON; }

/* Whether wt's kernels read panels (run_panels*): fp32 and bf16 on every SIMD path, int8 on
 * AVX-512 with VNNI. */
static int has_panels(const nl_mv_weight *wt) {
    return panel_path(wt->path) && (wt->f32_panels || wt->bf16_panels || wt->q8_panels);
}

/* An int8 weight's codes into panels where its path reads them (freeing the weight on failure). */
static nl_status q8_init_panels(nl_mv_weight *wt) {
    nl_status rc = q8_pack(wt, wt->path == NL_MV_AVX512 && wt->q8.path == NL_QDOT_VNNI);
    if (rc) nl_mv_weight_free(wt);
    return rc;
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
            nl_status rc = f32_pack(wt, panel_path(wt->path));
            if (rc) nl_mv_weight_free(wt);
            return rc;
        }
    case NL_WFMT_BF16:
        NL_TRY(nl_quant_check_finite(w, n, "bf16 matvec weight"));
        wt->bf16 = nl_malloc(n * sizeof(uint16_t), "bf16 matvec weight");
        if (!wt->bf16) return NL_ERR_NOMEM;
        for (size_t i = 0; i < n; i++) wt->bf16[i] = nl_bf16_from_f32(w[i]);
        {
            nl_status rc = bf16_pack(wt, panel_path(wt->path));
            if (rc) nl_mv_weight_free(wt);
            return rc;
        }
    case NL_WFMT_INT8: NL_TRY(nl_qlinear_init(&wt->q8, w, N, K, NL_QLINEAR_W8A8)); return q8_init_panels(wt);
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
    NL_TRY(nl_qlinear_init_codes(&wt->q8, codes, scales, N, K, NL_QLINEAR_W8A8));
    return q8_init_panels(wt);
}

void nl_mv_weight_free(nl_mv_weight *wt) {
    if (!wt) return;
    nl_free(wt->owned_f32);
    nl_free(wt->f32_panels);
    nl_free(wt->bf16);
    nl_free(wt->bf16_panels);
    nl_free(wt->q8_panels);
    nl_qlinear_free(&wt->q8);
    nl_free(wt->q4);
    nl_free(wt->q4_d);
    memset(wt, 0, sizeof *wt);
}

int nl_mv_weight_detach(nl_mv_weight *wt) {
    switch (wt->fmt) {
    case NL_WFMT_FP32:
        if (!wt->f32_panels) return 0; /* its kernels read the fp32 rows */
        nl_free(wt->owned_f32);
        wt->owned_f32 = NULL;
        wt->f32 = NULL;
        return 1;
    case NL_WFMT_BF16:
    case NL_WFMT_INT8:
    case NL_WFMT_INT4: return 1; /* made from the source, never read it again */
    default: return 0;
    }
}

nl_status nl_mv_weight_set_path(nl_mv_weight *wt, nl_mv_path p) {
    if (p == NL_MV_AUTO) p = nl_mv_auto();
    if ((unsigned)p >= NL_MV_COUNT) return nl_fail(NL_ERR_INVALID, "unknown matvec kernel path %d", (int)p);
    if (!nl_mv_available(p))
        return nl_fail(NL_ERR_UNSUPPORTED, "matvec kernel path '%s' is not available on this CPU", nl_mv_path_name(p));
    NL_TRY(bf16_pack(wt, panel_path(p)));
    NL_TRY(f32_pack(wt, panel_path(p)));
    NL_TRY(q8_pack(wt, p == NL_MV_AVX512 && wt->q8.path == NL_QDOT_VNNI));
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
    int64_t M, N, K;
} mv_args;

/* portable: each (row, token) output is one fused multiply-add chain over k = 0 .. K - 1 from +0
 * (fmaf, correctly rounded with or without FMA hardware), the operations of the panel kernels;
 * the R x T chains of a tile advance together along k. */
static void tile_portable(const mv_args *a, int64_t n0, int R, int64_t m0, int T) {
    const int64_t K = a->K;
    float s[MV_RB][MV_TB] = {{0}};
    for (int64_t k = 0; k < K; k++)
        for (int r = 0; r < R; r++) {
            const float wv = a->wf ? a->wf[(n0 + r) * K + k] : nl_f32_from_bf16(a->wb[(n0 + r) * K + k]);
            for (int t = 0; t < T; t++) s[r][t] = fmaf(wv, a->x[(m0 + t) * K + k], s[r][t]);
        }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) a->y[(m0 + t) * a->N + n0 + r] = s[r][t];
}

enum { MV_PZ = NL_MV_PANEL / 16, MV_PT = 8, MV_PF = 4096, MV_PF_L1 = 2048, MV_PF_L2 = 8192 };

#if defined(__x86_64__) /* the AVX-512 and AVX2 panel kernels */
/* AVX-512, fp32 and bf16 weights in panels (see "Panels" above). A tile is P (1 or 2) adjacent panels
 * against T tokens, P x T x 3 accumulators of 16 rows held in registers (at most 24 of the 32):
 * per column k the panels' vectors are loaded once and multiplied by each token's x[k]
 * (broadcast), so a batch of up to 8 decodes reads a panel once while it streams from memory.
 * P = 2 (T <= 4) keeps two sequential streams in flight: one stream per core left bandwidth
 * unused (four at a time were no better than two). bf16 takes the
 * panels one after another for each pair of columns (raw vectors, then each half widened in
 * turn), so that P = 2 stays inside the registers; each output's chain is the same. Outputs are
 * stored straight from the accumulators, the lanes of rows lo .. hi - 1 of the panel only (P =
 * 1). pf: prefetch ahead in each panel (the first token tile of a panel streams it from memory;
 * the four panels a thread takes at a time lie back to back, so this runs on into the next
 * one): into L1 MV_PF_L1 bytes ahead and into L2 MV_PF_L2 bytes ahead (int8: MV_PF bytes, into
 * L1). Without it, two panels at a time read less. */
/* Two distances beat one 4 KB ahead into L1; 4 KB into L1 and 16 KB into L2 read more at 8
 * tokens but dropped at one token in some runs. The measurements: bench/results/matvec.md. */

/* acc[(p0 + p) * T + t] += wv[p] * token t's x[k], for the np panels p0 .. p0 + np - 1 */
TGT_AVX512 INLINE void panel_fma(__m512 acc[MV_PT][MV_PZ], const __m512 wv[][MV_PZ], const float *x, int64_t K,
                                 int64_t k, const int p0, const int np, const int T) {
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        const __m512 xb = _mm512_set1_ps(x[t * K + k]);
#pragma GCC unroll 2
        for (int p = 0; p < np; p++)
#pragma GCC unroll 3
            for (int j = 0; j < MV_PZ; j++)
                acc[(p0 + p) * T + t][j] = _mm512_fmadd_ps(wv[p][j], xb, acc[(p0 + p) * T + t][j]);
    }
}

/* Panel p0 of a bf16 tile, the column pair i (columns 2i and, if last = 0, 2i + 1). */
TGT_AVX512 INLINE void panel_bf16_pair(__m512 acc[MV_PT][MV_PZ], const uint16_t *wp, const float *x, int64_t K,
                                       int64_t i, const int p0, const int T, const int last) {
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512i raw[MV_PZ];
    __m512 wv[1][MV_PZ];
#pragma GCC unroll 3
    for (int j = 0; j < MV_PZ; j++) raw[j] = _mm512_load_si512((const void *)(wp + i * 2 * NL_MV_PANEL + 32 * j));
#pragma GCC unroll 3
    for (int j = 0; j < MV_PZ; j++) wv[0][j] = _mm512_castsi512_ps(_mm512_slli_epi32(raw[j], 16));
    panel_fma(acc, wv, x, K, 2 * i, p0, 1, T);
    if (last) return;
#pragma GCC unroll 3
    for (int j = 0; j < MV_PZ; j++) wv[0][j] = _mm512_castsi512_ps(_mm512_and_si512(raw[j], hi));
    panel_fma(acc, wv, x, K, 2 * i + 1, p0, 1, T);
}

/* What a tile needs beside its weights and tokens. A panel against more than 8 tokens takes
 * several passes; the first reads it from memory, the others from L2 while the memory sits idle.
 * Those others prefetch the next panel into L2 (nx: where this tile's share of it starts; nl:
 * cache lines per step along k), so that its first pass too reads from L2. */
typedef struct mv_tile {
    const float *xs;      /* int8: the tile's first token's scale */
    const int32_t *w_sum; /* int8: the first panel's first row's code sum */
    const float *w_scale; /* int8: and scale */
    const char *nx;       /* NULL: no prefetch of the next panel */
    int nl;
} mv_tile;

TGT_AVX512 INLINE void prefetch_next_panel(const mv_tile *q, int64_t it) {
    if (!q->nx) return;
    for (int l = 0; l < q->nl; l++) _mm_prefetch(q->nx + (it * q->nl + l) * 64, _MM_HINT_T1);
}

/* The cache line at a, MV_PF_L1 bytes on into L1 and MV_PF_L2 bytes on into L2. */
TGT_AVX512 INLINE void prefetch_panel(const char *a) {
    _mm_prefetch(a + MV_PF_L1, _MM_HINT_T0);
    _mm_prefetch(a + MV_PF_L2, _MM_HINT_T1);
}

/* P panels from w (ps elements apart) against T tokens; bf: bf16 panels, else fp32. */
TGT_AVX512 INLINE void tile_panel(const void *w, int64_t ps, const float *x, float *y, int64_t K, int64_t N,
                                  const int P, const int T, const int bf, int lo, int hi, int pf, const mv_tile *q) {
    __m512 acc[MV_PT][MV_PZ];
#pragma GCC unroll 8
    for (int a = 0; a < P * T; a++)
#pragma GCC unroll 3
        for (int j = 0; j < MV_PZ; j++) acc[a][j] = _mm512_setzero_ps();
    if (!bf) {
        const float *wp = w;
        for (int64_t k = 0; k < K; k++) {
            __m512 wv[2][MV_PZ];
#pragma GCC unroll 2
            for (int p = 0; p < P; p++)
#pragma GCC unroll 3
                for (int j = 0; j < MV_PZ; j++) wv[p][j] = _mm512_load_ps(wp + p * ps + k * NL_MV_PANEL + 16 * j);
            if (pf)
#pragma GCC unroll 2
                for (int p = 0; p < P; p++)
#pragma GCC unroll 3
                    for (int j = 0; j < MV_PZ; j++)
                        prefetch_panel((const char *)(wp + p * ps + k * NL_MV_PANEL + 16 * j));
            prefetch_next_panel(q, k);
            panel_fma(acc, wv, x, K, k, 0, P, T);
        }
    } else {
        const uint16_t *wp = w;
        const int64_t pairs = K / 2;
        for (int64_t i = 0; i < pairs; i++) {
            if (pf)
#pragma GCC unroll 2
                for (int p = 0; p < P; p++)
#pragma GCC unroll 3
                    for (int j = 0; j < MV_PZ; j++)
                        prefetch_panel((const char *)(wp + p * ps + i * 2 * NL_MV_PANEL + 32 * j));
            prefetch_next_panel(q, i);
#pragma GCC unroll 2
            for (int p = 0; p < P; p++) panel_bf16_pair(acc, wp + p * ps, x, K, i, p, T, 0);
        }
        if (K & 1)
#pragma GCC unroll 2
            for (int p = 0; p < P; p++) panel_bf16_pair(acc, wp + p * ps, x, K, pairs, p, T, 1);
    }
    if (P == 2 || (lo == 0 && hi == NL_MV_PANEL)) {
#pragma GCC unroll 2
        for (int p = 0; p < P; p++)
#pragma GCC unroll 8
            for (int t = 0; t < T; t++)
#pragma GCC unroll 3
                for (int j = 0; j < MV_PZ; j++)
                    _mm512_storeu_ps(y + t * N + p * NL_MV_PANEL + 16 * j, acc[p * T + t][j]);
        return;
    }
    for (int j = 0; j < MV_PZ; j++) {
        const int a = lo > 16 * j ? lo - 16 * j : 0, b = hi < 16 * j + 16 ? hi - 16 * j : 16;
        if (a >= b) continue;
        const __mmask16 mk = (__mmask16)(((1u << b) - 1u) & ~((1u << a) - 1u));
        for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y + t * N + 16 * j, mk, acc[t][j]);
    }
}
/* INT8 on AVX-512 VNNI, P panels (ps bytes apart) against T tokens' codes + 128 (xu, rows of kp):
 * per group of 4 columns, the token's 4 codes broadcast as one 32-bit lane, one dpbusd per
 * vector adds the group's 4 products into each row's int32 lane (exact, so the order is free).
 * Then, as q8_vnni_row and nl_qlinear_forward: y = (float)(sum - 128 x the row's code sum) x
 * (token scale x row scale), the same float operations per output, 16 rows at a time. */
#define TGT_PANEL_Q8 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))
TGT_PANEL_Q8 INLINE void tile_q8(const int8_t *w, int64_t ps, const uint8_t *xu, float *y, int64_t kp, int64_t N,
                                 const mv_tile *q, const int P, const int T, int lo, int hi, int pf) {
    __m512i acc[MV_PT][MV_PZ];
#pragma GCC unroll 8
    for (int a = 0; a < P * T; a++)
#pragma GCC unroll 3
        for (int j = 0; j < MV_PZ; j++) acc[a][j] = _mm512_setzero_si512();
    for (int64_t g = 0; g < kp / 4; g++) {
        __m512i wv[2][MV_PZ];
#pragma GCC unroll 2
        for (int p = 0; p < P; p++)
#pragma GCC unroll 3
            for (int j = 0; j < MV_PZ; j++)
                wv[p][j] = _mm512_load_si512((const void *)(w + p * ps + g * 4 * NL_MV_PANEL + 64 * j));
        if (pf)
#pragma GCC unroll 2
            for (int p = 0; p < P; p++)
#pragma GCC unroll 3
                for (int j = 0; j < MV_PZ; j++)
                    _mm_prefetch((const char *)(w + p * ps + g * 4 * NL_MV_PANEL + 64 * j) + MV_PF, _MM_HINT_T0);
        prefetch_next_panel(q, g);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            int32_t x4;
            memcpy(&x4, xu + t * kp + 4 * g, sizeof x4);
            const __m512i xb = _mm512_set1_epi32(x4);
#pragma GCC unroll 2
            for (int p = 0; p < P; p++)
#pragma GCC unroll 3
                for (int j = 0; j < MV_PZ; j++)
                    acc[p * T + t][j] = _mm512_dpbusd_epi32(acc[p * T + t][j], xb, wv[p][j]);
        }
    }
#pragma GCC unroll 2
    for (int p = 0; p < P; p++)
#pragma GCC unroll 3
        for (int j = 0; j < MV_PZ; j++) {
            const int r = p * NL_MV_PANEL + 16 * j;
            __mmask16 mk = 0xFFFF;
            if (P == 1) {
                const int a = lo > 16 * j ? lo - 16 * j : 0, b = hi < 16 * j + 16 ? hi - 16 * j : 16;
                if (a >= b) continue;
                mk = (__mmask16)(((1u << b) - 1u) & ~((1u << a) - 1u));
            }
            const __m512i c = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(mk, q->w_sum + r), 7);
            const __m512 ws = _mm512_maskz_loadu_ps(mk, q->w_scale + r);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[p * T + t][j], c));
                _mm512_mask_storeu_ps(y + t * N + r, mk, _mm512_mul_ps(f, _mm512_mul_ps(_mm512_set1_ps(q->xs[t]), ws)));
            }
        }
}

/* One tile: P panels from w (ps elements apart) against T tokens from x (rows of K elements: fp32
 * activations, or int8's codes + 128 in rows of k_pad), into y (the panels' first row of the tile's
 * first token); q: int8's scales (NULL for fp32 and bf16). */
typedef void (*tile_panel_fn)(const void *w, int64_t ps, const void *x, float *y, int64_t K, int64_t N, int lo, int hi,
                              int pf, const mv_tile *q);
#define TILE_PANEL(P, T, F)                                                                                            \
    TGT_PANEL_Q8 static void tile_panel_##P##_##T##_##F(const void *w, int64_t ps, const void *x, float *y, int64_t K, \
                                                        int64_t N, int lo, int hi, int pf, const mv_tile *q) {         \
        if (F == 2)                                                                                                    \
            tile_q8(w, ps, x, y, K, N, q, P, T, lo, hi, pf);                                                           \
        else                                                                                                           \
            tile_panel(w, ps, x, y, K, N, P, T, F, lo, hi, pf, q);                                                     \
    }
#define TILE_PANELS(F)                                                                                                 \
    TILE_PANEL(1, 1, F)                                                                                                \
    TILE_PANEL(1, 2, F)                                                                                                \
    TILE_PANEL(1, 3, F)                                                                                                \
    TILE_PANEL(1, 4, F)                                                                                                \
    TILE_PANEL(1, 5, F)                                                                                                \
    TILE_PANEL(1, 6, F)                                                                                                \
    TILE_PANEL(1, 7, F)                                                                                                \
    TILE_PANEL(1, 8, F)                                                                                                \
    TILE_PANEL(2, 1, F)                                                                                                \
    TILE_PANEL(2, 2, F)                                                                                                \
    TILE_PANEL(2, 3, F)                                                                                                \
    TILE_PANEL(2, 4, F)
TILE_PANELS(0)
TILE_PANELS(1)
TILE_PANELS(2)
#define TILE_ROW(F)                                                                                                    \
    {                                                                                                                  \
        {tile_panel_1_1_##F, tile_panel_1_2_##F, tile_panel_1_3_##F, tile_panel_1_4_##F,                               \
         tile_panel_1_5_##F, tile_panel_1_6_##F, tile_panel_1_7_##F, tile_panel_1_8_##F},                              \
        {                                                                                                              \
            tile_panel_2_1_##F, tile_panel_2_2_##F, tile_panel_2_3_##F, tile_panel_2_4_##F                             \
        }                                                                                                              \
    }
/* [format: fp32, bf16, int8][P - 1][T - 1] */
static const tile_panel_fn tiles_panel[3][2][MV_PT] = {TILE_ROW(0), TILE_ROW(1), TILE_ROW(2)};

/* Rows [n0, n1) for every token of a weight in panels: panel after panel, each against the
 * tokens in near-equal register tiles of at most 8, or, for up to 4 tokens, two whole panels at
 * a time. */
static void run_panels(const nl_mv_weight *wt, const nl_mv_act *act, float *y, int64_t n0, int64_t n1) {
    const int f = wt->q8_panels ? 2 : wt->bf16_panels ? 1 : 0;
    const int64_t M = act->M, N = wt->rows;
    /* K: the row length of the panels' columns and of x; ps: elements per panel */
    const int64_t K = f == 2 ? wt->q8.k_pad : wt->cols, ps = NL_MV_PANEL * (f == 1 ? K + (K & 1) : K);
    const char *base = f == 2 ? (const char *)wt->q8_panels
                       : f    ? (const char *)wt->bf16_panels
                              : (const char *)wt->f32_panels;
    const size_t esz = f == 2 ? 1 : f ? sizeof(uint16_t) : sizeof(float);
    const char *x = f == 2 ? (const char *)act->qu : (const char *)act->x;
    const size_t xsz = f == 2 ? 1 : sizeof(float);
    const int64_t ntile = (M + MV_PT - 1) / MV_PT, tb = M / ntile, extra = M % ntile;
    for (int64_t p = n0 / NL_MV_PANEL; p * NL_MV_PANEL < n1; p++) {
        const int64_t r0 = p * NL_MV_PANEL;
        const int lo = (int)(n0 > r0 ? n0 - r0 : 0), hi = (int)(n1 - r0 < NL_MV_PANEL ? n1 - r0 : NL_MV_PANEL);
        const void *wp = base + (size_t)(p * ps) * esz;
        mv_tile q = {act->scale, f == 2 ? wt->q8.w_sum + r0 : NULL, f == 2 ? wt->q8.w_scale + r0 : NULL, NULL, 0};
        if (M <= 4 && lo == 0 && r0 + 2 * NL_MV_PANEL <= n1) { /* this panel and the next, whole */
            tiles_panel[f][1][M - 1](wp, ps, x, y + r0, K, N, 0, NL_MV_PANEL, 1, &q);
            p++;
            continue;
        }
        /* passes after the first prefetch the next panel of this range, each its share */
        const int64_t it = f == 0 ? K : f == 1 ? K / 2 : K / 4, lines = ps * (int64_t)esz / 64;
        const int next = ntile > 1 && it > 0 && r0 + NL_MV_PANEL < n1;
        const int64_t nl = next ? (lines + (ntile - 1) * it - 1) / ((ntile - 1) * it) : 0;
        for (int64_t m = 0, i = 0; i < ntile; i++) {
            const int64_t T = tb + (i < extra);
            q.xs = act->scale ? act->scale + m : NULL;
            q.nx = next && i > 0 ? (const char *)wp + ps * (int64_t)esz + (i - 1) * it * nl * 64 : NULL;
            q.nl = (int)nl;
            tiles_panel[f][0][T - 1](wp, ps, x + (size_t)(m * K) * xsz, y + m * N + r0, K, N, lo, hi, i == 0, &q);
            m += T;
        }
    }
}

/* AVX2, fp32 and bf16 weights in the same panels as AVX-512 (see "Panels" above): a panel column
 * is 6 vectors of 8 rows (192 bytes, 3 cache lines). Every (row, token) output is the same fused
 * multiply-add chain over k = 0 .. K - 1 from +0 as on AVX-512 and in portable C, so the three
 * give the same bits. With 16 registers a tile is either a whole panel (V = 6 vectors) against
 * T <= 2 tokens, or for one token two adjacent panels (two sequential streams, as on AVX-512),
 * or a slice of 16 rows (V = 2 vectors from vector J0; the slice's cache line of each column)
 * against up to 6 tokens, or of 24 rows (V = 3) against up to 4 tokens when there are at most 8
 * (12 accumulators either way: 8, as 2 x 4 tokens, left the FMA latency showing). Slices of one
 * panel are passes over it, and each pass also prefetches its share of the next panel into L2,
 * so memory streams while the tiles compute; only a range's first panel is read from memory by
 * its first pass. (One thread, CPU time, 2048 x 768: 8 tokens 30 -> 54 GFLOP/s, 32 tokens 70 ->
 * 91, when the first pass of every panel read it from memory.) */
enum { AV_V = NL_MV_PANEL / 8, AV_T = 6, AV_KB = 128, AV_PASSES = 3 * 6 };

/* Vector j (8 rows) of column k of a panel: fp32, or bf16 widened (column 2i in the low half of
 * its pair's lane, 2i + 1 in the high half). */
TGT_AVX2 INLINE __m256 av2_w(const void *wp, const int bf, int64_t k, int j) {
    if (!bf) return _mm256_loadu_ps((const float *)wp + k * NL_MV_PANEL + 8 * j);
    const __m256i raw =
        _mm256_loadu_si256((const __m256i *)(const void *)((const uint16_t *)wp + (k >> 1) * 2 * NL_MV_PANEL + 16 * j));
    return _mm256_castsi256_ps((k & 1) ? _mm256_and_si256(raw, _mm256_set1_epi32((int)0xFFFF0000u))
                                       : _mm256_slli_epi32(raw, 16));
}

/* P panels (ps elements apart) x T tokens, vectors J0 .. J0 + V - 1 of each column; y: the
 * panel's row 0 of the first token; rows [lo, hi) of the P x 48 are stored. */
TGT_AVX2 INLINE void tile_av2(const void *w, int64_t ps, const float *x, float *y, int64_t K, int64_t N, const int P,
                              const int T, const int V, int J0, const int bf, int lo, int hi, int pf, const char *nx,
                              int64_t nl, int64_t k0, int64_t k1, float *part) {
    __m256 acc[12];
    const size_t esz = bf ? sizeof(uint16_t) : sizeof(float);
    int64_t due = 0; /* nx: nl lines of the next panel spread over the K steps, into L2 */
    /* columns k0 .. k1 - 1; the sums of columns before k0 are in part (8 floats per accumulator),
     * where they go again unless k1 is K: the same chain, paused and resumed */
#pragma GCC unroll 12
    for (int a = 0; a < P * T * V; a++) acc[a] = k0 ? _mm256_loadu_ps(part + 8 * a) : _mm256_setzero_ps();
    for (int64_t k = k0; k < k1; k++) {
        if (pf && (!bf || !(k & 1)))
            for (int p = 0; p < P; p++) {
                const char *c = (const char *)w + (size_t)(p * ps) * esz + (size_t)(bf ? k >> 1 : k) * 192;
#pragma GCC unroll 3
                for (int l = 0; l < 3; l++) {
                    _mm_prefetch(c + 64 * l + MV_PF_L1, _MM_HINT_T0);
                    _mm_prefetch(c + 64 * l + MV_PF_L2, _MM_HINT_T1);
                }
            }
        if (nx)
            for (due += nl; due >= k1 - k0; due -= k1 - k0, nx += 64) _mm_prefetch(nx, _MM_HINT_T1);
        if (V == AV_V) { /* whole panels: each weight vector loaded once, T broadcasts held */
            __m256 xb[2];
#pragma GCC unroll 2
            for (int t = 0; t < T; t++) xb[t] = _mm256_broadcast_ss(x + t * K + k);
#pragma GCC unroll 2
            for (int p = 0; p < P; p++)
#pragma GCC unroll 6
                for (int j = 0; j < V; j++) {
                    const __m256 wv = av2_w((const char *)w + (size_t)(p * ps) * esz, bf, k, J0 + j);
#pragma GCC unroll 2
                    for (int t = 0; t < T; t++)
                        acc[(p * T + t) * V + j] = _mm256_fmadd_ps(wv, xb[t], acc[(p * T + t) * V + j]);
                }
        } else { /* a slice: its vectors held, one broadcast at a time */
            __m256 wv[3];
#pragma GCC unroll 3
            for (int j = 0; j < V; j++) {
                wv[j] = av2_w(w, bf, k, J0 + j);
                /* held in a register: GCC would otherwise fold the load into each of the T
                 * multiply-adds, and T loads of each vector made the 24-row slice load-bound */
                __asm__("" : "+x"(wv[j]));
            }
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) {
                const __m256 xb = _mm256_broadcast_ss(x + t * K + k);
#pragma GCC unroll 3
                for (int j = 0; j < V; j++) acc[t * V + j] = _mm256_fmadd_ps(wv[j], xb, acc[t * V + j]);
            }
        }
    }
    if (k1 < K) {
#pragma GCC unroll 12
        for (int a = 0; a < P * T * V; a++) _mm256_storeu_ps(part + 8 * a, acc[a]);
        return;
    }
#pragma GCC unroll 2
    for (int p = 0; p < P; p++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++)
#pragma GCC unroll 6
            for (int j = 0; j < V; j++) {
                const int r = p * NL_MV_PANEL + 8 * (J0 + j);
                float *yo = y + t * N + r;
                if (r >= lo && r + 8 <= hi) {
                    _mm256_storeu_ps(yo, acc[(p * T + t) * V + j]);
                } else if (r < hi && r + 8 > lo) {
                    float tmp[8];
                    _mm256_storeu_ps(tmp, acc[(p * T + t) * V + j]);
                    for (int i = 0; i < 8; i++)
                        if (r + i >= lo && r + i < hi) yo[i] = tmp[i];
                }
            }
}

typedef void (*tile_av2_fn)(const void *w, int64_t ps, const float *x, float *y, int64_t K, int64_t N, int J0, int lo,
                            int hi, int pf, const char *nx, int64_t nl, int64_t k0, int64_t k1, float *part);
#define TILE_AV2(P, T, V, F)                                                                                           \
    TGT_AVX2 static void tile_av2_##P##_##T##_##V##_##F(                                                               \
        const void *w, int64_t ps, const float *x, float *y, int64_t K, int64_t N, int J0, int lo, int hi, int pf,     \
        const char *nx, int64_t nl, int64_t k0, int64_t k1, float *part) {                                             \
        tile_av2(w, ps, x, y, K, N, P, T, V, J0, F, lo, hi, pf, nx, nl, k0, k1, part);                                 \
    }
#define TILES_AV2(F)                                                                                                   \
    TILE_AV2(2, 1, 6, F)                                                                                               \
    TILE_AV2(1, 1, 6, F)                                                                                               \
    TILE_AV2(1, 2, 6, F)                                                                                               \
    TILE_AV2(1, 1, 2, F)                                                                                               \
    TILE_AV2(1, 2, 2, F)                                                                                               \
    TILE_AV2(1, 3, 2, F)                                                                                               \
    TILE_AV2(1, 4, 2, F)                                                                                               \
    TILE_AV2(1, 5, 2, F)                                                                                               \
    TILE_AV2(1, 6, 2, F)                                                                                               \
    TILE_AV2(1, 1, 3, F)                                                                                               \
    TILE_AV2(1, 2, 3, F)                                                                                               \
    TILE_AV2(1, 3, 3, F)                                                                                               \
    TILE_AV2(1, 4, 3, F)
TILES_AV2(0)
TILES_AV2(1)
/* [fp32, bf16]: two panels x 1 token, a panel x 1 or 2 tokens, a slice x 1 .. 6 tokens */
static const tile_av2_fn tiles_av2_two[2] = {tile_av2_2_1_6_0, tile_av2_2_1_6_1};
static const tile_av2_fn tiles_av2_panel[2][2] = {{tile_av2_1_1_6_0, tile_av2_1_2_6_0},
                                                  {tile_av2_1_1_6_1, tile_av2_1_2_6_1}};
static const tile_av2_fn tiles_av2_slice[2][AV_T] = {
    {tile_av2_1_1_2_0, tile_av2_1_2_2_0, tile_av2_1_3_2_0, tile_av2_1_4_2_0, tile_av2_1_5_2_0, tile_av2_1_6_2_0},
    {tile_av2_1_1_2_1, tile_av2_1_2_2_1, tile_av2_1_3_2_1, tile_av2_1_4_2_1, tile_av2_1_5_2_1, tile_av2_1_6_2_1}};
/* [fp32, bf16]: a slice of 24 rows x 1 .. 4 tokens (up to 8 tokens: 12 accumulators in 2 passes) */
static const tile_av2_fn tiles_av2_slice3[2][4] = {
    {tile_av2_1_1_3_0, tile_av2_1_2_3_0, tile_av2_1_3_3_0, tile_av2_1_4_3_0},
    {tile_av2_1_1_3_1, tile_av2_1_2_3_1, tile_av2_1_3_3_1, tile_av2_1_4_3_1}};

/* Rows [n0, n1) for every token, fp32 or bf16 panels on AVX2. */
static void run_panels_avx2(const nl_mv_weight *wt, const nl_mv_act *act, float *y, int64_t n0, int64_t n1) {
    const int bf = wt->bf16_panels != NULL;
    const int64_t M = act->M, N = wt->rows, K = wt->cols, ps = NL_MV_PANEL * (bf ? K + (K & 1) : K);
    const char *base = bf ? (const char *)wt->bf16_panels : (const char *)wt->f32_panels;
    const size_t esz = bf ? sizeof(uint16_t) : sizeof(float);
    /* up to 8 tokens: slices of 3 vectors (24 rows) x up to 4 tokens; more: 2 vectors x up to 6 */
    const int sv = M <= 8 ? 3 : 2, tmax = sv == 3 ? 4 : AV_T, sr = 8 * sv;
    const int64_t ntile = (M + tmax - 1) / tmax, tb = M / ntile, extra = M % ntile;
    int prefetched = 0; /* whether the previous block's passes brought this one into L2 */
    for (int64_t p = n0 / NL_MV_PANEL; p * NL_MV_PANEL < n1; p++) {
        const int64_t r0 = p * NL_MV_PANEL;
        const int lo = (int)(n0 > r0 ? n0 - r0 : 0), hi = (int)(n1 - r0 < NL_MV_PANEL ? n1 - r0 : NL_MV_PANEL);
        const void *wp = base + (size_t)(p * ps) * esz;
        if (M == 1 && lo == 0 && r0 + 2 * NL_MV_PANEL <= n1) { /* this panel and the next, whole */
            tiles_av2_two[bf](wp, ps, act->x, y + r0, K, N, 0, 0, 2 * NL_MV_PANEL, 1, NULL, 0, 0, K, NULL);
            p++;
            continue;
        }
        if (M <= 2) {
            tiles_av2_panel[bf][M - 1](wp, ps, act->x, y + r0, K, N, 0, lo, hi, 1, NULL, 0, 0, K, NULL);
            continue;
        }
        /* the slices' passes over a block of KB columns at a time (a sum paused at a block's end
         * resumes at the next: the same chain): the block stays in L1 for every pass after the
         * first, which streams it from memory with its prefetches running ahead into the next
         * block and, at the panel's end, the next panel */
        float part[AV_PASSES][12 * 8];
        const int64_t passes = ((hi - 1) / sr - lo / sr + 1) * ntile, kb = sv == 3 && passes <= AV_PASSES ? AV_KB : K;
        const int64_t col = NL_MV_PANEL * (int64_t)esz; /* bytes of one column of the panel */
        for (int64_t k0 = 0; k0 < K; k0 += kb) {
            const int64_t k1 = K - k0 <= kb ? K : k0 + kb;
            /* the next block of this panel, or the next panel's first, into L2 while this one
             * computes: its lines spread over every pass */
            const char *nx = NULL;
            int64_t lines = 0;
            if (k1 < K) {
                nx = (const char *)wp + k1 * col;
                lines = ((K - k1 < kb ? K - k1 : kb) * col + 63) / 64;
            } else if (r0 + NL_MV_PANEL < N) {
                nx = (const char *)wp + ps * (int64_t)esz;
                lines = ((K < kb ? K : kb) * col + 63) / 64;
            }
            const int64_t nl = nx ? (lines + passes - 1) / passes : 0;
            int pass = 0;
            for (int s = 0; s < AV_V / sv; s++) {
                if (sr * s >= hi || sr * s + sr <= lo) continue;
                for (int64_t m = 0, i = 0; i < ntile; i++, pass++) {
                    const int64_t T = tb + (i < extra);
                    const int64_t off = pass * nl, mine = off >= lines ? 0 : lines - off < nl ? lines - off : nl;
                    (sv == 3 ? tiles_av2_slice3[bf][T - 1] : tiles_av2_slice[bf][T - 1])(
                        wp, ps, act->x + m * K, y + m * N + r0, K, N, sv * s, lo, hi, pass == 0 && !prefetched,
                        mine ? nx + off * 64 : NULL, mine, k0, k1,
                        kb < K ? part[pass] : NULL); /* whole K: no sum to pause */
                    m += T;
                }
            }
            prefetched = nx != NULL;
            if (k1 == K) break;
        }
    }
}

#endif /* __x86_64__ */

#if defined(__aarch64__)
/* NEON, fp32 and bf16 weights in the same panels (see "Panels" above): a panel column is 12
 * vectors of 4 rows. Every (row, token) output is the same fused multiply-add chain over k = 0 ..
 * K - 1 from +0 (vfmaq_f32) as on the x86 paths and in portable C. With 32 registers a tile is a
 * whole panel (V = 12) against T <= 2 tokens or, for one token, two adjacent panels; or a slice
 * of 16 rows (V = 4 from vector J0) against up to 6 tokens: at most 24 accumulators. */
enum { NE_V = NL_MV_PANEL / 4, NE_T = 6 };

INLINE float32x4_t ne_w(const void *wp, const int bf, int64_t k, int j) {
    if (!bf) return vld1q_f32((const float *)wp + k * NL_MV_PANEL + 4 * j);
    const uint32x4_t raw =
        vld1q_u32((const uint32_t *)(const void *)((const uint16_t *)wp + (k >> 1) * 2 * NL_MV_PANEL) + 4 * j);
    return vreinterpretq_f32_u32((k & 1) ? vandq_u32(raw, vdupq_n_u32(0xFFFF0000u)) : vshlq_n_u32(raw, 16));
}

INLINE void tile_ne(const void *w, int64_t ps, const float *x, float *y, int64_t K, int64_t N, const int P, const int T,
                    const int V, int J0, const int bf, int lo, int hi) {
    float32x4_t acc[24];
    const size_t esz = bf ? sizeof(uint16_t) : sizeof(float);
    for (int a = 0; a < P * T * V; a++) acc[a] = vdupq_n_f32(0.0f);
    for (int64_t k = 0; k < K; k++) {
        if (V == NE_V) { /* whole panels: each weight vector loaded once, T <= 2 broadcasts held */
            float32x4_t xb[2];
            for (int t = 0; t < T; t++) xb[t] = vdupq_n_f32(x[t * K + k]);
            for (int p = 0; p < P; p++)
                for (int j = 0; j < V; j++) {
                    const float32x4_t wv = ne_w((const char *)w + (size_t)(p * ps) * esz, bf, k, J0 + j);
                    for (int t = 0; t < T; t++)
                        acc[(p * T + t) * V + j] = vfmaq_f32(acc[(p * T + t) * V + j], wv, xb[t]);
                }
        } else { /* a slice: its 4 vectors held, one broadcast at a time */
            float32x4_t wv[4];
            for (int j = 0; j < V; j++) wv[j] = ne_w(w, bf, k, J0 + j);
            for (int t = 0; t < T; t++) {
                const float32x4_t xb = vdupq_n_f32(x[t * K + k]);
                for (int j = 0; j < V; j++) acc[t * V + j] = vfmaq_f32(acc[t * V + j], wv[j], xb);
            }
        }
    }
    for (int p = 0; p < P; p++)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < V; j++) {
                const int r = p * NL_MV_PANEL + 4 * (J0 + j);
                float tmp[4];
                vst1q_f32(tmp, acc[(p * T + t) * V + j]);
                for (int i = 0; i < 4; i++)
                    if (r + i >= lo && r + i < hi) y[t * N + r + i] = tmp[i];
            }
}

typedef void (*tile_ne_fn)(const void *w, int64_t ps, const float *x, float *y, int64_t K, int64_t N, int J0, int lo,
                           int hi);
#define TILE_NE(P, T, V, F)                                                                                            \
    static void tile_ne_##P##_##T##_##V##_##F(const void *w, int64_t ps, const float *x, float *y, int64_t K,          \
                                              int64_t N, int J0, int lo, int hi) {                                     \
        tile_ne(w, ps, x, y, K, N, P, T, V, J0, F, lo, hi);                                                            \
    }
#define TILES_NE(F)                                                                                                    \
    TILE_NE(2, 1, 12, F)                                                                                               \
    TILE_NE(1, 1, 12, F)                                                                                               \
    TILE_NE(1, 2, 12, F)                                                                                               \
    TILE_NE(1, 1, 4, F)                                                                                                \
    TILE_NE(1, 2, 4, F)                                                                                                \
    TILE_NE(1, 3, 4, F)                                                                                                \
    TILE_NE(1, 4, 4, F)                                                                                                \
    TILE_NE(1, 5, 4, F)                                                                                                \
    TILE_NE(1, 6, 4, F)
TILES_NE(0)
TILES_NE(1)
static const tile_ne_fn tiles_ne_two[2] = {tile_ne_2_1_12_0, tile_ne_2_1_12_1};
static const tile_ne_fn tiles_ne_panel[2][2] = {{tile_ne_1_1_12_0, tile_ne_1_2_12_0},
                                                {tile_ne_1_1_12_1, tile_ne_1_2_12_1}};
static const tile_ne_fn tiles_ne_slice[2][NE_T] = {
    {tile_ne_1_1_4_0, tile_ne_1_2_4_0, tile_ne_1_3_4_0, tile_ne_1_4_4_0, tile_ne_1_5_4_0, tile_ne_1_6_4_0},
    {tile_ne_1_1_4_1, tile_ne_1_2_4_1, tile_ne_1_3_4_1, tile_ne_1_4_4_1, tile_ne_1_5_4_1, tile_ne_1_6_4_1}};

/* Rows [n0, n1) for every token, fp32 or bf16 panels on NEON (the tiling of run_panels_avx2). */
static void run_panels_neon(const nl_mv_weight *wt, const nl_mv_act *act, float *y, int64_t n0, int64_t n1) {
    const int bf = wt->bf16_panels != NULL;
    const int64_t M = act->M, N = wt->rows, K = wt->cols, ps = NL_MV_PANEL * (bf ? K + (K & 1) : K);
    const char *base = bf ? (const char *)wt->bf16_panels : (const char *)wt->f32_panels;
    const size_t esz = bf ? sizeof(uint16_t) : sizeof(float);
    const int64_t ntile = (M + NE_T - 1) / NE_T, tb = M / ntile, extra = M % ntile;
    for (int64_t p = n0 / NL_MV_PANEL; p * NL_MV_PANEL < n1; p++) {
        const int64_t r0 = p * NL_MV_PANEL;
        const int lo = (int)(n0 > r0 ? n0 - r0 : 0), hi = (int)(n1 - r0 < NL_MV_PANEL ? n1 - r0 : NL_MV_PANEL);
        const void *wp = base + (size_t)(p * ps) * esz;
        if (M == 1 && lo == 0 && r0 + 2 * NL_MV_PANEL <= n1) {
            tiles_ne_two[bf](wp, ps, act->x, y + r0, K, N, 0, 0, 2 * NL_MV_PANEL);
            p++;
            continue;
        }
        if (M <= 2) {
            tiles_ne_panel[bf][M - 1](wp, ps, act->x, y + r0, K, N, 0, lo, hi);
            continue;
        }
        for (int s = 0; s < NE_V / 4; s++) {
            if (16 * s >= hi || 16 * s + 16 <= lo) continue;
            for (int64_t m = 0, i = 0; i < ntile; i++) {
                const int64_t T = tb + (i < extra);
                tiles_ne_slice[bf][T - 1](wp, ps, act->x + m * K, y + m * N + r0, K, N, 4 * s, lo, hi);
                m += T;
            }
        }
    }
}

/* INT8 on NEON: one row against T <= 4 tokens, int32 sums (exact, any order: the bits of
 * q8_portable). With dotprod, sdot adds 4 products per int32 lane; without, smull / smull2 give
 * int16 products (at most 128 x 127) and sadalp adds their pairs into int32 lanes. */
#define TGT_DOT __attribute__((target("arch=armv8.2-a+dotprod")))
INLINE void q8_ne_store(const nl_qlinear *l, const nl_mv_act *a, float *y, int64_t n, int64_t m0, const int T,
                        const int32x4_t *acc) {
    for (int t = 0; t < T; t++)
        y[(m0 + t) * l->out_features + n] = (float)vaddvq_s32(acc[t]) * (a->scale[m0 + t] * l->w_scale[n]);
}
TGT_DOT INLINE void q8_ne_dot_tile(const nl_qlinear *l, const nl_mv_act *a, float *y, int64_t n, int64_t m0,
                                   const int T) {
    const int64_t kp = l->k_pad;
    const int8_t *w = l->w + n * kp;
    int32x4_t acc[4];
    for (int t = 0; t < T; t++) acc[t] = vdupq_n_s32(0);
    for (int64_t k = 0; k < kp; k += 16) {
        const int8x16_t wv = vld1q_s8(w + k);
        for (int t = 0; t < T; t++) acc[t] = vdotq_s32(acc[t], wv, vld1q_s8(a->q + (m0 + t) * kp + k));
    }
    q8_ne_store(l, a, y, n, m0, T, acc);
}
INLINE void q8_ne_tile(const nl_qlinear *l, const nl_mv_act *a, float *y, int64_t n, int64_t m0, const int T) {
    const int64_t kp = l->k_pad;
    const int8_t *w = l->w + n * kp;
    int32x4_t acc[4];
    for (int t = 0; t < T; t++) acc[t] = vdupq_n_s32(0);
    for (int64_t k = 0; k < kp; k += 16) {
        const int8x16_t wv = vld1q_s8(w + k);
        for (int t = 0; t < T; t++) {
            const int8x16_t xv = vld1q_s8(a->q + (m0 + t) * kp + k);
            acc[t] = vpadalq_s16(acc[t], vmull_s8(vget_low_s8(wv), vget_low_s8(xv)));
            acc[t] = vpadalq_s16(acc[t], vmull_high_s8(wv, xv));
        }
    }
    q8_ne_store(l, a, y, n, m0, T, acc);
}
#define Q8_NE(T)                                                                                                       \
    TGT_DOT static void q8_ne_dot_##T(const nl_qlinear *l, const nl_mv_act *a, float *y, int64_t n, int64_t m) {       \
        q8_ne_dot_tile(l, a, y, n, m, T);                                                                              \
    }                                                                                                                  \
    static void q8_ne_##T(const nl_qlinear *l, const nl_mv_act *a, float *y, int64_t n, int64_t m) {                   \
        q8_ne_tile(l, a, y, n, m, T);                                                                                  \
    }
Q8_NE(1)
Q8_NE(2)
Q8_NE(3)
Q8_NE(4)
typedef void (*q8_tile_fn)(const nl_qlinear *, const nl_mv_act *, float *, int64_t, int64_t);
static const q8_tile_fn q8_ne_tiles[2][4] = {{q8_ne_1, q8_ne_2, q8_ne_3, q8_ne_4},
                                             {q8_ne_dot_1, q8_ne_dot_2, q8_ne_dot_3, q8_ne_dot_4}};
#endif /* __aarch64__ */

/* Rows [n0, n1) for every token of fp32 or bf16 panels on AVX2 or NEON. */
static void run_panels_simd(const nl_mv_weight *wt, const nl_mv_act *act, float *y, int64_t n0, int64_t n1) {
#if defined(__x86_64__)
    if (wt->path == NL_MV_AVX512)
        run_panels(wt, act, y, n0, n1);
    else
        run_panels_avx2(wt, act, y, n0, n1);
#elif defined(__aarch64__)
    run_panels_neon(wt, act, y, n0, n1);
#else
    (void)wt, (void)act, (void)y, (void)n0, (void)n1; /* no SIMD path is available here */
#endif
}

/* Rows [n0, n1) for tokens [m0, m1) of fp32 or bf16 rows (the portable path): tiles of up to
 * 4 rows x 4 tokens. */
static void run_block(const mv_args *a, int64_t n0, int64_t n1, int64_t m0, int64_t m1) {
    for (int64_t n = n0; n < n1; n += MV_RB)
        for (int64_t m = m0; m < m1; m += MV_TB)
            tile_portable(a, n, (int)(n1 - n < MV_RB ? n1 - n : MV_RB), m, (int)(m1 - m < MV_TB ? m1 - m : MV_TB));
}

/* ---- int8 ----------------------------------------------------------------------------------
 * W8A8 on the layer's codes (N, k_pad), zero padded, and the tokens' codes (M, k_pad) of
 * nl_mv_act: one int32 accumulator per (row, token) pair (exact, so the order never matters),
 * then y = (float)sum * (token scale * row scale), the formula of nl_qlinear_forward. VNNI
 * (vpdpbusd) takes the activations as unsigned (codes + 128) and subtracts 128 * sum(row). */

#if defined(__x86_64__) /* the VNNI and AVX2 int8 kernels */
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

/* INT8 on AVX2 without VNNI: vpmaddubsw multiplies unsigned by signed bytes, so each weight's
 * sign moves onto the activation (|w| x sign(w) x, vpabsb / vpsignb); |w| <= 128 and the
 * activation codes lie in [-127, 127], so a pair's sum stays within 2 x 128 x 127 = 32512 and the
 * int16 never saturates; vpmaddwd by ones widens the pairs to int32. The sums are exact, so any
 * order gives the same bits as q8_portable and VNNI. A tile is one row (a sequential stream of
 * its codes) against T <= 4 tokens, the row's |w| computed once for all of them. */
TGT_AVX2 INLINE void q8_avx2_tile(const nl_qlinear *l, const nl_mv_act *a, float *y, int64_t n, int64_t m0,
                                  const int T) {
    const int64_t kp = l->k_pad;
    const int8_t *w = l->w + n * kp;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_si256();
    for (int64_t k = 0; k < kp; k += 32) {
        const __m256i wv = _mm256_loadu_si256((const __m256i *)(const void *)(w + k));
        const __m256i wa = _mm256_abs_epi8(wv);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(a->q + (m0 + t) * kp + k));
            const __m256i p = _mm256_maddubs_epi16(wa, _mm256_sign_epi8(xv, wv));
            acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(p, ones));
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc[t]), _mm256_extracti128_si256(acc[t], 1));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
        y[(m0 + t) * l->out_features + n] = (float)_mm_cvtsi128_si32(s) * (a->scale[m0 + t] * l->w_scale[n]);
    }
}
TGT_AVX2 static void q8_avx2_1(const nl_qlinear *l, const nl_mv_act *a, float *y, int64_t n, int64_t m) {
    q8_avx2_tile(l, a, y, n, m, 1);
}
TGT_AVX2 static void q8_avx2_2(const nl_qlinear *l, const nl_mv_act *a, float *y, int64_t n, int64_t m) {
    q8_avx2_tile(l, a, y, n, m, 2);
}
TGT_AVX2 static void q8_avx2_3(const nl_qlinear *l, const nl_mv_act *a, float *y, int64_t n, int64_t m) {
    q8_avx2_tile(l, a, y, n, m, 3);
}
TGT_AVX2 static void q8_avx2_4(const nl_qlinear *l, const nl_mv_act *a, float *y, int64_t n, int64_t m) {
    q8_avx2_tile(l, a, y, n, m, 4);
}
typedef void (*q8_tile_fn)(const nl_qlinear *, const nl_mv_act *, float *, int64_t, int64_t);
static const q8_tile_fn q8_avx2_tiles[4] = {q8_avx2_1, q8_avx2_2, q8_avx2_3, q8_avx2_4};

#endif /* __x86_64__ */

static void q8_portable(const nl_qlinear *l, const nl_mv_act *a, float *y, int64_t n, int64_t m) {
    const int64_t kp = l->k_pad;
    const int8_t *w = l->w + n * kp, *x = a->q + m * kp;
    int32_t s = 0;
    for (int64_t k = 0; k < kp; k++) s += (int32_t)w[k] * (int32_t)x[k];
    y[m * l->out_features + n] = (float)s * (a->scale[m] * l->w_scale[n]);
}

/* Rows [n0, n1) for tokens [m0, m1) of an int8 weight. */
static void run_block_int8(const nl_qlinear *l, nl_mv_path path, const nl_mv_act *a, float *y, int64_t n0, int64_t n1,
                           int64_t m0, int64_t m1) {
#if defined(__aarch64__)
    if (path == NL_MV_NEON) { /* row after row, each against tiles of up to 4 tokens */
        const q8_tile_fn *tiles = q8_ne_tiles[nl_isa_has_ext("dotprod")];
        for (int64_t n = n0; n < n1; n++)
            for (int64_t m = m0; m < m1; m += 4) tiles[(m1 - m < 4 ? m1 - m : 4) - 1](l, a, y, n, m);
        return;
    }
#endif
    (void)path;
#if defined(__x86_64__)
    if (l->path == NL_QDOT_AVX2) { /* row after row, each against tiles of up to 4 tokens */
        for (int64_t n = n0; n < n1; n++)
            for (int64_t m = m0; m < m1; m += 4) q8_avx2_tiles[(m1 - m < 4 ? m1 - m : 4) - 1](l, a, y, n, m);
        return;
    }
#endif
    if (l->path != NL_QDOT_VNNI) {
        for (int64_t n = n0; n < n1; n++)
            for (int64_t m = m0; m < m1; m++) q8_portable(l, a, y, n, m);
        return;
    }
#if defined(__x86_64__)
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
#endif
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

nl_status nl_mv_weight_init_q4_0(nl_mv_weight *wt, const void *blocks, int64_t N, int64_t K) {
    memset(wt, 0, sizeof *wt);
    if (N < 1 || K < 1 || K % Q4_G)
        return nl_fail(NL_ERR_INVALID,
                       "int4 matvec weight from Q4_0: %lld x %lld is not rows of whole 32-column blocks", (long long)N,
                       (long long)K);
    wt->rows = N;
    wt->cols = K;
    wt->fmt = NL_WFMT_INT4;
    wt->path = nl_mv_auto();
    const int64_t G = K / Q4_G;
    wt->groups = G;
    wt->q4 = nl_malloc((size_t)(N * G) * 16, "int4 matvec codes");
    wt->q4_d = nl_malloc((size_t)(N * G) * sizeof(uint16_t), "int4 matvec scales");
    if (!wt->q4 || !wt->q4_d) {
        nl_mv_weight_free(wt);
        return NL_ERR_NOMEM;
    }
    const uint8_t *b = blocks;
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < G; g++, b += 18) {
            uint16_t d = (uint16_t)(b[0] | b[1] << 8);
            if ((d & 0x7C00) == 0x7C00) {
                nl_mv_weight_free(wt);
                return nl_fail(NL_ERR_INVALID,
                               "int4 matvec weight from Q4_0: row %lld, block %lld has a non-finite scale",
                               (long long)n, (long long)g);
            }
            wt->q4_d[n * G + g] = d;
            uint8_t *row = wt->q4 + n * G * 16;
            for (int i = 0; i < 16; i++) row[q4_byte_at(G, g, i)] = b[2 + i];
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

#if defined(__x86_64__) /* the VNNI and AVX2 int4 kernels */
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

#define TGT_Q4_AVX2 __attribute__((target("avx2,fma,f16c")))
enum { Q4_PF = 2048 }; /* bytes of codes prefetched ahead (8 chunks of 16 groups) */

/* INT4 on AVX2: the VNNI tile's operations on 8 lanes (groups) at a time. Per chunk of 16 groups
 * and half h (groups 8h .. 8h + 7 in the 8 int32 lanes), each slice's 32 bytes split into low
 * and high nibbles (unsigned 0..15); vpmaddubsw against the token's codes (nl_mv_act's q4x,
 * |code| <= 127) gives pairs of at most 2 x 15 x 127 = 3810, so the 8 products of a slice pair
 * add up in int16 (at most 30480) and one vpmaddwd by ones gives each group's sum of its 32
 * nibble x code products in its lane, exact; minus 8 x the group's code sum: isum_g. Then acc_h
 * += (float)isum_g * d_g lane by lane (lane j of half h is q4_pair_portable's acc[8h + j]), and
 * the tree adds acc_0 + acc_1 (j + j^8), then the 128-bit halves (j^4), then j^2 and j^1: the
 * bits of q4_pair_portable. A short last chunk (slices of 4 x ng bytes) is read in place: a
 * half with no groups is skipped and a partial one loaded with its lanes past the row masked to
 * zero codes and scales (they would add +0 to a lane, which never changes it; copying the chunk
 * into a padded one first made K = 768 rows 2.7x slower per weight than K = 2048). A tile is one
 * row against T <= 4 tokens. */
TGT_Q4_AVX2 INLINE void q4_avx2_tile(const uint8_t *w, const uint16_t *d, int64_t G, const nl_mv_act *a, int64_t m0,
                                     float *y, int64_t N, const int T) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const int64_t kp = a->kp, g16 = kp / Q4_G;
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g += 16) {
        const int64_t ng = G - g < 16 ? G - g : 16; /* a short last chunk's slices are 4 x ng bytes */
        const uint8_t *wc = w + g * 16;
        const uint16_t *dc = d + g;
        /* the codes and scales a few chunks on (rows lie back to back: on into the next row): the
         * weight loads waited on memory without it */
#pragma GCC unroll 4
        for (int l = 0; l < 4; l++) _mm_prefetch((const char *)wc + Q4_PF + 64 * l, _MM_HINT_T0);
        _mm_prefetch((const char *)dc + Q4_PF / 8, _MM_HINT_T0);
        for (int h = 0; h < 2; h++) {
            const int nh = (int)(ng - 8 * h < 8 ? ng - 8 * h : 8); /* groups (32-bit lanes) in this half */
            if (nh <= 0) break; /* its lanes would add +0, which never changes a lane */
            __m256i wl[4], wh[4];
            const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(nh), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++) {
                const int *src = (const int *)(const void *)(wc + 4 * ng * b + 32 * h);
                const __m256i wv = nh == 8 ? _mm256_loadu_si256((const __m256i *)(const void *)src)
                                           : _mm256_maskload_epi32(src, lanes); /* zero codes past the row */
                wl[b] = _mm256_and_si256(wv, lo4);
                wh[b] = _mm256_and_si256(_mm256_srli_epi16(wv, 4), lo4);
            }
            __m128i d16;
            if (nh == 8)
                d16 = _mm_loadu_si128((const __m128i *)(const void *)(dc + 8 * h));
            else { /* zero scales past the row */
                uint16_t dpad[8] = {0};
                memcpy(dpad, dc + 8 * h, (size_t)nh * sizeof(uint16_t));
                d16 = _mm_loadu_si128((const __m128i *)(const void *)dpad);
            }
            const __m256 dv = _mm256_cvtph_ps(d16);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const int8_t *xp = a->q4x + (m0 + t) * kp + g * Q4_G + 32 * h;
                __m256i p16[4]; /* added as a tree: a short dependency chain */
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++) {
                    const __m256i xl = _mm256_loadu_si256((const __m256i *)(const void *)(xp + 128 * b));
                    const __m256i xh = _mm256_loadu_si256((const __m256i *)(const void *)(xp + 128 * b + 64));
                    p16[b] = _mm256_add_epi16(_mm256_maddubs_epi16(wl[b], xl), _mm256_maddubs_epi16(wh[b], xh));
                }
                const __m256i s16 =
                    _mm256_add_epi16(_mm256_add_epi16(p16[0], p16[1]), _mm256_add_epi16(p16[2], p16[3]));
                const __m256i xs8 = _mm256_slli_epi32(
                    _mm256_loadu_si256((const __m256i *)(const void *)(a->xsum + (m0 + t) * g16 + g + 8 * h)), 3);
                const __m256i s = _mm256_sub_epi32(_mm256_madd_epi16(s16, ones), xs8);
                acc[t][h] = _mm256_add_ps(acc[t][h], _mm256_mul_ps(_mm256_cvtepi32_ps(s), dv));
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const __m256 v = _mm256_add_ps(acc[t][0], acc[t][1]);                          /* j + j^8 */
        __m128 u = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* j^4 */
        u = _mm_add_ps(u, _mm_shuffle_ps(u, u, 0x4E));                                 /* j^2 */
        u = _mm_add_ps(u, _mm_shuffle_ps(u, u, 0xB1));                                 /* j^1 */
        y[t * N] = _mm_cvtss_f32(u) * a->scale[m0 + t];
    }
}
#define Q4_AVX2_TILE(T)                                                                                                \
    TGT_Q4_AVX2 static void q4_avx2_##T(const nl_mv_weight *wt, const nl_mv_act *a, int64_t n, int64_t m, float *y) {  \
        q4_avx2_tile(wt->q4 + n * wt->groups * 16, wt->q4_d + n * wt->groups, wt->groups, a, m, y + m * wt->rows + n,  \
                     wt->rows, T);                                                                                     \
    }
Q4_AVX2_TILE(1)
Q4_AVX2_TILE(2)
Q4_AVX2_TILE(3)
Q4_AVX2_TILE(4)
static const q4_tile_fn q4_avx2_tiles[4] = {q4_avx2_1, q4_avx2_2, q4_avx2_3, q4_avx2_4};

#endif /* __x86_64__ */

/* Which int4 kernel a weight on `path` runs here: 2 the VNNI tiles, 1 the AVX2 tiles, 0 C. */
static int q4_kernel(nl_mv_path path) {
#if !defined(__x86_64__)
    (void)path;
    return 0;
#endif
    if (path == NL_MV_AVX512 && nl_qdot_available(NL_QDOT_VNNI)) return 2;
    if ((path == NL_MV_AVX512 || path == NL_MV_AVX2) && nl_isa_has(NL_ISA_AVX2)) return 1;
    return 0;
}

/* Rows [n0, n1) for tokens [m0, m1): rows one after another (one sequential stream of the
 * codes). On VNNI two rows (adjacent in memory) at a time against tiles of up to 3 tokens (their
 * codes split into nibbles once per tile, each activation load shared by the two rows), an odd
 * last row against tiles of up to 4; the rows' bytes stay in L1 for the tiles after the first. */
static void run_block_int4(const nl_mv_weight *wt, const nl_mv_act *a, float *y, int64_t n0, int64_t n1, int64_t m0,
                           int64_t m1) {
    const int64_t G = wt->groups, N = wt->rows, kp = a->kp;
    const int kern = q4_kernel(wt->path);
    if (kern == 0) {
        for (int64_t n = n0; n < n1; n++)
            for (int64_t m = m0; m < m1; m++)
                y[m * N + n] = q4_pair_portable(wt->q4 + n * G * 16, wt->q4_d + n * G, G, a->q + m * kp, a->scale[m]);
        return;
    }
#if defined(__x86_64__)
    if (kern == 1) {
        for (int64_t n = n0; n < n1; n++)
            for (int64_t m = m0; m < m1; m += 4) q4_avx2_tiles[(m1 - m < 4 ? m1 - m : 4) - 1](wt, a, n, m, y);
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
#endif
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
    const int vnni = q4_kernel(wt->path) > 0; /* the VNNI and AVX2 tiles read q4x */
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

nl_status nl_mv_act_prepare(nl_mv_act *a, const nl_mv_weight *wt, const float *x, int64_t M) {
    if (M < 1) return nl_fail(NL_ERR_INVALID, "matvec: M must be positive, got %lld", (long long)M);
    if (wt->fmt != NL_WFMT_FP32 && wt->fmt != NL_WFMT_BF16 && wt->fmt != NL_WFMT_INT8 && wt->fmt != NL_WFMT_INT4)
        return nl_fail(NL_ERR_INVALID, "matvec: weight not initialised (format %d)", (int)wt->fmt);
    a->x = x;
    a->M = M;
    a->K = wt->cols;
    a->kp = wt->cols;
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
                 .M = M,
                 .N = wt->rows,
                 .K = wt->cols};
    if (has_panels(wt)) {
        /* a panel's tiles read it from memory once, then from L2 (48 rows x K x 1, 2 or 4 bytes) */
        run_panels_simd(wt, act, y, n0, n1);
        return;
    }
    for (int64_t nb = n0; nb < n1; nb += MV_RANGE_ROWS) {
        int64_t ne = n1 - nb < MV_RANGE_ROWS ? n1 : nb + MV_RANGE_ROWS;
        for (int64_t m0 = 0; m0 < M; m0 += MV_TOK) {
            int64_t m1 = M - m0 < MV_TOK ? M : m0 + MV_TOK;
            if (wt->fmt == NL_WFMT_INT8)
                run_block_int8(&wt->q8, wt->path, act, y, nb, ne, m0, m1);
            else if (wt->fmt == NL_WFMT_INT4)
                run_block_int4(wt, act, y, nb, ne, m0, m1);
            else
                run_block(&a, nb, ne, m0, m1);
        }
    }
}

nl_status nl_mv_forward_act(const nl_mv_weight *wt, nl_mv_act *act, const float *x, int64_t M, float *y, int threads) {
    NL_TRY(nl_mv_act_prepare(act, wt, x, M));
    /* panels are split two whole ones at a time (up to 4 tokens read two of them at once), and
     * handed out two such blocks at a time as threads come for them (a thread's four panels lie
     * back to back): on a shared machine one core often reads slower than the other for a while,
     * and an even split in advance left the faster one waiting at the end of every linear
     * (libgomp's waits: 12.5% of the samples of an 8-stream run of the 85M model, 7.7% handed
     * out). int4 blocks are 4 times larger: at 16 rows of a 768-column weight a thread's stream
     * of codes broke every 6 KB, before its prefetch (Q4_PF) had run ahead (2-thread share of the
     * roofline 0.45 -> 0.55, bench_decode --single 2, AVX2). Each output row is computed the same
     * whichever thread takes it. */
    const int64_t rows = has_panels(wt) ? 2 * NL_MV_PANEL : wt->fmt == NL_WFMT_INT4 ? 4 * MV_ROWS : MV_ROWS;
    const int64_t N = wt->rows, nblocks = (N + rows - 1) / rows;
    int nt = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 2) num_threads(nt)
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
