/*
 * NanoLM: parameter layout, activations, forward, backward (see include/nanolm/model.h).
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <omp.h>
#include <string.h>

#include "nanolm/model.h"
#include "nanolm/moe.h"
#include "blas_serial.h"
#include "model_internal.h"
#include "numerics/vexp.h"
#include "numerics/vexp_simd.h"

#include "nanolm/formats.h"
#include "nanolm/step_prof.h"

/* ---- parameter table ------------------------------------------------------------------------ */

static void add_tensor(nl_model *m, size_t *off, nl_param_kind kind, int layer, const char *name, int64_t d0,
                       int64_t d1) {
    nl_param_info *p = &m->table[m->n_tensors++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->kind = kind;
    p->layer = layer;
    p->ndim = d1 > 0 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1 > 0 ? d1 : 0;
    p->offset = *off;
    p->numel = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1);
    p->expert = -1;
    *off += p->numel;
}

/* Fills m->table and the counts; pointers are set later by point_weights. */
static void build_table(nl_model *m) {
    size_t off = 0;
    char nm[80];
    m->n_tensors = 0;
    if (!m->no_embed) add_tensor(m, &off, NL_PARAM_EMBED, -1, "model.embed_tokens.weight", m->V, m->C);
    for (int l = 0; l < m->L; l++) {
        m->layer_offsets[l] = off;
#define T(kind, suffix, d0, d1)                                                                                        \
    snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix);                                                          \
    add_tensor(m, &off, kind, l, nm, d0, d1)
        T(NL_PARAM_RMS_ATT, "input_layernorm.weight", m->C, 0);
        T(NL_PARAM_WQ, "self_attn.q_proj.weight", m->NH * m->hd, m->C);
        T(NL_PARAM_WK, "self_attn.k_proj.weight", m->KVH * m->hd, m->C);
        T(NL_PARAM_WV, "self_attn.v_proj.weight", m->KVH * m->hd, m->C);
        if (m->arch.qkv_bias) {
            T(NL_PARAM_BQ, "self_attn.q_proj.bias", m->NH * m->hd, 0);
            T(NL_PARAM_BK, "self_attn.k_proj.bias", m->KVH * m->hd, 0);
            T(NL_PARAM_BV, "self_attn.v_proj.bias", m->KVH * m->hd, 0);
        }
        T(NL_PARAM_WO, "self_attn.o_proj.weight", m->C, m->NH * m->hd);
        T(NL_PARAM_RMS_FFN, "post_attention_layernorm.weight", m->C, 0);
        if (nl_moe_is_layer(m, l)) {
            const nl_moe *e = m->moe;
            T(NL_PARAM_ROUTER, "mlp.gate.weight", e->E, m->C);
            if (e->S > 0) {
                T(NL_PARAM_SHARED_W1, "mlp.shared_experts.gate_proj.weight", e->S * e->F, m->C);
                T(NL_PARAM_SHARED_W3, "mlp.shared_experts.up_proj.weight", e->S * e->F, m->C);
                T(NL_PARAM_SHARED_W2, "mlp.shared_experts.down_proj.weight", m->C, e->S * e->F);
            }
            for (int64_t j = 0; j < e->E_local; j++) {
                int x = (int)(e->e0 + j);
                static const char *const part[3] = {"gate_proj", "up_proj", "down_proj"};
                static const nl_param_kind kinds[3] = {NL_PARAM_EXPERT_W1, NL_PARAM_EXPERT_W3, NL_PARAM_EXPERT_W2};
                for (int q = 0; q < 3; q++) {
                    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.%s.weight", l, x, part[q]);
                    add_tensor(m, &off, kinds[q], l, nm, q < 2 ? e->F : m->C, q < 2 ? m->C : e->F);
                    m->table[m->n_tensors - 1].expert = x;
                }
            }
            continue;
        }
        T(NL_PARAM_W1, "mlp.gate_proj.weight", m->H, m->C);
        T(NL_PARAM_W3, "mlp.up_proj.weight", m->H, m->C);
        T(NL_PARAM_W2, "mlp.down_proj.weight", m->C, m->H);
#undef T
    }
    m->layer_offsets[m->L] = off;
    if (m->no_tail) {
        m->n_params = off;
        return;
    }
    add_tensor(m, &off, NL_PARAM_RMS_FINAL, -1, "model.norm.weight", m->C, 0);
    if (!m->arch.tied_embeddings) add_tensor(m, &off, NL_PARAM_CLS, -1, "lm_head.weight", m->V, m->C);
    m->n_params = off;
}

static void point_weights(nl_model *m) {
    float *P = m->params;
    int i = 0;
    m->w.embed = m->no_embed ? NULL : P + m->table[i++].offset;
    for (int l = 0; l < m->L; l++) {
        nl_layer_weights *lw = &m->w.layers[l];
        lw->rms_att = P + m->table[i++].offset;
        lw->wq = P + m->table[i++].offset;
        lw->wk = P + m->table[i++].offset;
        lw->wv = P + m->table[i++].offset;
        if (m->arch.qkv_bias) {
            lw->bqkv = P + m->table[i].offset;
            i += 3;
        }
        lw->wo = P + m->table[i++].offset;
        lw->rms_ffn = P + m->table[i++].offset;
        if (nl_moe_is_layer(m, l)) {
            lw->router = P + m->table[i++].offset;
            if (m->moe->S > 0) {
                lw->sw1 = P + m->table[i].offset;
                lw->sw2 = P + m->table[i + 2].offset;
                i += 3;
            }
            lw->experts = m->moe->E_local > 0 ? P + m->table[i].offset : NULL;
            i += (int)(3 * m->moe->E_local);
            continue;
        }
        lw->w1 = P + m->table[i++].offset;
        lw->w3 = P + m->table[i++].offset;
        lw->w2 = P + m->table[i++].offset;
    }
    if (m->no_tail) return;
    m->w.rms_final = P + m->table[i++].offset;
    m->w.cls = m->arch.tied_embeddings ? m->w.embed : P + m->table[i++].offset;
}

static nl_status model_init(nl_model *m, const nl_arch *arch, int ep, int ep_rank, int with_embed, int with_tail);

nl_status nl_model_init(nl_model *m, const nl_arch *arch) { return model_init(m, arch, 1, 0, 1, 1); }

nl_status nl_model_init_ep(nl_model *m, const nl_arch *arch, int ep, int ep_rank) {
    return model_init(m, arch, ep, ep_rank, 1, 1);
}

nl_status nl_model_init_part(nl_model *m, const nl_arch *arch, int with_embed, int with_tail) {
    return model_init(m, arch, 1, 0, with_embed, with_tail);
}

