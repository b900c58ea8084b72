/*
 * nanolm fp8_study: the error of the emulated FP8 GEMM (nanolm/fp8.h) against fp64 on random
 * operands, per scaling recipe and accumulator: what `nanolm fp8 gemm` prints.
 *
 * Operands A (M, K) and B (K, N) are N(0, 1), uniform [0, 1) or uniform [-1, 1) from a seed.
 * An outlier multiplies column `outlier_col` of A (one input channel) by a factor and divides
 * row `outlier_col` of B by it, so the exact product is unchanged (trained LLMs pair outlier
 * activation channels with small weights, SmoothQuant §3) and the errors measure only what
 * quantization and accumulation lose. Delayed scaling first records `history` steps of the same
 * distribution without the outlier (so an outlier beyond the history's max saturates).
 */
#ifndef NANOLM_FP8_STUDY_H
#define NANOLM_FP8_STUDY_H

#include "nanolm/fp8.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nl_fp8_dist { NL_FP8_DIST_NORMAL = 0, NL_FP8_DIST_UNIFORM, NL_FP8_DIST_SYMMETRIC } nl_fp8_dist;

/* The operands of a study. */
typedef struct nl_fp8_study_cfg {
    int64_t M, N, K;
    nl_format fmt;       /* E4M3 or E5M2, both operands */
    int dist;            /* nl_fp8_dist: operands N(0, 1), U[0, 1) or U[-1, 1) */
    int64_t outlier_col; /* -1 = none */
    double outlier_factor;
    uint64_t seed;
    int history; /* delayed scaling: previous steps recorded before the measured call */
} nl_fp8_study_cfg;

/* One setting (in: scaling, acc) and its errors (out). acc err compares with fp64 of the FP8
 * operands (what accumulation loses), total err with fp64 of the fp32 operands; max =
 * max|C-R| / max|R|, fro = ||C-R|| / ||R||. skipped: block scaling with a limited accumulator
 * that is never promoted, or promoted at a period that does not divide 128 (block scales are
 * applied at promotion). */
typedef struct nl_fp8_study_row {
    nl_fp8_scaling scaling;
    nl_fp8_acc acc;
    int skipped;
    double acc_max, acc_fro, tot_max, tot_fro;
    nl_fp8_stats st;
} nl_fp8_study_row;

/* Measures every row of rows[0..n) (scaling and acc set by the caller) on the operands of `c`
 * with inner dimension K. NL_ERR_NOMEM, or an error of the GEMM. */
nl_status nl_fp8_study_run(const nl_fp8_study_cfg *c, int64_t K, nl_fp8_study_row *rows, int n);

/* acc err (max) of each accumulator versus K = 128, 256, ... up to c->K (at most 32 sizes), one
 * scaling. */
typedef struct nl_fp8_k_sweep {
    int nk;
    double k[32];
    double err[3][32]; /* [accumulator][K]; NaN where skipped */
    int skipped[3];
} nl_fp8_k_sweep;

/* NL_ERR_INVALID for c->K < 128 or naccs outside 1..3. */
nl_status nl_fp8_study_sweep_k(const nl_fp8_study_cfg *c, nl_fp8_scaling sc, const nl_fp8_acc *accs, int naccs,
                               nl_fp8_k_sweep *out);

/* The accumulators `fp8 gemm` compares, in accs[3]: fp32, the limited one of `bits` (products
 * aligned in groups of `group`) never promoted, and, when promote > 0, the same promoted to fp32
 * every `promote` products. Returns how many (2 or 3). */
int nl_fp8_study_accs(int bits, int group, int promote, nl_fp8_acc accs[3]);
/* The plot of a K sweep of scaling sc (c's format and shape in the title): acc err (max) against
 * K on log axes, one series per accumulator that was not skipped, named by nl_fp8_acc_name. */
nl_status nl_fp8_study_sweep_svg(const char *path, const nl_fp8_study_cfg *c, nl_fp8_scaling sc, const nl_fp8_acc *accs,
                                 int naccs, const nl_fp8_k_sweep *sw);

#ifdef __cplusplus
}
#endif

#endif
