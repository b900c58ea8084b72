/*
 * Pipeline parallelism (GPipe, 1F1B) of NanoLM; see include/nanolm/pipeline.h.
 *
 * A stage runs the same layer code as nl_model_forward / nl_model_backward (the layer kernels
 * of nanolm/model.h in the same order), on its own layers and on one micro-batch at a time, with
 * the activations of each micro-batch kept until its backward.
 */
#include "nanolm/pipeline.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

struct nl_pipe_mb {
    float *mem;
    /* Under sequence parallelism the buffers marked [rows] hold only this rank's sp_n rows
     * (b*T/TP instead of b*T): the residual stream, the norm outputs and their rstd. */
    float *R; /* [rows] (nl+1, b, T, C) residual stream entering each local layer (+ leaving) */
    float *ln1, *ln1_rstd, *qkv, *att, *atty, *resid2, *ln2, *ln2_rstd, *h13, *hact; /* ln*, resid2: [rows] */
    float *lnf, *lnf_rstd, *logits; /* last stage; lnf, lnf_rstd: [rows] */
    float *dsend;                   /* (b, T, C) gradient sent to the previous stage */
    nl_comm_request *fwd_req, *bwd_req;
};

void nl_pipe_memory_report(const nl_pipe *p, nl_dist_memory *out) {
    size_t n = p->model.n_params, f = sizeof(float);
    out->params = n * f;
    out->grads = n * f;
    out->optimizer = 2 * n * f;
    out->workspace = p->act_floats * f;
}

double nl_pipe_bubble_formula(int P, int M) { return (double)(P - 1) / (double)(M + P - 1); }

static int first_stage(const nl_pipe *p) { return p->s == 0; }
static int last_stage(const nl_pipe *p) { return p->s == p->P - 1; }

/* Copies this rank's part of the whole model `full` into p->model (same tensor order): layer j is
 * the whole model's layer l0 + j; q/k/v/gate/up (column-parallel) are rows [tr*n, (tr+1)*n) of
 * the (out, in) weight, o/down (row-parallel) its columns [tr*n, (tr+1)*n); the rest is copied. */
static nl_status cut_part(nl_pipe *p, const nl_model *full) {
    nl_model *m = &p->model;
    const nl_param_info *lt, *ft;
    int nl_ = nl_model_params_table(m, &lt), nf = nl_model_params_table(full, &ft);
    for (int k = 0; k < nl_; k++) {
        const nl_param_info *t = &lt[k], *g = NULL;
        int gl = t->layer >= 0 ? t->layer + p->l0 : -1;
        for (int i = 0; i < nf && !g; i++)
            if (ft[i].kind == t->kind && ft[i].layer == gl) g = &ft[i];
        if (!g) return nl_fail(NL_ERR_INVALID, "pipeline: tensor %s has no counterpart in the whole model", t->name);
        float *dst = m->params + t->offset;
        const float *src = full->params + g->offset;
        switch (t->kind) {
        case NL_PARAM_WQ:
        case NL_PARAM_WK:
        case NL_PARAM_WV:
        case NL_PARAM_W1:
        case NL_PARAM_W3: memcpy(dst, src + (size_t)p->tr * t->numel, t->numel * sizeof(float)); break;
        case NL_PARAM_WO:
        case NL_PARAM_W2: {
            int64_t rows = t->shape[0], cn = t->shape[1], cols = g->shape[1];
            for (int64_t r = 0; r < rows; r++)
                memcpy(dst + r * cn, src + r * cols + p->tr * cn, (size_t)cn * sizeof(float));
            break;
        }
        default:
            if (t->numel != g->numel) return nl_fail(NL_ERR_INVALID, "pipeline: tensor %s size mismatch", t->name);
            memcpy(dst, src, t->numel * sizeof(float));
            break;
        }
    }
    return NL_OK;
}

/* The layouts the pipeline/tensor engine refuses, by name. */
static nl_status check_layout(const nl_pipe *p, const nl_arch *arch, const nl_dist_opts *o, int M) {
    if (o->zero)
        return nl_fail(NL_ERR_UNSUPPORTED, "pipeline parallelism with ZeRO stage %d is not supported yet (ZeRO 0 only)",
                       o->zero);
    if (arch->tied_embeddings && p->P > 1)
        return nl_fail(NL_ERR_UNSUPPORTED, "pipeline parallelism needs untied embeddings (model %s ties them)",
                       arch->name);
    if (M < 1 || o->train.batch % M)
        return nl_fail(NL_ERR_INVALID, "the batch %lld must be a multiple of the micro-batch count %d",
                       (long long)o->train.batch, M);
    if (arch->n_heads % p->TP || arch->n_kv_heads % p->TP || arch->hidden_dim % p->TP)
        return nl_fail(
            NL_ERR_INVALID,
            "the tensor-parallel size %d must divide the heads %lld, the KV heads %lld and the hidden size %lld", p->TP,
            (long long)arch->n_heads, (long long)arch->n_kv_heads, (long long)arch->hidden_dim);
    if (o->sp && p->TP > 1 && (p->P > 1 || arch->tied_embeddings || ((o->train.batch / M) * o->train.seq) % p->TP))
        return nl_fail(NL_ERR_UNSUPPORTED,
                       "sequence parallelism needs one pipeline stage, untied embeddings and "
                       "micro-batch rows (%lld) divisible by the tensor-parallel size %d",
                       (long long)((o->train.batch / M) * o->train.seq), p->TP);
    if (p->P > arch->n_layers)
        return nl_fail(NL_ERR_INVALID, "%d pipeline stages for %lld layers: at most one stage per layer", p->P,
                       (long long)arch->n_layers);
    if (arch->n_experts > 0)
        return nl_fail(NL_ERR_UNSUPPORTED,
                       "tensor/pipeline parallelism of a mixture-of-experts model (%s) is not supported yet",
                       arch->name);
    return NL_OK;
}

