/*
 * nanolm qlinear: the course's QuantizedLinear on plain arrays (knows nothing of models).
 *
 * Weights W (out_features, in_features) = (N, K) are stored as int8 codes with one fp32 scale
 * per output channel (absmax, nl_quant_symmetric per channel). Two forward modes:
 *   W8A8         each token (row of x) is quantized on the fly by absmax to int8 with its own
 *                scale; int8 x int8 products are summed in int32; y = acc * (s_x * s_w), one
 *                multiply by both scales.
 *   WEIGHT_ONLY  int8 weights are dequantized on the fly and multiplied with fp32 activations.
 *
 * The int8 GEMM kernel has three paths chosen at run time (__builtin_cpu_supports): AVX-512
 * VNNI (vpdpbusd on activations shifted to unsigned, corrected by 128 * sum(w)), AVX2
 * (sign-extend to int16, vpmaddwd) and portable C. All paths give identical int32 sums.
 */
#ifndef NANOLM_QLINEAR_H
#define NANOLM_QLINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nl_qlinear_mode { NL_QLINEAR_W8A8 = 0, NL_QLINEAR_WEIGHT_ONLY = 1 } nl_qlinear_mode;

typedef enum nl_qdot_path {
    NL_QDOT_AUTO = 0,     /* the fastest this CPU runs */
    NL_QDOT_PORTABLE = 1, /* plain C */
    NL_QDOT_AVX2 = 2,     /* vpmovsxbw + vpmaddwd */
    NL_QDOT_VNNI = 3,     /* AVX-512 VNNI vpdpbusd */
    NL_QDOT_COUNT
} nl_qdot_path;

/* Largest K the int32 accumulators hold without overflow for any int8 inputs. */
#define NL_QDOT_MAX_K 65536

/* "portable", "avx2", "avx512-vnni" ("auto" for AUTO). */
const char *nl_qdot_path_name(nl_qdot_path p);
/* 1 if this CPU (and build) can run path p. */
int nl_qdot_available(nl_qdot_path p);
/* The path AUTO resolves to on this CPU. */
nl_qdot_path nl_qdot_auto(void);

/* int8 GEMM with int32 results: c[m * ldc + n] = sum_k a[m * lda + k] * b[n * ldb + k] for
 * m < M, n < N (a: (M, K) activations, b: (N, K) weights, both K-contiguous). Any int8
 * values; K <= NL_QDOT_MAX_K. OpenMP over the rows of b. NL_ERR_UNSUPPORTED if the path is
 * not available here, NL_ERR_INVALID for bad sizes, NL_ERR_NOMEM. */
nl_status nl_qgemm_s8(nl_qdot_path path, const int8_t *a, int64_t lda, const int8_t *b, int64_t ldb, int64_t M,
                      int64_t N, int64_t K, int32_t *c, int64_t ldc);

typedef struct nl_qlinear {
    int64_t in_features, out_features; /* K, N */
    int64_t k_pad;                     /* K rounded up to 64: row stride of w (zero padded) */
    int8_t *w;                         /* (N, k_pad) int8 codes */
    float *w_scale;                    /* (N) fp32 scale per output channel */
    int32_t *w_sum;                    /* (N) sum of each row's codes (VNNI correction) */
    nl_qlinear_mode mode;
    nl_qdot_path path; /* resolved kernel path (never AUTO after init) */
} nl_qlinear;

/* Quantizes w (out_features, in_features) per output channel to int8 and prepares the layer.
 * Errors: NaN/inf in w (names the index), bad sizes (K > NL_QDOT_MAX_K), NL_ERR_NOMEM. */
nl_status nl_qlinear_init(nl_qlinear *l, const float *w, int64_t out_features, int64_t in_features,
                          nl_qlinear_mode mode);
/* The same from existing codes (N, K) and per-channel scales (N), e.g. read from a file.
 * NL_ERR_INVALID for a non-finite or negative scale (names the channel). */
nl_status nl_qlinear_init_codes(nl_qlinear *l, const int8_t *codes, const float *scales, int64_t out_features,
                                int64_t in_features, nl_qlinear_mode mode);
void nl_qlinear_free(nl_qlinear *l);
/* Selects the kernel path (tests, benchmarks). NL_ERR_UNSUPPORTED if this CPU lacks it. */
nl_status nl_qlinear_set_path(nl_qlinear *l, nl_qdot_path p);
/* y (M, N) = x (M, K) @ W^T in the layer's mode. NaN/inf in x -> NL_ERR_INVALID naming the
 * index (W8A8); NL_ERR_NOMEM for the activation buffers. */
nl_status nl_qlinear_forward(const nl_qlinear *l, const float *x, int64_t M, float *y);
/* The W8A8 activation quantizer on its own: each token (row of x (M, K)) by absmax to int8
 * codes q (M, kp), zero padded from K to kp, its scale in xs (M); with qu != NULL also the
 * codes + 128 as unsigned bytes (the VNNI operand). Errors: NL_ERR_INVALID for sizes, or for
 * NaN/inf in x (naming the index). */
nl_status nl_qlinear_quantize_tokens(const float *x, int64_t M, int64_t K, int64_t kp, int8_t *q, uint8_t *qu,
                                     float *xs);
/* Bytes of the layer's weights as stored: N * K codes + N fp32 scales. */
size_t nl_qlinear_bytes(const nl_qlinear *l);

#ifdef __cplusplus
}
#endif
#endif
