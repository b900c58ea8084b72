/* Expert-parallel training of NanoLM-MoE (see nanolm/moe_ep.h). */
#include <math.h>
#include <string.h>

#include "nanolm/checkpoint.h"
#include "nanolm/moe_ep.h"

void nl_ep_opts_default(nl_ep_opts *o) {
    memset(o, 0, sizeof *o);
    nl_train_opts_default(&o->train);
    o->train.batch = 4;
    o->train.seq = 32;
    o->ep = 1;
    o->cp = 1;
    o->impl = NL_COMM_OURS;
    o->aux_coef = 0.01f;
}

/* counts: int64 blocks travel as pairs of f32 words (all-to-all copies bits, never adds) */
static nl_status ep_counts(void *user, const int64_t *send, int64_t *recv, int64_t n) {
    nl_ep_trainer *t = user;
    t->st.a2a_count_bytes += (uint64_t)((nl_comm_size(t->ep_comm) - 1) * n) * sizeof(int64_t);
    return nl_comm_all_to_all(t->ep_comm, send, recv, (size_t)(2 * n), NL_COMM_F32, t->o.impl);
}

static nl_status ep_rows(void *user, const float *send, const int64_t *send_rows, float *recv, const int64_t *recv_rows,
                         int64_t width) {
    nl_ep_trainer *t = user;
    int p = nl_comm_size(t->ep_comm);
    size_t sc[64], so[64], rc[64], ro[64], a = 0, b = 0;
    for (int r = 0; r < p; r++) {
        sc[r] = (size_t)(send_rows[r] * width);
        so[r] = a;
        a += sc[r];
        rc[r] = (size_t)(recv_rows[r] * width);
        ro[r] = b;
        b += rc[r];
    }
    return nl_comm_all_to_allv(t->ep_comm, send, sc, so, recv, rc, ro, NL_COMM_F32, t->o.impl);
}

static nl_status cp_fwd(void *user, int layer, float *out, const float *qkv, int64_t B, int64_t T) {
    nl_ep_trainer *t = user;
    nl_cp_attn *a = &t->cpa[layer];
    (void)T;
    NL_TRY(nl_cp_attn_forward(a, qkv));
    memcpy(out, a->out, (size_t)(B * a->Tl * a->NH * a->hd) * sizeof(float));
    return NL_OK;
}

static nl_status cp_bwd(void *user, int layer, float *dqkv, const float *dout, const float *qkv, int64_t B, int64_t T) {
    nl_ep_trainer *t = user;
    (void)B, (void)T;
    return nl_cp_attn_backward(&t->cpa[layer], dqkv, dout, qkv);
}

size_t nl_ep_act_bytes(const nl_ep_trainer *t) {
    size_t b = nl_model_act_bytes(&t->model);
    if (t->cpa)
        for (int64_t l = 0; l < t->model.L; l++) b += t->cpa[l].bytes;
    return b;
}

