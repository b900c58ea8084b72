/*
 * nanolm matvec: the decode kernels. y (M, N) = x (M, K) . W^T for a weight W (N, K) stored in
 * fp32, bf16, int8 or int4, where M is small (1 for one stream, up to a few hundred for a batched
 * step). Knows nothing of models.
 *
 * Batch 1 is a matrix-vector product whose time is reading W once. Each kernel path (AVX-512,
 * AVX2, NEON, portable C) keeps the weight in a layout of its own, chosen so that a small batch
 * still reads W once from memory; the layouts and the kernels' tiles are internal to numerics/
 * (src/numerics/matvec_internal.h).
 *
 * Exact on every path: y[m][n] is computed by the same sequence of operations whatever the path
 * (NANOLM_ISA), M, the tokens that share the call and the number of threads. Each fp32 / bf16
 * output is one fused multiply-add chain over k = 0 .. K - 1 from +0 (no sum across lanes; fmaf
 * in portable C); int8 sums are exact int32 and int4 follows one fixed float order (below). A
 * request's output is then bit-identical alone or batched (vLLM does not promise this; nanolm
 * does), and the same on an AVX-512, an AVX2, an ARM or a plain C build.
 *
 * Formats:
 *   FP32  W as given (borrowed or copied).
 *   BF16  W rounded to bfloat16 (nl_bf16_from_f32 of formats.h), expanded to fp32 in registers; fp32 activations.
 *   INT8  W8A8 with the weights of nanolm/qlinear.h: int8 codes with one fp32 absmax scale per
 *         output row, each token quantized once per input by absmax (nl_mv_act), int32 sums
 *         (exact, so any order and any path give the same bits), one multiply by both scales:
 *         the same bits as nl_qlinear_forward.
 *   INT4  llama.cpp's Q4_0 granularity: each output row cut into groups of 32 consecutive input
 *         columns (the last one zero padded), scale d = absmax / 7 stored as fp16 (nearest even),
 *         codes q = clamp(rint(w / d), -8, 7). Activations as INT8 (each token once, absmax).
 *         A (row, token) output is
 *             y = s_x * sum over lanes j of the 16-lane tree below of
 *                 acc[j] = sum over groups g = j, j + 16, ... in order of (float)isum_g * d_g
 *         where isum_g is the group's exact int32 dot product; the lanes are added as
 *         ((0+8)+(4+12)) + ((2+10)+(6+14)) ... (the halving tree: j + 8, then + 4, + 2, + 1).
 *         Every path gives the same bits.
 */
#ifndef NANOLM_MATVEC_H
#define NANOLM_MATVEC_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/qlinear.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Storage format of a decode weight. AUTO (engine options only): fp32 for an fp32 checkpoint,
 * int8 for a quantized int8 per-channel checkpoint or a Q8_0 GGUF, int4 for a Q4_0 GGUF. */
typedef enum nl_wfmt {
    NL_WFMT_AUTO = -1,
    NL_WFMT_FP32 = 0,
    NL_WFMT_BF16 = 1,
    NL_WFMT_INT8 = 2,
    NL_WFMT_INT4 = 3,
    NL_WFMT_COUNT
} nl_wfmt;

/* Kernel path of the fp32/bf16 kernels (int8 uses nl_qdot_path; int4 follows this path, with
 * AVX-512 VNNI where the AVX512 path has it). */
typedef enum nl_mv_path {
    NL_MV_AUTO = 0,     /* the fastest this CPU runs */
    NL_MV_PORTABLE = 1, /* plain C, one fmaf chain per pair */
    NL_MV_AVX2 = 2,     /* 8-lane FMA */
    NL_MV_AVX512 = 3,   /* 16-lane FMA */
    NL_MV_NEON = 4,     /* aarch64: 4-lane FMA */
    NL_MV_COUNT
} nl_mv_path;

