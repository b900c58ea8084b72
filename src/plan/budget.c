/* The memory of training one model on one layout (nanolm/budget.h): parameters per GPU, state
 * per ZeRO stage, activations of a batch. */
#include <math.h>
#include <string.h>

#include "nanolm/budget.h"

nl_status nl_budget_count(const nl_budget_layout *L, double params, nl_budget *b) {
    b->total = b->nonemb = b->active = params;
    if (b->has_model) {
        nl_arch_params p;
        nl_plan_count_params(&b->a, &b->fam, &p);             /* as plan train and plan serve count it */
        double s = params > 0 ? params / (double)p.total : 1; /* a nominal size for the same shape */
        b->total = (double)p.total * s;
        b->nonemb = (double)p.non_embedding * s;
        b->active = (double)p.active * s;
        b->expert = (double)p.mlp_experts * s;
        if (L->ep > 1 && (b->a.n_experts == 0 || b->a.n_experts % L->ep))
            return nl_fail(NL_ERR_INVALID, "--ep %lld must divide the %lld experts of %s", (long long)L->ep,
                           (long long)b->a.n_experts, b->a.name);
        if (L->tp > 1 && b->a.n_heads % L->tp)
            return nl_fail(NL_ERR_INVALID, "--tp %lld does not divide %lld heads", (long long)L->tp,
                           (long long)b->a.n_heads);
    } else if (L->ep > 1) {
        return nl_fail(NL_ERR_INVALID, "--ep needs a --model with experts");
    }
    int64_t tp = L->tp, pp = L->pp, ep = L->ep;
    if (L->gpus % (tp * pp))
        return nl_fail(NL_ERR_INVALID, "--gpus %lld is not a multiple of tp*pp = %lld", (long long)L->gpus,
                       (long long)(tp * pp));
    b->dp = L->gpus / (tp * pp);
    if (ep > b->dp)
        return nl_fail(NL_ERR_INVALID, "--ep %lld exceeds the data-parallel degree %lld", (long long)ep,
                       (long long)b->dp);
    /* Parameters one GPU holds: dense part split by tp*pp, routed experts by ep*tp*pp. */
    b->per_gpu = (b->total - b->expert) / (double)(tp * pp) + b->expert / (double)(ep * tp * pp);
    b->per_gpu_ne = (b->nonemb - b->expert) / (double)(tp * pp) + b->expert / (double)(ep * tp * pp);
    b->shard = b->hw.gpus_per_node / tp > 0 ? b->hw.gpus_per_node / tp : 1;
    if (b->shard > b->dp) b->shard = b->dp;
    return NL_OK;
}

double nl_budget_stage_bytes(const nl_budget_layout *L, const nl_budget *b, int z, nl_state_bytes *sd) {
    double edp = (double)b->dp / (double)L->ep;
    nl_state_bytes se;
    nl_plan_state_bytes(&b->rec, (nl_zero)z, b->dp, b->shard, sd);
    nl_plan_state_bytes(&b->rec, (nl_zero)z, (int64_t)edp, b->shard < edp ? b->shard : (int64_t)edp, &se);
    double dl = (b->total - b->expert) / (double)(L->tp * L->pp), el = b->expert / (double)(L->ep * L->tp * L->pp);
    return dl * sd->total + el * se.total;
}

void nl_budget_activations(const nl_budget_layout *L, const nl_budget *b, nl_budget_act *x) {
    const nl_arch *a = &b->a;
    x->tokens = (double)L->batch * (double)L->seq;
    nl_act_opts ao = {.tp = L->tp,
                      .sp = L->sp,
                      .flash = !L->no_flash,
                      .recompute = (nl_recompute)L->recompute,
                      .seq = (double)L->seq,
                      .bytes_per_elem = 2,
                      .fam = b->fam};
    nl_plan_act_layer(a, &ao, &x->al);
    ao.recompute = NL_RECOMPUTE_SELECTIVE;
    nl_plan_act_layer(a, &ao, &x->sel);
    ao.recompute = NL_RECOMPUTE_FULL;
    nl_plan_act_layer(a, &ao, &x->full);
    x->layers = (double)a->n_layers / (double)L->pp;
    x->bytes = x->al.bytes_per_token * x->tokens * x->layers;
    x->k_none = nl_plan_act_korthikanti(a, (double)L->seq, NL_RECOMPUTE_NONE, 0, L->tp, L->sp);
    x->k_flash = nl_plan_act_korthikanti(a, (double)L->seq, NL_RECOMPUTE_NONE, 1, L->tp, L->sp);
    x->k_full = nl_plan_act_korthikanti(a, (double)L->seq, NL_RECOMPUTE_FULL, 1, L->tp, L->sp);
    x->logits = nl_plan_logits_bytes(a, x->tokens) / (double)L->tp;
    x->micro = L->micro > 0 ? L->micro : (L->pp > 1 ? 2 * L->pp : 1);
    x->inflight_1f1b = L->pp > 1 ? fmin((double)L->pp, (double)x->micro) : 1;
    x->inflight_gpipe = (double)x->micro;
}

void nl_budget_bars(const nl_budget_layout *L, const nl_budget *b, const nl_budget_act *x, nl_train_eval ev[4]) {
    memset(ev, 0, 4 * sizeof *ev);
    for (int z = 0; z <= 3; z++) {
        nl_state_bytes sd;
        nl_plan_state_bytes(&b->rec, (nl_zero)z, b->dp, b->shard, &sd);
        ev[z].L =
            (nl_layout){b->dp, L->tp, L->pp, 1, L->ep, (nl_zero)z, L->batch, 1, 1, (nl_recompute)L->recompute, L->sp};
        ev[z].mem_weights = b->per_gpu * sd.weights;
        ev[z].mem_grads = b->per_gpu * sd.grads;
        ev[z].mem_optim = b->per_gpu * sd.optim;
        ev[z].mem_act = b->has_model ? x->bytes : 0;
        ev[z].mem_total = ev[z].mem_weights + ev[z].mem_grads + ev[z].mem_optim + ev[z].mem_act;
    }
}
