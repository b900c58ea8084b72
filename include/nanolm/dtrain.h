/*
 * Data-parallel training of NanoLM over MPI: DDP and ZeRO-1/2/3 (FSDP full shard).
 *
 * The model's parameters are one flat fp32 vector; it is cut into units: the embedding, each
 * layer, and the tail (final norm and an untied classifier). A unit is an offset range
 * [begin, begin + len); its shard on data-parallel rank r of p is [begin + r*s, begin + (r+1)*s)
 * with s = ceil(len / p), i.e. the unit padded to a multiple of p (padding is never stored in
 * the model, only in the shards).
 *
 *   zero 0 (DDP)  every rank holds parameters, gradients, AdamW state. After a unit's backward
 *                 is done its gradients are all-reduced non-blocking (one bucket per unit) while
 *                 the backward of the layers below runs; each rank then updates everything.
 *   zero 1        optimizer state sharded: gradients reduce-scattered per unit, each rank updates
 *                 its shard, parameters all-gathered per unit.
 *   zero 2        gradients sharded too: the reduced shard is all a rank keeps between steps
 *                 (the model's full gradient buffer is the backward's workspace).
 *   zero 3        parameters sharded too: each layer is all-gathered before its forward, its
 *                 weights are dropped (overwritten with NaN) after use, all-gathered again before
 *                 its backward and dropped again; gradients reduce-scattered per unit. The
 *                 embedding and tail units are gathered once per step (FSDP's root unit).
 *
 * Every rank's batch is its own slice of the global batch (nl_data_batch with the dp rank), so a
 * run on p ranks with batch B sees the same data as one process with batch p*B.
 * Only fp32 training; tensor and pipeline parallelism are not part of this module.
 */
#ifndef NANOLM_DTRAIN_H
#define NANOLM_DTRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/arch.h"
#include "nanolm/base.h"
#include "nanolm/comm.h"
#include "nanolm/data.h"
#include "nanolm/model.h"
#include "nanolm/checkpoint.h"
#include "nanolm/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_dist_opts {
    nl_train_opts train; /* the training options (nanolm/train.h): batch = windows per data-parallel
                            rank, seq, AdamW, clipping, seed (initialisation on rank 0, then
                            broadcast, and data) */
    int zero;            /* 0 (DDP), 1, 2, 3 */
    int overlap;         /* DDP: all-reduce buckets during backward (1) or after it (0) */
    int sp;              /* tensor parallel: sequence parallelism (Korthikanti et al.; pipeline.h) */
    nl_comm_impl impl;   /* collectives: ours or native */
} nl_dist_opts;

/* The training defaults (nl_train_opts_default), DDP, overlap on, our collectives. */
void nl_dist_opts_default(nl_dist_opts *o);

/* Bytes this rank holds between steps (persistent state), exactly as allocated, and the
 * workspace it needs during a step on top of that. */
typedef struct nl_dist_memory {
    size_t params, grads, optimizer;
    size_t workspace;
} nl_dist_memory;

typedef struct nl_dist_unit {
    size_t begin, len; /* range of the flat parameter vector, floats */
    size_t shard;      /* ceil(len / p): floats per rank */
    size_t pos;        /* offset of this unit's shard in the rank's shard buffers */
} nl_dist_unit;

typedef struct nl_dist_trainer {
    nl_model model;
    nl_dist_opts o;
    nl_comm *dp; /* the data-parallel group (borrowed) */
    int p, r;
    int n_units; /* L + 2: embedding, layers, tail */
    nl_dist_unit *units;
    size_t shard_total;     /* sum of unit shards */
    float *pshard;          /* zero 3: (shard_total) parameters of this rank's shards */
    float *gshard;          /* zero 2, 3: (shard_total) reduced gradients */
    float *adam_m, *adam_v; /* zero 0: (n_params); zero >= 1: (shard_total) */
    float *staging;         /* (p * max shard) padded unit for reduce-scatter / all-gather */
    nl_adamw opt;           /* hyper-parameters and steps taken (t); its m, v stay NULL */
    int32_t *x, *y;         /* (B, T) */
    nl_comm_request **req;  /* DDP buckets in flight, one per unit */
    nl_linear_ops ops;
    nl_status hook_status; /* first error inside a hook */
    int in_backward;
    double backward_s, comm_wait_s; /* last step: backward time, time waiting for buckets after it */
} nl_dist_trainer;

/* Builds the model (initialised on dp rank 0 with o->seed and broadcast to the group), the
 * shards and the optimizer state. Errors: NL_ERR_INVALID (bad zero level, sizes), NL_ERR_NOMEM,
 * NL_ERR_COMM. */
nl_status nl_dist_init(nl_dist_trainer *t, const nl_arch *arch, const nl_dist_opts *o, nl_comm *dp);
void nl_dist_free(nl_dist_trainer *t);
/* Fills L with the hooks of the one training loop (nanolm/train.h), in the order a step calls
 * them: grads runs forward and backward of this rank's slice of step `step`'s global batch and
 * synchronises the gradients (all-reduce per bucket, or reduce-scatter per unit) and averages
 * them over the ranks; the loss is the mean of the global batch. sumsq is the sum of squares of
 * the global gradient (collective for ZeRO); scale scales what this rank owns; update runs AdamW
 * (nl_adamw_update_range) on what it owns and all-gathers the parameters (ZeRO-1/2). eval is the
 * validation loss (every rank, its full replica; ZeRO-3 gathers it). save writes a checkpoint
 * (nanolm/checkpoint.h: weights, AdamW moments and t, and the state's step, RNG, scaler,
 * precision and run) that one process can read: the shards are gathered to dp rank 0, which
 * writes the file atomically (collective over the group). load: every rank reads the checkpoint
 * (validated as nl_ckpt_load_state does) and keeps its part. Errors: data or model errors,
 * NL_ERR_COMM, NL_ERR_IO / NL_ERR_FORMAT naming the file, NL_ERR_INVALID when its model differs. */
void nl_dist_layout(nl_dist_trainer *t, nl_train_layout *L);
/* The persistent and workspace bytes of this rank. */
void nl_dist_memory_report(const nl_dist_trainer *t, nl_dist_memory *out);

#ifdef __cplusplus
}
#endif
#endif