/* This rank's part as a model of its own: the stage's layers, T-th of the heads, KV heads and
 * SwiGLU width, the embedding on the first stage, final norm and classifier on the last. Only
 * allocated here; fill_part gives it its values. */
static nl_status init_part(nl_pipe *p, const nl_arch *arch) {
    p->l0 = (int)(p->s * arch->n_layers / p->P);
    p->l1 = (int)((p->s + 1) * arch->n_layers / p->P);
    nl_arch la = *arch;
    la.n_layers = p->l1 - p->l0;
    la.n_heads = arch->n_heads / p->TP;
    la.n_kv_heads = arch->n_kv_heads / p->TP;
    la.hidden_dim = arch->hidden_dim / p->TP;
    la.head_dim = nl_arch_head_dim(arch);
    return nl_model_init_part(&p->model, &la, first_stage(p), last_stage(p));
}

/* The part's values are the one-process initialisation's (a whole model is built, cut and freed),
 * broadcast over the data-parallel group; then its gradients and the shapes of a micro-batch. */
static nl_status fill_part(nl_pipe *p, const nl_arch *arch, const nl_dist_opts *o) {
    nl_model full, *m = &p->model;
    NL_TRY(nl_model_init(&full, arch));
    nl_model_init_random(&full, o->train.seed);
    p->n_params_full = full.n_params;
    nl_status st = cut_part(p, &full);
    nl_model_free(&full);
    if (st) return st;
    NL_TRY(nl_comm_broadcast(p->dp, m->params, m->n_params, NL_COMM_F32, 0, o->impl));
    NL_TRY(nl_model_alloc_grads(m));
    p->b = o->train.batch / p->M;
    p->sp_n = o->sp && p->TP > 1 ? p->b * o->train.seq / p->TP : 0;
    p->sp_r0 = p->sp_n * p->tr;
    p->nh = (int)m->NH;
    p->kvh = (int)m->KVH;
    p->h = (int)m->H;
    return NL_OK;
}

#define TAKE(ptr, n) (ptr = q, q += (n))

/* Activation slots: GPipe keeps all M micro-batches alive; 1F1B at most P - s on stage s
 * (micro-batch k lives in slot k mod n_slots). Each slot is one allocation cut into the
 * per-layer buffers of its micro-batch. */
static nl_status alloc_microbatches(nl_pipe *p) {
    const nl_model *m = &p->model;
    int64_t nl = p->l1 - p->l0, T = p->o.train.seq, bT = p->b * T, C = m->C, QKV = (p->nh + 2 * p->kvh) * m->hd,
            H = p->h, V = m->V, NH = p->nh, hd = m->hd;
    p->n_slots = p->schedule == NL_PIPE_1F1B && p->P - p->s < p->M ? p->P - p->s : p->M;
    p->mbs = nl_calloc((size_t)p->n_slots, sizeof *p->mbs, "micro-batches");
    if (!p->mbs) return NL_ERR_NOMEM;
    for (int k = 0; k < p->n_slots; k++) {
        nl_pipe_mb *mb = &p->mbs[k];
        /* rows of the sequence-sharded tensors: this rank's shard under SP, all otherwise */
        int64_t rT = p->sp_n ? p->sp_n : bT;
        size_t f =
            (size_t)((nl + 1) * rT * C +
                     nl * (rT * C * 3 + rT * 2 + bT * QKV + p->b * NH * T * T + bT * NH * hd + bT * 3 * H) + bT * C);
        if (last_stage(p)) f += (size_t)(rT * C + rT + bT * V);
        p->act_floats += f;
        mb->mem = nl_calloc(f, sizeof(float), "micro-batch activations");
        if (!mb->mem) return NL_ERR_NOMEM;
        float *q = mb->mem;
        TAKE(mb->R, (nl + 1) * rT * C);
        TAKE(mb->ln1, nl * rT * C);
        TAKE(mb->ln1_rstd, nl * rT);
        TAKE(mb->qkv, nl * bT * QKV);
        TAKE(mb->att, nl * p->b * NH * T * T);
        TAKE(mb->atty, nl * bT * NH * hd);
        TAKE(mb->resid2, nl * rT * C);
        TAKE(mb->ln2, nl * rT * C);
        TAKE(mb->ln2_rstd, nl * rT);
        TAKE(mb->h13, nl * bT * 2 * H);
        TAKE(mb->hact, nl * bT * H);
        TAKE(mb->dsend, bT * C);
        if (last_stage(p)) {
            TAKE(mb->lnf, rT * C);
            TAKE(mb->lnf_rstd, rT);
            TAKE(mb->logits, bT * V);
        }
    }
    return NL_OK;
}

