/*
 * FP8 training of NanoLM: the model's linear layers (q/k/v, o, gate/up, down) run their forward
 * matmul and both backward matmuls through the emulated FP8 GEMM (nanolm/fp8.h), installed as
 * the model's nl_linear_ops hook. Everything else stays in higher precision, as DeepSeek-V3
 * (§3.3) and the course do: the embedding, the classifier (lm head, through the model's default
 * linear path), RMSNorm, attention (scores, softmax, weighted sum), the fp32 master weights,
 * gradients and AdamW states.
 *
 * The three GEMMs of a linear y (N, out) = x (N, in) . W^T, W (out, in):
 *   forward  y  = x . W^T         A = x    (fmt_act),  B = W^T (fmt_act)
 *   dgrad    dx = dy . W          A = dy   (fmt_grad), B = W   (fmt_act)
 *   wgrad    dW += dy^T . x       A = dy^T (fmt_grad), B = x   (fmt_act)
 * fmt_act = fmt_grad = E4M3 is DeepSeek-V3's recipe (with block scaling); fmt_grad = E5M2 is the
 * "hybrid" recipe of Micikevicius et al. 2022 / Transformer Engine's Format.HYBRID.
 * With block scaling A is quantized in 1x128 tiles along the GEMM's K and B in 128x128 blocks,
 * whatever the GEMM (for wgrad K is the token dimension).
 */
#ifndef NANOLM_FP8_LINEAR_H
#define NANOLM_FP8_LINEAR_H

#include "nanolm/fp8.h"
#include "nanolm/linear_hook.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_fp8_recipe {
    nl_format fmt_act;       /* activations and weights (E4M3) */
    nl_format fmt_grad;      /* output gradients in backward (E4M3, or E5M2 = hybrid) */
    nl_fp8_scaling scaling;  /* block by default */
    nl_fp8_acc acc;          /* fp32 by default (bits = 0); 14-bit / promote 128 = DeepSeek-V3's H800 */
    int history_len, margin; /* delayed scaling: amax history and margin (16, 0) */
} nl_fp8_recipe;

/* E4M3 everywhere, block scaling, fp32 accumulation, delayed history 16, margin 0. */
void nl_fp8_recipe_default(nl_fp8_recipe *r);
/* The recipe as a run records it (and a resume checks it), in buf[n]: formats, scaling and
 * accumulator, "e4m3/e5m2/block/acc14/promote128". Returns buf. */
const char *nl_fp8_recipe_id(const nl_fp8_recipe *r, char *buf, size_t n);
/* The recipe in words, in buf[n]: "e4m3/e4m3, block scaling, fp32 accumulation" or "..., 14-bit
 * accumulator, promote 128". Returns buf. */
const char *nl_fp8_recipe_desc(const nl_fp8_recipe *r, char *buf, size_t n);

/* What the FP8 linears did so far. */
typedef struct nl_fp8_linear_stats {
    int64_t gemms;              /* FP8 GEMMs run */
    int64_t saturated, flushed; /* elements clipped to +-fmax / nonzero elements that became 0 */
    int64_t quantized;          /* elements quantized */
} nl_fp8_linear_stats;

typedef struct nl_fp8_linear {
    nl_fp8_recipe recipe;
    nl_model *model;
    nl_linear_hook hook;     /* installed as model->linear_ops over the previous hook (restored on remove) */
    nl_fp8_delayed *delayed; /* (L * 4 sites, 6 roles) for delayed scaling, else NULL */
    nl_fp8_linear_stats stats;
    nl_status status; /* first failure inside a hook (hooks cannot return one) */
    char error[256];
} nl_fp8_linear;

/* Installs FP8 linears on model m (which must outlive f). Errors: NL_ERR_INVALID for a recipe
 * with a non-FP8 format, an unknown scaling or a bad accumulator (block scaling with a limited
 * accumulator also needs promote dividing 128); NL_ERR_NOMEM. */
nl_status nl_fp8_linear_install(nl_fp8_linear *f, nl_model *m, const nl_fp8_recipe *r);
/* Restores the model's previous linear ops and frees f's state. */
void nl_fp8_linear_remove(nl_fp8_linear *f);
/* NL_OK, or the first error a hook met (a GEMM that failed fills its output with NaN, so the
 * loss becomes NaN and training stops); the message is in f->error. */
nl_status nl_fp8_linear_status(const nl_fp8_linear *f);

#ifdef __cplusplus
}
#endif
#endif
