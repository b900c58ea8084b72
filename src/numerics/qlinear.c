/* QuantizedLinear: int8 weights with per-output-channel scales, W8A8 and weight-only forward,
 * and the int8 GEMM kernel behind it (AVX-512 VNNI / AVX2 / portable, chosen at run time). */
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <math.h>
#include <string.h>

#include "nanolm/isa.h"
#include "nanolm/qlinear.h"
#include "nanolm/quant.h"

/* min/max that compile to single vector instructions (fminf/fmaxf are library calls because of
 * their NaN rules; NaN never reaches these: inputs are checked for it). */
static inline float qmin_f(float a, float b) { return a < b ? a : b; }
static inline float qmax_f(float a, float b) { return a > b ? a : b; }

#define TGT_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define TGT_AVX2 __attribute__((target("avx2")))
#define INLINE   static inline __attribute__((always_inline))

/* ---- paths ----------------------------------------------------------------------------------- */

const char *nl_qdot_path_name(nl_qdot_path p) {
    switch (p) {
    case NL_QDOT_AUTO: return "auto";
    case NL_QDOT_PORTABLE: return "portable";
    case NL_QDOT_AVX2: return "avx2";
    case NL_QDOT_VNNI: return "avx512-vnni";
    default: return "?";
    }
}

int nl_qdot_available(nl_qdot_path p) {
    switch (p) {
    case NL_QDOT_AUTO:
    case NL_QDOT_PORTABLE: return 1;
    case NL_QDOT_AVX2: return nl_isa_has(NL_ISA_AVX2);
    case NL_QDOT_VNNI: return nl_isa_has_ext("avx512vnni");
    default: return 0;
    }
}

nl_qdot_path nl_qdot_auto(void) {
    if (nl_qdot_available(NL_QDOT_VNNI)) return NL_QDOT_VNNI;
    if (nl_qdot_available(NL_QDOT_AVX2)) return NL_QDOT_AVX2;
    return NL_QDOT_PORTABLE;
}

/* ---- tile epilogue: int32 sums -> int32 output or fp32 scaled by both scales ----------------- */

typedef struct qout {
    int32_t *c;
    int64_t ldc; /* int32 output (nl_qgemm_s8) */
    float *y;
    int64_t ldy;     /* or fp32 output (W8A8) */
    const float *xs; /* (M) token scales */
    const float *ws; /* (N) channel scales */
} qout;

INLINE void store_tile(const qout *o, int64_t m0, int64_t n0, int mr, int nr, int32_t t[4][4]) {
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            if (o->y)
                o->y[(m0 + i) * o->ldy + n0 + j] = (float)t[i][j] * (o->xs[m0 + i] * o->ws[n0 + j]);
            else
                o->c[(m0 + i) * o->ldc + n0 + j] = t[i][j];
        }
}

/* Dispatches a tile function on constant (mr, nr) so that every loop over them unrolls. */
#define TILE_SWITCH(MRMAX, mr, nr, CALL)                                                                               \
    switch ((mr)*8 + (nr)) {                                                                                           \
    case 9: CALL(1, 1); break;                                                                                         \
    case 10: CALL(1, 2); break;                                                                                        \
    case 11: CALL(1, 3); break;                                                                                        \
    case 12: CALL(1, 4); break;                                                                                        \
    case 17: CALL(2, 1); break;                                                                                        \
    case 18: CALL(2, 2); break;                                                                                        \
    case 19: CALL(2, 3); break;                                                                                        \
    case 20: CALL(2, 4); break;                                                                                        \
    case 25:                                                                                                           \
        if (MRMAX >= 3) CALL(3, 1);                                                                                    \
        break;                                                                                                         \
    case 26:                                                                                                           \
        if (MRMAX >= 3) CALL(3, 2);                                                                                    \
        break;                                                                                                         \
    case 27:                                                                                                           \
        if (MRMAX >= 3) CALL(3, 3);                                                                                    \
        break;                                                                                                         \
    case 28:                                                                                                           \
        if (MRMAX >= 3) CALL(3, 4);                                                                                    \
        break;                                                                                                         \
    case 33:                                                                                                           \
        if (MRMAX >= 4) CALL(4, 1);                                                                                    \
        break;                                                                                                         \
    case 34:                                                                                                           \
        if (MRMAX >= 4) CALL(4, 2);                                                                                    \
        break;                                                                                                         \
    case 35:                                                                                                           \
        if (MRMAX >= 4) CALL(4, 3);                                                                                    \
        break;                                                                                                         \
    case 36:                                                                                                           \
        if (MRMAX >= 4) CALL(4, 4);                                                                                    \
        break;                                                                                                         \
    default: break;                                                                                                    \
    }

