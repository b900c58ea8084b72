/*
 * DDP and ZeRO-1/2/3 on NanoLM (see include/nanolm/dtrain.h).
 *
 * The per-layer timing comes from the model's linear hook (nl_linear_ops): the layer code calls
 * it for every matmul, in forward order QKV, O, GATE_UP, DOWN per layer and in backward order
 * CLS, then DOWN, GATE_UP, O, QKV per layer from the last. So
 *   - backward reaching (DOWN, l) means every gradient of layer l+1 (or of the tail when
 *     l = L-1) is final: its bucket can be all-reduced / reduce-scattered, and ZeRO-3 must
 *     gather layer l's weights before this matmul;
 *   - forward finishing (DOWN, l) means layer l's weights are no longer needed in forward and
 *     layer l+1 (or the tail) must be there before its first norm.
 */
#include "nanolm/dtrain.h"
#include "nanolm/checkpoint.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void nl_dist_opts_default(nl_dist_opts *o) {
    memset(o, 0, sizeof *o);
    nl_train_opts_default(&o->train);
    o->zero = 0;
    o->overlap = 1;
    o->impl = NL_COMM_OURS;
}

/* ---- units -------------------------------------------------------------------------------- */

static int unit_of_layer(int l) { return l + 1; }
static int tail_unit(const nl_dist_trainer *t) { return t->n_units - 1; }

/* Floats of unit u's shard on this rank that are real parameters (not padding). */
static size_t shard_real(const nl_dist_trainer *t, int u) {
    const nl_dist_unit *x = &t->units[u];
    size_t lo = (size_t)t->r * x->shard;
    if (lo >= x->len) return 0;
    return x->len - lo < x->shard ? x->len - lo : x->shard;
}

/* Reduce-scatter unit u's gradients; this rank's reduced shard goes to gshard (zero 2, 3) or
 * back into the model's gradient buffer at the shard's range (zero 1). */
static nl_status unit_reduce_scatter(nl_dist_trainer *t, int u) {
    nl_model *m = &t->model;
    const nl_dist_unit *x = &t->units[u];
    size_t padded = x->shard * (size_t)t->p, real = shard_real(t, u);
    memcpy(t->staging, m->train->grads + x->begin, x->len * sizeof(float));
    memset(t->staging + x->len, 0, (padded - x->len) * sizeof(float));
    float *mine = t->staging + (size_t)t->r * x->shard;
    NL_TRY(nl_comm_reduce_scatter(t->dp, t->staging, mine, padded, NL_COMM_F32, t->o.impl));
    if (t->o.zero >= 2)
        memcpy(t->gshard + x->pos, mine, x->shard * sizeof(float));
    else
        memcpy(m->train->grads + x->begin + (size_t)t->r * x->shard, mine, real * sizeof(float));
    return NL_OK;
}

/* All-gather unit u's parameters into the model from this rank's shard (pshard for zero 3, the
 * model's own range otherwise). */
static nl_status unit_all_gather(nl_dist_trainer *t, int u) {
    nl_model *m = &t->model;
    const nl_dist_unit *x = &t->units[u];
    size_t padded = x->shard * (size_t)t->p, real = shard_real(t, u);
    float *mine = t->staging + (size_t)t->r * x->shard;
    if (t->o.zero == 3) {
        memcpy(mine, t->pshard + x->pos, x->shard * sizeof(float));
    } else {
        memcpy(mine, m->params + x->begin + (size_t)t->r * x->shard, real * sizeof(float));
        memset(mine + real, 0, (x->shard - real) * sizeof(float));
    }
    NL_TRY(nl_comm_all_gather(t->dp, mine, t->staging, padded, NL_COMM_F32, t->o.impl));
    memcpy(m->params + x->begin, t->staging, x->len * sizeof(float));
    return NL_OK;
}

/* ZeRO-3: drop unit u's gathered weights. They are overwritten with NaN, so that any use of a
 * weight that was not gathered again shows up as a NaN loss. */
static void unit_drop(nl_dist_trainer *t, int u) {
    const nl_dist_unit *x = &t->units[u];
    float *p = t->model.params + x->begin;
    for (size_t i = 0; i < x->len; i++) p[i] = NAN;
}

