/*
 * What a gradient loses in a 16-bit format: the fraction of values flushed to zero, left
 * subnormal (fewer significant bits) or overflowing, in fp16 with and without loss scaling and
 * in bf16 — the course's point that fp16 needs loss scaling (Micikevicius et al. 2018) and bf16
 * usually does not, measured on a real model's backward pass.
 */
#ifndef NANOLM_PRECISION_H
#define NANOLM_PRECISION_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/formats.h"
#include "nanolm/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_underflow_counts {
    int64_t values;    /* all values looked at */
    int64_t nonzero;   /* nonzero in fp32 */
    int64_t flushed;   /* nonzero in fp32, zero after x * scale is rounded to the format */
    int64_t subnormal; /* nonzero but below the format's smallest normal after scaling */
    int64_t overflow;  /* |x * scale| rounds beyond the largest finite value (inf) */
} nl_underflow_counts;

/* Rounds x[i] * scale to format f (nearest-even, IEEE overflow) and adds what happened to *c.
 * Errors: NL_ERR_INVALID for a non-positive or non-finite scale, a format without subnormal
 * semantics (only fp16, bf16, fp32, tf32 and the FP8 formats are accepted). */
nl_status nl_underflow_count(nl_format f, float scale, const float *x, size_t n, nl_underflow_counts *c);

/* Gradients of a model on real tokens, in fp32: runs `batches` forward/backward passes over
 * consecutive windows of (B, T + 1) tokens from `tokens` (n), with loss scale 1, and returns
 *   *act (n_act)  the output gradients dL/dy of every linear layer (what an fp16 backward
 *                 carries between layers), all batches concatenated;
 *   *wgt (n_wgt)  the parameter gradients (m->grads) of each batch, concatenated.
 * Both are nl_malloc'd (free with nl_free). m must have activations for (B, T) and gradients.
 * Errors: NL_ERR_INVALID when n < B * (T + 1) * batches, NL_ERR_NOMEM, forward errors. */
nl_status nl_grad_sample(nl_model *m, const int32_t *tokens, int64_t n, int64_t B, int64_t T, int batches, float **act,
                         size_t *n_act, float **wgt, size_t *n_wgt);

/* The largest power of two S <= s_max such that max|x| * S stays below fmax (no overflow);
 * 1 if even S = 1 overflows... returns 0 for empty / all-zero x (any scale works). */
double nl_underflow_max_scale(const float *x, size_t n, double fmax, double s_max);

/* The study of `nanolm precision underflow`: the gradients of nl_grad_sample counted in four
 * schemes, fp16 without loss scaling, with GradScaler's initial scale 2^16, with the largest
 * power-of-two scale (<= 2^24) that overflows neither tensor, and bf16 without scaling.
 * cnt[0][s]: the linear layers' output gradients, cnt[1][s]: the parameter gradients. */
enum { NL_UNDERFLOW_SCHEMES = 4 };
typedef struct nl_underflow_study {
    nl_format fmt[NL_UNDERFLOW_SCHEMES];
    double scale[NL_UNDERFLOW_SCHEMES];
    char label[NL_UNDERFLOW_SCHEMES][48];
    nl_underflow_counts cnt[2][NL_UNDERFLOW_SCHEMES];
} nl_underflow_study;

/* Allocates m's activations (B, T) and gradients, samples (as nl_grad_sample) and counts. */
nl_status nl_underflow_study_run(nl_model *m, const int32_t *tokens, int64_t n, int64_t B, int64_t T, int batches,
                                 nl_underflow_study *out);

#ifdef __cplusplus
}
#endif
#endif