/* "fp32", "bf16", "int8", "int4" ("auto" for AUTO); NULL for an unknown value. */
const char *nl_wfmt_name(nl_wfmt f);
/* Parses "fp32" | "bf16" | "int8" | "int4" | "auto"; NL_ERR_INVALID naming the text otherwise. */
nl_status nl_wfmt_parse(const char *s, nl_wfmt *out);
/* "portable", "avx2", "avx512", "neon" ("auto"). */
const char *nl_mv_path_name(nl_mv_path p);
/* 1 if this CPU (and build) runs path p. */
int nl_mv_available(nl_mv_path p);
/* What AUTO resolves to here. */
nl_mv_path nl_mv_auto(void);

/* One weight matrix (N, K) in a decode format. */
typedef struct nl_mv_weight {
    nl_wfmt fmt;
    int64_t rows, cols; /* N (outputs), K (inputs) */
    const float *f32;   /* FP32: (N, K), borrowed or owned (owned_f32) */
    float *owned_f32;
    /* The path's own layouts (src/numerics/matvec_internal.h); NULL where the path has none. */
    float *f32_panels;     /* FP32 on a SIMD path: a panel copy, read instead of f32 */
    uint16_t *bf16;        /* BF16 on the portable path: (N, K) bfloat16 bits (NULL on SIMD) */
    uint16_t *bf16_panels; /* BF16 on a SIMD path: the weight, in panels only */
    nl_qlinear q8;         /* INT8 (on the AVX512 path with VNNI q8.w is NULL: the codes are in q8_panels) */
    int8_t *q8_panels;     /* INT8 on the AVX512 path with VNNI: the codes, in panels only */
    uint8_t *q4;           /* INT4: (N, groups * 16) packed codes + 8, in the kernels' byte order */
    uint16_t *q4_d;        /* INT4: (N, groups) fp16 scales */
    int64_t groups;        /* INT4: ceil(K / 32) */
    nl_mv_path path;       /* resolved (never AUTO) */
} nl_mv_weight;

/* Prepares W (N, K) in format fmt. FP32 borrows w (it must outlive the weight) unless copy is
 * set; on a SIMD path it also keeps its panel copy (N rounded up to 48, x K x 4 bytes).
 * BF16 on a SIMD path and INT8 on the AVX512 path with VNNI hold their values in panels only (N
 * rounded up to 48 rows); nl_mv_weight_set_path moves them back into rows for another path.
 * Errors: NL_ERR_INVALID for sizes or format (AUTO is not a format here), NaN/inf in w
 * (naming the index) for BF16, INT8 and INT4; NL_ERR_RANGE for an INT4 group whose scale
 * overflows fp16 (|w| > 458,000, naming the row and columns); NL_ERR_NOMEM. */
nl_status nl_mv_weight_init(nl_mv_weight *wt, nl_wfmt fmt, const float *w, int64_t N, int64_t K, int copy);
/* INT8 from existing codes (N, K) and per-row scales (N) (a quantized checkpoint). Errors as
 * nl_qlinear_init_codes. */
nl_status nl_mv_weight_init_int8(nl_mv_weight *wt, const int8_t *codes, const float *scales, int64_t N, int64_t K);
/* INT4 straight from llama.cpp's Q4_0 blocks (N rows of K / 32 blocks of 18 bytes: fp16 scale d,
 * then byte i = column i low nibble, column i + 16 high, value (nibble - 8) * d), which is this
 * format's group layout: the scales and codes are copied, so the kernels compute with exactly
 * the file's weights (d may be negative: llama.cpp's quantizer divides by -8). K must be a
 * multiple of 32. Errors: NL_ERR_INVALID (sizes, an inf/NaN scale naming the row), NL_ERR_NOMEM. */
nl_status nl_mv_weight_init_q4_0(nl_mv_weight *wt, const void *blocks, int64_t N, int64_t K);
/* Frees what the weight owns; safe on a zeroed struct. */
void nl_mv_weight_free(nl_mv_weight *wt);
/* Lets go of the fp32 matrix the weight was made from, where it keeps a copy of its own: 1 for
 * fp32 with panels (the panels become the only copy; a later nl_mv_weight_set_path to a path
 * without them rebuilds the rows from them), bf16, int8 and int4 (made from it, never read it
 * again): the source may then be freed. 0 for fp32 without panels, whose kernels read the
 * source: it must outlive the weight, as before. */