/* Backward scratch; SP adds one (b*T, C) buffer that holds, transiently, the all-gathered norm
 * output feeding a column-parallel matmul (re-gathered in backward for its weight gradient). */
static nl_status alloc_scratch(nl_pipe *p) {
    const nl_model *m = &p->model;
    int64_t T = p->o.train.seq, bT = p->b * T, C = m->C, QKV = (p->nh + 2 * p->kvh) * m->hd, H = p->h, NH = p->nh,
            hd = m->hd;
    size_t sf =
        (size_t)(bT * C * 2 + bT * QKV + bT * NH * hd + p->b * NH * T + bT * 2 * H + bT * H + (p->sp_n ? bT * C : 0));
    p->act_floats += sf;
    p->scratch = nl_calloc(sf, sizeof(float), "pipeline backward scratch");
    if (!p->scratch) return NL_ERR_NOMEM;
    float *q = p->scratch;
    TAKE(p->dresid, bT * C);
    TAKE(p->dln, bT * C);
    TAKE(p->dqkv, bT * QKV);
    TAKE(p->datty, bT * NH * hd);
    TAKE(p->datt, p->b * NH * T);
    TAKE(p->dh13, bT * 2 * H);
    TAKE(p->dhact, bT * H);
    if (p->sp_n) TAKE(p->gat, bT * C);
    return NL_OK;
}
#undef TAKE

/* AdamW state, the batch, the timeline of the last step, and the ownership mask: 1 = replicated
 * over the tensor-parallel group (norms, embedding, classifier), 2 = this rank's slice of a split
 * weight (counted once in the global gradient norm). */
static nl_status alloc_step_state(nl_pipe *p) {
    const nl_model *m = &p->model;
    const nl_train_opts *tr = &p->o.train;
    int M = p->M;
    p->opt.beta1 = tr->beta1, p->opt.beta2 = tr->beta2, p->opt.eps = tr->adam_eps;
    p->opt.weight_decay = tr->weight_decay;
    p->adam_m = nl_calloc(m->n_params, sizeof(float), "AdamW first moment");
    p->adam_v = nl_calloc(m->n_params, sizeof(float), "AdamW second moment");
    p->x = nl_malloc((size_t)(tr->batch * tr->seq) * sizeof(int32_t), "batch inputs");
    p->y = nl_malloc((size_t)(tr->batch * tr->seq) * sizeof(int32_t), "batch targets");
    p->own = nl_calloc(m->n_params, 1, "replicated/split mask");
    p->ev_kind = nl_calloc((size_t)(4 * M), sizeof(int), "timeline");
    p->ev_t0 = nl_calloc((size_t)(4 * M), sizeof(double), "timeline");
    if (!p->ev_kind || !p->ev_t0 || !p->adam_m || !p->adam_v || !p->x || !p->y || !p->own) return NL_ERR_NOMEM;
    p->ev_mb = p->ev_kind + 2 * M;
    p->ev_t1 = p->ev_t0 + 2 * M;
    const nl_param_info *tab;
    int nt = nl_model_params_table(m, &tab);
    for (int k = 0; k < nt; k++) {
        nl_param_kind kd = tab[k].kind;
        int split = kd == NL_PARAM_WQ || kd == NL_PARAM_WK || kd == NL_PARAM_WV || kd == NL_PARAM_WO ||
                    kd == NL_PARAM_W1 || kd == NL_PARAM_W2 || kd == NL_PARAM_W3;
        memset(p->own + tab[k].offset, split && p->TP > 1 ? 2 : 1, tab[k].numel);
    }
    return NL_OK;
}

nl_status nl_pipe_init(nl_pipe *p, const nl_arch *arch, const nl_dist_opts *o, int M, nl_pipe_schedule sched,
                       nl_comm *pp_comm, nl_comm *dp_comm, nl_comm *tp_comm) {
    memset(p, 0, sizeof *p);
    p->tp = tp_comm;
    p->TP = nl_comm_size(tp_comm);
    p->tr = nl_comm_rank(tp_comm);
    p->o = *o;
    p->M = M;
    p->schedule = sched;
    p->pp = pp_comm;
    p->dp = dp_comm;
    p->P = nl_comm_size(pp_comm);
    p->s = nl_comm_rank(pp_comm);
    p->D = nl_comm_size(dp_comm);
    p->d = nl_comm_rank(dp_comm);
    NL_TRY(check_layout(p, arch, o, M));
    NL_TRY(init_part(p, arch));
    nl_status st = fill_part(p, arch, o);
    if (!st) st = alloc_microbatches(p);
    if (!st) st = alloc_scratch(p);
    if (!st) st = alloc_step_state(p);
    if (st) nl_pipe_free(p);
    return st;
}