nl_status nl_ep_init(nl_ep_trainer *t, const nl_arch *arch, const nl_ep_opts *o, nl_comm *world) {
    memset(t, 0, sizeof *t);
    t->o = *o;
    t->world = world;
    t->n = nl_comm_size(world);
    t->rank = nl_comm_rank(world);
    if (arch->n_experts <= 0) return nl_fail(NL_ERR_INVALID, "expert parallelism: arch %s has no experts", arch->name);
    if (o->ep < 1 || o->ep > 64 || t->n % o->ep)
        return nl_fail(NL_ERR_INVALID, "expert-parallel size %d must divide the %d ranks (and be at most 64)", o->ep,
                       t->n);
    if (o->cp < 1 || t->n % o->cp || (o->cp > 1 && o->ep > 1))
        return nl_fail(NL_ERR_INVALID,
                       "context-parallel size %d must divide the %d ranks (and is not combined with expert "
                       "parallelism)",
                       o->cp, t->n);
    if (o->cp > 1 && (o->aux_coef != 0 || o->capacity_factor != 0))
        return nl_fail(NL_ERR_INVALID,
                       "context parallelism (size %d) needs no load-balancing loss and no capacity limit "
                       "(their groups are whole sequences)",
                       o->cp);
    if (o->train.seq % (2 * o->cp))
        return nl_fail(NL_ERR_INVALID, "sequence length %lld must be a multiple of 2 x the context-parallel size %d",
                       (long long)o->train.seq, o->cp);
    int er = t->rank % o->ep;
    nl_status st = nl_model_init_ep(&t->model, arch, o->ep, er);
    if (st) return st;
    t->model.moe->capacity_factor = o->capacity_factor;
    t->model.moe->aux_coef = o->aux_coef;
    nl_model_init_random(&t->model, o->train.seed);
    if ((st = nl_comm_split(world, t->rank / o->ep, t->rank, "ep", &t->ep_comm)) ||
        (st = nl_comm_split(world, er, t->rank, "expert-dp", &t->edp_comm)))
        goto fail;
    t->ops = (nl_moe_ops){ep_counts, ep_rows, t};
    t->model.moe->ops = &t->ops;
    int64_t Tl = o->train.seq / o->cp;
    if (o->cp > 1) {
        if ((st = nl_comm_split(world, t->rank / o->cp, t->rank, "cp", &t->cp_comm))) goto fail;
        t->cpa = nl_calloc((size_t)t->model.L, sizeof *t->cpa, "ring attention contexts");
        t->positions = nl_malloc((size_t)Tl * sizeof(int64_t), "positions");
        t->gx = nl_malloc((size_t)(2 * o->train.batch * o->train.seq) * sizeof(int32_t), "full windows");
        if (!t->cpa || !t->positions || !t->gx) {
            st = NL_ERR_NOMEM;
            goto fail;
        }
        t->gy = t->gx + o->train.batch * o->train.seq;
        for (int64_t l = 0; l < t->model.L; l++)
            if ((st = nl_cp_attn_init(&t->cpa[l], t->cp_comm, o->train.batch, o->train.seq, t->model.NH, t->model.KVH,
                                      t->model.hd)))
                goto fail;
        for (int64_t i = 0; i < Tl; i++) t->positions[i] = nl_cp_position(o->cp, t->rank % o->cp, o->train.seq, i);
        t->attn = (nl_attn_ops){cp_fwd, cp_bwd, t};
        t->model.attn_ops = &t->attn;
        t->model.positions = t->positions;
    }
    int64_t BT = o->train.batch * Tl, ne = t->model.moe->n_moe_layers * t->model.moe->E;
    if ((st = nl_model_alloc_grads(&t->model)) || (st = nl_model_alloc_acts(&t->model, o->train.batch, Tl)) ||
        (st = nl_adamw_init(&t->opt, &t->model, o->train.beta1, o->train.beta2, o->train.adam_eps,
                            o->train.weight_decay)))
        goto fail;
    t->x = nl_malloc((size_t)(2 * BT) * sizeof(int32_t), "batch");
    t->st.tokens = nl_calloc((size_t)ne, sizeof(int64_t), "expert loads");
    t->fbuf = nl_malloc((size_t)(ne + 3) * sizeof(float), "stats");
    if (!t->x || !t->st.tokens || !t->fbuf) {
        st = NL_ERR_NOMEM;
        goto fail;
    }
    t->y = t->x + BT;
    return NL_OK;
fail:
    nl_ep_free(t);
    return st;
}

void nl_ep_free(nl_ep_trainer *t) {
    if (t->cpa)
        for (int64_t l = 0; l < t->model.L; l++) nl_cp_attn_free(&t->cpa[l]);
    nl_model_free(&t->model);
    nl_free(t->cpa);
    nl_free(t->positions);
    nl_free(t->gx);
    if (t->cp_comm) nl_comm_free(t->cp_comm);
    nl_adamw_free(&t->opt);
    if (t->ep_comm) nl_comm_free(t->ep_comm);
    if (t->edp_comm) nl_comm_free(t->edp_comm);
    nl_free(t->x);
    nl_free(t->st.tokens);
    nl_free(t->fbuf);
    memset(t, 0, sizeof *t);
}

/* This rank's slice of the global batch for `step` into t->x, t->y (B, T / cp). */
static nl_status ep_batch(nl_ep_trainer *t, const nl_data *d, int64_t step) {
    int B = (int)t->o.train.batch, T = (int)(t->o.train.seq / t->o.cp), cp = t->o.cp;
    if (cp == 1) return nl_data_batch(d, NL_DATA_TRAIN, t->o.train.seed, step, t->rank, t->n, B, T, t->x, t->y);
    /* the data-parallel rank's full windows; this rank keeps its columns */
    int S = (int)t->o.train.seq;
    NL_TRY(nl_data_batch(d, NL_DATA_TRAIN, t->o.train.seed, step, t->rank / cp, t->n / cp, B, S, t->gx, t->gy));
    for (int b = 0; b < B; b++)
        for (int i = 0; i < T; i++) {
            t->x[b * T + i] = t->gx[b * S + t->positions[i]];
            t->y[b * T + i] = t->gy[b * S + t->positions[i]];
        }
    return NL_OK;
}

/* Gradient synchronisation: replicated ranges averaged over the world, each layer's expert range
 * over the ranks that hold the same experts. */