static nl_status model_init(nl_model *m, const nl_arch *arch, int ep, int ep_rank, int with_embed, int with_tail) {
    memset(m, 0, sizeof *m);
    m->no_embed = !with_embed;
    m->no_tail = !with_tail;
    NL_TRY(nl_arch_validate(arch));
    if (ep < 1 || ep_rank < 0 || ep_rank >= ep)
        return nl_fail(NL_ERR_INVALID, "expert parallelism: rank %d of %d is not valid", ep_rank, ep);
    if (arch->n_experts > 0) {
        if (arch->n_experts % ep)
            return nl_fail(NL_ERR_INVALID, "arch %s: expert-parallel degree %d does not divide n_experts %lld",
                           arch->name, ep, (long long)arch->n_experts);
        if (arch->first_moe_layer < 0 || arch->first_moe_layer >= arch->n_layers)
            return nl_fail(NL_ERR_INVALID, "arch %s: first_moe_layer %lld outside [0, %lld)", arch->name,
                           (long long)arch->first_moe_layer, (long long)arch->n_layers);
        nl_moe *e = m->moe = nl_calloc(1, sizeof *m->moe, "MoE state");
        if (!e) return NL_ERR_NOMEM;
        e->E = arch->n_experts;
        e->K = arch->top_k;
        e->S = arch->n_shared_experts;
        e->F = arch->expert_hidden_dim;
        e->first = arch->first_moe_layer;
        e->n_moe_layers = arch->n_layers - arch->first_moe_layer;
        e->ep = ep;
        e->ep_rank = ep_rank;
        e->E_local = e->E / ep;
        e->e0 = e->E_local * ep_rank;
        e->aux_coef = 0.01f;
    } else if (ep > 1) {
        return nl_fail(NL_ERR_INVALID, "arch %s: expert-parallel degree %d needs a mixture-of-experts model",
                       arch->name, ep);
    }
    if (!(arch->norm_eps > 0) || !isfinite(arch->norm_eps) || !(arch->rope_theta > 0) || !isfinite(arch->rope_theta))
        return nl_fail(NL_ERR_INVALID, "arch %s: norm_eps %g and rope_theta %g must be finite and positive", arch->name,
                       arch->norm_eps, arch->rope_theta);
    m->arch = *arch;
    m->C = arch->dim;
    m->L = arch->n_layers;
    m->NH = arch->n_heads;
    m->KVH = arch->n_kv_heads;
    m->hd = nl_arch_head_dim(arch);
    m->H = arch->hidden_dim;
    m->V = arch->vocab_size;
    m->QKV = (m->NH + 2 * m->KVH) * m->hd;
    m->precision = NL_PREC_FP32;
    size_t n_tab = (size_t)((m->arch.qkv_bias ? 12 : 9) * m->L + 3);
    if (m->moe) n_tab += (size_t)(m->L * (4 + 3 * m->moe->E_local));
    m->table = nl_calloc(n_tab, sizeof(nl_param_info), "parameter table");
    m->layer_offsets = nl_calloc((size_t)m->L + 1, sizeof(size_t), "layer offsets");
    m->w.layers = nl_calloc((size_t)m->L, sizeof(nl_layer_weights), "layer pointers");
    if (!m->table || !m->layer_offsets || !m->w.layers) {
        nl_model_free(m);
        return NL_ERR_NOMEM;
    }
    build_table(m);
    m->params = nl_calloc(m->n_params, sizeof(float), "parameters");
    /* RoPE tables (seq_len, hd/2), computed in double */
    int64_t half = m->hd / 2, S = arch->seq_len;
    m->rope_cos = nl_malloc((size_t)(S * half) * sizeof(float), "rope cos");
    m->rope_sin = nl_malloc((size_t)(S * half) * sizeof(float), "rope sin");
    if (!m->params || !m->rope_cos || !m->rope_sin) {
        nl_model_free(m);
        return NL_ERR_NOMEM;
    }
    for (int64_t t = 0; t < S; t++)
        for (int64_t i = 0; i < half; i++) {
            double freq = nl_arch_rope_inv_freq(arch, i);
            m->rope_cos[t * half + i] = (float)cos((double)t * freq);
            m->rope_sin[t * half + i] = (float)sin((double)t * freq);
        }
    point_weights(m);
    return NL_OK;
}

void nl_model_free(nl_model *m) {
    nl_moe_free(m);
    nl_free(m->params);
    if (m->train) {
        nl_free(m->train->grads);
        nl_free(m->train->params_lp);
        nl_free(m->train->acts_mem);
        nl_free(m->train->lp_mem);
        nl_free(m->train);
    }
    nl_free(m->rope_cos);
    nl_free(m->rope_sin);
    nl_free(m->table);
    nl_free(m->layer_offsets);
    nl_free(m->w.layers);
    memset(m, 0, sizeof *m);
}

void nl_model_init_random(nl_model *m, uint64_t seed) {
    nl_rng rng, erng;
    nl_rng_seed(&rng, seed);
    float resid_std = 0.02f / sqrtf(2.0f * (float)m->L);
    for (int i = 0; i < m->n_tensors; i++) {
        const nl_param_info *p = &m->table[i];
        float *x = m->params + p->offset;
        if (p->ndim == 1) {
            float v = p->kind == NL_PARAM_BQ || p->kind == NL_PARAM_BK || p->kind == NL_PARAM_BV ? 0.0f : 1.0f;
            for (size_t j = 0; j < p->numel; j++) x[j] = v;
            continue;
        }
        float std = (p->kind == NL_PARAM_WO || p->kind == NL_PARAM_W2 || p->kind == NL_PARAM_SHARED_W2 ||
                     p->kind == NL_PARAM_EXPERT_W2)
                        ? resid_std
                        : 0.02f;
        /* a routed expert draws from its own stream (seed, layer, expert), so a rank that holds
         * only some experts (expert parallelism) gets the same values as one process */
        nl_rng *r = &rng;
        if (p->expert >= 0) {
            if (p->kind == NL_PARAM_EXPERT_W1)
                nl_rng_seed(&erng, seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(1 + p->layer * 65536 + p->expert)));
            r = &erng;
        }
        for (size_t j = 0; j < p->numel; j++) x[j] = (float)(nl_rng_normal(r) * std);
    }
}

/* m->train, created on first use (the loss scale 1). */
static nl_train_state *train_state(nl_model *m) {
    if (!m->train) {
        m->train = nl_calloc(1, sizeof *m->train, "training state");
        if (m->train) m->train->loss_scale = 1.0f;
    }
    return m->train;
}

nl_status nl_model_alloc_grads(nl_model *m) {
    nl_train_state *ts = train_state(m);
    if (!ts) return NL_ERR_NOMEM;
    if (ts->grads) return NL_OK;
    ts->grads = nl_calloc(m->n_params, sizeof(float), "gradients");
    return ts->grads ? NL_OK : NL_ERR_NOMEM;
}

void nl_model_zero_grad(nl_model *m) {
    if (!m->train || !m->train->grads) return;
    float *grads = m->train->grads;
    const size_t chunk = 1 << 16; /* floats */
    int64_t nchunks = (int64_t)((m->n_params + chunk - 1) / chunk);
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (int64_t c = 0; c < nchunks; c++) {
        size_t lo = (size_t)c * chunk, n = m->n_params - lo < chunk ? m->n_params - lo : chunk;
        memset(grads + lo, 0, n * sizeof(float));
    }
}

int nl_model_params_table(const nl_model *m, const nl_param_info **out) {
    *out = m->table;
    return m->n_tensors;
}

const nl_param_info *nl_model_find_param(const nl_model *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->table[i].name, name)) return &m->table[i];
    return NULL;
}

size_t nl_model_param_bytes(const nl_model *m) { return m->n_params * sizeof(float); }
size_t nl_model_act_bytes(const nl_model *m) {
    size_t own = m->train ? m->train->acts_floats + m->train->lp_floats : 0;
    return (own + (m->moe ? m->moe->mem_floats : 0)) * sizeof(float);
}
size_t nl_model_lp_weight_bytes(const nl_model *m) {
    return m->train && m->train->params_lp ? m->n_params * sizeof(float) : 0;
}

