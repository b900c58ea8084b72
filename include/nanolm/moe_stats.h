/*
 * nanolm moe_stats: what an expert or context parallel MoE training run reports (`nanolm moe
 * train`): the load balance of the experts, one record per step with the byte counts of every
 * rank, and the memory every rank holds.
 */
#ifndef NANOLM_MOE_STATS_H
#define NANOLM_MOE_STATS_H

#include "nanolm/moe_ep.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Mean over the MoE layers of (max expert load / mean expert load); tok: (layers, E). */
double nl_moe_load_ratio(const int64_t *tok, int64_t layers, int64_t E);

/* The byte counts of a step (nl_ep_step_stats), in this order. */
enum { NL_MOE_STEP_BYTES = 6 };
extern const char *const nl_moe_step_byte_names[NL_MOE_STEP_BYTES];

/* One step: its figures, and the byte counts of every rank (bytes[k * N + r]). */
typedef struct nl_moe_step_rec {
    int64_t step, slots, dropped;
    double loss, aux_loss, grad_norm, lr, val_loss, max_mean_load;
    double *bytes;
} nl_moe_step_rec;

typedef struct nl_moe_steps {
    nl_moe_step_rec *rec;
    int64_t n, cap;
} nl_moe_steps;

/* Appends the step that the trainer logged as r (t->st holds its statistics), with the byte
 * counts gathered from every rank. Collective over w. */
nl_status nl_moe_steps_record(nl_moe_steps *s, nl_comm *w, const nl_ep_trainer *t, const nl_train_log *r);
void nl_moe_steps_free(nl_moe_steps *s);

/* Bytes every rank holds: v (4, N) = parameters, gradients, optimizer state, activations per
 * rank. Collective over w. */
nl_status nl_moe_memory(nl_comm *w, const nl_ep_trainer *t, double *v);

#ifdef __cplusplus
}
#endif

#endif
