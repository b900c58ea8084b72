/* NanoLM-MoE: router, top-k, capacity, aux loss, dispatch/combine (see nanolm/moe.h). */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "nanolm/moe.h"
#include "model_internal.h"

/* out (n, o) = in (n, i) . w (o, i)^T, ld = row strides */
static void gemm_nt(int64_t n, int64_t o, int64_t i, const float *in, int64_t ldi, const float *w, int64_t ldw,
                    float *out, int64_t ldo) {
    if (n <= 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)o, (int)i, 1.0f, in, (int)ldi, w, (int)ldw, 0.0f,
                out, (int)ldo);
}
/* din (n, i) (= or +=) dout (n, o) . w (o, i) */
static void gemm_nn(int64_t n, int64_t i, int64_t o, const float *dout, int64_t ldd, const float *w, int64_t ldw,
                    float *din, int64_t ldi, float beta) {
    if (n <= 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)i, (int)o, 1.0f, dout, (int)ldd, w, (int)ldw,
                beta, din, (int)ldi);
}
/* dw (o, i) += dout (n, o)^T . in (n, i) */
static void gemm_tn(int64_t o, int64_t i, int64_t n, const float *dout, int64_t ldd, const float *in, int64_t ldi,
                    float *dw, int64_t ldw) {
    if (n <= 0) return;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)o, (int)i, (int)n, 1.0f, dout, (int)ldd, in, (int)ldi,
                1.0f, dw, (int)ldw);
}

int nl_moe_is_layer(const nl_model *m, int64_t l) { return m->moe && l >= m->moe->first && l < m->L; }

void nl_moe_expert_range(const nl_model *m, int64_t l, size_t *begin, size_t *end) {
    *begin = *end = 0;
    if (!nl_moe_is_layer(m, l) || !m->w.layers[l].experts) return;
    *begin = (size_t)(m->w.layers[l].experts - m->params);
    *end = *begin + (size_t)(m->moe->E_local * 3 * m->moe->F * m->C);
}

static const nl_arch moe_presets[] = {
    /* The course's MoE example (week 14: 64 routed + 2 shared SwiGLU experts, top-6, D = 2048,
     * expert F = 1024, 24 layers) scaled down: D = 64, F = 32 (F = D/2 as there), 2 layers,
     * byte vocabulary. */
    {.name = "moe-course-tiny",
     .vocab_size = 256,
     .dim = 64,
     .n_layers = 2,
     .n_heads = 4,
     .n_kv_heads = 4,
     .hidden_dim = 0,
     .seq_len = 64,
     .rope_theta = 10000.0,
     .norm_eps = 1e-5,
     .tied_embeddings = 0,
     .n_experts = 64,
     .n_shared_experts = 2,
     .top_k = 6,
     .expert_hidden_dim = 32,
     .first_moe_layer = 0},
};

nl_status nl_moe_preset(const char *name, nl_arch *out) {
    for (size_t i = 0; i < sizeof moe_presets / sizeof moe_presets[0]; i++)
        if (!strcmp(moe_presets[i].name, name)) {
            *out = moe_presets[i];
            return NL_OK;
        }
    return nl_fail(NL_ERR_INVALID, "unknown MoE preset '%s' (known: moe-course-tiny)", name);
}

void nl_moe_free(nl_model *m) {
    if (!m->moe) return;
    nl_free(m->moe->mem);
    nl_free(m->moe->layers);
    nl_free(m->moe->tokens);
    nl_free(m->moe->s_cnt);
    nl_free(m->moe);
    m->moe = NULL;
}

