/*
 * Training pieces for NanoLM: AdamW (PyTorch semantics, decay on 2-D weights only), global
 * gradient-norm clipping, a cosine learning-rate schedule with linear warmup, and fp16 dynamic
 * loss scaling with torch.cuda.amp.GradScaler semantics. Everything walks the model's flat
 * parameter vector, so a shard (an offset range) can be updated on its own.
 */
#ifndef NANOLM_TRAIN_H
#define NANOLM_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- AdamW --------------------------------------------------------------------------------------
 * torch.optim.AdamW: p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). Weight decay only on tensors with ndim 2. */
typedef struct nl_adamw {
    float beta1, beta2, eps, weight_decay;
    int64_t t;        /* completed optimizer steps */
    size_t n;         /* floats (= model->n_params) */
    float *m, *v;     /* first and second moments, same layout as params; one allocation */
} nl_adamw;

/* Allocates zeroed moments for model m. Returns NL_ERR_NOMEM on failure. */
nl_status nl_adamw_init(nl_adamw *opt, const nl_model *m, float beta1, float beta2, float eps, float weight_decay);
void nl_adamw_free(nl_adamw *opt);
/* One update of all parameters with learning rate lr from m->grads (not modified). */
void nl_adamw_step(nl_adamw *opt, nl_model *m, float lr);
/* Bytes of optimizer state (m and v). */
size_t nl_adamw_bytes(const nl_adamw *opt);

/* ---- gradients ----------------------------------------------------------------------------------- */
/* L2 norm of all gradients (accumulated in double). Non-finite if any gradient is. */
double nl_grad_norm(const nl_model *m);
/* Scales gradients by max_norm / (norm + 1e-6) when norm > max_norm (torch clip_grad_norm_).
 * Returns the norm before clipping. max_norm <= 0 disables clipping. */
double nl_grad_clip(nl_model *m, double max_norm);
/* Multiplies every gradient by s. */
void nl_grad_scale(nl_model *m, float s);

/* ---- schedule ------------------------------------------------------------------------------------
 * Linear warmup from lr_max/warmup to lr_max over `warmup` steps, then cosine decay to lr_min at
 * step total-1. step is 0-based. */
float nl_lr_cosine(int64_t step, int64_t warmup, int64_t total, float lr_max, float lr_min);

/* ---- fp16 dynamic loss scaling (torch GradScaler) -----------------------------------------------
 * The loss is multiplied by `scale` before backward; after backward nl_scaler_unscale divides the
 * gradients by it and reports inf/NaN; nl_scaler_update then halves the scale (and the caller
 * skips the step) on inf/NaN, or doubles it after `growth_interval` consecutive good steps. */
typedef struct nl_loss_scaler {
    float scale;             /* 65536 initially */
    float growth_factor;     /* 2 */
    float backoff_factor;    /* 0.5 */
    int64_t growth_interval; /* 2000 */
    int64_t good_steps;      /* consecutive steps without inf/NaN */
    int64_t skipped;         /* steps skipped so far */
} nl_loss_scaler;
void nl_scaler_init(nl_loss_scaler *s);
/* Divides m->grads by s->scale; returns 1 if any gradient is inf or NaN (grads then unusable). */
int nl_scaler_unscale(nl_loss_scaler *s, nl_model *m);
/* Updates the scale after a step; found_inf from nl_scaler_unscale. */
void nl_scaler_update(nl_loss_scaler *s, int found_inf);

#ifdef __cplusplus
}
#endif
#endif