/* Unit u's gradients are final. */
static nl_status unit_grads_done(nl_dist_trainer *t, int u) {
    if (t->o.zero == 0) {
        if (!t->o.overlap) return NL_OK; /* all-reduced after backward */
        const nl_dist_unit *x = &t->units[u];
        return nl_comm_all_reduce_start(t->dp, t->model.train->grads + x->begin, x->len, NL_COMM_F32, t->o.impl,
                                        &t->req[u]);
    }
    return unit_reduce_scatter(t, u);
}

static nl_status progress_all(nl_dist_trainer *t) {
    for (int u = 0; u < t->n_units; u++)
        if (t->req[u]) {
            int done;
            NL_TRY(nl_comm_progress(t->req[u], &done));
        }
    return NL_OK;
}

/* ---- the linear hook ------------------------------------------------------------------------- */

static void hook_forward(void *user, const nl_linear_site *site, float *out, const float *in, const float *w, int64_t n,
                         int64_t in_dim, int64_t out_dim) {
    nl_dist_trainer *t = user;
    nl_model *m = &t->model;
    m->linear_ops = NULL;
    nl_linear_forward(m, site, out, in, w, n, in_dim, out_dim);
    m->linear_ops = &t->ops;
    if (t->hook_status || t->o.zero != 3 || site->kind != NL_LIN_DOWN) return;
    int l = site->layer;
    unit_drop(t, unit_of_layer(l));
    int next = l + 1 < m->L ? unit_of_layer(l + 1) : tail_unit(t);
    t->hook_status = unit_all_gather(t, next);
}

static void hook_backward(void *user, const nl_linear_site *site, float *din, float *dw, const float *dout,
                          const float *in, const float *w, int64_t n, int64_t in_dim, int64_t out_dim) {
    nl_dist_trainer *t = user;
    nl_model *m = &t->model;
    if (!t->hook_status && site->kind == NL_LIN_DOWN) {
        int l = site->layer;
        int done = l + 1 < m->L ? unit_of_layer(l + 1) : tail_unit(t);
        t->hook_status = unit_grads_done(t, done);
        if (!t->hook_status && t->o.zero == 3) {
            unit_drop(t, done);
            t->hook_status = unit_all_gather(t, unit_of_layer(l));
        }
    }
    m->linear_ops = NULL;
    nl_linear_backward(m, site, din, dw, dout, in, w, n, in_dim, out_dim);
    m->linear_ops = &t->ops;
    if (!t->hook_status) t->hook_status = progress_all(t);
}

/* ---- init -------------------------------------------------------------------------------------- */