nl_status nl_moe_alloc_acts(nl_model *m, int64_t B, int64_t T) {
    nl_moe *e = m->moe;
    int64_t BT = B * T, C = m->C, E = e->E, K = e->K, F = e->F, SF = e->S * e->F;
    e->rmax = BT * K * e->ep;
    /* scratch rows wide enough for C, 2F, the shared experts' (BT, 2SF) and dz (BT, E) */
    int64_t w = C > 2 * F ? C : 2 * F;
    if (2 * SF > w * K) w = (2 * SF + K - 1) / K;
    if (E > w * K) w = (E + K - 1) / K;
    size_t per = 0;
#define A(n) per += ((size_t)(n) + 15) & ~(size_t)15
    A(BT * E);
    A(BT * K);
    A(BT * K);
    A(BT * K);
    A(BT * K * C);
    A(e->rmax * C);
    A(e->rmax * 2 * F);
    A(e->rmax * F);
    A(BT * 2 * SF);
    A(BT * SF);
    size_t shared = 0;
    shared += 4 * (((size_t)(e->rmax * w) + 15) & ~(size_t)15);
    shared += ((size_t)(BT * K) + 15) & ~(size_t)15;
#undef A
    e->layers = nl_calloc((size_t)e->n_moe_layers, sizeof *e->layers, "MoE layer activations");
    e->tokens = nl_calloc((size_t)(e->n_moe_layers * E), sizeof(int64_t), "MoE token counts");
    /* per layer: send_cnt (E) + recv_cnt (ep * E_local) = 2E; plus scratch 4E + 2 ep */
    e->s_cnt = nl_calloc((size_t)(e->n_moe_layers * 2 * E + 4 * E + 2 * e->ep), sizeof(int64_t), "MoE counts");
    e->mem_floats = per * (size_t)e->n_moe_layers + shared;
    e->mem = nl_malloc(e->mem_floats * sizeof(float), "MoE activations");
    if (!e->layers || !e->tokens || !e->s_cnt || !e->mem) return NL_ERR_NOMEM;
    float *p = e->mem;
#define TAKE(ptr, type, n)                                                                                             \
    do {                                                                                                               \
        ptr = (type *)p;                                                                                               \
        p += ((size_t)(n) + 15) & ~(size_t)15;                                                                         \
    } while (0)
    for (int64_t j = 0; j < e->n_moe_layers; j++) {
        nl_moe_layer *la = &e->layers[j];
        TAKE(la->probs, float, BT *E);
        TAKE(la->gates, float, BT *K);
        TAKE(la->sel, int32_t, BT * K);
        TAKE(la->slot, int32_t, BT * K);
        TAKE(la->ysend, float, BT *K *C);
        TAKE(la->xrecv, float, e->rmax *C);
        TAKE(la->h13, float, e->rmax * 2 * F);
        TAKE(la->hact, float, e->rmax *F);
        TAKE(la->h13s, float, BT * 2 * SF);
        TAKE(la->hacts, float, BT *SF);
        la->send_cnt = e->s_cnt + j * 2 * E;
        la->recv_cnt = la->send_cnt + E;
    }
    TAKE(e->s_send, float, e->rmax *w);
    TAKE(e->s_recv, float, e->rmax *w);
    TAKE(e->s_a, float, e->rmax *w);
    TAKE(e->s_b, float, e->rmax *w);
    TAKE(e->s_dg, float, BT *K);
#undef TAKE
    return NL_OK;
}

/* ---- exchange ---------------------------------------------------------------------------------
 * send order: rows sorted by global expert (n_send rows, send_cnt[E]); expert-major order on the
 * expert side: local expert j, then source rank s (recv_cnt[s * E_local + j] rows each). */

/* rows per destination rank of the send order, and per source rank of the receive */
static void rank_rows(const nl_moe *e, const nl_moe_layer *la, int64_t *to, int64_t *from) {
    for (int r = 0; r < e->ep; r++) {
        to[r] = from[r] = 0;
        for (int64_t j = 0; j < e->E_local; j++) {
            to[r] += la->send_cnt[r * e->E_local + j];
            from[r] += la->recv_cnt[r * e->E_local + j];
        }
    }
}

/* source-major (s, j) <-> expert-major (j, s) row permutation; dir 0: source -> expert */
static void permute(const nl_moe *e, const nl_moe_layer *la, const float *src, float *dst, int64_t width, int dir) {
    int64_t pos_em = 0;
    for (int64_t j = 0; j < e->E_local; j++)
        for (int s = 0; s < e->ep; s++) {
            int64_t pos_sm = 0;
            for (int s2 = 0; s2 < s; s2++)
                for (int64_t j2 = 0; j2 < e->E_local; j2++) pos_sm += la->recv_cnt[s2 * e->E_local + j2];
            for (int64_t j2 = 0; j2 < j; j2++) pos_sm += la->recv_cnt[s * e->E_local + j2];
            int64_t n = la->recv_cnt[s * e->E_local + j];
            if (dir == 0)
                memcpy(dst + pos_em * width, src + pos_sm * width, (size_t)(n * width) * sizeof(float));
            else
                memcpy(dst + pos_sm * width, src + pos_em * width, (size_t)(n * width) * sizeof(float));
            pos_em += n;
        }
}

