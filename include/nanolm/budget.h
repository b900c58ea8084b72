/*
 * nanolm budget: the memory of training one model on one layout (`nanolm budget`): the
 * parameters one GPU holds under tp/pp/ep, the training state per GPU at each ZeRO stage, and
 * the activations of a batch under the three recomputation modes beside Korthikanti et al.'s
 * published formulas. Pure arithmetic over nanolm/plan.h.
 */
#ifndef NANOLM_BUDGET_H
#define NANOLM_BUDGET_H

#include "nanolm/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The layout and the batch. */
typedef struct nl_budget_layout {
    int64_t gpus, tp, pp, ep, batch, seq, micro; /* micro 0: 2 x pp */
    int sp, no_flash, recompute;                 /* recompute: nl_recompute */
} nl_budget_layout;

/* The model (a or only a parameter count) and what one GPU holds. */
typedef struct nl_budget {
    nl_recipe rec;
    nl_hw hw;
    nl_arch a;     /* zero without a model */
    nl_family fam; /* the model's family */
    int has_model;
    double total, nonemb, active, expert; /* parameters (scaled to `params` with a model) */
    double per_gpu, per_gpu_ne;           /* parameters one GPU holds under tp/pp/ep */
    int64_t dp, shard;                    /* data-parallel degree; hsdp shard group */
} nl_budget;

/* Counts b's parameters (b->rec, hw, a, fam and has_model set by the caller; params > 0 scales a
 * model to that size, and is the count without one) and what one GPU holds under L.
 * NL_ERR_INVALID naming the option at fault: --ep without experts or not dividing them, --tp
 * not dividing the heads, --gpus not a multiple of tp*pp, --ep above the data-parallel degree. */
nl_status nl_budget_count(const nl_budget_layout *L, double params, nl_budget *b);

/* State bytes per GPU at ZeRO stage z: the dense part sharded over dp, the experts over dp/ep.
 * *sd: the per-parameter bytes of the dense part. */
double nl_budget_stage_bytes(const nl_budget_layout *L, const nl_budget *b, int z, nl_state_bytes *sd);

/* The activations of the batch (needs a model): this walk under the three recomputation modes,
 * Korthikanti's formulas, the logits and the micro-batches a pipeline keeps in flight. */
typedef struct nl_budget_act {
    nl_act_layer al, sel, full;
    double tokens, layers, bytes, k_none, k_flash, k_full, logits, inflight_1f1b, inflight_gpipe;
    int64_t micro;
} nl_budget_act;

void nl_budget_activations(const nl_budget_layout *L, const nl_budget *b, nl_budget_act *x);

/* One memory bar per ZeRO stage 0..3 at this layout (activations included with a model), for
 * nl_plan_svg_memory. */
void nl_budget_bars(const nl_budget_layout *L, const nl_budget *b, const nl_budget_act *x, nl_train_eval ev[4]);

#ifdef __cplusplus
}
#endif

#endif
