/* The planner's assumptions as a user overrides them (`--gemm-eff`, `--link-eff`, `--napkin`, ...
 * of plan train, layer and serve), and how they change the GPU of the catalog and the efficiencies
 * of a training request, or a serving request. */
#ifndef NANOLM_PLAN_ASSUME_H
#define NANOLM_PLAN_ASSUME_H

#include "nanolm/plan.h"

typedef struct nl_plan_assume {
    nl_eff eff;            /* gemm, attn, tp_overlap, dp_overlap, usable_mem as given (nl_eff_default) */
    double kernel_us;      /* per kernel launch; < 0: the planner's 5 */
    double reserved_gb;    /* GB per GPU held by the context and buffers; < 0: the planner's 2 */
    double link_eff;       /* achieved share of NVLink and network bandwidth; < 0: the GPU's */
    double latency_us;     /* per collective call; < 0: the GPU's */
    double price;          /* $ per GPU-hour; < 0: the GPU's */
    double mfu;            /* > 0: time = 6 N tokens / (peak x mfu) instead of the kernel model */
    int64_t gpus_per_node; /* > 0: instead of the GPU's */
    int napkin; /* the course's napkin: MFU 0.4, links at full speed without latency, plain rings over
                   one link per GPU; serving: 50% MFU prefill, full HBM bandwidth, no launch cost */
} nl_plan_assume;

/* Nothing overridden: the planner's efficiencies (nl_eff_default) and the GPU's own figures. */
void nl_plan_assume_default(nl_plan_assume *a);

/* Applies a to *hw (a GPU of the catalog) and gives the efficiencies of the cost model in *eff. */
void nl_plan_assume_train(const nl_plan_assume *a, nl_hw *hw, nl_eff *eff);

/* Applies a to a serving request whose GPU is set: --gemm-eff for prefill and decode GEMMs,
 * and the napkin (a prefill MFU given in sq is kept). */
void nl_plan_assume_serve(const nl_plan_assume *a, nl_serve_req *sq);

#endif
