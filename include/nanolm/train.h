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

#include "nanolm/data.h"
#include "nanolm/infer.h"
#include "nanolm/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- AdamW --------------------------------------------------------------------------------------
 * torch.optim.AdamW: p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). Weight decay only on tensors with ndim 2. */
typedef struct nl_adamw {
    float beta1, beta2, eps, weight_decay;
    int64_t t;            /* completed optimizer steps */
    size_t n;             /* floats (= model->n_params) */
    float *m, *v;         /* first and second moments, same layout as params; one allocation */
    const float *lr_mult; /* NULL, or one learning-rate multiplier per tensor (muP; borrowed) */
} nl_adamw;

/* Allocates zeroed moments for model m. Returns NL_ERR_NOMEM on failure. */
nl_status nl_adamw_init(nl_adamw *opt, const nl_model *m, float beta1, float beta2, float eps, float weight_decay);
void nl_adamw_free(nl_adamw *opt);
/* One update of all parameters with learning rate lr from m->grads (not modified): t += 1, then
 * nl_adamw_update_range over the whole vector. */
void nl_adamw_step(nl_adamw *opt, nl_model *m, float lr);
/* The AdamW update (the one copy of its arithmetic) of the parameters [g0, g0 + n) of model m's
 * flat vector with opt's hyper-parameters and step count opt->t (already incremented for this
 * step): p, g, mm, vv point at element g0 of wherever that range lives (the model's own buffers,
 * or a shard's). Decay and muP multipliers follow m's tensor table. opt->m / opt->v are not used
 * (mm, vv are), so a sharded layout keeps its moments where it likes. */
void nl_adamw_update_range(const nl_adamw *opt, const nl_model *m, float lr, size_t g0, size_t n, float *p,
                           const float *g, float *mm, float *vv);
/* Bytes of optimizer state (m and v). */
size_t nl_adamw_bytes(const nl_adamw *opt);

/* ---- gradients ----------------------------------------------------------------------------------- */
/* Sum of squares of n floats in double, in an order that depends only on n (fixed chunks). */
double nl_sumsq(const float *x, size_t n);
/* L2 norm of all gradients: sqrt(nl_sumsq(grads)). Non-finite if any gradient is. */
double nl_grad_norm(const nl_model *m);
/* The clipping factor for a global gradient norm: max_norm / (norm + 1e-6) when norm > max_norm
 * (torch clip_grad_norm_), else 1 (also for max_norm <= 0 or a non-finite norm). */
float nl_clip_factor(double norm, double max_norm);
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

/* ---- evaluation ------------------------------------------------------------------------------
 * Mean cross-entropy (nats/token) over a split of d in consecutive windows of T tokens
 * (nl_data_eval_batch: every token after the first is a target once; a last partial window is
 * dropped), B windows per forward, at most max_windows windows (0: all). m must have
 * activations for (B, T). *n_scored receives the number of predicted tokens.
 * Errors: NL_ERR_INVALID when the split has no full window. */
nl_status nl_eval_loss(nl_model *m, const nl_data *d, nl_data_split split, int64_t B, int64_t T, int64_t max_windows,
                       double *mean_loss, int64_t *n_scored);
/* The one evaluation loop under nl_eval_loss and nl_eval_token_losses (nanolm/lossstat.h): the
 * same windows, B per forward, and after each forward visit(user, losses, n) with the n = nb * T
 * per-token losses (nb, T) of that batch in text order. A visitor's error stops the loop and is
 * returned. Errors as nl_eval_loss. */
typedef nl_status (*nl_eval_visit)(void *user, const float *losses, int64_t n);
nl_status nl_eval_windows(nl_model *m, const nl_data *d, nl_data_split split, int64_t B, int64_t T, int64_t max_windows,
                          nl_eval_visit visit, void *user);
/* The number of windows of T tokens those loops evaluate: the split's, at most max_windows (> 0).
 * Errors: NL_ERR_INVALID naming the file and split when not one full window fits. */
nl_status nl_eval_window_count(const nl_data *d, nl_data_split split, int64_t T, int64_t max_windows, int64_t *windows);
/* The same over a token array already in memory (all of it, consecutive windows of T).
 * Errors as nl_eval_loss, plus NL_ERR_INVALID for a token outside the model's vocabulary. */
nl_status nl_eval_loss_tokens(nl_model *m, const int *tokens, int64_t n, int64_t B, int64_t T, double *mean_loss,
                              int64_t *n_scored);

/* The same loss computed token by token through a KV cache (nl_model_step, the generation path)
 * with decode state st (nl_decode_state_init for m, in the cache's element type): window w of T
 * tokens runs positions 0..T-1 from an empty cache. At most max_windows windows (0: all). Errors
 * as nl_eval_loss, plus NL_ERR_INVALID for a state not made for m or a token outside the
 * vocabulary. */