nl_status nl_dist_init(nl_dist_trainer *t, const nl_arch *arch, const nl_dist_opts *o, nl_comm *dp) {
    memset(t, 0, sizeof *t);
    if (o->zero < 0 || o->zero > 3) return nl_fail(NL_ERR_INVALID, "ZeRO stage must be 0, 1, 2 or 3, got %d", o->zero);
    if (o->train.batch < 1 || o->train.seq < 1 || o->train.seq > arch->seq_len)
        return nl_fail(NL_ERR_INVALID, "batch %lld and seq %lld must be >= 1 and seq <= the model's seq_len %lld",
                       (long long)o->train.batch, (long long)o->train.seq, (long long)arch->seq_len);
    t->o = *o;
    t->dp = dp;
    t->p = nl_comm_size(dp);
    t->r = nl_comm_rank(dp);
    nl_model *m = &t->model;
    nl_status st = nl_model_init(m, arch);
    if (st) return st;
    if (t->r == 0) nl_model_init_random(m, o->train.seed);
    /* replicas start identical: rank 0's initialisation is broadcast */
    if ((st = nl_comm_broadcast(dp, m->params, m->n_params, NL_COMM_F32, 0, o->impl))) goto fail;
    if ((st = nl_model_alloc_grads(m)) || (st = nl_model_alloc_acts(m, o->train.batch, o->train.seq))) goto fail;

    t->n_units = (int)m->L + 2;
    t->units = nl_calloc((size_t)t->n_units, sizeof *t->units, "units");
    t->req = nl_calloc((size_t)t->n_units, sizeof *t->req, "bucket requests");
    t->x = nl_malloc((size_t)(o->train.batch * o->train.seq) * sizeof(int32_t), "batch inputs");
    t->y = nl_malloc((size_t)(o->train.batch * o->train.seq) * sizeof(int32_t), "batch targets");
    if (!t->units || !t->req || !t->x || !t->y) {
        st = NL_ERR_NOMEM;
        goto fail;
    }
    size_t maxshard = 0;
    for (int u = 0; u < t->n_units; u++) {
        nl_dist_unit *x = &t->units[u];
        x->begin = u == 0 ? 0 : m->layer_offsets[u - 1];
        size_t end = u == 0 ? m->layer_offsets[0] : (u <= m->L ? m->layer_offsets[u] : m->n_params);
        x->len = end - x->begin;
        x->shard = (x->len + (size_t)t->p - 1) / (size_t)t->p;
        x->pos = t->shard_total;
        t->shard_total += x->shard;
        if (x->shard > maxshard) maxshard = x->shard;
    }
    /* hyper-parameters and the step count; the moments are adam_m / adam_v (sharded or not) */
    t->opt.beta1 = o->train.beta1, t->opt.beta2 = o->train.beta2, t->opt.eps = o->train.adam_eps;
    t->opt.weight_decay = o->train.weight_decay;
    size_t opt_n = o->zero == 0 ? m->n_params : t->shard_total;
    t->adam_m = nl_calloc(opt_n, sizeof(float), "AdamW first moment");
    t->adam_v = nl_calloc(opt_n, sizeof(float), "AdamW second moment");
    if (!t->adam_m || !t->adam_v) {
        st = NL_ERR_NOMEM;
        goto fail;
    }
    if (o->zero >= 1) {
        t->staging = nl_malloc(maxshard * (size_t)t->p * sizeof(float) + 64, "collective staging");
        if (!t->staging) {
            st = NL_ERR_NOMEM;
            goto fail;
        }
    }
    if (o->zero >= 2) {
        t->gshard = nl_calloc(t->shard_total, sizeof(float), "gradient shard");
        if (!t->gshard) {
            st = NL_ERR_NOMEM;
            goto fail;
        }
    }
    if (o->zero == 3) {
        t->pshard = nl_calloc(t->shard_total, sizeof(float), "parameter shard");
        if (!t->pshard) {
            st = NL_ERR_NOMEM;
            goto fail;
        }
        for (int u = 0; u < t->n_units; u++)
            memcpy(t->pshard + t->units[u].pos, m->params + t->units[u].begin + (size_t)t->r * t->units[u].shard,
                   shard_real(t, u) * sizeof(float));
        for (int u = 0; u < t->n_units; u++) unit_drop(t, u);
    }
    t->ops.forward = hook_forward;
    t->ops.backward = hook_backward;
    t->ops.user = t;
    m->linear_ops = &t->ops;
    return NL_OK;
fail:
    nl_dist_free(t);
    return st;
}

void nl_dist_free(nl_dist_trainer *t) {
    for (int u = 0; t->req && u < t->n_units; u++)
        if (t->req[u]) nl_comm_wait(t->req[u]);
    t->model.linear_ops = NULL;
    nl_model_free(&t->model);
    nl_free(t->units);
    nl_free(t->req);
    nl_free(t->x);
    nl_free(t->y);
    nl_free(t->adam_m);
    nl_free(t->adam_v);
    nl_free(t->staging);
    nl_free(t->gshard);
    nl_free(t->pshard);
    memset(t, 0, sizeof *t);
}

/* ---- the step -------------------------------------------------------------------------------------- */

/* The gradients this rank owns after reduction: (pointer, global index, count) per unit. */
static float *owned_grads(nl_dist_trainer *t, int u, size_t *g0, size_t *n) {
    const nl_dist_unit *x = &t->units[u];
    if (t->o.zero == 0) {
        *g0 = x->begin;
        *n = x->len;
        return t->model.train->grads + x->begin;
    }
    *g0 = x->begin + (size_t)t->r * x->shard;
    *n = shard_real(t, u);
    return t->o.zero == 1 ? t->model.train->grads + *g0 : t->gshard + x->pos;
}