static nl_status ep_sync_grads(nl_ep_trainer *t) {
    nl_model *m = &t->model;
    size_t pos = 0;
    float inv = 1.0f / (float)t->n;
    for (int64_t l = 0; l <= m->L; l++) {
        size_t b = m->n_params, en = m->n_params;
        if (l < m->L) nl_moe_expert_range(m, l, &b, &en);
        if (l < m->L && b == en) continue; /* dense layer: part of the next replicated range */
        if (b > pos) {
            if (t->n > 1) NL_TRY(nl_comm_all_reduce(t->world, m->train->grads + pos, b - pos, NL_COMM_F32, t->o.impl));
            if (t->n > 1)
                for (size_t i = pos; i < b; i++) m->train->grads[i] *= inv;
        }
        if (en > b) {
            if (nl_comm_size(t->edp_comm) > 1)
                NL_TRY(nl_comm_all_reduce(t->edp_comm, m->train->grads + b, en - b, NL_COMM_F32, t->o.impl));
            if (t->n > 1)
                for (size_t i = b; i < en; i++) m->train->grads[i] *= inv;
        }
        pos = en;
    }
    return NL_OK;
}

/* The step's statistics over the world: loss, aux loss, expert loads, slots, dropped. */
static nl_status ep_stats(nl_ep_trainer *t, float loss) {
    nl_moe *e = t->model.moe;
    int64_t ne = e->n_moe_layers * e->E;
    double v[2] = {loss, e->aux_loss};
    for (int k = 0; k < 2; k++) {
        if (t->n > 1) NL_TRY(nl_comm_sum_double(t->world, &v[k]));
        v[k] /= t->n;
    }
    for (int64_t i = 0; i < ne; i++) t->fbuf[i] = (float)e->tokens[i];
    t->fbuf[ne] = (float)e->slots;
    t->fbuf[ne + 1] = (float)e->dropped;
    if (t->n > 1) NL_TRY(nl_comm_all_reduce(t->world, t->fbuf, (size_t)ne + 2, NL_COMM_F32, NL_COMM_NATIVE));
    for (int64_t i = 0; i < ne; i++) t->st.tokens[i] = (int64_t)t->fbuf[i];
    t->st.slots = (int64_t)t->fbuf[ne];
    t->st.dropped = (int64_t)t->fbuf[ne + 1];
    t->st.loss = (float)v[0];
    t->st.aux_loss = v[1];
    return NL_OK;
}

static nl_status L_grads(void *user, const nl_data *d, int64_t step, float *loss_out) {
    nl_ep_trainer *t = user;
    nl_model *m = &t->model;
    nl_moe *e = m->moe;
    int B = (int)t->o.train.batch, T = (int)(t->o.train.seq / t->o.cp);
    NL_TRY(ep_batch(t, d, step));
    nl_comm_stats s0, s1;
    nl_comm_get_stats(t->ep_comm, &s0);
    t->st.a2a_count_bytes = 0;
    nl_model_zero_grad(m);
    float loss;
    NL_TRY(nl_model_forward(m, t->x, t->y, B, T, &loss));
    /* a non-finite loss still runs backward (the experts' all-to-alls need every rank); its mean
     * over the world is non-finite too, so every rank's loop stops at the same step */
    NL_TRY(nl_model_backward(m));
    nl_comm_get_stats(t->ep_comm, &s1);
    t->st.a2a_sent_bytes = s1.coll[NL_COMM_OP_ALL_TO_ALL].sent_bytes - s0.coll[NL_COMM_OP_ALL_TO_ALL].sent_bytes;
    t->st.payload_sent_bytes = (uint64_t)e->rows_sent * (uint64_t)m->C * sizeof(float);
    t->st.payload_self_bytes = (uint64_t)e->rows_self * (uint64_t)m->C * sizeof(float);
    t->st.dispatched_bytes = (uint64_t)e->rows_dispatched * (uint64_t)m->C * sizeof(float);
    t->st.returned_bytes = (uint64_t)e->rows_returned * (uint64_t)m->C * sizeof(float);
    NL_TRY(ep_sync_grads(t));
    NL_TRY(ep_stats(t, loss));
    *loss_out = t->st.loss;
    return NL_OK;
}