nl_status nl_eval_loss_kv(const nl_model *m, nl_decode_state *st, const nl_data *d, nl_data_split split, int64_t T,
                          int64_t max_windows, double *mean_loss, int64_t *n_scored);

/* ---- the training loop ------------------------------------------------------------------------- */
typedef struct nl_train_opts {
    int64_t steps;      /* optimizer steps in total (a resumed run continues up to this) */
    int64_t stop_after; /* > 0: stop after this step (validate and save) without changing
                               the schedule, to be resumed later */
    int64_t batch, seq; /* B windows of T tokens per micro-batch (seq 0: the model's seq_len) */
    int64_t grad_accum; /* micro-batches per step (gradients averaged) */
    float lr, lr_min;   /* cosine from lr to lr_min */
    int64_t warmup;     /* linear warmup steps; < 0: derived (a resumed run's recorded warmup,
                           else 100, or steps/10 when that is not below steps) */
    float weight_decay, beta1, beta2, adam_eps, grad_clip;
    nl_precision precision;
    float loss_scale_init;    /* fp16: initial loss scale (0: GradScaler's 65536) */
    uint64_t seed;            /* initialisation and data sampling */
    int64_t eval_every;       /* validation every K steps (0: only at the end) */
    int64_t eval_windows;     /* validation windows of T tokens (the first ones of the split) */
    const char *out;          /* checkpoint path (NULL: none); saved at each validation and the end */
    const char *resume;       /* checkpoint to resume from (NULL: fresh run) */
    const char *init_weights; /* start from this checkpoint's weights only: fresh optimizer,
                                 step 0, full schedule (QAT; exclusive with resume) */
    const char *tokenizer;    /* recorded in checkpoints: "byte" or "tok512" */
    int64_t mup_base_dim;     /* > 0: muP (nanolm/mup.h) with this base width; 0: standard */
    int no_loss_scaling;      /* fp16: a fixed loss scale of 1 (an overflow still skips the step) */
    const char *qat;          /* QAT scheme the caller installs (recorded, checked on resume; NULL none) */
    const char *fp8;          /* FP8 recipe the caller installs (recorded, checked on resume; NULL none) */
    const volatile int *stop; /* when *stop becomes nonzero (a signal handler sets it), the current
                                 step finishes, is validated and saved, and nl_trainer_run returns
                                 NL_OK with t->stopped set to that value (NULL: never). A layout
                                 takes the max over ranks once per step (agree_stop), so every
                                 rank stops after the same step */
} nl_train_opts;

/* Fills defaults: steps 2000, batch 12, seq 64, accum 1, lr 1e-3, lr_min lr/10, warmup 100,
 * weight_decay 0.1, betas (0.9, 0.95), eps 1e-8, clip 1.0, fp32, seed 1337, eval 250 x 200. */
void nl_train_opts_default(nl_train_opts *o);

/* Exact bytes of what training allocates. */
typedef struct nl_train_memory {
    size_t params, grads, optimizer, activations, lp_weights, batch, total;
} nl_train_memory;

/* One record per optimizer step (and per validation). */
typedef struct nl_train_log {
    int64_t step; /* 1-based */
    float lr, loss, grad_norm, loss_scale;
    float val_loss;      /* NaN when not evaluated at this step */
    double tokens_per_s; /* of this step */
    int skipped;         /* fp16: step skipped on inf/NaN gradients */
} nl_train_log;

typedef void (*nl_train_callback)(void *user, const nl_train_log *rec, const nl_train_opts *o);

/* ---- parallel layouts ----------------------------------------------------------------------------
 * A parallel layout (data, ZeRO, tensor, pipeline: src/parallel/) plugs into the one training loop
 * through these hooks; the loop keeps the schedule, the clipping, the evaluation points, the
 * checkpoints and the log. One step (nl_train_layout_step) is: grads (forward and backward of this
 * rank's slice, gradient synchronisation, stage schedule; *loss = mean of the global batch), sumsq
 * (the global gradient's sum of squares), scale (by nl_clip_factor when clipping), update (AdamW
 * through nl_adamw_update_range on what this rank owns). eval, save and load may be NULL: the
 * layout then has no validation (val_loss NaN) and refuses checkpoints. All hooks are collective. */
struct nl_ckpt_state;
typedef struct nl_train_layout {
    void *user;
    const char *name; /* "DDP", "ZeRO", "pipeline/tensor" */
    int rank0;        /* 1 on the rank that prints and writes files */
    size_t n_params;  /* of the whole model */
    nl_status (*grads)(void *user, const nl_data *d, int64_t step, float *loss);
    nl_status (*sumsq)(void *user, double *ss);
    void (*scale)(void *user, float f);
    nl_status (*update)(void *user, float lr);
    nl_status (*eval)(void *user, const nl_data *d, int64_t windows, double *loss);
    nl_status (*save)(void *user, const char *path, const struct nl_ckpt_state *st);
    nl_status (*load)(void *user, const char *path, struct nl_ckpt_state *st);
    /* *stop = max over all ranks of *stop, so that every rank stops after the same step when a
     * signal reached some of them (NULL: the ranks never need to agree, e.g. one rank) */
    nl_status (*agree_stop)(void *user, int *stop);
} nl_train_layout;

