/*
 * nanolm quant_study: two small studies of absmax quantization (nanolm/quant.h) that
 * `nanolm quant demo` and `nanolm quant outliers` print: the course's four-value example, and
 * the damage one outlier row does per tensor, per channel and per block.
 */
#ifndef NANOLM_QUANT_STUDY_H
#define NANOLM_QUANT_STUDY_H

#include "nanolm/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the course's example ---------------------------------------------------------------------- */

/* One step: x in int8 absmax, per tensor (block 0) or per block, and q * scale. */
typedef struct nl_quant_demo_step {
    const char *name;
    float x[4];
    int64_t block; /* 0 = per tensor */
    nl_qtensor q;
    float back[4];
} nl_quant_demo_step;

/* The three steps: (0.3, -0.5, 0.12, 1.5) in int8, then with an outlier 30, then with blocks of
 * 2; and how many of the 255 codes land within |x| <= 0.5 once the outlier sets the step (levels,
 * from code lo to code hi). */
typedef struct nl_quant_demo {
    nl_quant_demo_step st[3];
    int levels, lo, hi;
} nl_quant_demo;

nl_status nl_quant_demo_run(nl_quant_demo *d);
void nl_quant_demo_free(nl_quant_demo *d);

/* ---- one outlier row ---------------------------------------------------------------------------- */

enum { NL_QUANT_OUTLIER_ROW = 7, NL_QUANT_OUTLIER_SCHEMES = 5 };

/* One scheme and what it did to the matrix: MSE over all rows and over the rows other than the
 * outlier row, SQNR, bytes stored. */
typedef struct nl_quant_outlier_row {
    const char *name;
    nl_quant_granularity g;
    int64_t block;
    double mse, sqnr, mse_rest;
    size_t bytes;
} nl_quant_outlier_row;

/* A random N(0, 0.02) (rows, cols) matrix from seed whose row NL_QUANT_OUTLIER_ROW is multiplied
 * by factor, quantized with `bits`-bit absmax per tensor, per channel and per block 32/64/128.
 * NL_ERR_INVALID for rows <= NL_QUANT_OUTLIER_ROW; NL_ERR_NOMEM; the quantizers' errors. */
nl_status nl_quant_outlier_study(int64_t rows, int64_t cols, int bits, double factor, uint64_t seed,
                                 nl_quant_outlier_row out[NL_QUANT_OUTLIER_SCHEMES]);

/* ---- values: a user's own values through a scheme (`nanolm quant values`) ---------------- */
/* The scheme of `name` with one scale per `block` values (0: one for all): int8, int4 or intB
 * (absmax), affine (uint8 with a zero point, per tensor only), or any name nl_quant_spec_parse
 * knows (without a block). NL_ERR_INVALID naming the scheme or the --block it does not take. */
nl_status nl_quant_values_spec(const char *name, int64_t block, nl_quant_spec *spec);

typedef struct nl_quant_values {
    nl_qtensor q;   /* the codes, scales and zero points of the (1, n) values */
    float *back;    /* [n] the dequantized values */
    double max_err; /* the largest |x - back| */
} nl_quant_values;
/* Quantizes x[0..n) with spec and dequantizes it back. Free with nl_quant_values_free (also
 * after an error). */
nl_status nl_quant_values_run(const float *x, int64_t n, const nl_quant_spec *spec, nl_quant_values *v);
void nl_quant_values_free(nl_quant_values *v);

#ifdef __cplusplus
}
#endif

#endif
