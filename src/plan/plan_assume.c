/* The planner's assumptions as a user overrides them (nanolm/plan_assume.h). */
#include "nanolm/plan_assume.h"

#include <string.h>

void nl_plan_assume_default(nl_plan_assume *a) {
    memset(a, 0, sizeof *a);
    nl_eff_default(&a->eff);
    a->kernel_us = a->reserved_gb = -1;
    a->link_eff = a->latency_us = a->price = -1;
}

void nl_plan_assume_train(const nl_plan_assume *a, nl_hw *hw, nl_eff *eff) {
    *eff = a->eff;
    if (a->kernel_us >= 0) eff->kernel_s = a->kernel_us * 1e-6;
    if (a->reserved_gb >= 0) eff->reserved_bytes = a->reserved_gb * 1e9;
    if (a->napkin) {
        hw->intra_eff = hw->inter_eff = 1;
        hw->latency_s = 0;
        hw->nvls_eff = 0;      /* the course's collectives: plain rings, */
        hw->nics_per_node = 0; /* one link per GPU across nodes */
        eff->fixed_mfu = 0.4;
    }
    if (a->link_eff > 0) hw->intra_eff = hw->inter_eff = a->link_eff;
    if (a->latency_us >= 0) hw->latency_s = a->latency_us * 1e-6;
    if (a->price >= 0) hw->price_per_hour = a->price;
    if (a->gpus_per_node > 0) hw->gpus_per_node = a->gpus_per_node;
    if (a->mfu > 0) eff->fixed_mfu = a->mfu;
}

void nl_plan_assume_serve(const nl_plan_assume *a, nl_serve_req *sq) {
    if (a->eff.gemm > 0) sq->hw.gemm_eff = a->eff.gemm; /* prefill and decode GEMMs too */
    if (a->napkin) { /* the course's roofline: 50% MFU prefill, full HBM bandwidth, no launches */
        if (!(sq->prefill_mfu > 0)) sq->prefill_mfu = 0.5;
        sq->kernel_s = 0;
        sq->hbm_eff = 1;
    }
}
