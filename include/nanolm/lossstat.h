/*
 * How precise is a measured loss? The mean of per-token losses has a standard error, but
 * neighbouring tokens' losses are correlated (the same word, the same context), so the i.i.d.
 * formula sd/sqrt(n) is too optimistic. Batch means: cut the stream into consecutive batches of
 * b tokens; when b is much longer than the correlation length the batch means are nearly
 * independent, and their spread gives the standard error of the overall mean.
 */
#ifndef NANOLM_LOSSSTAT_H
#define NANOLM_LOSSSTAT_H

#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/data.h"
#include "nanolm/model.h"

typedef struct nl_loss_stats {
    int64_t n;     /* tokens used (a multiple of batch) */
    int64_t batch; /* tokens per batch */
    int64_t n_batches;
    double mean;         /* of the n tokens */
    double sd;           /* per-token standard deviation */
    double se_iid;       /* sd / sqrt(n): what independence would give */
    double se;           /* batch-means standard error of the mean */
    double ci_lo, ci_hi; /* 95% interval: mean -/+ t(0.975, n_batches-1) * se */
    double ess_factor;   /* (se / se_iid)^2: tokens per effectively independent token */
} nl_loss_stats;

/* Batch-means statistics of `n` per-token losses in stream order. batch <= 0 picks
 * floor(sqrt(n)) (the usual choice: batches and batch length grow together). A last partial
 * batch is dropped. Errors: NL_ERR_INVALID when fewer than 2 full batches fit or a value is
 * not finite (message names the index). */
nl_status nl_loss_stats_compute(const float *losses, int64_t n, int64_t batch, nl_loss_stats *out);

/* Tokens needed for a standard error of target_se, assuming the same per-token long-run
 * variance (n * se^2 stays constant): n * (se / target_se)^2, rounded up. */
double nl_loss_stats_tokens_for_se(const nl_loss_stats *s, double target_se);

/* Two-sided 97.5% quantile of Student's t with df degrees of freedom (Cornish-Fisher
 * expansion about the normal quantile; exact to ~1e-3 for df >= 5). */
double nl_student_t975(double df);

/* Per-token losses of m over a split of d, in text order (consecutive windows of T tokens, as
 * nl_eval_loss). *losses is malloc'd (nl_free), *n its length. Errors as nl_eval_loss. */
nl_status nl_eval_token_losses(nl_model *m, const nl_data *d, nl_data_split split, int64_t B, int64_t T,
                               int64_t max_windows, float **losses, int64_t *n);

/* What `nanolm eval` measures. kv < 0: the batched evaluation (windows of (B, T), activations
 * allocated here) with the batch-means statistics (se_batch 0: sqrt(tokens)) and, with a llama2.c
 * tokenizer (llama2c = 1), the mean split between non-ASCII byte-fallback targets (pieces
 * <0x80>..<0xFF>) and the rest; kv >= 0: token by token through a KV cache of that nl_kv_dtype
 * (a decode state made and freed here), loss only. target_se > 0: the tokens needed for that
 * standard error. */
typedef struct nl_eval_summary {
    int64_t scored;
    double loss;     /* mean over all scored tokens */
    size_t kv_bytes; /* kv >= 0: bytes of the K/V storage of the cache as allocated */
    nl_loss_stats st;
    int show_fb; /* the byte-fallback split applies */
    int64_t n_fb;
    double sum_fb, fb_mean, rest_mean, need;
} nl_eval_summary;

nl_status nl_eval_summary_run(nl_model *m, const nl_data *d, int llama2c, nl_data_split split, int64_t B, int64_t T,
                              int kv, int64_t max_windows, int64_t se_batch, double target_se, nl_eval_summary *out);

#endif