/* Allocates the bf16/fp16 matmul scratch once both the precision and the batch are known. */
static nl_status ensure_lp_scratch(nl_model *m) {
    nl_train_state *ts = m->train;
    if (m->precision == NL_PREC_FP32 || !ts || !ts->acts_mem || ts->lp_mem) return NL_OK;
    size_t n = (size_t)(ts->B * ts->T * ts->maxdim);
    ts->lp_mem = nl_malloc(2 * n * sizeof(float), "low-precision matmul scratch");
    if (!ts->lp_mem) return NL_ERR_NOMEM;
    ts->lp_floats = 2 * n;
    ts->a.lp_scratch = ts->lp_mem;
    ts->a.lp_scratch2 = ts->lp_mem + n;
    return NL_OK;
}

nl_status nl_model_alloc_acts(nl_model *m, int64_t B, int64_t T) {
    if (B <= 0 || T <= 0)
        return nl_fail(NL_ERR_INVALID, "activations: batch %lld x %lld must be positive", (long long)B, (long long)T);
    if (T > m->arch.seq_len)
        return nl_fail(NL_ERR_INVALID, "sequence length %lld exceeds the model's seq_len %lld", (long long)T,
                       (long long)m->arch.seq_len);
    if (m->train && m->train->acts_mem)
        return nl_fail(NL_ERR_INVALID, "activations already allocated for (%lld, %lld)", (long long)m->train->B,
                       (long long)m->train->T);
    int64_t L = m->L, C = m->C, NH = m->NH, H = m->H, V = m->V, QKV = m->QKV;
    int64_t maxdim = C;
    if (QKV > maxdim) maxdim = QKV;
    if (2 * H > maxdim) maxdim = 2 * H;
    if (V > maxdim) maxdim = V;
    if (NH * m->hd > maxdim) maxdim = NH * m->hd;
    /* every part below is at most (L + 1) x B x T x max(maxdim, NH x T) floats: check in double
     * before multiplying in int64 */
    double width = (double)maxdim > (double)NH * (double)T ? (double)maxdim : (double)NH * (double)T;
    if ((double)(L + 1) * (double)B * (double)T * width * 32 >= 0x1p62)
        return nl_fail(NL_ERR_INVALID, "activations of batch %lld x %lld for this model: the size overflows",
                       (long long)B, (long long)T);
    nl_train_state *ts = train_state(m);
    if (!ts) return NL_ERR_NOMEM;
    nl_acts *a = &ts->a;
    int64_t BT = B * T;
    struct {
        float **p;
        int64_t n;
    } parts[] = {
        {&a->resid, (L + 1) * BT * C},
        {&a->ln1, L * BT * C},
        {&a->ln1_rstd, L * BT},
        {&a->qkv, L * BT * QKV},
        {&a->att, m->attn_ops ? 0 : L * B * NH * T * T},
        {&a->atty, L * BT * NH * m->hd},
        {&a->resid2, L * BT * C},
        {&a->ln2, L * BT * C},
        {&a->ln2_rstd, L * BT},
        {&a->h13, L * BT * 2 * H},
        {&a->hact, L * BT * H},
        {&a->lnf, BT * C},
        {&a->lnf_rstd, BT},
        {&a->logits, BT * V},
        {&a->losses, BT},
        {&a->dresid, BT * C},
        {&a->dln, BT * C},
        {&a->dqkv, BT * QKV},
        {&a->datty, BT * NH * m->hd},
        {&a->datt, m->attn_ops ? 0 : B * NH * T * T},
        {&a->dh13, BT * 2 * H},
        {&a->dhact, BT * H},
    };
    size_t n = sizeof parts / sizeof parts[0], total = 0;
    for (size_t i = 0; i < n; i++) total += ((size_t)parts[i].n + 15) & ~(size_t)15; /* 64-byte aligned parts */
    ts->acts_mem = nl_malloc(total * sizeof(float), "activations");
    if (!ts->acts_mem) return NL_ERR_NOMEM;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        *parts[i].p = ts->acts_mem + off;
        off += ((size_t)parts[i].n + 15) & ~(size_t)15;
    }
    ts->acts_floats = total;
    ts->B = B;
    ts->T = T;
    ts->maxdim = maxdim;
    if (m->moe) NL_TRY(nl_moe_alloc_acts(m, B, T));
    return ensure_lp_scratch(m);
}

/* ---- mixed precision -------------------------------------------------------------------------- */

static void refresh_lp_weights(nl_model *m);

nl_status nl_model_set_precision(nl_model *m, nl_precision p) {
    if (p == NL_PREC_FP32) {
        if (m->train) {
            nl_free(m->train->params_lp);
            m->train->params_lp = NULL;
        }
        m->precision = p;
        return NL_OK;
    }
    nl_train_state *ts = train_state(m);
    if (!ts) return NL_ERR_NOMEM;
    if (!ts->params_lp) {
        ts->params_lp = nl_malloc(m->n_params * sizeof(float), "low-precision weights");
        if (!ts->params_lp) return NL_ERR_NOMEM;
    }
    m->precision = p;
    refresh_lp_weights(m); /* valid before the first forward (a decode step reads it too) */
    return ensure_lp_scratch(m);
}

static nl_format prec_format(nl_precision p) { return p == NL_PREC_BF16 ? NL_FMT_BF16 : NL_FMT_FP16; }

/* Rounds x (n) into dst in the model's precision (a copy; x untouched). */
static const float *round_copy(const nl_model *m, float *dst, const float *x, size_t n) {
    memcpy(dst, x, n * sizeof(float));
    nl_fmt_round_array(prec_format(m->precision), dst, n); /* cannot fail for bf16/fp16 */
    return dst;
}

/* Refreshes the rounded weight copy from the fp32 master weights (once per forward). */
static void refresh_lp_weights(nl_model *m) {
    if (m->precision == NL_PREC_FP32 || !m->train || !m->train->params_lp) return;
    round_copy(m, m->train->params_lp, m->params, m->n_params);
}

/* ---- linear ----------------------------------------------------------------------------------
 * The linear GEMMs run on the OpenMP threads, one pool for the whole step: each thread computes a
 * fixed block of rows of the product with a single-threaded cblas_sgemm (OpenBLAS set to one
 * thread meanwhile: blas_serial.h). With OpenBLAS's own threads for these GEMMs and OpenMP's for
 * everything else, the two pools met every few hundred microseconds and a 2-thread step lost
 * to other jobs sharing the cores (docs/nanolm.md, Speed).
 *
 * Blocks depend only on the shape and the thread count, so results are bit-identical run to run
 * for a given thread count (not across thread counts: OpenBLAS's result for a block of rows is
 * not always bit-identical to the same rows of the whole product). */

enum {
    LIN_ALIGN = 16,        /* block boundaries on multiples of 16 rows (the sgemm kernel's tiles) */
    LIN_MIN_FLOP = 1 << 18 /* smaller products (inference, n = 1) stay one call */
};

