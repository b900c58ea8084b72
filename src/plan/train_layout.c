/* A training layout's options into a training-plan request. See include/nanolm/train_layout.h. */
#include "nanolm/train_layout.h"

#include <math.h>
#include <string.h>

/* The attention kernel: materialized scores or FlashAttention at one of its published rates. */
static nl_status layout_attention(const char *name, nl_train_req *q) {
    if (!name) return NL_OK;
    if (!strcmp(name, "materialized"))
        q->attn_materialized = 1;
    else if (!strcmp(name, "flash-triton") || !strcmp(name, "flash-v1"))
        q->attn_triton = 1; /* both at FlashAttention (v1)'s published rate */
    else if (strcmp(name, "flash"))
        return nl_fail(NL_ERR_INVALID, "unknown --attention '%s' (flash, flash-v1, flash-triton, materialized)", name);
    return NL_OK;
}

nl_status nl_train_layout_request(const nl_train_layout *l, nl_train_req *q) {
    q->gpus = l->gpus;
    q->seq = l->seq > 0 ? l->seq : q->arch.seq_len;
    q->fix.dp = l->fix[0];
    q->fix.tp = l->fix[1];
    q->fix.pp = l->fix[2];
    q->fix.cp = l->fix[3];
    q->fix.ep = l->fix[4];
    q->fix.micro_batch = l->fix[5];
    q->fix.zero_plus1 = l->zero_plus1;
    q->fix.recompute_plus1 = l->recompute_plus1;
    q->fix.vpp = l->interleave;
    if ((l->first_layers > 0) != (l->last_layers > 0) || (l->first_layers > 0 && l->fix[2] < 2))
        return nl_fail(NL_ERR_INVALID, "--first-stage-layers and --last-stage-layers go together, with --pp >= 2");
    NL_TRY(layout_attention(l->attention, q));
    q->distribute_saved = l->dist_saved;
    q->moe_node_limit = l->node_limit;
    q->zero3_calls_per_layer = l->z3_calls;
    q->zero3_prefetch = l->z3_prefetch;
    q->zero3_nic_spread = l->z3_spread;
    q->fix.first_layers = l->first_layers;
    q->fix.last_layers = l->last_layers;
    q->fix.sp_plus1 = l->sp_given ? (l->sp == 0 ? 2 : 1) : 0; /* on|off */
    q->schedule = l->schedule;
    /* Default batch: ~4M tokens (Llama 2 and 3 trained 7-8B models with 4M-token batches). */
    q->global_batch = l->global_batch > 0 ? l->global_batch : (int64_t)fmax(1, round(4194304.0 / (double)q->seq));
    return NL_OK;
}