/* ---- portable ----------------------------------------------------------------------------------- */

static void block_portable(const int8_t *a, int64_t lda, const int8_t *b, int64_t ldb, int64_t m0, int64_t m1,
                           int64_t n0, int64_t n1, int64_t K, const qout *o) {
    for (int64_t n = n0; n < n1; n += 4) {
        int nr = n1 - n < 4 ? (int)(n1 - n) : 4;
        for (int64_t m = m0; m < m1; m += 4) {
            int mr = m1 - m < 4 ? (int)(m1 - m) : 4;
            int32_t t[4][4];
            for (int i = 0; i < mr; i++)
                for (int j = 0; j < nr; j++) {
                    const int8_t *ai = a + (m + i) * lda, *bj = b + (n + j) * ldb;
                    int32_t s = 0;
                    for (int64_t k = 0; k < K; k++) s += (int32_t)ai[k] * (int32_t)bj[k];
                    t[i][j] = s;
                }
            store_tile(o, m, n, mr, nr, t);
        }
    }
}

#if defined(__x86_64__) /* the x86 kernels; elsewhere nl_qdot_available says no to both */
/* ---- AVX2: sign-extend to int16, vpmaddwd (exact: |a*b + a'*b'| <= 2^15) ------------------------- */

TGT_AVX2 INLINE __m128i hsum4_256(__m256i r0, __m256i r1, __m256i r2, __m256i r3) {
    __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(r0, r1), _mm256_hadd_epi32(r2, r3));
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