void nl_pipe_free(nl_pipe *p) {
    for (int k = 0; p->mbs && k < p->n_slots; k++) {
        if (p->mbs[k].fwd_req) nl_comm_wait(p->mbs[k].fwd_req);
        if (p->mbs[k].bwd_req) nl_comm_wait(p->mbs[k].bwd_req);
        nl_free(p->mbs[k].mem);
    }
    nl_free(p->mbs);
    nl_free(p->scratch);
    nl_free(p->adam_m);
    nl_free(p->adam_v);
    nl_free(p->x);
    nl_free(p->y);
    nl_free(p->own);
    nl_free(p->ev_kind);
    nl_free(p->ev_t0);
    nl_model_free(&p->model);
    memset(p, 0, sizeof *p);
}

static nl_linear_site site(const nl_model *m, nl_linear_kind k, int layer, const float *w) {
    nl_linear_site s = {k, layer, (size_t)(w - m->params)};
    return s;
}

/* c (M, N, ldc) = a (M, K, lda) . b^T where b is (N, K, ldb): y = x W^T. */
static void gemm_nt(int64_t M, int64_t N, int64_t K, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                    int64_t ldc) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, a, (int)lda, b, (int)ldb, 0.0f,
                c, (int)ldc);
}
/* c (M, N) = a (M, K) . b (K, N) + beta c: dx = dy W. */
static void gemm_nn(int64_t M, int64_t N, int64_t K, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                    int64_t ldc, float beta) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)K, 1.0f, a, (int)lda, b, (int)ldb, beta,
                c, (int)ldc);
}
/* c (M, N) += a^T . b with a (K, M), b (K, N): dW += dy^T x. */
static void gemm_tn(int64_t M, int64_t N, int64_t K, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                    int64_t ldc) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)M, (int)N, (int)K, 1.0f, a, (int)lda, b, (int)ldb, 1.0f,
                c, (int)ldc);
}

/* Megatron's all-reduce over the tensor-parallel group (the time counts as communication, not
 * computation: *t_mark is moved past it). */
static nl_status tp_sum(nl_pipe *p, float *buf, size_t n, double *t_mark) {
    if (p->TP == 1) return NL_OK;
    double t0 = nl_time_s();
    NL_TRY(nl_comm_all_reduce(p->tp, buf, n, NL_COMM_F32, p->o.impl));
    double dt = nl_time_s() - t0;
    p->tp_s += dt;
    *t_mark += dt;
    return NL_OK;
}

/* Sequence parallel: this rank's rows [sp_r0, sp_r0 + sp_n) `shard` (sp_n, C) -> all rows `full`
 * (BT, C) (all-gather), and the sum over the group of `full`'s rows -> this rank's rows `shard`
 * (reduce-scatter). n = BT * C; shard may point into full at this rank's rows (in place). */
static nl_status sp_gather(nl_pipe *p, const float *shard, float *full, size_t n, double *t_mark) {
    double t0 = nl_time_s();
    NL_TRY(nl_comm_all_gather(p->tp, shard, full, n, NL_COMM_F32, p->o.impl));
    double dt = nl_time_s() - t0;
    p->tp_s += dt;
    *t_mark += dt;
    return NL_OK;
}

static nl_status sp_scatter(nl_pipe *p, float *full, float *shard, size_t n, double *t_mark) {
    double t0 = nl_time_s();
    NL_TRY(nl_comm_reduce_scatter(p->tp, full, shard, n, NL_COMM_F32, p->o.impl));
    double dt = nl_time_s() - t0;
    p->tp_s += dt;
    *t_mark += dt;
    return NL_OK;
}

static void record(nl_pipe *p, int kind, int k, double t0, double t1) {
    if (p->n_ev >= 2 * p->M) return;
    p->ev_kind[p->n_ev] = kind;
    p->ev_mb[p->n_ev] = k;
    p->ev_t0[p->n_ev] = t0 - p->t_step0;
    p->ev_t1[p->n_ev] = t1 - p->t_step0;
    p->n_ev++;
}

