/* plan layer's figures around one layer's collectives (layer_study.h). */
#include "nanolm/layer_study.h"

#include <string.h>

/* The figures beside the collectives: sizes, compute and the TP compute-bound width. */
static void layer_extras(const nl_layer_study_req *a, const nl_train_req *q, nl_layer_study *x) {
    nl_arch_params ap;
    nl_plan_count_params(&q->arch, &q->fam, &ap);
    x->N = a->params > 0 ? a->params : (double)ap.total;
    x->T = (double)(int64_t)(a->tokens > 0 ? a->tokens : (double)q->arch.seq_len);
    x->peak = q->hw.flops_bf16;
    x->mfu = q->eff.fixed_mfu > 0 ? q->eff.fixed_mfu : 0.5;
    x->active_layer = (double)(ap.active - ap.embedding - ap.classifier - q->arch.dim) / (double)q->arch.n_layers;
    if (a->params > 0) x->active_layer *= a->params / (double)ap.total;
    x->layer_fwd = 2 * x->active_layer * x->T / (x->peak * x->mfu);
    x->dp_traffic = 0;
    x->fsdp_gather = 0;
    const nl_layer_plan *lp = &x->lp;
    for (int i = 0; i < lp->n; i++)
        if (!strcmp(lp->c[i].when, "step")) x->dp_traffic += lp->c[i].time_s * lp->c[i].count;
    if (a->zero == NL_ZERO_3 || a->zero == NL_ZERO_HSDP)
        for (int i = 0; i < lp->n && !x->fsdp_gather; i++)
            if (strstr(lp->c[i].what, "all-gather")) x->fsdp_gather = lp->c[i].bytes;
    x->p2 = (double)(a->tp > 1 ? a->tp : 2);
    x->tp_bound = 2 * (x->p2 - 1) * x->peak / (q->hw.intra_bw * q->hw.intra_eff);
}

nl_status nl_plan_layer_study(nl_train_req *q, const nl_layer_study_req *a, nl_layer_study *out) {
    memset(out, 0, sizeof *out);
    int64_t T = (int64_t)(a->tokens > 0 ? a->tokens : (double)q->arch.seq_len);
    q->seq = (T % q->arch.seq_len == 0) ? q->arch.seq_len : T;
    int64_t mb = T / q->seq;
    q->gpus = a->dp * a->tp * a->pp;
    q->global_batch = a->dp * mb * a->micro;
    q->tokens = 1e12;
    nl_layout L = {a->dp, a->tp, a->pp, 1, a->ep, a->zero, mb, a->micro, 1, NL_RECOMPUTE_NONE, a->sp};
    nl_status rc = nl_plan_layer(q, &L, (double)T, &out->lp);
    if (!rc) layer_extras(a, q, out);
    return rc;
}
