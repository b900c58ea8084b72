/*
 * Maximal update parametrisation (muP; Yang et al. 2022, "Tensor Programs V") for NanoLM
 * trained with AdamW. Width multiplier r = dim / base_dim:
 *   - hidden matrices (q, k, v, o, gate, up, down): initial std divided by sqrt(r) (variance
 *     ~ 1/fan_in) and Adam learning rate divided by r;
 *   - token embedding and RMSNorm gains: unchanged init and learning rate;
 *   - classifier: unchanged init and learning rate, logits multiplied by 1/r (the output
 *     multiplier, through the model's linear hook);
 *   - attention keeps 1/sqrt(head_dim): widths grow by adding heads of a fixed head_dim, so the
 *     1/d rule of muP changes nothing here.
 * At r = 1 this is the standard parametrisation exactly, so a learning rate tuned at the base
 * width transfers. fp32 only.
 */
#ifndef NANOLM_MUP_H
#define NANOLM_MUP_H

#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/model.h"

struct nl_adamw;

typedef struct nl_mup {
    int64_t base_dim;
    double width_mult; /* r = dim / base_dim */
    float out_mult;    /* 1 / r */
    float *lr_mult;    /* (n_tensors) per-tensor learning-rate multipliers, given to AdamW */
    nl_linear_ops ops; /* the classifier's output multiplier, around nl_linear_*_default */
    nl_model *model;   /* the model the hook is installed on */
    float *dw_cls;     /* (V, C) scratch for the classifier's weight gradient; NULL at r = 1 */
} nl_mup;

/* Sets up muP for m and its optimizer opt: installs the output multiplier on m->linear_ops and
 * the per-tensor learning rates on opt->lr_mult; with rescale_init (a fresh model initialised
 * by nl_model_init_random) divides the hidden matrices by sqrt(r). Errors: NL_ERR_INVALID for
 * base_dim <= 0 or a precision other than fp32, NL_ERR_NOMEM. */
nl_status nl_mup_init(nl_mup *mu, nl_model *m, struct nl_adamw *opt, int64_t base_dim, int rescale_init);
/* Removes the hooks from m and opt and frees mu's buffers. */
void nl_mup_free(nl_mup *mu, nl_model *m, struct nl_adamw *opt);


#include "nanolm/data.h"

/* A learning-rate sweep at several widths (the muP transfer experiment): for every width w and
 * learning rate lrs[j], trains a fresh NanoLM of `layers` layers, dim w (heads of 16, as
 * nl_sweep_arch) for `steps` steps of batch x seq tokens (cosine, warmup steps/10) and stores
 * the validation loss over `val_windows` windows in loss[i * n_lr + j] (INFINITY when training
 * diverges). base_dim > 0: muP with that base width; 0: standard parametrisation. Errors:
 * data or allocation errors (message names the width and learning rate). */
nl_status nl_lr_sweep(const nl_data *d, const int64_t *widths, int n_w, const double *lrs, int n_lr, int64_t layers,
                      int64_t steps, int64_t batch, int64_t seq, int64_t val_windows, int64_t base_dim, uint64_t seed,
                      double *loss);
/* The minimum's position refined by the parabola through the smallest value and its two
 * neighbours (grid units, e.g. 2.3 lies between x[2] and x[3]); the plain index at an edge or
 * next to a non-finite value; NaN if no value is finite. */
double nl_argmin_interp(const double *x, int n);

/* The muP transfer experiment of `nanolm scaling lr-transfer`: nl_lr_sweep at every width and
 * learning rate (batch 8 x seq 32, 100 validation windows, seed 11), once in the standard
 * parametrisation and once with muP at base width `base`, and the best learning rate per width. */
enum { NL_LRT_MAX_WIDTHS = 8, NL_LRT_MAX_LRS = 16 };
typedef struct nl_lr_transfer {
    int n_w, n_lr; /* the grid: widths[n_w] x lrs[n_lr] */
    int64_t widths[NL_LRT_MAX_WIDTHS];
    double lrs[NL_LRT_MAX_LRS];
    double sp[NL_LRT_MAX_WIDTHS * NL_LRT_MAX_LRS], mu[NL_LRT_MAX_WIDTHS * NL_LRT_MAX_LRS]; /* [width][lr] */
    int best_sp[NL_LRT_MAX_WIDTHS], best_mu[NL_LRT_MAX_WIDTHS]; /* grid index of the smallest loss */
    double fb[2][NL_LRT_MAX_WIDTHS]; /* [sp, mup][width]: best index refined by nl_argmin_interp */
    double lo[2], hi[2];             /* the range of fb over the widths */
} nl_lr_transfer;

/* NL_ERR_INVALID for more than NL_LRT_MAX_WIDTHS widths or NL_LRT_MAX_LRS rates; nl_lr_sweep's
 * errors. */
nl_status nl_lr_transfer_run(const nl_data *d, const int64_t *widths, int n_w, const double *lrs, int n_lr,
                             int64_t layers, int64_t steps, int64_t base, nl_lr_transfer *x);
/* The plots of x: validation loss against the learning rate (log axis), one line per width,
 * diverged runs drawn at 6; the standard parametrisation in `path`, muP in mup-NAME beside it
 * (NAME: path's file name), whose path goes to mup_path[n]. */
nl_status nl_lr_transfer_svg(const char *path, const nl_lr_transfer *x, char *mup_path, size_t n);
#endif
