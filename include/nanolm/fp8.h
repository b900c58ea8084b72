/*
 * nanolm fp8: an emulated FP8 GEMM, C (M, N) = A (M, K) . B (K, N), with the scaling recipes
 * and the accumulator of real FP8 training.
 *
 * Operands (fp32) are multiplied by a scale s and rounded to E4M3 or E5M2 (nearest-even,
 * saturating to the largest finite value, through the formats module); the GEMM sums the
 * products of the FP8 values and multiplies by 1/(s_a s_b) on the way out.
 *
 * Scaling (what s is):
 *   tensor   one s per tensor from the current amax: s = fmax / amax.
 *   delayed  one s per tensor from the amax history of the last H calls (Transformer Engine's
 *            DelayedScaling with amax_compute_algo="max"): s = fmax / max(history) / 2^margin.
 *            The scale is computed BEFORE this call's amax is known: a value above the
 *            history's max saturates (the failure delayed scaling invites).
 *   block    online per block (DeepSeek-V3 §3.3.1): A in 1x128 tiles along K (per row of A),
 *            B in 128x128 blocks; s = fmax / amax(block). A partial last tile/block (K or N not
 *            a multiple of 128) gets its own scale from its own elements.
 *   mx       OCP Microscaling v1.0 (§6.3): blocks of 32 along K (rows of A, columns of B) share
 *            an E8M0 power-of-two scale 2^X, X = floor(log2 amax) - emax_elem (emax_elem = 8 for
 *            E4M3, 15 for E5M2), clamped to [-127, 127]; elements = round(x / 2^X), saturating.
 *            A partial last block along K gets its own scale.
 *
 * Accumulator (nl_fp8_acc):
 *   bits = 0: fp32 accumulation. Computed as cblas_sgemm of the dequantized operands (q / s):
 *     FP8 x FP8 products are exact in fp32, so this is fp32 accumulation up to the order of the
 *     additions and the place where 1/(s_a s_b) is multiplied in (both at the fp32 rounding
 *     level, ~1e-7, far below FP8's 2^-4).
 *   bits = k (2..24): a limited accumulator, the model of Hopper's FP8 tensor core as DeepSeek-V3
 *     describes it (§3.3.2 measures ~14 bits; §3.5.2: "after aligning 32 mantissa products by right-shifting based on the
 *     maximum exponent, the Tensor Core only uses the highest 14 bits of each mantissa product
 *     for addition, and truncates bits exceeding this range. The accumulation of addition
 *     results into registers also employs 14-bit precision"), k = 14 on H800. Products of the
 *     (unscaled) FP8 values are exact. K is walked in groups of `group` products (default 32 =
 *     the K of one FP8 WGMMA instruction). For each group:
 *       NL_FP8_ACC_TRUNCATE (default, the tensor-core model):
 *         e   = the largest exponent floor(log2 |p|) among the group's nonzero products (the
 *               register does not take part in the alignment);
 *         each product p becomes the k-bit two's-complement integer (SIGN INCLUDED)
 *               q = floor(p / 2^(e-k+2)), i.e. k-1 magnitude bits below 2^(e+1): the
 *               sign-filling right shift of the hardware, so a negative product with bits below
 *               the unit rounds AWAY from zero (a tiny negative product becomes -1 unit, a tiny
 *               positive one vanishes);
 *         the integers are summed exactly (S * 2^(e-k+2));
 *         the register (a float of k significant bits: FP22 = 1 sign, 8 exponent, 13 stored
 *               mantissa bits for k = 14, as SageAttention-2 measured) receives reg + S*2^(e-k+2)
 *               computed exactly and truncated TOWARD ZERO to k significant bits. Its exponent
 *               range is not limited.
 *     nl_fp8_gemm runs this as integer SIMD on the FP8 significands (AVX-512 where built, else
 *     portable C); a scalar reference on double products gives the same bits (opts.reference).
 *       NL_FP8_ACC_NEAREST (a k-bit floating-point accumulator, the course's "round the sum to
 *         E4M3 after every step" with k = 4, group = 1): the partial sum plus the group's products
 *         is formed exactly (in double) and rounded to nearest-even at k significant bits.
 *     Promotion: every `promote` products (N_C; a multiple of `group`; 0 = never) the register
 *     is multiplied by the scales' inverses 1/(s_a s_b) of the current block and added to an
 *     fp32 accumulator (CUDA-core FMA in DeepSeek-V3), and the register restarts from zero.
 *     The last register value is promoted at the end of K. With block scaling the scales change every
 *     128 along K, so promote must divide 128 (DeepSeek-V3 uses N_C = 128 = the block);
 *     with mx the power-of-two scales are applied exactly to the products inside the
 *     accumulator (as MX tensor cores do), so any promote (also 0) works.
 */