static nl_status L_grads(void *user, const nl_data *d, int64_t step, float *loss_out) {
    nl_dist_trainer *t = user;
    nl_model *m = &t->model;
    int B = (int)t->o.train.batch, T = (int)t->o.train.seq;
    NL_TRY(nl_data_batch(d, NL_DATA_TRAIN, t->o.train.seed, step, t->r, t->p, B, T, t->x, t->y));
    nl_model_zero_grad(m);
    t->hook_status = NL_OK;
    if (t->o.zero == 3) { /* the root units stay for the whole step; layer 0 before its forward */
        NL_TRY(unit_all_gather(t, 0));
        NL_TRY(unit_all_gather(t, unit_of_layer(0)));
    }
    float loss = 0;
    NL_TRY(nl_model_forward(m, t->x, t->y, B, T, &loss));
    NL_TRY(t->hook_status);
    double tb = nl_time_s();
    NL_TRY(nl_model_backward(m));
    NL_TRY(t->hook_status);
    /* layer 0 and the embedding finish last */
    NL_TRY(unit_grads_done(t, unit_of_layer(0)));
    NL_TRY(unit_grads_done(t, 0));
    t->backward_s = nl_time_s() - tb;
    double tw = nl_time_s();
    if (t->o.zero == 0) {
        for (int u = 0; u < t->n_units; u++) {
            if (t->o.overlap) {
                nl_status st = nl_comm_wait(t->req[u]);
                t->req[u] = NULL;
                NL_TRY(st);
            } else {
                NL_TRY(nl_comm_all_reduce(t->dp, m->train->grads + t->units[u].begin, t->units[u].len, NL_COMM_F32,
                                          t->o.impl));
            }
        }
    }
    t->comm_wait_s = nl_time_s() - tw;
    if (t->o.zero == 3)
        for (int u = 0; u < t->n_units; u++) unit_drop(t, u);
    /* mean over ranks: gradients and loss */
    if (t->p > 1) {
        float inv_p = 1.0f / (float)t->p;
        for (int u = 0; u < t->n_units; u++) {
            size_t g0, n;
            float *g = owned_grads(t, u, &g0, &n);
            for (size_t i = 0; i < n; i++) g[i] *= inv_p;
        }
    }
    double lsum = loss;
    NL_TRY(nl_comm_sum_double(t->dp, &lsum));
    *loss_out = (float)(lsum / t->p);
    return NL_OK;
}

static nl_status L_sumsq(void *user, double *ss) {
    nl_dist_trainer *t = user;
    /* one rank, or DDP (every rank holds all reduced gradients): the whole vector at once, in the
     * order of the one-process trainer (nl_grad_norm), so --dp 1 is bit-identical to it */
    if (t->o.zero == 0 || t->p == 1) {
        *ss = nl_sumsq(t->o.zero >= 2 ? t->gshard : t->model.train->grads, t->model.n_params);
        return NL_OK;
    }
    double s = 0;
    for (int u = 0; u < t->n_units; u++) {
        size_t g0, n;
        const float *g = owned_grads(t, u, &g0, &n);
        s += nl_sumsq(g, n);
    }
    NL_TRY(nl_comm_sum_double(t->dp, &s));
    *ss = s;
    return NL_OK;
}

static void L_scale(void *user, float f) {
    nl_dist_trainer *t = user;
    for (int u = 0; u < t->n_units; u++) {
        size_t g0, n;
        float *g = owned_grads(t, u, &g0, &n);
        for (size_t i = 0; i < n; i++) g[i] *= f;
    }
}

static nl_status L_update(void *user, float lr) {
    nl_dist_trainer *t = user;
    nl_model *m = &t->model;
    t->opt.t++;
    for (int u = 0; u < t->n_units; u++) { /* AdamW on what this rank owns */
        size_t g0, n;
        float *g = owned_grads(t, u, &g0, &n);
        float *p = t->o.zero == 3 ? t->pshard + t->units[u].pos : m->params + g0;
        size_t opos = t->o.zero == 0 ? g0 : t->units[u].pos;
        nl_adamw_update_range(&t->opt, m, lr, g0, n, p, g, t->adam_m + opos, t->adam_v + opos);
    }
    if (t->o.zero == 1 || t->o.zero == 2)
        for (int u = 0; u < t->n_units; u++) NL_TRY(unit_all_gather(t, u));
    return NL_OK;
}