/* Rows [*r0, *r1) of `rows` for block `i` of `nb`: equal shares rounded up to LIN_ALIGN. */
static void lin_block(int64_t rows, int i, int nb, int64_t *r0, int64_t *r1) {
    int64_t per = (rows + nb - 1) / nb;
    per = (per + LIN_ALIGN - 1) / LIN_ALIGN * LIN_ALIGN;
    *r0 = (int64_t)i * per < rows ? (int64_t)i * per : rows;
    *r1 = *r0 + per < rows ? *r0 + per : rows;
}

/* Number of row blocks for a product of `flop` multiply-adds over `rows` rows: the thread count,
 * or 1 when the product is small or the rows too few to give each thread an aligned block. */
static int lin_blocks(int64_t rows, int64_t flop) {
    int nt = nl_threads();
    if (nt < 2 || flop < LIN_MIN_FLOP || rows < (int64_t)nt * LIN_ALIGN) return 1;
    return nt;
}

/* out (n, out_dim) = in (n, in_dim) . w^T: thread i computes rows block i of out. */
static void lin_forward_blocks(float *out, const float *in, const float *w, int64_t n, int64_t in_dim,
                               int64_t out_dim) {
    int nb = lin_blocks(n, n * in_dim * out_dim);
    int saved = nl_blas_serial_begin();
#pragma omp parallel for schedule(static, 1) num_threads(nb) if (nb > 1)
    for (int i = 0; i < nb; i++) {
        int64_t r0, r1;
        lin_block(n, i, nb, &r0, &r1);
        if (r1 > r0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(r1 - r0), (int)out_dim, (int)in_dim, 1.0f,
                        in + r0 * in_dim, (int)in_dim, w, (int)in_dim, 0.0f, out + r0 * out_dim, (int)out_dim);
    }
    nl_blas_serial_end(saved);
}

/* din (n, in_dim) = dout . w (skipped when din is NULL) in row blocks of din, and
 * dw (out_dim, in_dim) += dout^T . in in row blocks of dw (each block sums over all n rows, so
 * no reduction across threads). One parallel region; the two GEMMs need no barrier between. */
static void lin_backward_blocks(float *din, float *dw, const float *dout, const float *in, const float *w, int64_t n,
                                int64_t in_dim, int64_t out_dim) {
    int64_t flop = n * in_dim * out_dim;
    int nb_in = din ? lin_blocks(n, flop) : 0, nb_w = lin_blocks(out_dim, flop);
    int nb = nb_in > nb_w ? nb_in : nb_w;
    int saved = nl_blas_serial_begin();
#pragma omp parallel num_threads(nb) if (nb > 1)
    {
#pragma omp for schedule(static, 1) nowait
        for (int i = 0; i < nb_in; i++) {
            int64_t r0, r1;
            lin_block(n, i, nb_in, &r0, &r1);
            if (r1 > r0)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(r1 - r0), (int)in_dim, (int)out_dim, 1.0f,
                            dout + r0 * out_dim, (int)out_dim, w, (int)in_dim, 0.0f, din + r0 * in_dim, (int)in_dim);
        }
#pragma omp for schedule(static, 1)
        for (int i = 0; i < nb_w; i++) {
            int64_t o0, o1;
            lin_block(out_dim, i, nb_w, &o0, &o1);
            if (o1 > o0)
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(o1 - o0), (int)in_dim, (int)n, 1.0f,
                            dout + o0, (int)out_dim, in, (int)in_dim, 1.0f, dw + o0 * in_dim, (int)in_dim);
        }
    }
    nl_blas_serial_end(saved);
}

/* The training activations' scratch for a rounded matmul input (NULL without a training state). */
static float *lp_scratch(const nl_model *m) { return m->train ? m->train->a.lp_scratch : NULL; }

/* The default linear with the bf16/fp16 input rounded into lp (n * in_dim floats). */
static void linear_forward_default_lp(const nl_model *m, const nl_linear_site *site, float *out, const float *in,
                                      const float *w, int64_t n, int64_t in_dim, int64_t out_dim, float *lp) {
    if (m->precision != NL_PREC_FP32 && m->train && m->train->params_lp) {
        w = m->train->params_lp + site->weight_offset;
        in = round_copy(m, lp, in, (size_t)(n * in_dim));
    }
    lin_forward_blocks(out, in, w, n, in_dim, out_dim);
}

void nl_linear_forward_default(const nl_model *m, const nl_linear_site *site, float *out, const float *in,
                               const float *w, int64_t n, int64_t in_dim, int64_t out_dim) {
    linear_forward_default_lp(m, site, out, in, w, n, in_dim, out_dim, lp_scratch(m));
}

void nl_linear_backward_default(nl_model *m, const nl_linear_site *site, float *din, float *dw, const float *dout,
                                const float *in, const float *w, int64_t n, int64_t in_dim, int64_t out_dim) {
    if (m->precision != NL_PREC_FP32 && m->train && m->train->params_lp) {
        w = m->train->params_lp + site->weight_offset;
        in = round_copy(m, m->train->a.lp_scratch, in, (size_t)(n * in_dim));
        dout = round_copy(m, m->train->a.lp_scratch2, dout, (size_t)(n * out_dim));
    }
    lin_backward_blocks(din, dw, dout, in, w, n, in_dim, out_dim);
}

void nl_linear_forward(const nl_model *m, const nl_linear_site *site, float *out, const float *in, const float *w,
                       int64_t n, int64_t in_dim, int64_t out_dim) {
    if (m->linear_ops && m->linear_ops->forward)
        m->linear_ops->forward(m->linear_ops->user, site, out, in, w, n, in_dim, out_dim);
    else
        linear_forward_default_lp(m, site, out, in, w, n, in_dim, out_dim, lp_scratch(m));
}

void nl_linear_forward_lp(const nl_model *m, const nl_linear_site *site, float *out, const float *in, const float *w,
                          int64_t n, int64_t in_dim, int64_t out_dim, float *lp) {
    if (m->linear_ops && m->linear_ops->forward)
        m->linear_ops->forward(m->linear_ops->user, site, out, in, w, n, in_dim, out_dim);
    else
        linear_forward_default_lp(m, site, out, in, w, n, in_dim, out_dim, lp);
}

void nl_linear_backward(nl_model *m, const nl_linear_site *site, float *din, float *dw, const float *dout,
                        const float *in, const float *w, int64_t n, int64_t in_dim, int64_t out_dim) {
    if (m->linear_ops && m->linear_ops->backward)
        m->linear_ops->backward(m->linear_ops->user, site, din, dw, dout, in, w, n, in_dim, out_dim);
    else
        nl_linear_backward_default(m, site, din, dw, dout, in, w, n, in_dim, out_dim);
}

void nl_add_bias(float *x, const float *bias, int64_t N, int64_t D) {
#pragma omp parallel for schedule(static) if (N * D > (1 << 16))
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < D; j++) x[i * D + j] += bias[j];
}

static nl_linear_site site_of(const nl_model *m, nl_linear_kind kind, int layer, const float *w) {
    nl_linear_site s = {kind, layer, (size_t)(w - m->params)};
    return s;
}

/* RoPE on the q and k heads of qkv (B, T, QKV), by column index or by m->positions. The NH q
 * heads and the KVH k heads are adjacent in a row, so one pass rotates NH + KVH heads. */