#ifndef NANOLM_FP8_H
#define NANOLM_FP8_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/formats.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NL_FP8_BLOCK       128  /* DeepSeek-V3 tile / block edge */
#define NL_FP8_MX_BLOCK    32   /* OCP MX block size */
#define NL_FP8_HISTORY_MAX 1024 /* Transformer Engine's default amax_history_len */

typedef enum nl_fp8_scaling {
    NL_FP8_SCALE_TENSOR,
    NL_FP8_SCALE_DELAYED,
    NL_FP8_SCALE_BLOCK,
    NL_FP8_SCALE_MX,
    NL_FP8_SCALE_COUNT
} nl_fp8_scaling;

/* "tensor", "delayed", "block", "mx"; "?" when out of range. */
const char *nl_fp8_scaling_name(nl_fp8_scaling s);
/* Parses a scaling name; NL_ERR_INVALID listing the valid names on an unknown one. */
nl_status nl_fp8_scaling_from_name(const char *name, nl_fp8_scaling *out);
/* Parses an FP8 format name ("e4m3" or "e5m2", also the formats module's aliases);
 * NL_ERR_INVALID naming the input when it is not an FP8 format. */
nl_status nl_fp8_format_from_name(const char *name, nl_format *out);

/* ---- delayed scaling state (one per tensor role: activations, weights, gradients) ---------- */
typedef struct nl_fp8_delayed {
    int history_len;                        /* H, 1..NL_FP8_HISTORY_MAX */
    int margin;                             /* scale = fmax / amax / 2^margin */
    int64_t steps;                          /* calls recorded so far */
    float amax_history[NL_FP8_HISTORY_MAX]; /* ring: the last H amaxes (0 = not yet seen) */
    float scale;                            /* the scale the NEXT quantization uses; 1 at start */
} nl_fp8_delayed;

/* Resets the state: empty history, scale 1 (Transformer Engine's initial scale).
 * NL_ERR_INVALID when history_len is outside 1..NL_FP8_HISTORY_MAX or margin < 0. */
nl_status nl_fp8_delayed_init(nl_fp8_delayed *d, int history_len, int margin);
/* Records the amax of the tensor just quantized and computes the scale for the next call:
 *   amax_w = max of the last H recorded amaxes (this one included);
 *   scale  = fmax / amax_w / 2^margin, kept unchanged when amax_w is 0, not finite or the new
 *            scale is not finite.
 * fmax is the format's largest finite value (448 for E4M3, 57344 for E5M2).
 * NL_ERR_INVALID for a negative or NaN amax. */
nl_status nl_fp8_delayed_update(nl_fp8_delayed *d, float amax, double fmax);

/* ---- accumulator ------------------------------------------------------------------------------ */
typedef enum nl_fp8_acc_round { NL_FP8_ACC_TRUNCATE = 0, NL_FP8_ACC_NEAREST } nl_fp8_acc_round;

typedef struct nl_fp8_acc {
    int bits;    /* 0 = fp32 accumulation; 2..24 = limited accumulator of k bits */
    int group;   /* products aligned together (0 = default 32) */
    int promote; /* N_C: promote to fp32 every this many products; 0 = never */
    nl_fp8_acc_round round;
} nl_fp8_acc;

/* Checks an accumulator description (bits 0 or 2..24, group >= 1, promote >= 0 and a multiple
 * of group). NL_ERR_INVALID naming the bad field. */
nl_status nl_fp8_acc_validate(const nl_fp8_acc *acc);
/* An accumulator in words, in buf[n]: "fp32", "14-bit, never promoted" or "14-bit, promote every
 * 128". Returns buf. */
const char *nl_fp8_acc_name(const nl_fp8_acc *acc, char *buf, size_t n);
/* Sums terms[0..n) through the limited accumulator exactly as the GEMM does for one output
 * (unit scales): groups, alignment, truncation or rounding, promotion every acc->promote terms
 * into an fp32 sum. With acc->bits == 0 it is a plain sequential fp32 sum. Terms must be
 * finite. Returns the fp32 result; *out_sum receives it. NL_ERR_INVALID for a bad acc,
 * NULL pointers with n > 0, or a non-finite term (naming its index). */