TGT_AVX2 INLINE void tile_avx2(const int8_t *a, int64_t lda, const int8_t *b, int64_t ldb, int64_t K, const int MR,
                               const int NR, int32_t t[4][4]) {
    __m256i acc[2][4];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = _mm256_setzero_si256();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256i bv[4];
        for (int j = 0; j < NR; j++) bv[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + j * ldb + k)));
        for (int i = 0; i < MR; i++) {
            __m256i av = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(a + i * lda + k)));
            for (int j = 0; j < NR; j++) acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(av, bv[j]));
        }
    }
    for (int i = 0; i < MR; i++) {
        int32_t s[4];
        _mm_storeu_si128((__m128i *)s, hsum4_256(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
        for (int j = 0; j < NR; j++) {
            int32_t v = s[j];
            for (int64_t kk = k; kk < K; kk++) v += (int32_t)a[i * lda + kk] * (int32_t)b[j * ldb + kk];
            t[i][j] = v;
        }
    }
}

TGT_AVX2 static void block_avx2(const int8_t *a, int64_t lda, const int8_t *b, int64_t ldb, int64_t m0, int64_t m1,
                                int64_t n0, int64_t n1, int64_t K, const qout *o) {
    for (int64_t n = n0; n < n1; n += 4) {
        int nr = n1 - n < 4 ? (int)(n1 - n) : 4;
        for (int64_t m = m0; m < m1; m += 2) {
            int mr = m1 - m < 2 ? (int)(m1 - m) : 2;
            int32_t t[4][4];
#define CALL_AVX2(MR_, NR_) tile_avx2(a + m * lda, lda, b + n * ldb, ldb, K, MR_, NR_, t)
            TILE_SWITCH(2, mr, nr, CALL_AVX2)
#undef CALL_AVX2
            store_tile(o, m, n, mr, nr, t);
        }
    }
}

/* ---- AVX-512 VNNI: vpdpbusd needs unsigned x signed, so activations come shifted by +128
 * (au = a ^ 0x80) and every sum is corrected by -128 * sum(b row): exact in int32. ------------ */

TGT_VNNI INLINE __m128i hsum4_512(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
    __m256i r0 = _mm256_add_epi32(_mm512_castsi512_si256(a0), _mm512_extracti64x4_epi64(a0, 1));
    __m256i r1 = _mm256_add_epi32(_mm512_castsi512_si256(a1), _mm512_extracti64x4_epi64(a1, 1));
    __m256i r2 = _mm256_add_epi32(_mm512_castsi512_si256(a2), _mm512_extracti64x4_epi64(a2, 1));
    __m256i r3 = _mm256_add_epi32(_mm512_castsi512_si256(a3), _mm512_extracti64x4_epi64(a3, 1));
    __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(r0, r1), _mm256_hadd_epi32(r2, r3));
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

TGT_VNNI INLINE void tile_vnni(const uint8_t *au, int64_t lda, const int8_t *b, int64_t ldb, const int32_t *bsum,
                               int64_t K, const int MR, const int NR, int32_t t[4][4]) {
    __m512i acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_si512();
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
        __m512i bv[4];
        for (int j = 0; j < NR; j++) bv[j] = _mm512_loadu_si512((const void *)(b + j * ldb + k));
        for (int i = 0; i < MR; i++) {
            __m512i av = _mm512_loadu_si512((const void *)(au + i * lda + k));
            for (int j = 0; j < NR; j++) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], av, bv[j]);
        }
    }
    if (k < K) { /* masked tail: lanes beyond K load as 0 and add nothing */
        __mmask64 mk = ~0ULL >> (64 - (K - k));
        __m512i bv[4];
        for (int j = 0; j < NR; j++) bv[j] = _mm512_maskz_loadu_epi8(mk, (const void *)(b + j * ldb + k));
        for (int i = 0; i < MR; i++) {
            __m512i av = _mm512_maskz_loadu_epi8(mk, (const void *)(au + i * lda + k));
            for (int j = 0; j < NR; j++) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], av, bv[j]);
        }
    }
    for (int i = 0; i < MR; i++) {
        int32_t s[4];
        _mm_storeu_si128((__m128i *)s, hsum4_512(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
        for (int j = 0; j < NR; j++) t[i][j] = s[j] - 128 * bsum[j];
    }
}

TGT_VNNI static void block_vnni(const uint8_t *au, int64_t lda, const int8_t *b, int64_t ldb, const int32_t *bsum,
                                int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t K, const qout *o) {
    for (int64_t n = n0; n < n1; n += 4) {
        int nr = n1 - n < 4 ? (int)(n1 - n) : 4;
        for (int64_t m = m0; m < m1; m += 4) {
            int mr = m1 - m < 4 ? (int)(m1 - m) : 4;
            int32_t t[4][4];
#define CALL_VNNI(MR_, NR_) tile_vnni(au + m * lda, lda, b + n * ldb, ldb, bsum + n, K, MR_, NR_, t)
            TILE_SWITCH(4, mr, nr, CALL_VNNI)
#undef CALL_VNNI
            store_tile(o, m, n, mr, nr, t);
        }
    }
}

#endif

/* ---- driver: OpenMP over groups of 4 weight rows; tokens in chunks that stay in L2 ------------ */

#define M_CHUNK 64

static void run_gemm(nl_qdot_path path, const int8_t *a, const uint8_t *au, int64_t lda, const int8_t *b, int64_t ldb,
                     const int32_t *bsum, int64_t M, int64_t N, int64_t K, const qout *o) {
    const int64_t ntiles = (N + 3) / 4;
    const int par = (double)M * (double)N * (double)K > 4e6; /* below ~20 us of work, one thread */
#pragma omp parallel if (par)
    for (int64_t m0 = 0; m0 < M; m0 += M_CHUNK) {
        int64_t m1 = M - m0 < M_CHUNK ? M : m0 + M_CHUNK;
#pragma omp for schedule(static) nowait
        for (int64_t tI = 0; tI < ntiles; tI++) {
            int64_t n0 = tI * 4, n1 = N - n0 < 4 ? N : n0 + 4;
            switch (path) {
#if defined(__x86_64__)
            case NL_QDOT_VNNI: block_vnni(au, lda, b, ldb, bsum, m0, m1, n0, n1, K, o); break;
            case NL_QDOT_AVX2: block_avx2(a, lda, b, ldb, m0, m1, n0, n1, K, o); break;
#else
            case NL_QDOT_VNNI:
            case NL_QDOT_AVX2: (void)au, (void)bsum; /* never chosen off x86 */
#endif
            default: block_portable(a, lda, b, ldb, m0, m1, n0, n1, K, o); break;
            }
        }
    }
}

static nl_status resolve_path(nl_qdot_path *p) {
    if (*p == NL_QDOT_AUTO) *p = nl_qdot_auto();
    if ((unsigned)*p >= NL_QDOT_COUNT) return nl_fail(NL_ERR_INVALID, "unknown int8 kernel path %d", (int)*p);
    if (!nl_qdot_available(*p))
        return nl_fail(NL_ERR_UNSUPPORTED, "int8 kernel path '%s' is not available on this CPU", nl_qdot_path_name(*p));
    return NL_OK;
}

nl_status nl_qgemm_s8(nl_qdot_path path, const int8_t *a, int64_t lda, const int8_t *b, int64_t ldb, int64_t M,
                      int64_t N, int64_t K, int32_t *c, int64_t ldc) {
    NL_TRY(resolve_path(&path));
    if (M <= 0 || N <= 0 || K <= 0 || K > NL_QDOT_MAX_K || lda < K || ldb < K || ldc < N)
        return nl_fail(NL_ERR_INVALID, "int8 GEMM sizes M=%lld N=%lld K=%lld (K <= %d, lda/ldb >= K, ldc >= N)",
                       (long long)M, (long long)N, (long long)K, NL_QDOT_MAX_K);
    qout o = {.c = c, .ldc = ldc};
    if (path != NL_QDOT_VNNI) {
        run_gemm(path, a, NULL, lda, b, ldb, NULL, M, N, K, &o);
        return NL_OK;
    }
    uint8_t *au = nl_malloc((size_t)(M * K), "int8 GEMM unsigned activations");
    int32_t *bsum = nl_malloc((size_t)N * sizeof(int32_t), "int8 GEMM weight sums");
    if (!au || !bsum) {
        nl_free(au);
        nl_free(bsum);
        return NL_ERR_NOMEM;
    }
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) au[m * K + k] = (uint8_t)a[m * lda + k] ^ 0x80u;
    for (int64_t n = 0; n < N; n++) {
        int32_t s = 0;
        for (int64_t k = 0; k < K; k++) s += b[n * ldb + k];
        bsum[n] = s;
    }
    run_gemm(path, a, au, K, b, ldb, bsum, M, N, K, &o);
    nl_free(au);
    nl_free(bsum);
    return NL_OK;
}