/* send-order rows -> expert-major rows on the expert side */
static nl_status to_experts(nl_model *m, nl_moe_layer *la, const float *send, float *dst, int64_t width) {
    nl_moe *e = m->moe;
    if (e->ep == 1) {
        memcpy(dst, send, (size_t)(la->n_send * width) * sizeof(float));
        e->rows_self += la->n_send;
        e->rows_dispatched += la->n_send;
        return NL_OK;
    }
    int64_t *to = e->s_cnt + e->n_moe_layers * 2 * e->E + 4 * e->E, *from = to + e->ep;
    rank_rows(e, la, to, from);
    NL_TRY(e->ops->rows(e->ops->user, send, to, e->s_recv, from, width));
    e->rows_dispatched += la->n_send;
    for (int r = 0; r < e->ep; r++) {
        if (r == e->ep_rank)
            e->rows_self += to[r];
        else
            e->rows_sent += to[r];
    }
    permute(e, la, e->s_recv, dst, width, 0);
    return NL_OK;
}

/* expert-major rows -> send-order rows back on the source side */
static nl_status from_experts(nl_model *m, nl_moe_layer *la, const float *src, float *send, int64_t width) {
    nl_moe *e = m->moe;
    if (e->ep == 1) {
        memcpy(send, src, (size_t)(la->n_send * width) * sizeof(float));
        e->rows_self += la->n_send;
        e->rows_returned += la->n_send;
        return NL_OK;
    }
    int64_t *to = e->s_cnt + e->n_moe_layers * 2 * e->E + 4 * e->E, *from = to + e->ep;
    rank_rows(e, la, to, from);
    permute(e, la, src, e->s_recv, width, 1);
    NL_TRY(e->ops->rows(e->ops->user, e->s_recv, from, send, to, width));
    e->rows_returned += la->n_send;
    for (int r = 0; r < e->ep; r++) {
        if (r == e->ep_rank)
            e->rows_self += from[r];
        else
            e->rows_sent += from[r];
    }
    return NL_OK;
}

/* ---- forward ---------------------------------------------------------------------------------- */

static void swiglu_fwd(float *out, const float *h13, int64_t n, int64_t F) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < F; k++) {
            float g = h13[i * 2 * F + k], u = h13[i * 2 * F + F + k];
            out[i * F + k] = g / (1.0f + expf(-g)) * u;
        }
}

static void swiglu_bwd(float *dh13, const float *dout, const float *h13, int64_t n, int64_t F) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < F; k++) {
            float g = h13[i * 2 * F + k], u = h13[i * 2 * F + F + k], d = dout[i * F + k];
            float sg = 1.0f / (1.0f + expf(-g)), silu = g * sg;
            dh13[i * 2 * F + k] = d * u * sg * (1.0f + g * (1.0f - sg));
            dh13[i * 2 * F + F + k] = d * silu;
        }
}

