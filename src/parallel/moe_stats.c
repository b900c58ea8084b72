/* What an expert or context parallel MoE training run reports (nanolm/moe_stats.h): expert load
 * balance, per-step records with every rank's byte counts, memory per rank. */
#include <stdlib.h>

#include "nanolm/moe_stats.h"

double nl_moe_load_ratio(const int64_t *tok, int64_t layers, int64_t E) {
    double r = 0;
    for (int64_t l = 0; l < layers; l++) {
        double mx = 0, sum = 0;
        for (int64_t e = 0; e < E; e++) {
            sum += (double)tok[l * E + e];
            if (tok[l * E + e] > mx) mx = (double)tok[l * E + e];
        }
        r += sum > 0 ? mx / (sum / (double)E) : 0;
    }
    return r / (double)layers;
}

const char *const nl_moe_step_byte_names[NL_MOE_STEP_BYTES] = {"a2a_sent_bytes",     "a2a_count_bytes",
                                                               "payload_sent_bytes", "payload_self_bytes",
                                                               "dispatched_bytes",   "returned_bytes"};

/* Per-rank values gathered to everyone by a sum of one-hot vectors. */
static nl_status gather(nl_comm *w, double *v, double mine) {
    int n = nl_comm_size(w), rank = nl_comm_rank(w);
    for (int i = 0; i < n; i++) {
        v[i] = i == rank ? mine : 0;
        if (n > 1) NL_TRY(nl_comm_sum_double(w, &v[i]));
    }
    return NL_OK;
}

/* Room for one more record. */
static nl_status grow(nl_moe_steps *s) {
    if (s->n < s->cap) return NL_OK;
    int64_t cap = s->cap ? 2 * s->cap : 64;
    nl_moe_step_rec *p = realloc(s->rec, (size_t)cap * sizeof *p);
    if (!p) return NL_ERR_NOMEM;
    s->rec = p, s->cap = cap;
    return NL_OK;
}

nl_status nl_moe_steps_record(nl_moe_steps *s, nl_comm *w, const nl_ep_trainer *t, const nl_train_log *r) {
    const nl_ep_step_stats *st = &t->st;
    const nl_moe *e = t->model.moe;
    int N = nl_comm_size(w);
    double mine[NL_MOE_STEP_BYTES] = {(double)st->a2a_sent_bytes,     (double)st->a2a_count_bytes,
                                      (double)st->payload_sent_bytes, (double)st->payload_self_bytes,
                                      (double)st->dispatched_bytes,   (double)st->returned_bytes};
    double *bytes = malloc(sizeof(double) * NL_MOE_STEP_BYTES * (size_t)N);
    nl_status rc = bytes ? grow(s) : NL_ERR_NOMEM;
    if (rc) {
        free(bytes);
        return nl_fail(NL_ERR_NOMEM, "out of memory (step %lld's record)", (long long)r->step - 1);
    }
    for (int k = 0; k < NL_MOE_STEP_BYTES; k++) { /* every rank takes part in the gathers */
        nl_status g = gather(w, bytes + k * N, mine[k]);
        if (g && !rc) rc = g;
    }
    s->rec[s->n++] = (nl_moe_step_rec){r->step - 1, st->slots,    st->dropped,
                                       r->loss,     st->aux_loss, r->grad_norm,
                                       r->lr,       r->val_loss,  nl_moe_load_ratio(st->tokens, e->n_moe_layers, e->E),
                                       bytes};
    return rc;
}

void nl_moe_steps_free(nl_moe_steps *s) {
    for (int64_t i = 0; i < s->n; i++) free(s->rec[i].bytes);
    free(s->rec);
    s->rec = NULL;
    s->n = s->cap = 0;
}

nl_status nl_moe_memory(nl_comm *w, const nl_ep_trainer *t, double *v) {
    int N = nl_comm_size(w);
    double mine[4] = {(double)nl_model_param_bytes(&t->model), (double)nl_model_param_bytes(&t->model),
                      (double)nl_adamw_bytes(&t->opt), (double)nl_ep_act_bytes(t)};
    for (int k = 0; k < 4; k++) NL_TRY(gather(w, v + k * N, mine[k]));
    return NL_OK;
}