static nl_status L_eval(void *user, const nl_data *d, int64_t windows, double *loss) {
    nl_dist_trainer *t = user;
    nl_model *m = &t->model;
    if (t->o.zero == 3)
        for (int u = 0; u < t->n_units; u++) NL_TRY(unit_all_gather(t, u));
    m->linear_ops = NULL; /* every rank evaluates its full replica: no collectives inside */
    nl_status st = nl_eval_loss(m, d, NL_DATA_VAL, t->o.train.batch, t->o.train.seq, windows, loss, NULL);
    m->linear_ops = &t->ops;
    if (t->o.zero == 3)
        for (int u = 0; u < t->n_units; u++) unit_drop(t, u);
    return st;
}

/* ---- the hooks of the one training loop (grads .. eval above, save and load below) ------------ */

static nl_status L_save(void *user, const char *path, const nl_ckpt_state *state);
static nl_status L_load(void *user, const char *path, nl_ckpt_state *cs);

static nl_status L_agree_stop(void *u, int *stop) {
    (void)u;
    return nl_comm_max_int(nl_comm_world(), stop);
}

void nl_dist_layout(nl_dist_trainer *t, nl_train_layout *L) {
    memset(L, 0, sizeof *L);
    L->user = t;
    L->name = t->o.zero ? "ZeRO" : "DDP";
    L->rank0 = nl_comm_world_rank() == 0;
    L->n_params = t->model.n_params;
    L->grads = L_grads;
    L->sumsq = L_sumsq;
    L->scale = L_scale;
    L->update = L_update;
    L->eval = L_eval;
    L->save = L_save;
    L->load = L_load;
    L->agree_stop = L_agree_stop;
}

void nl_dist_memory_report(const nl_dist_trainer *t, nl_dist_memory *out) {
    size_t n = t->model.n_params, S = t->shard_total, f = sizeof(float);
    size_t staging = 0, maxshard = 0;
    for (int u = 0; u < t->n_units; u++)
        if (t->units[u].shard > maxshard) maxshard = t->units[u].shard;
    if (t->staging) staging = maxshard * (size_t)t->p * f;
    out->params = (t->o.zero == 3 ? S : n) * f;
    out->grads = (t->o.zero >= 2 ? S : n) * f;
    out->optimizer = 2 * (t->o.zero >= 1 ? S : n) * f;
    /* the model's full buffers that a sharded level only needs during the step */
    out->workspace = staging + (t->o.zero >= 2 ? n * f : 0) + (t->o.zero == 3 ? n * f : 0);
}

static nl_status gather_params(nl_dist_trainer *t, float *out) {
    if (t->o.zero == 3) {
        for (int u = 0; u < t->n_units; u++) {
            NL_TRY(unit_all_gather(t, u));
            memcpy(out + t->units[u].begin, t->model.params + t->units[u].begin, t->units[u].len * sizeof(float));
            unit_drop(t, u);
        }
        return NL_OK;
    }
    memcpy(out, t->model.params, t->model.n_params * sizeof(float));
    return NL_OK;
}

/* ---- checkpoints --------------------------------------------------------------------------------- */

/* All-gather a sharded per-unit array (shard_total floats) into a full one (n_params floats). */
static nl_status gather_shards(nl_dist_trainer *t, const float *shards, float *full) {
    for (int u = 0; u < t->n_units; u++) {
        const nl_dist_unit *x = &t->units[u];
        float *mine = t->staging + (size_t)t->r * x->shard;
        memcpy(mine, shards + x->pos, x->shard * sizeof(float));
        NL_TRY(nl_comm_all_gather(t->dp, mine, t->staging, x->shard * (size_t)t->p, NL_COMM_F32, t->o.impl));
        memcpy(full + x->begin, t->staging, x->len * sizeof(float));
    }
    return NL_OK;
}

