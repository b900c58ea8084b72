/* nanolm layer_study: what `plan layer` reports around nl_plan_layer: the request and layout
 * of one layout given by its degrees, the model's size, the data-parallel traffic per step, one
 * MoE layer's forward compute and the width at which tensor parallelism turns compute-bound. */
#ifndef NANOLM_LAYER_STUDY_H
#define NANOLM_LAYER_STUDY_H

#include "nanolm/plan.h"

/* One layout by its degrees; tokens is per GPU per microbatch (0: the context), params
 * overrides the model's count when > 0. */
typedef struct nl_layer_study_req {
    int64_t dp, tp, pp, ep, micro;
    nl_zero zero;
    int sp;
    double tokens, params;
} nl_layer_study_req;

typedef struct nl_layer_study {
    nl_layer_plan lp;
    double N;            /* parameters */
    double T;            /* tokens per GPU per microbatch */
    double peak, mfu;    /* bf16 FLOP/s and the efficiency of the compute figures */
    double active_layer; /* active parameters of one layer */
    double layer_fwd;    /* one layer's forward compute, s */
    double dp_traffic;   /* data-parallel/ZeRO communication per step, s */
    double p2;           /* the TP degree of the compute-bound width (2 when tp is 1) */
    double tp_bound;     /* D above which a TP matmul is compute-bound */
    double fsdp_gather;  /* bytes of the first all-gather of the step (ZeRO-3/HSDP), 0 if none */
} nl_layer_study;

/* Completes q (seq, gpus, global batch, tokens) for the layout a and plans its collectives. */
nl_status nl_plan_layer_study(nl_train_req *q, const nl_layer_study_req *a, nl_layer_study *out);

#endif