/* Forward of micro-batch k on this stage. */
static nl_status stage_forward(nl_pipe *p, int k) {
    nl_model *m = &p->model;
    nl_pipe_mb *mb = &p->mbs[k % p->n_slots];
    int64_t B = p->b, T = p->o.train.seq, BT = B * T, C = m->C, H = p->h, V = m->V, NH = p->nh, KVH = p->kvh,
            hd = m->hd, QKV = (NH + 2 * KVH) * hd;
    const int32_t *tok = p->x + (size_t)k * BT, *tgt = p->y + (size_t)k * BT;
    float eps = (float)m->arch.norm_eps;
    double t0 = nl_time_s();
    /* a reused slot (1F1B): the sends of its previous micro-batch must be done */
    if (mb->fwd_req || mb->bwd_req) {
        nl_status st = nl_comm_wait(mb->fwd_req);
        mb->fwd_req = NULL;
        NL_TRY(st);
        st = nl_comm_wait(mb->bwd_req);
        mb->bwd_req = NULL;
        NL_TRY(st);
    }
    /* rows the norms and residuals work on: all, or this rank's sequence shard [r0, r0 + rn); the
     * buffers of sequence-sharded tensors hold rn rows */
    int64_t r0 = p->sp_n ? p->sp_r0 : 0, rn = p->sp_n ? p->sp_n : BT;
    if (first_stage(p)) {
        for (int64_t i = 0; i < rn; i++)
            memcpy(mb->R + i * C, m->w.embed + (int64_t)tok[r0 + i] * C, (size_t)C * sizeof(float));
    } else {
        NL_TRY(nl_comm_recv(p->pp, mb->R, (size_t)(BT * C), NL_COMM_F32, p->s - 1, 2 * k));
    }
    double t1 = nl_time_s(), t_busy0 = t1;
    p->idle_s += t1 - t0;
    for (int64_t j = 0; j < p->l1 - p->l0; j++) {
        nl_layer_weights *lw = &m->w.layers[j]; /* the whole model's layer l0 + j */
        float *x = mb->R + j * rn * C, *ln1 = mb->ln1 + j * rn * C, *qkv = mb->qkv + j * BT * QKV;
        float *att = mb->att + j * B * NH * T * T, *atty = mb->atty + j * BT * NH * hd;
        float *x2 = mb->resid2 + j * rn * C, *ln2 = mb->ln2 + j * rn * C, *h13 = mb->h13 + j * BT * 2 * H;
        float *hact = mb->hact + j * BT * H, *xo = mb->R + (j + 1) * rn * C;
        int64_t qd = NH * hd, kd = KVH * hd;
        /* SP: the column-parallel matmuls read the all-gathered norm output (transient, p->gat),
         * the row-parallel ones write all rows into p->dresid (free during a forward), which is
         * reduce-scattered into the shard */
        float *lin = p->sp_n ? p->gat : ln1, *rpo = p->sp_n ? p->dresid : x2;
        nl_rmsnorm_forward(ln1, mb->ln1_rstd + j * rn, x, lw->rms_att, rn, C, eps);
        if (p->sp_n) NL_TRY(sp_gather(p, ln1, lin, (size_t)(BT * C), &t1));
        /* column-parallel q, k, v: this rank's heads are rows [tr*qd, (tr+1)*qd) of wq, ... */
        gemm_nt(BT, qd, C, lin, C, lw->wq, C, qkv, QKV);
        gemm_nt(BT, kd, C, lin, C, lw->wk, C, qkv + qd, QKV);
        gemm_nt(BT, kd, C, lin, C, lw->wv, C, qkv + qd + kd, QKV);
        nl_rope_apply(qkv, m->rope_cos, m->rope_sin, B, T, NH, hd, QKV, 0);
        nl_rope_apply(qkv + qd, m->rope_cos, m->rope_sin, B, T, KVH, hd, QKV, 0);
        nl_attention_forward(atty, att, qkv, B, T, NH, KVH, hd);
        /* row-parallel o: this rank's columns of wo, then the sum over the group */
        gemm_nt(BT, C, qd, atty, qd, lw->wo, qd, rpo, C);
        if (p->sp_n)
            NL_TRY(sp_scatter(p, rpo, x2, (size_t)(BT * C), &t1));
        else
            NL_TRY(tp_sum(p, x2, (size_t)(BT * C), &t1));
        for (int64_t i = 0; i < rn * C; i++) x2[i] += x[i];
        nl_rmsnorm_forward(ln2, mb->ln2_rstd + j * rn, x2, lw->rms_ffn, rn, C, eps);
        if (p->sp_n)
            lin = p->gat, rpo = p->dresid;
        else
            lin = ln2, rpo = xo;
        if (p->sp_n) NL_TRY(sp_gather(p, ln2, lin, (size_t)(BT * C), &t1));
        gemm_nt(BT, H, C, lin, C, lw->w1, C, h13, 2 * H);
        gemm_nt(BT, H, C, lin, C, lw->w3, C, h13 + H, 2 * H);
        nl_swiglu_forward(hact, h13, BT, H);
        gemm_nt(BT, C, H, hact, H, lw->w2, H, rpo, C);
        if (p->sp_n)
            NL_TRY(sp_scatter(p, rpo, xo, (size_t)(BT * C), &t1));
        else
            NL_TRY(tp_sum(p, xo, (size_t)(BT * C), &t1));
        for (int64_t i = 0; i < rn * C; i++) xo[i] += x2[i];
    }
    float *out = mb->R + (p->l1 - p->l0) * rn * C;
    if (last_stage(p)) {
        nl_rmsnorm_forward(mb->lnf, mb->lnf_rstd, out, m->w.rms_final, rn, C, eps);
        float *lnf = mb->lnf;
        if (p->sp_n) NL_TRY(sp_gather(p, mb->lnf, lnf = p->gat, (size_t)(BT * C), &t1));
        nl_linear_site s = site(m, NL_LIN_CLS, -1, m->w.cls);
        nl_linear_forward(m, &s, mb->logits, lnf, m->w.cls, BT, C, V);
        double total = 0;
        for (int64_t i = 0; i < BT; i++) {
            const float *z = mb->logits + i * V;
            float mx = -INFINITY;
            for (int64_t v = 0; v < V; v++) mx = z[v] > mx ? z[v] : mx;
            float sum = 0.0f;
            for (int64_t v = 0; v < V; v++) sum += expf(z[v] - mx);
            total += logf(sum) + mx - z[tgt[i]];
        }
        p->loss_sum += (float)(total / (double)BT);
        p->busy_s += nl_time_s() - t1;
        record(p, 0, k, t_busy0, nl_time_s());
    } else {
        p->busy_s += nl_time_s() - t1;
        record(p, 0, k, t_busy0, nl_time_s());
        NL_TRY(nl_comm_send_start(p->pp, out, (size_t)(BT * C), NL_COMM_F32, p->s + 1, 2 * k, &mb->fwd_req));
    }
    return NL_OK;
}