static nl_status L_save(void *user, const char *path, const nl_ckpt_state *state) {
    nl_dist_trainer *t = user;
    nl_model *m = &t->model;
    size_t n = m->n_params;
    float *mom = NULL, *params = NULL;
    nl_status st = NL_OK;
    if (t->o.zero >= 1) {
        mom = nl_malloc(2 * n * sizeof(float), "checkpoint moments");
        if (!mom) return NL_ERR_NOMEM;
        if ((st = gather_shards(t, t->adam_m, mom)) || (st = gather_shards(t, t->adam_v, mom + n))) goto out;
    }
    if (t->o.zero == 3) {
        params = nl_malloc(n * sizeof(float), "checkpoint parameters");
        if (!params) {
            st = NL_ERR_NOMEM;
            goto out;
        }
        if ((st = gather_params(t, params))) goto out;
    }
    if (t->r == 0) {
        nl_adamw opt = t->opt;
        opt.n = n;
        opt.m = mom ? mom : t->adam_m;
        opt.v = mom ? mom + n : t->adam_v;
        nl_ckpt_state cs = *state;
        cs.opt = &opt;
        if (params) memcpy(m->params, params, n * sizeof(float));
        st = nl_ckpt_save(path, m, "byte", &cs);
        if (params)
            for (int u = 0; u < t->n_units; u++) unit_drop(t, u);
    }
    /* everyone learns whether rank 0 managed to write the file */
    double bad = st ? 1 : 0;
    nl_status st2 = nl_comm_max_double(t->dp, &bad);
    if (!st && (st2 || bad)) st = st2 ? st2 : nl_fail(NL_ERR_IO, "checkpoint %s: rank 0 could not write it", path);
out:
    nl_free(mom);
    nl_free(params);
    return st;
}

static nl_status L_load(void *user, const char *path, nl_ckpt_state *cs) {
    nl_dist_trainer *t = user;
    nl_model tmp, *m = &t->model;
    memset(&tmp, 0, sizeof tmp);
    char tok[64];
    nl_adamw opt;
    memset(&opt, 0, sizeof opt);
    NL_TRY(nl_ckpt_load_model(path, &tmp, tok));
    nl_status st = NL_OK;
    if (tmp.n_params != m->n_params || tmp.L != m->L) {
        st = nl_fail(NL_ERR_INVALID, "checkpoint %s holds a model of %zu parameters, this run has %zu", path,
                     tmp.n_params, m->n_params);
        goto out;
    }
    if ((st = nl_adamw_init(&opt, &tmp, t->opt.beta1, t->opt.beta2, t->opt.eps, t->opt.weight_decay))) goto out;
    memset(cs, 0, sizeof *cs);
    cs->opt = &opt;
    if ((st = nl_ckpt_load_state(path, &tmp, cs))) goto out;
    cs->opt = NULL;
    t->opt.t = opt.t;
    if (t->o.zero == 0) {
        memcpy(m->params, tmp.params, m->n_params * sizeof(float));
        memcpy(t->adam_m, opt.m, m->n_params * sizeof(float));
        memcpy(t->adam_v, opt.v, m->n_params * sizeof(float));
    } else {
        if (t->o.zero < 3) memcpy(m->params, tmp.params, m->n_params * sizeof(float));
        for (int u = 0; u < t->n_units; u++) {
            const nl_dist_unit *x = &t->units[u];
            size_t g0 = x->begin + (size_t)t->r * x->shard, real = shard_real(t, u);
            memset(t->adam_m + x->pos, 0, x->shard * sizeof(float));
            memset(t->adam_v + x->pos, 0, x->shard * sizeof(float));
            memcpy(t->adam_m + x->pos, opt.m + g0, real * sizeof(float));
            memcpy(t->adam_v + x->pos, opt.v + g0, real * sizeof(float));
            if (t->o.zero == 3) {
                memset(t->pshard + x->pos, 0, x->shard * sizeof(float));
                memcpy(t->pshard + x->pos, tmp.params + g0, real * sizeof(float));
            }
        }
    }
out:
    nl_adamw_free(&opt);
    nl_model_free(&tmp);
    return st;
}