nl_status nl_moe_forward(nl_model *m, int64_t l, const float *x, float *out, int64_t B, int64_t T) {
    nl_moe *e = m->moe;
    nl_moe_layer *la = &e->layers[l - e->first];
    const nl_layer_weights *lw = &m->w.layers[l];
    int64_t BT = B * T, C = m->C, E = e->E, K = e->K, F = e->F, SF = e->S * e->F;
    /* router: probs (BT, E) = softmax(x Wr^T) */
    gemm_nt(BT, E, C, x, C, lw->router, C, la->probs, E);
    for (int64_t i = 0; i < BT; i++) {
        float *p = la->probs + i * E, mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < E; j++) mx = p[j] > mx ? p[j] : mx;
        for (int64_t j = 0; j < E; j++) sum += (p[j] = expf(p[j] - mx));
        for (int64_t j = 0; j < E; j++) p[j] /= sum;
        /* top-k (ties: lower index), renormalised gates */
        float gs = 0;
        for (int64_t k = 0; k < K; k++) {
            int32_t best = -1;
            for (int64_t j = 0; j < E; j++) {
                int taken = 0;
                for (int64_t q = 0; q < k; q++) taken |= la->sel[i * K + q] == j;
                if (!taken && (best < 0 || p[j] > p[best])) best = (int32_t)j;
            }
            la->sel[i * K + k] = best;
            gs += p[best];
        }
        for (int64_t k = 0; k < K; k++) la->gates[i * K + k] = p[la->sel[i * K + k]] / gs;
    }
    /* per sequence: counts, capacity, aux loss */
    int64_t *tok = e->tokens + (l - e->first) * E, *cnt = e->s_cnt + e->n_moe_layers * 2 * E;
    memset(tok, 0, (size_t)E * sizeof(int64_t));
    memset(la->send_cnt, 0, (size_t)E * sizeof(int64_t));
    int64_t cap = e->capacity_factor > 0 ? (int64_t)ceil((double)e->capacity_factor * (double)(T * K) / (double)E) : -1;
    double aux = 0;
    for (int64_t b = 0; b < B; b++) {
        memset(cnt, 0, (size_t)E * sizeof(int64_t));
        for (int64_t t = 0; t < T; t++)
            for (int64_t k = 0; k < K; k++) {
                int64_t i = b * T + t, x_ = la->sel[i * K + k];
                int keep = cap < 0 || cnt[x_] < cap;
                cnt[x_]++;
                la->slot[i * K + k] = keep ? 0 : -1;
                if (keep)
                    la->send_cnt[x_]++;
                else
                    e->dropped++;
            }
        double s = 0;
        for (int64_t j = 0; j < E; j++) {
            double P = 0;
            for (int64_t t = 0; t < T; t++) P += la->probs[(b * T + t) * E + j];
            s += (double)cnt[j] / (double)(T * K) * (P / (double)T);
            tok[j] += cnt[j];
        }
        aux += (double)e->aux_coef * (double)E * s;
    }
    e->aux_loss += aux / (double)B;
    e->slots += BT * K;
    /* send order: stable counting sort of kept slots by expert */
    int64_t *pos = cnt, acc = 0;
    for (int64_t j = 0; j < E; j++) {
        pos[j] = acc;
        acc += la->send_cnt[j];
    }
    la->n_send = acc;
    for (int64_t i = 0; i < BT * K; i++)
        if (la->slot[i] >= 0) {
            int64_t r = pos[la->sel[i]]++;
            la->slot[i] = (int32_t)r;
            memcpy(e->s_send + r * C, x + (i / K) * C, (size_t)C * sizeof(float));
        }
    /* counts to the expert owners */
    if (e->ep == 1)
        memcpy(la->recv_cnt, la->send_cnt, (size_t)E * sizeof(int64_t));
    else
        NL_TRY(e->ops->counts(e->ops->user, la->send_cnt, la->recv_cnt, e->E_local));
    la->n_recv = 0;
    for (int64_t q = 0; q < e->ep * e->E_local; q++) la->n_recv += la->recv_cnt[q];
    NL_TRY(to_experts(m, la, e->s_send, la->xrecv, C));
    /* the local experts on their rows (expert-major) */
    int64_t row = 0;
    for (int64_t j = 0; j < e->E_local; j++) {
        int64_t n = 0;
        for (int s = 0; s < e->ep; s++) n += la->recv_cnt[s * e->E_local + j];
        const float *w = lw->experts + j * 3 * F * C;
        gemm_nt(n, 2 * F, C, la->xrecv + row * C, C, w, C, la->h13 + row * 2 * F, 2 * F);
        swiglu_fwd(la->hact + row * F, la->h13 + row * 2 * F, n, F);
        gemm_nt(n, C, F, la->hact + row * F, F, w + 2 * F * C, F, e->s_a + row * C, C);
        row += n;
    }
    NL_TRY(from_experts(m, la, e->s_a, la->ysend, C));
    /* shared experts, then the gated combine */
    if (SF > 0) {
        gemm_nt(BT, 2 * SF, C, x, C, lw->sw1, C, la->h13s, 2 * SF);
        swiglu_fwd(la->hacts, la->h13s, BT, SF);
        gemm_nt(BT, C, SF, la->hacts, SF, lw->sw2, SF, out, C);
    } else {
        memset(out, 0, (size_t)(BT * C) * sizeof(float));
    }
    for (int64_t i = 0; i < BT; i++)
        for (int64_t k = 0; k < K; k++) {
            int32_t r = la->slot[i * K + k];
            if (r < 0) continue;
            float g = la->gates[i * K + k];
            const float *y = la->ysend + (int64_t)r * C;
            for (int64_t c = 0; c < C; c++) out[i * C + c] += g * y[c];
        }
    return NL_OK;
}

/* ---- backward --------------------------------------------------------------------------------- */