/* One optimizer step through a layout's hooks (see above); *loss and *grad_norm (before
 * clipping) may be NULL. Errors: the hooks', NL_ERR_NUMERIC for a non-finite loss (no update). */
nl_status nl_train_layout_step(const nl_train_layout *L, const nl_data *d, int64_t step, float lr, float grad_clip,
                               float *loss, double *grad_norm);

typedef struct nl_trainer {
    nl_model model;
    nl_adamw opt;
    nl_loss_scaler scaler;
    nl_rng rng;         /* seeded from o->seed; batches are nl_data_batch(seed, step) */
    int64_t step;       /* completed steps */
    int64_t saved_step; /* step of the last checkpoint written (-1: none yet) */
    int32_t *x, *y;     /* (B, T) batch buffers */
    nl_train_log *log;  /* (log_cap) records, 0..n_log: one per step this process runs */
    int64_t n_log, log_cap;
    int64_t seq; /* tokens per window (o->seq, or the model's seq_len when 0) */
    int stopped; /* nl_trainer_run returned early on o->stop: its (agreed) value */
    nl_train_memory mem;
    double wall_s;                 /* of the steps run in this process */
    struct nl_mup *mup;            /* muP hooks (NULL: standard parametrisation) */
    const nl_train_layout *layout; /* a parallel layout's hooks (NULL: this process alone, `model`) */
    int64_t tokens_done;
    struct nl_step_prof *prof; /* NANOLM_STEP_PROFILE set: the phases of the steps (nanolm/step_prof.h) */
    int64_t warmup;            /* the warmup this run uses: o->warmup, or derived when that is < 0 */
    char *out_lock_path;       /* o->out while this run holds its lock (nl_output_lock), else NULL */
    int out_lock_fd;
} nl_trainer;

/* Builds the model (fresh from arch and seed, or from o->resume with its state) and allocates
 * everything once. With o->resume, arch may be NULL (the checkpoint's shape); when given it must
 * equal the checkpoint's. Everything that defines the run (shape, precision, loss scaling, muP
 * base width, QAT scheme, FP8 recipe, schedule and warmup) must match what the checkpoint
 * recorded, and o->steps must exceed its step. Errors: NL_ERR_INVALID naming both values of a
 * mismatch or invalid sizes (seq > arch seq_len), NL_ERR_NOMEM, checkpoint errors. */
nl_status nl_trainer_init(nl_trainer *t, const nl_arch *arch, const nl_train_opts *o);
/* Model FLOPs of training on one token at window length T, as nanoGPT's estimate_mfu and PaLM
 * (appendix B) count them: 6 N for the weight matrices (N: the parameters less the embedding
 * table, which is a lookup; 2 N forward, 4 N backward) plus 12 L (n_heads head_dim) T for
 * attention's scores and weighted values, forward and backward, over the full T x T square.
 * The hardware does more (recomputation, norms, the optimizer): those do not count. */
double nl_train_flops_per_token(const nl_model *m, int64_t T);
/* The same loop over a parallel layout (whose model lives in the layout): allocates the log,
 * locks o->out on the rank that writes files as nl_trainer_init does (every rank refuses when it
 * is held; collective through L->agree_stop), resumes through L->load (the same checks as
 * nl_trainer_init). Refused, naming the option:
 * precision other than fp32, grad_accum > 1, muP, QAT, FP8, init_weights; o->out or o->resume
 * when the layout has no save / load. L is borrowed until nl_trainer_free. */
nl_status nl_trainer_init_layout(nl_trainer *t, const nl_train_opts *o, const nl_train_layout *L);
void nl_trainer_free(nl_trainer *t);
/* Writes the log (t->log) as CSV: step,lr,train_loss,val_loss,grad_norm,loss_scale,skipped,
 * tokens_per_s; atomically. Errors: NL_ERR_IO naming the file, NL_ERR_NOMEM. */
nl_status nl_train_log_write_csv(const nl_trainer *t, const char *path);
/* Trains on d's train split up to o->steps, evaluating on its validation split. Micro-batch k
 * of step s is nl_data_batch(d, train, seed, s * grad_accum + k), so a resumed run sees the same
 * batches. Calls cb (may be NULL) after each step. A non-finite loss stops training with
 * NL_ERR_NUMERIC ("loss is nan at step N ...") and the last good checkpoint (if any) stays on
 * disk. Errors: NL_ERR_INVALID when a split is shorter than one window (T + 1 tokens). */
nl_status nl_trainer_run(nl_trainer *t, const nl_train_opts *o, const nl_data *d, nl_train_callback cb, void *user);

#ifdef __cplusplus
}
#endif
#endif