static void rope(const nl_model *m, float *qkv, int64_t B, int64_t T, int inverse) {
    int64_t NH = m->NH, KVH = m->KVH, hd = m->hd, QKV = m->QKV, half = hd / 2;
    if (!m->positions) {
        nl_rope_apply(qkv, m->rope_cos, m->rope_sin, B, T, NH + KVH, hd, QKV, inverse);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < B * T; bt++) {
        const int64_t t = bt % T;
        nl_rope_row(qkv + bt * QKV, m->rope_cos + m->positions[t] * half, m->rope_sin + m->positions[t] * half,
                    NH + KVH, hd, inverse);
    }
}

enum { CE_PIECE = 256 }; /* logits per piece of the loss's exps */

#define PROF(ph) nl_step_prof_mark(m->prof, NL_PROF_##ph)

/* ---- forward ------------------------------------------------------------------------------------ */

/* ---- the fused forward --------------------------------------------------------------------------
 * Everything of the forward but attention works on rows of (B*T) independently: the norms, the
 * linears (thread i computes rows block i of each product, lin_forward_blocks), RoPE, SwiGLU and
 * the loss. With the default fp32 linears, and when every linear of the layer splits its rows
 * into the same blocks, a thread carries its block of rows from one attention to the next in one
 * parallel region: O, residual + norm, gate_up, SwiGLU, down, the next layer's norm, QKV and
 * RoPE (or the final norm, the classifier and the loss). A layer takes 2 parallel regions
 * instead of 9, and a block of rows is still in the thread's cache when the next step reads it.
 * Each element is computed by the same calls with the same arguments as in the unfused forward
 * (same row blocks, same row functions), so the bits are the same. */

/* Row blocks of the fused forward: the common block count of every linear on n rows, or 0 when
 * the linears would split differently (then the unfused forward runs). */
static int fused_blocks(const nl_model *m, int64_t n) {
    if (m->linear_ops || m->precision != NL_PREC_FP32 || m->moe || m->no_embed || m->no_tail) return 0;
    int64_t C = m->C, H = m->H, A = m->NH * m->hd;
    int nb = lin_blocks(n, n * C * m->QKV);
    if (lin_blocks(n, n * A * C) != nb || lin_blocks(n, n * C * 2 * H) != nb || lin_blocks(n, n * H * C) != nb ||
        lin_blocks(n, n * C * m->V) != nb)
        return 0;
    return nb;
}

static void rows_sgemm(float *out, const float *in, const float *w, int64_t r0, int64_t r1, int64_t in_dim,
                       int64_t out_dim) {
    if (r1 > r0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(r1 - r0), (int)out_dim, (int)in_dim, 1.0f,
                    in + r0 * in_dim, (int)in_dim, w, (int)in_dim, 0.0f, out + r0 * out_dim, (int)out_dim);
}

/* Thread 0 marks the phases of its rows (the others do the same work on theirs at the same time). */
#define PROF0(ph)                                                                                                      \
    do {                                                                                                               \
        if (m->prof && omp_get_thread_num() == 0) nl_step_prof_mark(m->prof, NL_PROF_##ph);                            \
    } while (0)

/* Rows [r0, r1) of layer l up to attention: resid[l] += pending, ln1, qkv (+ bias), RoPE. */
static void fused_pre_attention(nl_model *m, int64_t l, const float *pending, int64_t r0, int64_t r1, int64_t T) {
    int64_t C = m->C, BT = m->train->B_cur * m->train->T_cur, QKV = m->QKV, half = m->hd / 2;
    nl_acts *a = &m->train->a;
    nl_layer_weights *lw = &m->w.layers[l];
    float *x = a->resid + l * BT * C, *ln1 = a->ln1 + l * BT * C, *qkv = a->qkv + l * BT * QKV;
    nl_rmsnorm_residual_forward(ln1 + r0 * C, a->ln1_rstd + l * BT + r0, x + r0 * C, pending ? pending + r0 * C : NULL,
                                lw->rms_att, r1 - r0, C, (float)m->arch.norm_eps);
    PROF0(NORM);
    rows_sgemm(qkv, ln1, lw->wq, r0, r1, C, QKV);
    if (lw->bqkv) nl_add_bias(qkv + r0 * QKV, lw->bqkv, r1 - r0, QKV);
    PROF0(GEMM);
    for (int64_t bt = r0; bt < r1; bt++) {
        int64_t t = m->positions ? m->positions[bt % T] : bt % T;
        nl_rope_row(qkv + bt * QKV, m->rope_cos + t * half, m->rope_sin + t * half, m->NH + m->KVH, m->hd, 0);
    }
    PROF0(ROPE);
}

/* Cross-entropy of rows [r0, r1) into a->losses (as the unfused forward computes it). */
static void ce_rows(nl_model *m, const int32_t *targets, int64_t r0, int64_t r1) {
    int64_t V = m->V;
    nl_acts *a = &m->train->a;
    for (int64_t i = r0; i < r1; i++) {
        const float *z = a->logits + i * V;
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int64_t v = 0; v < V; v++) mx = z[v] > mx ? z[v] : mx;
        float sum = 0.0f, e[CE_PIECE];
        for (int64_t v0 = 0; v0 < V; v0 += CE_PIECE) {
            int64_t k = V - v0 < CE_PIECE ? V - v0 : CE_PIECE;
            nl_vexp_shift(e, z + v0, mx, k);
            for (int64_t v = 0; v < k; v++) sum += e[v];
        }
        a->losses[i] = logf(sum) + mx - z[targets[i]];
    }
}

static void fused_forward(nl_model *m, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T, int nb) {
    int64_t C = m->C, BT = B * T, L = m->L, QKV = m->QKV, H = m->H, V = m->V, NH = m->NH, KVH = m->KVH, hd = m->hd;
    nl_acts *a = &m->train->a;
    float eps = (float)m->arch.norm_eps;
    int saved = nl_blas_serial_begin();
    /* embedding and layer 0 up to attention */
#pragma omp parallel for schedule(static, 1) num_threads(nb) if (nb > 1)
    for (int i = 0; i < nb; i++) {
        int64_t r0, r1;
        lin_block(BT, i, nb, &r0, &r1);
        for (int64_t bt = r0; bt < r1; bt++)
            memcpy(a->resid + bt * C, m->w.embed + (int64_t)tokens[bt] * C, (size_t)C * sizeof(float));
        PROF0(EMBED);
        fused_pre_attention(m, 0, NULL, r0, r1, T);
    }
    if (m->prof) nl_step_prof_mark(m->prof, NL_PROF_WAIT); /* the region's end: waiting for the others */
    for (int64_t l = 0; l < L; l++) {
        nl_layer_weights *lw = &m->w.layers[l];
        float *x = a->resid + l * BT * C, *qkv = a->qkv + l * BT * QKV;
        float *att = a->att + l * B * NH * T * T, *atty = a->atty + l * BT * NH * hd;
        float *x2 = a->resid2 + l * BT * C, *ln2 = a->ln2 + l * BT * C, *h13 = a->h13 + l * BT * 2 * H;
        float *hact = a->hact + l * BT * H, *xo = a->resid + (l + 1) * BT * C;
        nl_attention_forward(atty, att, qkv, B, T, NH, KVH, hd); /* (with attn_ops the forward is unfused) */
        if (m->prof) nl_step_prof_mark(m->prof, NL_PROF_ATTN);
#pragma omp parallel for schedule(static, 1) num_threads(nb) if (nb > 1)
        for (int i = 0; i < nb; i++) {
            int64_t r0, r1;
            lin_block(BT, i, nb, &r0, &r1);
            rows_sgemm(x2, atty, lw->wo, r0, r1, NH * hd, C);
            PROF0(GEMM);
            nl_rmsnorm_residual_forward(ln2 + r0 * C, a->ln2_rstd + l * BT + r0, x2 + r0 * C, x + r0 * C, lw->rms_ffn,
                                        r1 - r0, C, eps); /* x2 += x */
            PROF0(NORM);
            rows_sgemm(h13, ln2, lw->w1, r0, r1, C, 2 * H);
            PROF0(GEMM);
            nl_swiglu_forward(hact + r0 * H, h13 + r0 * 2 * H, r1 - r0, H);
            PROF0(SWIGLU);
            rows_sgemm(xo, hact, lw->w2, r0, r1, H, C);
            PROF0(GEMM);
            if (l + 1 < L) {
                fused_pre_attention(m, l + 1, x2, r0, r1, T); /* resid[l+1] = xo + x2 */
                continue;
            }
            nl_rmsnorm_residual_forward(a->lnf + r0 * C, a->lnf_rstd + r0, xo + r0 * C, x2 + r0 * C, m->w.rms_final,
                                        r1 - r0, C, eps);
            PROF0(NORM);
            rows_sgemm(a->logits, a->lnf, m->w.cls, r0, r1, C, V);
            PROF0(GEMM);
            if (targets) ce_rows(m, targets, r0, r1);
            PROF0(LOSS);
        }
        if (m->prof) nl_step_prof_mark(m->prof, NL_PROF_WAIT);
    }
    nl_blas_serial_end(saved);
}