/* Backward of micro-batch k on this stage: gradients accumulate (+=) into model.grads. */
static nl_status stage_backward(nl_pipe *p, int k) {
    nl_model *m = &p->model;
    nl_pipe_mb *mb = &p->mbs[k % p->n_slots];
    int64_t B = p->b, T = p->o.train.seq, BT = B * T, C = m->C, H = p->h, V = m->V, NH = p->nh, KVH = p->kvh,
            hd = m->hd, QKV = (NH + 2 * KVH) * hd;
    const int32_t *tok = p->x + (size_t)k * BT, *tgt = p->y + (size_t)k * BT;
    float *G = m->train->grads;
#define GRAD(ptr) (G + ((ptr)-m->params))
    double t0 = nl_time_s();
    int64_t nl = p->l1 - p->l0;
    /* this rank's rows [r0, r0 + rn) of the scratch gradients; stored shards hold rn rows */
    int64_t r0 = p->sp_n ? p->sp_r0 : 0, rn = p->sp_n ? p->sp_n : BT;
    if (last_stage(p)) {
        float dscale = 1.0f / (float)BT;
        for (int64_t i = 0; i < BT; i++) {
            float *z = mb->logits + i * V;
            float mx = -INFINITY;
            for (int64_t v = 0; v < V; v++) mx = z[v] > mx ? z[v] : mx;
            float sum = 0.0f;
            for (int64_t v = 0; v < V; v++) {
                z[v] = expf(z[v] - mx);
                sum += z[v];
            }
            float inv = 1.0f / sum;
            for (int64_t v = 0; v < V; v++) z[v] = z[v] * inv * dscale;
            z[tgt[i]] -= dscale;
        }
        /* SP: the classifier's input is re-gathered from the stored shard */
        float *lnf = mb->lnf;
        if (p->sp_n) NL_TRY(sp_gather(p, mb->lnf, lnf = p->gat, (size_t)(BT * C), &t0));
        nl_linear_site s = site(m, NL_LIN_CLS, -1, m->w.cls);
        nl_linear_backward(m, &s, p->dln, GRAD(m->w.cls), mb->logits, lnf, m->w.cls, BT, C, V);
        memset(p->dresid, 0, (size_t)(BT * C) * sizeof(float));
        nl_rmsnorm_backward(p->dresid + r0 * C, GRAD(m->w.rms_final), p->dln + r0 * C, mb->R + nl * rn * C,
                            m->w.rms_final, mb->lnf_rstd, rn, C);
    } else {
        NL_TRY(nl_comm_recv(p->pp, p->dresid, (size_t)(BT * C), NL_COMM_F32, p->s + 1, 2 * k + 1));
        double t1 = nl_time_s();
        p->idle_s += t1 - t0;
        t0 = t1;
    }
    double t_busy0 = t0;
    for (int64_t j = nl - 1; j >= 0; j--) {
        nl_layer_weights *lw = &m->w.layers[j]; /* the whole model's layer l0 + j */
        float *x = mb->R + j * rn * C, *ln1 = mb->ln1 + j * rn * C, *qkv = mb->qkv + j * BT * QKV;
        float *att = mb->att + j * B * NH * T * T, *atty = mb->atty + j * BT * NH * hd;
        float *x2 = mb->resid2 + j * rn * C, *ln2 = mb->ln2 + j * rn * C, *h13 = mb->h13 + j * BT * 2 * H;
        float *hact = mb->hact + j * BT * H;
        int64_t qd = NH * hd, kd = KVH * hd, ldo = qd, ldw2 = H;
        /* sequence parallel: this rank's rows of dresid -> all rows (grad of the reduce-scatter) */
        if (p->sp_n) NL_TRY(sp_gather(p, p->dresid + p->sp_r0 * C, p->dresid, (size_t)(BT * C), &t0));
        /* down (row-parallel): dhact = dresid . w2[:, slice]; dw2[:, slice] += dresid^T . hact */
        gemm_nn(BT, H, C, p->dresid, C, lw->w2, ldw2, p->dhact, H, 0.0f);
        gemm_tn(C, H, BT, p->dresid, C, hact, H, GRAD(lw->w2), ldw2);
        nl_swiglu_backward(p->dh13, p->dhact, h13, BT, H);
        /* gate/up (column-parallel): dln = dgate . w1s + dup . w3s, summed over the group */
        gemm_nn(BT, C, H, p->dh13, 2 * H, lw->w1, C, p->dln, C, 0.0f);
        gemm_nn(BT, C, H, p->dh13 + H, 2 * H, lw->w3, C, p->dln, C, 1.0f);
        /* SP: the weight gradients need all rows of the norm output: re-gathered from the shard */
        float *lin = ln2;
        if (p->sp_n) NL_TRY(sp_gather(p, ln2, lin = p->gat, (size_t)(BT * C), &t0));
        gemm_tn(H, C, BT, p->dh13, 2 * H, lin, C, GRAD(lw->w1), C);
        gemm_tn(H, C, BT, p->dh13 + H, 2 * H, lin, C, GRAD(lw->w3), C);
        if (p->sp_n)
            NL_TRY(sp_scatter(p, p->dln, p->dln + p->sp_r0 * C, (size_t)(BT * C), &t0));
        else
            NL_TRY(tp_sum(p, p->dln, (size_t)(BT * C), &t0));
        nl_rmsnorm_backward(p->dresid + r0 * C, GRAD(lw->rms_ffn), p->dln + r0 * C, x2, lw->rms_ffn,
                            mb->ln2_rstd + j * rn, rn, C);
        if (p->sp_n) NL_TRY(sp_gather(p, p->dresid + p->sp_r0 * C, p->dresid, (size_t)(BT * C), &t0));
        /* o (row-parallel) */
        gemm_nn(BT, qd, C, p->dresid, C, lw->wo, ldo, p->datty, qd, 0.0f);
        gemm_tn(C, qd, BT, p->dresid, C, atty, qd, GRAD(lw->wo), ldo);
        nl_attention_backward(p->dqkv, p->datt, p->datty, att, qkv, B, T, NH, KVH, hd);
        nl_rope_apply(p->dqkv, m->rope_cos, m->rope_sin, B, T, NH, hd, QKV, 1);
        nl_rope_apply(p->dqkv + qd, m->rope_cos, m->rope_sin, B, T, KVH, hd, QKV, 1);
        /* q, k, v (column-parallel) */
        gemm_nn(BT, C, qd, p->dqkv, QKV, lw->wq, C, p->dln, C, 0.0f);
        gemm_nn(BT, C, kd, p->dqkv + qd, QKV, lw->wk, C, p->dln, C, 1.0f);
        gemm_nn(BT, C, kd, p->dqkv + qd + kd, QKV, lw->wv, C, p->dln, C, 1.0f);
        lin = ln1;
        if (p->sp_n) NL_TRY(sp_gather(p, ln1, lin = p->gat, (size_t)(BT * C), &t0));
        gemm_tn(qd, C, BT, p->dqkv, QKV, lin, C, GRAD(lw->wq), C);
        gemm_tn(kd, C, BT, p->dqkv + qd, QKV, lin, C, GRAD(lw->wk), C);
        gemm_tn(kd, C, BT, p->dqkv + qd + kd, QKV, lin, C, GRAD(lw->wv), C);
        if (p->sp_n)
            NL_TRY(sp_scatter(p, p->dln, p->dln + p->sp_r0 * C, (size_t)(BT * C), &t0));
        else
            NL_TRY(tp_sum(p, p->dln, (size_t)(BT * C), &t0));
        nl_rmsnorm_backward(p->dresid + r0 * C, GRAD(lw->rms_att), p->dln + r0 * C, x, lw->rms_att,
                            mb->ln1_rstd + j * rn, rn, C);
    }
    if (first_stage(p)) {
        float *dembed = GRAD(m->w.embed);
        for (int64_t i = r0; i < r0 + rn; i++) {
            float *dd = dembed + (int64_t)tok[i] * C;
            const float *g = p->dresid + i * C;
            for (int64_t c = 0; c < C; c++) dd[c] += g[c];
        }
        p->busy_s += nl_time_s() - t0;
        record(p, 1, k, t_busy0, nl_time_s());
    } else {
        memcpy(mb->dsend, p->dresid, (size_t)(BT * C) * sizeof(float));
        p->busy_s += nl_time_s() - t0;
        record(p, 1, k, t_busy0, nl_time_s());
        NL_TRY(nl_comm_send_start(p->pp, mb->dsend, (size_t)(BT * C), NL_COMM_F32, p->s - 1, 2 * k + 1, &mb->bwd_req));
    }
#undef GRAD
    return NL_OK;
}