/* ---- the layer --------------------------------------------------------------------------------- */

static int64_t round64(int64_t k) { return (k + 63) & ~(int64_t)63; }

nl_status nl_qlinear_init_codes(nl_qlinear *l, const int8_t *codes, const float *scales, int64_t N, int64_t K,
                                nl_qlinear_mode mode) {
    memset(l, 0, sizeof *l);
    if (N <= 0 || K <= 0 || K > NL_QDOT_MAX_K)
        return nl_fail(NL_ERR_INVALID, "QuantizedLinear shape (%lld, %lld): both must be positive, in_features <= %d",
                       (long long)N, (long long)K, NL_QDOT_MAX_K);
    if (mode != NL_QLINEAR_W8A8 && mode != NL_QLINEAR_WEIGHT_ONLY)
        return nl_fail(NL_ERR_INVALID, "unknown QuantizedLinear mode %d", (int)mode);
    for (int64_t n = 0; n < N; n++)
        if (!isfinite(scales[n]) || scales[n] < 0)
            return nl_fail(NL_ERR_INVALID, "QuantizedLinear: scale of output channel %lld is %g", (long long)n,
                           (double)scales[n]);
    l->in_features = K;
    l->out_features = N;
    l->k_pad = round64(K);
    l->mode = mode;
    l->w = nl_calloc((size_t)N, (size_t)l->k_pad, "QuantizedLinear weights");
    l->w_scale = nl_malloc((size_t)N * sizeof(float), "QuantizedLinear scales");
    l->w_sum = nl_malloc((size_t)N * sizeof(int32_t), "QuantizedLinear weight sums");
    if (!l->w || !l->w_scale || !l->w_sum) {
        nl_qlinear_free(l);
        return NL_ERR_NOMEM;
    }
    for (int64_t n = 0; n < N; n++) {
        memcpy(l->w + n * l->k_pad, codes + n * K, (size_t)K);
        int32_t s = 0;
        for (int64_t k = 0; k < K; k++) s += codes[n * K + k];
        l->w_sum[n] = s;
        l->w_scale[n] = scales[n];
    }
    l->path = nl_qdot_auto();
    return NL_OK;
}

