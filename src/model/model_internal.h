/*
 * Declarations internal to the model layer (src/model/), as SQLite keeps sqliteInt.h: what the
 * files of the model share with each other and with the tests, and no other layer calls. The
 * contracts other layers use are in include/nanolm/ (model.h, infer.h, moe.h).
 */
#ifndef NANOLM_MODEL_INTERNAL_H
#define NANOLM_MODEL_INTERNAL_H

#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/model.h"

/* nl_linear_forward with the bf16/fp16 rounded input written into lp (n * in_dim floats) instead
 * of the training activations' scratch: the decode step passes its own state's buffer, so that
 * several decode states can run over one model. */
void nl_linear_forward_lp(const nl_model *m, const nl_linear_site *site, float *out, const float *in, const float *w,
                          int64_t n, int64_t in_dim, int64_t out_dim, float *lp);

/* ---- the fused forward and backward's pieces of the layer kernels (layers.c) ------------------ */
/* x (N, C) += r (skipped when r is NULL), then as nl_rmsnorm_forward on the sum (one pass). */
void nl_rmsnorm_residual_forward(float *out, float *rstd, float *x, const float *r, const float *w, int64_t N,
                                 int64_t C, float eps);
/* The two parts of nl_rmsnorm_backward: dx rows [n0, n1), and dw columns [c0, c0 + 64) summed over
 * all N rows in order (the fused backward runs them inside its own parallel regions). */
enum { NL_RMSNORM_DW_BLOCK = 64 };
void nl_rmsnorm_backward_rows(float *dx, const float *dout, const float *x, const float *w, const float *rstd,
                              int64_t n0, int64_t n1, int64_t C);
void nl_rmsnorm_backward_dw_cols(float *dw, const float *dout, const float *x, const float *rstd, int64_t N, int64_t C,
                                 int64_t c0);

/* ---- mixture of experts inside the model (moe.c; nanolm/moe.h has the public part) -------------- */
/* Sizes the MoE activations for batches of up to (B, T) (nl_model_alloc_acts). */
nl_status nl_moe_alloc_acts(nl_model *m, int64_t B, int64_t T);
/* Frees m->moe and what it holds (nl_model_free). */
void nl_moe_free(nl_model *m);
/* out (BT, C) = MoE MLP of layer l applied to x (BT, C); adds to the aux loss. */
nl_status nl_moe_forward(nl_model *m, int64_t l, const float *x, float *out, int64_t B, int64_t T);
/* dx (BT, C) = d/dx given dout (BT, C); accumulates parameter gradients (incl. aux loss). */
nl_status nl_moe_backward(nl_model *m, int64_t l, const float *x, const float *dout, float *dx, int64_t B, int64_t T);

#endif