static nl_status L_grads(void *user, const nl_data *d, int64_t step, float *loss_out) {
    nl_pipe *p = user;
    nl_model *m = &p->model;
    NL_TRY(nl_comm_barrier(p->pp)); /* a common origin for the timeline */
    double ts = nl_time_s();
    p->t_step0 = ts;
    p->n_ev = 0;
    p->busy_s = p->idle_s = p->tp_s = 0;
    p->loss_sum = 0;
    NL_TRY(nl_data_batch(d, NL_DATA_TRAIN, p->o.train.seed, step, p->d, p->D, (int)p->o.train.batch,
                         (int)p->o.train.seq, p->x, p->y));
    nl_model_zero_grad(m);
    int M = p->M;
    if (p->schedule == NL_PIPE_GPIPE) {
        for (int k = 0; k < M; k++) NL_TRY(stage_forward(p, k));
        for (int k = 0; k < M; k++) NL_TRY(stage_backward(p, k));
    } else {
        int warm = p->P - p->s - 1 < M ? p->P - p->s - 1 : M, f = 0, b = 0;
        for (; f < warm; f++) NL_TRY(stage_forward(p, f));
        while (f < M) {
            NL_TRY(stage_forward(p, f++));
            NL_TRY(stage_backward(p, b++));
        }
        while (b < M) NL_TRY(stage_backward(p, b++));
    }
    double tw = nl_time_s();
    for (int k = 0; k < p->n_slots; k++) {
        nl_status st = nl_comm_wait(p->mbs[k].fwd_req);
        p->mbs[k].fwd_req = NULL;
        NL_TRY(st);
        st = nl_comm_wait(p->mbs[k].bwd_req);
        p->mbs[k].bwd_req = NULL;
        NL_TRY(st);
    }
    p->idle_s += nl_time_s() - tw;
    p->step_s = nl_time_s() - ts;

    /* sequence parallel: norm weights and the embedding saw only this rank's rows */
    if (p->sp_n) {
        const nl_param_info *tb;
        int ntb = nl_model_params_table(m, &tb);
        for (int k = 0; k < ntb; k++)
            if (tb[k].kind == NL_PARAM_EMBED || tb[k].kind == NL_PARAM_RMS_ATT || tb[k].kind == NL_PARAM_RMS_FFN ||
                tb[k].kind == NL_PARAM_RMS_FINAL)
                NL_TRY(nl_comm_all_reduce(p->tp, m->train->grads + tb[k].offset, tb[k].numel, NL_COMM_F32, p->o.impl));
    }
    /* mean over micro-batches and data-parallel ranks */
    /* this rank holds only what it owns: one range, its whole parameter buffer */
    size_t lo[1] = {0}, hi[1] = {m->n_params};
    int nr = 1;
    float scale = 1.0f / (float)M;
    for (int i = 0; i < nr; i++) {
        for (size_t j = lo[i]; j < hi[i]; j++) m->train->grads[j] *= scale;
        if (p->D > 1) {
            NL_TRY(nl_comm_all_reduce(p->dp, m->train->grads + lo[i], hi[i] - lo[i], NL_COMM_F32, p->o.impl));
            float inv = 1.0f / (float)p->D;
            for (size_t j = lo[i]; j < hi[i]; j++) m->train->grads[j] *= inv;
        }
    }
    double lsum = 0;
    if (last_stage(p)) lsum = p->loss_sum;
    NL_TRY(nl_comm_sum_double(p->pp, &lsum));
    lsum /= M;
    NL_TRY(nl_comm_sum_double(p->dp, &lsum));
    *loss_out = (float)(lsum / p->D);
    return NL_OK;
}