nl_status nl_qlinear_init(nl_qlinear *l, const float *w, int64_t N, int64_t K, nl_qlinear_mode mode) {
    memset(l, 0, sizeof *l);
    if (N <= 0 || K <= 0 || K > NL_QDOT_MAX_K)
        return nl_fail(NL_ERR_INVALID, "QuantizedLinear shape (%lld, %lld): both must be positive, in_features <= %d",
                       (long long)N, (long long)K, NL_QDOT_MAX_K);
    nl_qtensor q;
    NL_TRY(nl_quant_symmetric(w, N, K, 8, 1, &q)); /* int8, one absmax scale per output channel */
    nl_status rc = nl_qlinear_init_codes(l, (const int8_t *)q.codes, q.scales, N, K, mode);
    nl_qtensor_free(&q);
    return rc;
}

void nl_qlinear_free(nl_qlinear *l) {
    if (!l) return;
    nl_free(l->w);
    nl_free(l->w_scale);
    nl_free(l->w_sum);
    l->w = NULL;
    l->w_scale = NULL;
    l->w_sum = NULL;
}

nl_status nl_qlinear_set_path(nl_qlinear *l, nl_qdot_path p) {
    NL_TRY(resolve_path(&p));
    l->path = p;
    return NL_OK;
}

size_t nl_qlinear_bytes(const nl_qlinear *l) {
    return (size_t)l->out_features * (size_t)l->in_features + (size_t)l->out_features * sizeof(float);
}

/* Per-token absmax int8 (and the +128 copy for VNNI) into rows of k_pad (zero padded). */
static int quantize_tokens(const float *x, int64_t M, int64_t K, int64_t kp, int8_t *q, uint8_t *qu, float *xs);

nl_status nl_qlinear_quantize_tokens(const float *x, int64_t M, int64_t K, int64_t kp, int8_t *q, uint8_t *qu,
                                     float *xs) {
    if (M < 1 || K < 1 || kp < K)
        return nl_fail(NL_ERR_INVALID, "W8A8 token quantization: bad sizes M %lld, K %lld, padded K %lld", (long long)M,
                       (long long)K, (long long)kp);
    if (quantize_tokens(x, M, K, kp, q, qu, xs)) return nl_quant_check_finite(x, (size_t)(M * K), "W8A8 input");
    return NL_OK;
}