nl_status nl_model_forward(nl_model *m, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T,
                           float *loss) {
    nl_train_state *ts = m->train;
    if (!ts || !ts->acts_mem)
        return nl_fail(NL_ERR_INVALID, "forward: no activations for batch (%lld, %lld) (nl_model_alloc_acts)",
                       (long long)B, (long long)T);
    if (B > ts->B || T > ts->T || B * T > ts->B * ts->T)
        return nl_fail(NL_ERR_INVALID, "forward: batch (%lld, %lld) exceeds the activations sized for (%lld, %lld)",
                       (long long)B, (long long)T, (long long)ts->B, (long long)ts->T);
    int64_t C = m->C, BT = B * T, L = m->L, QKV = m->QKV, H = m->H, V = m->V, NH = m->NH, KVH = m->KVH, hd = m->hd;
    for (int64_t i = 0; i < BT; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return nl_fail(NL_ERR_INVALID, "forward: token %d at index %lld is outside the vocabulary [0, %lld)",
                           tokens[i], (long long)i, (long long)V);
        if (targets && (targets[i] < 0 || targets[i] >= V))
            return nl_fail(NL_ERR_INVALID, "forward: target %d at index %lld is outside the vocabulary [0, %lld)",
                           targets[i], (long long)i, (long long)V);
    }
    ts->B_cur = B;
    ts->T_cur = T;
    if (m->moe) {
        m->moe->aux_loss = 0;
        m->moe->slots = m->moe->dropped = m->moe->rows_sent = m->moe->rows_self = 0;
        m->moe->rows_dispatched = m->moe->rows_returned = 0;
    }
    ts->targets = targets;
    ts->tokens = tokens;
    refresh_lp_weights(m);
    PROF(OTHER);
    nl_acts *a = &m->train->a;
    float eps = (float)m->arch.norm_eps;
    int nb_fused = m->attn_ops ? 0 : fused_blocks(m, BT);
    if (nb_fused > 0) {
        fused_forward(m, tokens, targets, B, T, nb_fused);
        if (!targets) return NL_OK;
        goto loss_total;
    }
    /* embedding: resid[0] (B, T, C) */
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < BT; i++)
        memcpy(a->resid + i * C, m->w.embed + (int64_t)tokens[i] * C, (size_t)C * sizeof(float));
    PROF(EMBED);
    /* Each residual add is done by the RMSNorm that reads its sum (nl_rmsnorm_residual_forward):
     * resid[l+1] = xo + x2 of layer l is completed by layer l+1's input norm (or the final norm). */
    const float *pending = NULL; /* what resid[l] still lacks: x2 of layer l-1 */
    for (int64_t l = 0; l < L; l++) {
        nl_layer_weights *lw = &m->w.layers[l];
        float *x = a->resid + l * BT * C, *ln1 = a->ln1 + l * BT * C, *qkv = a->qkv + l * BT * QKV;
        float *att = a->att + l * B * NH * T * T, *atty = a->atty + l * BT * NH * hd;
        float *x2 = a->resid2 + l * BT * C, *ln2 = a->ln2 + l * BT * C, *h13 = a->h13 + l * BT * 2 * H;
        float *hact = a->hact + l * BT * H, *xo = a->resid + (l + 1) * BT * C;
        nl_rmsnorm_residual_forward(ln1, a->ln1_rstd + l * BT, x, pending, lw->rms_att, BT, C, eps);
        PROF(NORM);
        nl_linear_site s = site_of(m, NL_LIN_QKV, (int)l, lw->wq);
        nl_linear_forward(m, &s, qkv, ln1, lw->wq, BT, C, QKV);
        if (lw->bqkv) nl_add_bias(qkv, lw->bqkv, BT, QKV);
        PROF(GEMM);
        rope(m, qkv, B, T, 0);
        PROF(ROPE);
        if (m->attn_ops)
            NL_TRY(m->attn_ops->forward(m->attn_ops->user, (int)l, atty, qkv, B, T));
        else
            nl_attention_forward(atty, att, qkv, B, T, NH, KVH, hd);
        PROF(ATTN);
        s = site_of(m, NL_LIN_O, (int)l, lw->wo);
        nl_linear_forward(m, &s, x2, atty, lw->wo, BT, NH * hd, C);
        PROF(GEMM);
        nl_rmsnorm_residual_forward(ln2, a->ln2_rstd + l * BT, x2, x, lw->rms_ffn, BT, C, eps); /* x2 += x */
        PROF(NORM);
        pending = x2; /* resid[l+1] = xo + x2 */
        if (nl_moe_is_layer(m, l)) {
            NL_TRY(nl_moe_forward(m, l, ln2, xo, B, T));
            PROF(OTHER);
            continue;
        }
        s = site_of(m, NL_LIN_GATE_UP, (int)l, lw->w1);
        nl_linear_forward(m, &s, h13, ln2, lw->w1, BT, C, 2 * H);
        PROF(GEMM);
        nl_swiglu_forward(hact, h13, BT, H);
        PROF(SWIGLU);
        s = site_of(m, NL_LIN_DOWN, (int)l, lw->w2);
        nl_linear_forward(m, &s, xo, hact, lw->w2, BT, H, C);
        PROF(GEMM);
    }
    nl_rmsnorm_residual_forward(a->lnf, a->lnf_rstd, a->resid + L * BT * C, pending, m->w.rms_final, BT, C, eps);
    PROF(NORM);
    nl_linear_site s = site_of(m, NL_LIN_CLS, -1, m->w.cls);
    nl_linear_forward(m, &s, a->logits, a->lnf, m->w.cls, BT, C, V);
    PROF(GEMM);
    if (!targets) return NL_OK;
        /* cross-entropy per token: logsumexp(logits) - logits[target] */
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < BT; i++) {
        const float *z = a->logits + i * V;
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int64_t v = 0; v < V; v++) mx = z[v] > mx ? z[v] : mx;
        float sum = 0.0f, e[CE_PIECE]; /* exps of a piece 8 lanes at a time, summed in order */
        for (int64_t v0 = 0; v0 < V; v0 += CE_PIECE) {
            int64_t k = V - v0 < CE_PIECE ? V - v0 : CE_PIECE;
            nl_vexp_shift(e, z + v0, mx, k);
            for (int64_t v = 0; v < k; v++) sum += e[v];
        }
        a->losses[i] = logf(sum) + mx - z[targets[i]];
    }
