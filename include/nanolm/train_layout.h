/* The run and the fixed parts of a training layout (what `plan train` takes as options), and how
 * they fill a training-plan request (nl_train_req) whose model and hardware are set. */
#ifndef NANOLM_TRAIN_LAYOUT_H
#define NANOLM_TRAIN_LAYOUT_H

#include "nanolm/plan.h"

typedef struct nl_train_layout {
    int64_t gpus;                      /* GPUs in all */
    int64_t global_batch, seq;         /* 0: ~4M tokens a step; the model's context */
    int64_t fix[6], interleave;        /* dp tp pp cp ep micro-batch, pipeline chunks; 0: searched */
    int64_t first_layers, last_layers; /* uneven pipeline ends (both or neither, with pp >= 2); 0: even */
    int64_t node_limit;                /* MoE tokens routed to at most this many nodes; 0: no limit */
    int64_t z3_calls;                  /* ZeRO-3 gathers per layer and pass; 0: one */
    double z3_prefetch;                /* ZeRO-3 parameters gathered ahead; 0: the next layer */
    int z3_spread;                     /* ZeRO-3 rings across nodes spread over the node's NICs */
    int dist_saved;                    /* full recomputation keeps 1/tp of each checkpoint per rank */
    const char *attention;             /* flash (NULL too), flash-v1, flash-triton or materialized */
    int sp, sp_given;                  /* sequence parallelism: 0 on, 1 off; searched unless given */
    int zero_plus1, recompute_plus1;   /* nl_zero + 1, nl_recompute + 1; 0: searched */
    nl_sched schedule;                 /* the pipeline schedule */
} nl_train_layout;

/* Fills the run (gpus, seq, global batch), the fixed layout and the training stack of *q from *l;
 * q's model (arch) is read for the default sequence length. NL_ERR_INVALID, with the option
 * named, on uneven pipeline ends without both ends and pp >= 2, or an unknown attention kernel. */
nl_status nl_train_layout_request(const nl_train_layout *l, nl_train_req *q);

#endif