static nl_status L_sumsq(void *user, double *ss_out) {
    nl_ep_trainer *t = user;
    nl_model *m = &t->model;
    /* ep 1: every rank holds the whole reduced gradient; in the one-process trainer's order
     * (nl_grad_norm), so one rank is bit-identical to it */
    if (t->o.ep == 1) {
        *ss_out = nl_sumsq(m->train->grads, m->n_params);
        return NL_OK;
    }
    size_t pos = 0;
    double ss_rep = 0, ss_exp = 0;
    for (int64_t l = 0; l <= m->L; l++) {
        size_t b = m->n_params, en = m->n_params;
        if (l < m->L) nl_moe_expert_range(m, l, &b, &en);
        if (l < m->L && b == en) continue;
        if (b > pos) ss_rep += nl_sumsq(m->train->grads + pos, b - pos);
        if (en > b) ss_exp += nl_sumsq(m->train->grads + b, en - b);
        pos = en;
    }
    NL_TRY(nl_comm_sum_double(t->ep_comm, &ss_exp));
    *ss_out = ss_rep + ss_exp;
    return NL_OK;
}

static nl_status L_update(void *user, float lr) {
    nl_ep_trainer *t = user;
    nl_adamw_step(&t->opt, &t->model, lr);
    return NL_OK;
}

static nl_status L_eval(void *user, const nl_data *d, int64_t windows, double *loss) {
    nl_ep_trainer *t = user;
    if (t->o.cp > 1)
        return nl_fail(NL_ERR_UNSUPPORTED,
                       "context parallelism has no validation (its attention needs the sequence split)");
    /* every rank runs the same windows (the experts' all-to-all needs every rank in every forward) */
    NL_TRY(nl_eval_loss(&t->model, d, NL_DATA_VAL, t->o.train.batch, t->o.train.seq, windows, loss, NULL));
    if (t->n > 1) {
        NL_TRY(nl_comm_sum_double(t->world, loss));
        *loss /= t->n;
    }
    return NL_OK;
}

static nl_status L_save(void *user, const char *path, const nl_ckpt_state *state) {
    nl_ep_trainer *t = user;
    if (t->o.ep > 1)
        return nl_fail(NL_ERR_UNSUPPORTED,
                       "expert parallelism over %d ranks: checkpoints hold whole models (ep 1 only)", t->o.ep);
    nl_status st = NL_OK;
    if (t->rank == 0) {
        nl_ckpt_state cs = *state;
        cs.opt = &t->opt;
        st = nl_ckpt_save(path, &t->model, "byte", &cs);
    }
    int bad = st ? 1 : 0; /* everyone learns whether rank 0 managed to write the file */
    nl_status st2 = nl_comm_max_int(t->world, &bad);
    if (!st && (st2 || bad)) st = st2 ? st2 : nl_fail(NL_ERR_IO, "checkpoint %s: rank 0 could not write it", path);
    return st;
}

static nl_status L_load(void *user, const char *path, nl_ckpt_state *cs) {
    nl_ep_trainer *t = user;
    nl_model tmp, *m = &t->model;
    memset(&tmp, 0, sizeof tmp);
    char tok[64];
    if (t->o.ep > 1)
        return nl_fail(NL_ERR_UNSUPPORTED,
                       "expert parallelism over %d ranks: checkpoints hold whole models (ep 1 only)", t->o.ep);
    NL_TRY(nl_ckpt_load_model(path, &tmp, tok));
    nl_status st = NL_OK;
    if (tmp.n_params != m->n_params || tmp.L != m->L || !tmp.moe) {
        st = nl_fail(NL_ERR_INVALID, "checkpoint %s holds a model of %zu parameters%s, this run has a MoE model of %zu",
                     path, tmp.n_params, tmp.moe ? "" : " without experts", m->n_params);
        goto out;
    }
    memcpy(m->params, tmp.params, m->n_params * sizeof(float));
    memset(cs, 0, sizeof *cs);
    cs->opt = &t->opt;
    st = nl_ckpt_load_state(path, m, cs);
    cs->opt = NULL;
out:
    nl_model_free(&tmp);
    return st;
}

/* ---- the hooks of the one training loop (grads .. load above) --------------------------------- */

static void L_scale(void *u, float f) {
    nl_ep_trainer *t = u;
    nl_grad_scale(&t->model, f);
}
static nl_status L_agree_stop(void *u, int *stop) {
    nl_ep_trainer *t = u;
    return nl_comm_max_int(t->world, stop);
}

void nl_ep_layout(nl_ep_trainer *t, nl_train_layout *L) {
    memset(L, 0, sizeof *L);
    L->user = t;
    L->name = t->o.cp > 1 ? "context-parallel" : "expert-parallel";
    L->rank0 = t->rank == 0;
    L->n_params = t->model.n_params;
    L->grads = L_grads;
    L->sumsq = L_sumsq;
    L->scale = L_scale;
    L->update = L_update;
    L->eval = t->o.cp == 1 ? L_eval : NULL;
    L->save = t->o.ep == 1 ? L_save : NULL;
    L->load = t->o.ep == 1 ? L_load : NULL;
    L->agree_stop = L_agree_stop;
}