loss_total:;
    double total = 0.0;
    for (int64_t i = 0; i < BT; i++) total += a->losses[i];
    ts->mean_loss = (float)(total / (double)BT);
    if (loss) *loss = ts->mean_loss;
    PROF(LOSS);
    return NL_OK;
}

/* ---- backward ----------------------------------------------------------------------------------- */

/* ---- the fused backward -------------------------------------------------------------------------
 * The backward of a layer in 3 parallel regions instead of 9 (the forward's conditions, and no
 * q/k/v biases). Activation gradients go by row blocks, each thread keeping its block from one
 * step to the next (static schedules over the same blocks give a thread the same block); weight
 * gradients go by blocks of the weight's rows, which sum over all rows of the batch, after the
 * barrier that completes what they read. The calls and blocks are those of the unfused backward
 * (lin_backward_blocks, nl_rmsnorm_backward's two parts, nl_swiglu_backward and nl_rope_row on
 * rows), so the bits are the same:
 *   down_swiglu(l): d hact rows, SwiGLU backward rows | d W2
 *   ffn(l):         d ln2 rows, norm dx rows | d W1; barrier; norm dw | d atty rows | d Wo
 *   attention backward
 *   qkv(l):         inverse RoPE rows, d ln1 rows, norm dx rows; barrier; d Wqkv | norm dw, and
 *                   down_swiglu(l - 1) in the same region */

static void rows_din(float *din, const float *dout, const float *w, int64_t r0, int64_t r1, int64_t in_dim,
                     int64_t out_dim) {
    if (r1 > r0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(r1 - r0), (int)in_dim, (int)out_dim, 1.0f,
                    dout + r0 * out_dim, (int)out_dim, w, (int)in_dim, 0.0f, din + r0 * in_dim, (int)in_dim);
}

/* dw += dout^T in over the weight-row blocks of lin_backward_blocks (an omp for, no wait) */
static void cols_dw(float *dw, const float *dout, const float *in, int64_t n, int64_t in_dim, int64_t out_dim) {
    int nb_w = lin_blocks(out_dim, n * in_dim * out_dim);
#pragma omp for schedule(static, 1) nowait
    for (int i = 0; i < nb_w; i++) {
        int64_t o0, o1;
        lin_block(out_dim, i, nb_w, &o0, &o1);
        if (o1 > o0)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(o1 - o0), (int)in_dim, (int)n, 1.0f, dout + o0,
                        (int)out_dim, in, (int)in_dim, 1.0f, dw + o0 * in_dim, (int)in_dim);
    }
}

static void norm_dw(float *dw, const float *dout, const float *x, const float *rstd, int64_t N, int64_t C) {
#pragma omp for schedule(static) nowait
    for (int64_t c0 = 0; c0 < C; c0 += NL_RMSNORM_DW_BLOCK) nl_rmsnorm_backward_dw_cols(dw, dout, x, rstd, N, C, c0);
}

/* Inside a region: d hact and the SwiGLU backward on the thread's row blocks, then its part of d W2. */
static void fused_down_swiglu(nl_model *m, int64_t l, int nb, int64_t BT) {
    int64_t C = m->C, H = m->H;
    nl_acts *a = &m->train->a;
    nl_layer_weights *lw = &m->w.layers[l];
#pragma omp for schedule(static, 1) nowait
    for (int i = 0; i < nb; i++) {
        int64_t r0, r1;
        lin_block(BT, i, nb, &r0, &r1);
        rows_din(a->dhact, a->dresid, lw->w2, r0, r1, H, C);
        PROF0(GEMM);
        nl_swiglu_backward(a->dh13 + r0 * 2 * H, a->dhact + r0 * H, a->h13 + l * BT * 2 * H + r0 * 2 * H, r1 - r0, H);
        PROF0(SWIGLU);
    }
    cols_dw(m->train->grads + (lw->w2 - m->params), a->dresid, a->hact + l * BT * H, BT, H, C);
    PROF0(GEMM);
}

static void fused_backward_layers(nl_model *m, int nb) {
    int64_t B = m->train->B_cur, T = m->train->T_cur, BT = B * T, C = m->C, H = m->H, QKV = m->QKV, NH = m->NH,
            KVH = m->KVH;
    int64_t hd = m->hd, A = NH * hd, half = hd / 2;
    nl_acts *a = &m->train->a;
    float *G = m->train->grads;
    int saved = nl_blas_serial_begin();
#pragma omp parallel num_threads(nb) if (nb > 1)
    fused_down_swiglu(m, m->L - 1, nb, BT);
    if (m->prof) nl_step_prof_mark(m->prof, NL_PROF_WAIT);
    for (int64_t l = m->L - 1; l >= 0; l--) {
        nl_layer_weights *lw = &m->w.layers[l];
        const float *x = a->resid + l * BT * C, *ln1 = a->ln1 + l * BT * C, *qkv = a->qkv + l * BT * QKV;
        const float *att = a->att + l * B * NH * T * T, *atty = a->atty + l * BT * A;
        const float *x2 = a->resid2 + l * BT * C, *ln2 = a->ln2 + l * BT * C;
#pragma omp parallel num_threads(nb) if (nb > 1)
        {
#pragma omp for schedule(static, 1) nowait
            for (int i = 0; i < nb; i++) {
                int64_t r0, r1;
                lin_block(BT, i, nb, &r0, &r1);
                rows_din(a->dln, a->dh13, lw->w1, r0, r1, C, 2 * H);
                nl_rmsnorm_backward_rows(a->dresid, a->dln, x2, lw->rms_ffn, a->ln2_rstd + l * BT, r0, r1, C);
            }
            cols_dw(G + (lw->w1 - m->params), a->dh13, ln2, BT, C, 2 * H);
            PROF0(GEMM);
#pragma omp barrier
            PROF0(WAIT);
            norm_dw(G + (lw->rms_ffn - m->params), a->dln, x2, a->ln2_rstd + l * BT, BT, C);
            PROF0(NORM);
#pragma omp for schedule(static, 1) nowait
            for (int i = 0; i < nb; i++) {
                int64_t r0, r1;
                lin_block(BT, i, nb, &r0, &r1);
                rows_din(a->datty, a->dresid, lw->wo, r0, r1, A, C);
            }
            cols_dw(G + (lw->wo - m->params), a->dresid, atty, BT, A, C);
            PROF0(GEMM);
        }
        if (m->prof) nl_step_prof_mark(m->prof, NL_PROF_WAIT);
        nl_attention_backward(a->dqkv, a->datt, a->datty, att, qkv, B, T, NH, KVH, hd);
        if (m->prof) nl_step_prof_mark(m->prof, NL_PROF_ATTN);
#pragma omp parallel num_threads(nb) if (nb > 1)
        {
#pragma omp for schedule(static, 1) nowait
            for (int i = 0; i < nb; i++) {
                int64_t r0, r1;
                lin_block(BT, i, nb, &r0, &r1);
                for (int64_t bt = r0; bt < r1; bt++) {
                    int64_t t = m->positions ? m->positions[bt % T] : bt % T;
                    nl_rope_row(a->dqkv + bt * QKV, m->rope_cos + t * half, m->rope_sin + t * half, NH + KVH, hd, 1);
                }
                PROF0(ROPE);
                rows_din(a->dln, a->dqkv, lw->wq, r0, r1, C, QKV);
                PROF0(GEMM);
                nl_rmsnorm_backward_rows(a->dresid, a->dln, x, lw->rms_att, a->ln1_rstd + l * BT, r0, r1, C);
                PROF0(NORM);
            }
#pragma omp barrier
            PROF0(WAIT);
            cols_dw(G + (lw->wq - m->params), a->dqkv, ln1, BT, C, QKV);
            PROF0(GEMM);
            norm_dw(G + (lw->rms_att - m->params), a->dln, x, a->ln1_rstd + l * BT, BT, C);
            PROF0(NORM);
            if (l > 0) fused_down_swiglu(m, l - 1, nb, BT);
        }
        if (m->prof) nl_step_prof_mark(m->prof, NL_PROF_WAIT);
    }
    nl_blas_serial_end(saved);
}