nl_status nl_fp8_acc_sum(const nl_fp8_acc *acc, const double *terms, int64_t n, float *out_sum);

/* ---- the GEMM ----------------------------------------------------------------------------------- */
typedef struct nl_fp8_gemm_opts {
    nl_format fmt_a, fmt_b; /* NL_FMT_E4M3 or NL_FMT_E5M2 */
    nl_fp8_scaling scaling;
    nl_fp8_acc acc;
    nl_fp8_delayed *delayed_a; /* required for NL_FP8_SCALE_DELAYED; updated by the call */
    nl_fp8_delayed *delayed_b;
    int trans_a;    /* 0: A stored (M, K) row-major; 1: stored (K, M) (A^T given) */
    int trans_b;    /* 0: B stored (K, N) row-major; 1: stored (N, K) (B^T given) */
    int accumulate; /* 0: C = A.B; 1: C += A.B */
    int reference;  /* limited accumulator kernel (all give the same bits):
                                 * 0 = the fastest one built (AVX-512 where available),
                                 * 1 = the scalar reference (one output at a time, slow),
                                 * 2 = the portable vectorised C kernel. For tests. */
} nl_fp8_gemm_opts;

/* What the quantization did to one operand. */
typedef struct nl_fp8_operand_stats {
    float amax;                  /* max |x| of the fp32 operand */
    int64_t saturated;           /* elements with |x * s| > fmax, clipped to +-fmax */
    int64_t flushed;             /* nonzero elements that became 0 */
    double scale_min, scale_max; /* range of the scales s used (one value for tensor/delayed) */
} nl_fp8_operand_stats;

typedef struct nl_fp8_stats {
    nl_fp8_operand_stats a, b;
} nl_fp8_stats;

/* Defaults: E4M3 for both, block scaling, 14-bit truncating accumulator with groups of 32 and
 * promotion every 128 (DeepSeek-V3's recipe), no transposes. */
void nl_fp8_gemm_opts_default(nl_fp8_gemm_opts *o);

/* C (M, N) = A (M, K) . B (K, N) (or +=, see opts) through FP8 as described at the top.
 * stats may be NULL. Uses OpenMP over rows and column chunks.
 * Errors (C untouched): NL_ERR_INVALID for M, N or K < 1, NULL pointers, a non-FP8 format, an
 * unknown scaling, a bad accumulator, block scaling with a limited accumulator whose promote
 * does not divide 128, delayed scaling without state, or a NaN/inf in A or B (naming the tensor
 * and the element); NL_ERR_NOMEM when the work buffers cannot be allocated. */
nl_status nl_fp8_gemm(const nl_fp8_gemm_opts *o, int64_t M, int64_t N, int64_t K, const float *A, const float *B,
                      float *C, nl_fp8_stats *stats);

/* Quantizes a (rows, cols) row-major tensor to FP8 with the given scaling and writes the
 * dequantized values (q / s) to out (may alias x). `along_rows` = 1 treats the tensor as an A
 * operand (tiles run along each row), 0 as a B operand (tiles run down each column).
 * Same errors as nl_fp8_gemm. For tests and for the training hook's diagnostics. */
nl_status nl_fp8_quantize(nl_format fmt, nl_fp8_scaling scaling, nl_fp8_delayed *delayed, int64_t rows, int64_t cols,
                          int along_rows, const float *x, float *out, nl_fp8_operand_stats *stats);

/* Relative errors of c (n) against ref (n):
 *   *max_rel = max_i |c_i - ref_i| / max_i |ref_i|   (the worst element, on the output's scale)
 *   *fro_rel = ||c - ref||_2 / ||ref||_2
 * Either pointer may be NULL. Both are 0 when ref is all zero and c equals it. */
void nl_fp8_rel_error(int64_t n, const float *c, const double *ref, double *max_rel, double *fro_rel);

/* fp64 reference GEMM: C (M, N) = A . B with A (M, K), B (K, N) row-major (double sums). */
void nl_fp8_gemm_ref_f64(int64_t M, int64_t N, int64_t K, const float *A, const float *B, double *C);

#ifdef __cplusplus
}
#endif
#endif