static int quantize_tokens(const float *x, int64_t M, int64_t K, int64_t kp, int8_t *q, uint8_t *qu, float *xs) {
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (M * K > (1 << 15))
    for (int64_t m = 0; m < M; m++) {
        const float *xm = x + m * K;
        /* max |x| on the bits (vectorizes); patterns >= 0x7F800000 are NaN/inf */
        uint32_t mb = 0;
        for (int64_t k = 0; k < K; k++) {
            uint32_t v;
            memcpy(&v, xm + k, 4);
            v &= 0x7FFFFFFFu;
            mb = v > mb ? v : mb;
        }
        bad |= mb >= 0x7F800000u;
        float amax;
        memcpy(&amax, &mb, 4);
        float s = amax > 0.0f ? amax / 127.0f : 1.0f;
        if (!(s > 0.0f)) s = 1.1754944e-38f; /* amax so small that amax/127 underflows */
        float inv = 1.0f / s;
        xs[m] = s;
        int8_t *qm = q + m * kp;
        for (int64_t k = 0; k < K; k++) qm[k] = (int8_t)(int)qmin_f(qmax_f(rintf(xm[k] * inv), -127.0f), 127.0f);
        memset(qm + K, 0, (size_t)(kp - K));
        if (qu)
            for (int64_t k = 0; k < kp; k++) qu[m * kp + k] = (uint8_t)qm[k] ^ 0x80u;
    }
    return bad;
}

static nl_status forward_weight_only(const nl_qlinear *l, const float *x, int64_t M, float *y) {
    const int64_t N = l->out_features, K = l->in_features;
    nl_status rc = NL_OK;
#pragma omp parallel if (M * N * K > (1 << 20))
    {
        float *wf = nl_malloc((size_t)K * sizeof(float), "dequantized weight row");
        if (!wf) {
#pragma omp atomic write
            rc = NL_ERR_NOMEM;
        }
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            if (!wf) continue;
            const int8_t *wn = l->w + n * l->k_pad;
            for (int64_t k = 0; k < K; k++) wf[k] = (float)wn[k];
            for (int64_t m = 0; m < M; m++) {
                const float *xm = x + m * K;
                float s = 0.0f;
                for (int64_t k = 0; k < K; k++) s += xm[k] * wf[k];
                y[m * N + n] = s * l->w_scale[n];
            }
        }
        nl_free(wf);
    }
    return rc;
}

nl_status nl_qlinear_forward(const nl_qlinear *l, const float *x, int64_t M, float *y) {
    if (!l || !l->w) return nl_fail(NL_ERR_INVALID, "QuantizedLinear is not initialised");
    if (M <= 0) return nl_fail(NL_ERR_INVALID, "QuantizedLinear forward: M must be positive, got %lld", (long long)M);
    const int64_t K = l->in_features, N = l->out_features, kp = l->k_pad;
    if (l->mode == NL_QLINEAR_WEIGHT_ONLY) {
        NL_TRY(nl_quant_check_finite(x, (size_t)(M * K), "QuantizedLinear input"));
        return forward_weight_only(l, x, M, y);
    }
    int8_t *q = nl_malloc((size_t)(M * kp), "W8A8 activation codes");
    uint8_t *qu = l->path == NL_QDOT_VNNI ? nl_malloc((size_t)(M * kp), "W8A8 unsigned activation codes") : NULL;
    float *xs = nl_malloc((size_t)M * sizeof(float), "W8A8 token scales");
    if (!q || !xs || (l->path == NL_QDOT_VNNI && !qu)) {
        nl_free(q);
        nl_free(qu);
        nl_free(xs);
        return NL_ERR_NOMEM;
    }
    if (quantize_tokens(x, M, K, kp, q, qu, xs)) {
        nl_free(q);
        nl_free(qu);
        nl_free(xs);
        return nl_quant_check_finite(x, (size_t)(M * K), "QuantizedLinear input");
    }
    qout o = {.y = y, .ldy = N, .xs = xs, .ws = l->w_scale};
    run_gemm(l->path, q, qu, kp, l->w, kp, l->w_sum, M, N, kp, &o);
    nl_free(q);
    nl_free(qu);
    nl_free(xs);
    return NL_OK;
}