nl_status nl_model_backward(nl_model *m) {
    nl_train_state *ts = m->train;
    if (!ts || !ts->grads) return nl_fail(NL_ERR_INVALID, "backward: gradients not allocated (nl_model_alloc_grads)");
    if (!ts->targets) return nl_fail(NL_ERR_INVALID, "backward: the last forward had no targets");
    int64_t B = ts->B_cur, T = ts->T_cur;
    int64_t C = m->C, BT = B * T, L = m->L, QKV = m->QKV, H = m->H, V = m->V, NH = m->NH, KVH = m->KVH, hd = m->hd;
    nl_acts *a = &m->train->a;
    const int32_t *targets = ts->targets;
    float *G = ts->grads;
#define GRAD(ptr) (G + ((ptr)-m->params))
    /* dlogits = (softmax - onehot) * loss_scale / (B T), in place of the logits */
    float dscale = ts->loss_scale / (float)BT;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < BT; i++) {
        float *z = a->logits + i * V;
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int64_t v = 0; v < V; v++) mx = z[v] > mx ? z[v] : mx;
        float sum = 0.0f;
        nl_vexp_shift(z, z, mx, V);
        for (int64_t v = 0; v < V; v++) sum += z[v]; /* in order */
        float inv = 1.0f / sum;
#pragma omp simd
        for (int64_t v = 0; v < V; v++) z[v] = z[v] * inv * dscale;
        z[targets[i]] -= dscale;
    }
    ts->targets = NULL; /* logits are gone: a second backward needs a new forward */
    PROF(LOSS);
    nl_linear_site s = site_of(m, NL_LIN_CLS, -1, m->w.cls);
    nl_linear_backward(m, &s, a->dln, GRAD(m->w.cls), a->logits, a->lnf, m->w.cls, BT, C, V);
    PROF(GEMM);
    memset(a->dresid, 0, (size_t)(BT * C) * sizeof(float));
    nl_rmsnorm_backward(a->dresid, GRAD(m->w.rms_final), a->dln, a->resid + L * BT * C, m->w.rms_final, a->lnf_rstd, BT,
                        C);
    PROF(NORM);
    int nb_fused = m->attn_ops || m->arch.qkv_bias ? 0 : fused_blocks(m, BT);
    if (nb_fused > 0) fused_backward_layers(m, nb_fused);
    for (int64_t l = nb_fused > 0 ? -1 : L - 1; l >= 0; l--) {
        nl_layer_weights *lw = &m->w.layers[l];
        float *x = a->resid + l * BT * C, *ln1 = a->ln1 + l * BT * C, *qkv = a->qkv + l * BT * QKV;
        float *att = a->att + l * B * NH * T * T, *atty = a->atty + l * BT * NH * hd;
        float *x2 = a->resid2 + l * BT * C, *ln2 = a->ln2 + l * BT * C, *h13 = a->h13 + l * BT * 2 * H;
        float *hact = a->hact + l * BT * H;
        /* dresid holds d resid[l+1]; resid[l+1] = x2 + down(hact) */
        if (nl_moe_is_layer(m, l)) {
            NL_TRY(nl_moe_backward(m, l, ln2, a->dresid, a->dln, B, T));
            PROF(OTHER);
        } else {
            s = site_of(m, NL_LIN_DOWN, (int)l, lw->w2);
            nl_linear_backward(m, &s, a->dhact, GRAD(lw->w2), a->dresid, hact, lw->w2, BT, H, C);
            PROF(GEMM);
            nl_swiglu_backward(a->dh13, a->dhact, h13, BT, H);
            PROF(SWIGLU);
            s = site_of(m, NL_LIN_GATE_UP, (int)l, lw->w1);
            nl_linear_backward(m, &s, a->dln, GRAD(lw->w1), a->dh13, ln2, lw->w1, BT, C, 2 * H);
            PROF(GEMM);
        }
        nl_rmsnorm_backward(a->dresid, GRAD(lw->rms_ffn), a->dln, x2, lw->rms_ffn, a->ln2_rstd + l * BT, BT, C);
        PROF(NORM);
        /* dresid holds d x2; x2 = x + o(atty) */
        s = site_of(m, NL_LIN_O, (int)l, lw->wo);
        nl_linear_backward(m, &s, a->datty, GRAD(lw->wo), a->dresid, atty, lw->wo, BT, NH * hd, C);
        PROF(GEMM);
        if (m->attn_ops)
            NL_TRY(m->attn_ops->backward(m->attn_ops->user, (int)l, a->dqkv, a->datty, qkv, B, T));
        else
            nl_attention_backward(a->dqkv, a->datt, a->datty, att, qkv, B, T, NH, KVH, hd);
        PROF(ATTN);
        rope(m, a->dqkv, B, T, 1);
        PROF(ROPE);
        if (lw->bqkv) { /* d bias (QKV) += column sums of dqkv (B*T, QKV) */
            float *db = GRAD(lw->bqkv);
            for (int64_t i = 0; i < BT; i++)
                for (int64_t j = 0; j < QKV; j++) db[j] += a->dqkv[i * QKV + j];
        }
        s = site_of(m, NL_LIN_QKV, (int)l, lw->wq);
        nl_linear_backward(m, &s, a->dln, GRAD(lw->wq), a->dqkv, ln1, lw->wq, BT, C, QKV);
        PROF(GEMM);
        nl_rmsnorm_backward(a->dresid, GRAD(lw->rms_att), a->dln, x, lw->rms_att, a->ln1_rstd + l * BT, BT, C);
        PROF(NORM);
    }
    /* embedding: serial over tokens (repeated tokens add to the same row), vectorised over C */
    float *dembed = GRAD(m->w.embed);
    for (int64_t i = 0; i < BT; i++) {
        float *d = dembed + (int64_t)ts->tokens[i] * C;
        const float *g = a->dresid + i * C;
        for (int64_t c = 0; c < C; c++) d[c] += g[c];
    }
    PROF(EMBED);
#undef GRAD
    return NL_OK;
}