int nl_mv_weight_detach(nl_mv_weight *wt);
/* Selects the fp32/bf16 kernel path (tests, benchmarks). NL_ERR_UNSUPPORTED when this CPU
 * lacks it. */
nl_status nl_mv_weight_set_path(nl_mv_weight *wt, nl_mv_path p);
/* Bytes of the weight as stored and read once per call: N*K*4 (fp32), N*K*2 (bf16),
 * N*K + 4N (int8 codes and scales), N*G*16 + N*G*2 with G = ceil(K / 32) (int4 codes and fp16
 * scales: N*K/2 + N*(K/32)*2 when 32 divides K). */
size_t nl_mv_weight_bytes(const nl_mv_weight *wt);
/* INT4: the weight as the kernels see it, codes x scales, into w (N, K) (tests, error studies).
 * NL_ERR_INVALID for a weight of another format. */
nl_status nl_mv_int4_dequantize(const nl_mv_weight *wt, float *w);

/* y (M, N) = x (M, K) . W^T with `threads` OpenMP threads (<= 0: the OpenMP default). Batch
 * invariant (exact, above). Errors: M < 1 (NL_ERR_INVALID), NaN/inf in x for INT8 or INT4 (naming the
 * index), NL_ERR_NOMEM (INT8 activation buffers). */
nl_status nl_mv_forward(const nl_mv_weight *wt, const float *x, int64_t M, float *y, int threads);

/* One matvec input x (M, K) prepared for a weight format: FP32 and BF16 read x as given; INT8
 * and INT4 quantize each token once (absmax, nl_qlinear_quantize_tokens) into codes that every output
 * row then reads. The buffers grow as needed and are reused from call to call. */
typedef struct nl_mv_act {
    const float *x;   /* (M, K) */
    int64_t M, K, kp; /* kp: K padded for INT8 (the weight's k_pad), for INT4 to 512 */
    int8_t *q;        /* INT8, INT4: (M, kp) codes */
    uint8_t *qu;      /* INT8 on VNNI: (M, kp) codes + 128 */
    float *scale;     /* INT8, INT4: (M) token scales */
    int8_t *q4x;      /* INT4 on VNNI: (M, kp) codes in the kernel's load order (matvec_internal.h) */
    int32_t *xsum;    /* INT4: (M, kp / 32) each group's sum of codes */
    size_t cap_codes, cap_tokens, cap_q4;
} nl_mv_act;

/* Prepares x (M, K = wt->cols) for wt. Errors: M < 1 (NL_ERR_INVALID), NaN/inf in x for INT8
 * and INT4 (naming the index), NL_ERR_NOMEM. Runs on the calling thread only. */
nl_status nl_mv_act_prepare(nl_mv_act *a, const nl_mv_weight *wt, const float *x, int64_t M);
/* Frees the buffers; safe on a zeroed struct. */
void nl_mv_act_free(nl_mv_act *a);

/* nl_mv_forward with the caller's act (zeroed before first use, freed by nl_mv_act_free), whose
 * buffers are reused from call to call instead of allocated per call. Same bits. */
nl_status nl_mv_forward_act(const nl_mv_weight *wt, nl_mv_act *act, const float *x, int64_t M, float *y, int threads);

/* Output rows [n0, n1) of y (M, N) = x . W^T for every token of a (prepared for wt), on the
 * calling thread: the building block for callers that split the rows over their own threads
 * (one parallel region per step instead of one per matvec). Each (token, row) output has the
 * same bits whatever range, M or thread computes it. */
void nl_mv_forward_range(const nl_mv_weight *wt, const nl_mv_act *a, float *y, int64_t n0, int64_t n1);

/* The scalar reference the kernels are tested against: y (M, N) = x . w^T in double precision
 * over fp32 (or bf16-rounded, for bf16 = 1) weights. */
void nl_mv_reference(float *y, const float *x, const float *w, int64_t M, int64_t N, int64_t K, int bf16);

#ifdef __cplusplus
}
#endif
#endif