nl_status nl_moe_backward(nl_model *m, int64_t l, const float *x, const float *dout, float *dx, int64_t B, int64_t T) {
    nl_moe *e = m->moe;
    nl_moe_layer *la = &e->layers[l - e->first];
    const nl_layer_weights *lw = &m->w.layers[l];
    int64_t BT = B * T, C = m->C, E = e->E, K = e->K, F = e->F, SF = e->S * e->F;
    float *G = m->train->grads;
#define GRAD(ptr) (G + ((ptr)-m->params))
    /* shared experts */
    if (SF > 0) {
        float *dhacts = e->s_a, *dh13s = e->s_b; /* (BT, SF), (BT, 2SF) fit: rmax >= BT */
        gemm_nn(BT, SF, C, dout, C, lw->sw2, SF, dhacts, SF, 0.0f);
        gemm_tn(C, SF, BT, dout, C, la->hacts, SF, GRAD(lw->sw2), SF);
        swiglu_bwd(dh13s, dhacts, la->h13s, BT, SF);
        gemm_nn(BT, C, 2 * SF, dh13s, 2 * SF, lw->sw1, C, dx, C, 0.0f);
        gemm_tn(2 * SF, C, BT, dh13s, 2 * SF, x, C, GRAD(lw->sw1), C);
    } else {
        memset(dx, 0, (size_t)(BT * C) * sizeof(float));
    }
    /* gate gradients and the routed outputs' gradients (send order) */
    float *dg = e->s_dg, *dysend = e->s_send;
    for (int64_t i = 0; i < BT; i++)
        for (int64_t k = 0; k < K; k++) {
            int32_t r = la->slot[i * K + k];
            dg[i * K + k] = 0;
            if (r < 0) continue;
            const float *y = la->ysend + (int64_t)r * C, *d = dout + i * C;
            float g = la->gates[i * K + k], s = 0;
            for (int64_t c = 0; c < C; c++) {
                s += d[c] * y[c];
                dysend[(int64_t)r * C + c] = g * d[c];
            }
            dg[i * K + k] = s;
        }
    float *dy = e->s_a, *dxr = e->s_b;
    NL_TRY(to_experts(m, la, dysend, dy, C));
    int64_t row = 0;
    float *dhact = e->s_recv, *dh13 = e->s_send; /* s_send is free again after to_experts */
    for (int64_t j = 0; j < e->E_local; j++) {
        int64_t n = 0;
        for (int s = 0; s < e->ep; s++) n += la->recv_cnt[s * e->E_local + j];
        const float *w = lw->experts + j * 3 * F * C;
        float *gw = GRAD(lw->experts) + j * 3 * F * C;
        gemm_nn(n, F, C, dy + row * C, C, w + 2 * F * C, F, dhact, F, 0.0f);
        gemm_tn(C, F, n, dy + row * C, C, la->hact + row * F, F, gw + 2 * F * C, F);
        swiglu_bwd(dh13, dhact, la->h13 + row * 2 * F, n, F);
        gemm_nn(n, C, 2 * F, dh13, 2 * F, w, C, dxr + row * C, C, 0.0f);
        gemm_tn(2 * F, C, n, dh13, 2 * F, la->xrecv + row * C, C, gw, C);
        row += n;
    }
    float *dxsend = e->s_a; /* dy is consumed */
    NL_TRY(from_experts(m, la, dxr, dxsend, C));
    for (int64_t i = 0; i < BT; i++)
        for (int64_t k = 0; k < K; k++) {
            int32_t r = la->slot[i * K + k];
            if (r < 0) continue;
            for (int64_t c = 0; c < C; c++) dx[i * C + c] += dxsend[(int64_t)r * C + c];
        }
    /* router: d probs from the gates (renormalised over the selection) and the aux loss, then
     * softmax backward; dz (BT, E) in s_b */
    float *dz = e->s_b;
    int64_t *cnt = e->s_cnt + e->n_moe_layers * 2 * E;
    for (int64_t b = 0; b < B; b++) {
        memset(cnt, 0, (size_t)E * sizeof(int64_t));
        for (int64_t t = 0; t < T; t++)
            for (int64_t k = 0; k < K; k++) cnt[la->sel[(b * T + t) * K + k]]++;
        for (int64_t t = 0; t < T; t++) {
            int64_t i = b * T + t;
            const float *p = la->probs + i * E;
            float *d = dz + i * E;
            /* aux = coef*E/B * sum_b sum_e f_e * mean_t p: d/dp_e = coef*E*f_e/(T*B) */
            for (int64_t j = 0; j < E; j++)
                d[j] = e->aux_coef * (float)E * ((float)cnt[j] / (float)(T * K)) / (float)(T * B);
            float gs = 0, dot = 0;
            for (int64_t k = 0; k < K; k++) {
                gs += p[la->sel[i * K + k]];
                dot += dg[i * K + k] * la->gates[i * K + k];
            }
            for (int64_t k = 0; k < K; k++) d[la->sel[i * K + k]] += (dg[i * K + k] - dot) / gs;
            float sd = 0;
            for (int64_t j = 0; j < E; j++) sd += p[j] * d[j];
            for (int64_t j = 0; j < E; j++) d[j] = p[j] * (d[j] - sd);
        }
    }
    gemm_tn(E, C, BT, dz, E, x, C, GRAD(lw->router), C);
    gemm_nn(BT, C, E, dz, E, lw->router, C, dx, C, 1.0f);
#undef GRAD
    return NL_OK;
}