static nl_status L_sumsq(void *user, double *ss_out) {
    nl_pipe *p = user;
    const nl_model *m = &p->model;
    /* global norm: split slices once each, replicated tensors once per tensor-parallel group */
    double ss = 0;
    for (size_t j = 0; j < m->n_params; j++)
        if (p->own[j] == 2 || (p->own[j] == 1 && p->tr == 0)) ss += (double)m->train->grads[j] * m->train->grads[j];
    NL_TRY(nl_comm_sum_double(p->pp, &ss)); /* stages own disjoint ranges */
    NL_TRY(nl_comm_sum_double(p->tp, &ss));
    *ss_out = ss;
    return NL_OK;
}

static void L_scale(void *user, float f) {
    nl_pipe *p = user;
    nl_grad_scale(&p->model, f);
}

static nl_status L_update(void *user, float lr) {
    nl_pipe *p = user;
    nl_model *m = &p->model;
    p->opt.t++;
    /* AdamW (nl_adamw_update_range) on the owned runs of the part's flat vector */
    size_t n = m->n_params;
    for (size_t i = 0; i < n;) {
        while (i < n && !p->own[i]) i++;
        size_t j = i;
        while (j < n && p->own[j]) j++;
        if (j > i)
            nl_adamw_update_range(&p->opt, m, lr, i, j - i, m->params + i, m->train->grads + i, p->adam_m + i,
                                  p->adam_v + i);
        i = j;
    }
    return NL_OK;
}

static nl_status L_agree_stop(void *u, int *stop) {
    (void)u;
    return nl_comm_max_int(nl_comm_world(), stop);
}

void nl_pipe_layout(nl_pipe *p, nl_train_layout *L) {
    memset(L, 0, sizeof *L);
    L->user = p;
    L->name = p->P > 1 ? "pipeline" : "tensor-parallel";
    L->rank0 = nl_comm_world_rank() == 0;
    L->n_params = p->n_params_full;
    L->grads = L_grads;
    L->sumsq = L_sumsq;
    L->scale = L_scale;
    L->update = L_update;
    L->agree_stop = L_agree_stop;
}

nl_status nl_pipe_step(nl_pipe *p, const nl_data *d, int64_t step, float lr, float *loss_out, double *norm_out) {
    nl_train_layout L;
    nl_pipe_layout(p, &L);
    return nl_train_layout_step(&L, d, step, lr, p->o.train.grad_clip, loss_out, norm_out);
}
