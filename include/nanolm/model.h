/*
 * NanoLM: a Llama-architecture decoder-only transformer in plain C (llm.c / llama2.c style).
 *
 *   tokens (B, T) -> embedding (B, T, C)
 *   L x [ x += Wo . attention(RoPE(Wq . rmsnorm(x)), RoPE(Wk . rmsnorm(x)), Wv . rmsnorm(x))
 *         x += W2 . (silu(W1 . rmsnorm(x)) * (W3 . rmsnorm(x))) ]
 *   logits (B, T, V) = Wcls . rmsnorm(x)       (Wcls = embedding when tied)
 *
 * Memory layout: every parameter lives in ONE flat fp32 allocation (`params`), gradients in a
 * second with the same layout (`train->grads`). A layer's tensors are contiguous, so a layer (or
 * any ZeRO shard) is an offset range. The order is:
 *   model.embed_tokens.weight                          (V, C)
 *   for each layer l:                                  [layer_offset(l), layer_offset(l+1))
 *     model.layers.l.input_layernorm.weight            (C)
 *     model.layers.l.self_attn.q_proj.weight           (NH*hd, C)   \ contiguous: one fused
 *     model.layers.l.self_attn.k_proj.weight           (KVH*hd, C)  | (NH+2KVH)*hd x C matmul
 *     model.layers.l.self_attn.v_proj.weight           (KVH*hd, C)  /
 *     model.layers.l.self_attn.{q,k,v}_proj.bias       (NH*hd), (KVH*hd), (KVH*hd)  only with
 *                                                      arch.qkv_bias (Qwen2): fused (QKV)
 *     model.layers.l.self_attn.o_proj.weight           (C, NH*hd)
 *     model.layers.l.post_attention_layernorm.weight   (C)
 *     model.layers.l.mlp.gate_proj.weight              (H, C)       \ contiguous: one fused
 *     model.layers.l.mlp.up_proj.weight                (H, C)       / 2H x C matmul
 *     model.layers.l.mlp.down_proj.weight              (C, H)
 *   model.norm.weight                                  (C)
 *   lm_head.weight                                     (V, C)   only when untied
 * Linear weights are stored (out, in) as in PyTorch's nn.Linear: y = x W^T.
 * RoPE rotates adjacent pairs (2i, 2i+1) of each head (Meta / llama2.c convention), with
 * frequency rope_theta^(-2i/hd).
 */
#ifndef NANOLM_MODEL_H
#define NANOLM_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/arch.h"
#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- parameter table ------------------------------------------------------------------------ */

typedef enum nl_param_kind {
    NL_PARAM_EMBED,
    NL_PARAM_RMS_ATT,
    NL_PARAM_WQ,
    NL_PARAM_WK,
    NL_PARAM_WV,
    NL_PARAM_WO,
    NL_PARAM_RMS_FFN,
    NL_PARAM_W1,
    NL_PARAM_W3,
    NL_PARAM_W2,
    NL_PARAM_RMS_FINAL,
    NL_PARAM_CLS,
    /* mixture-of-experts layers (see nanolm/moe.h) */
    NL_PARAM_ROUTER,
    NL_PARAM_SHARED_W1,
    NL_PARAM_SHARED_W3,
    NL_PARAM_SHARED_W2,
    NL_PARAM_EXPERT_W1,
    NL_PARAM_EXPERT_W3,
    NL_PARAM_EXPERT_W2,
    /* q/k/v biases (arch.qkv_bias, Qwen2): (NH*hd), (KVH*hd), (KVH*hd), right after wv */
    NL_PARAM_BQ,
    NL_PARAM_BK,
    NL_PARAM_BV
} nl_param_kind;

/* One tensor of the flat parameter vector. */
typedef struct nl_param_info {
    char name[80]; /* Hugging Face Llama name, e.g. model.layers.0.self_attn.q_proj.weight */
    nl_param_kind kind;
    int layer;        /* -1 for embedding, final norm, classifier */
    int ndim;         /* 1 or 2 */
    int64_t shape[2]; /* (out, in) for matrices, (C) for norms */
    size_t offset;    /* in floats, into params / grads */
    size_t numel;
    int expert; /* routed expert index (global) for NL_PARAM_EXPERT_*, else -1 */
} nl_param_info;

/* Pointers into the flat buffer for one layer. */
typedef struct nl_layer_weights {
    float *rms_att; /* (C) */
    float *wq;      /* (NH*hd, C); wk (KVH*hd, C) and wv (KVH*hd, C) follow it directly */
    float *wk, *wv;
    float *wo;      /* (C, NH*hd) */
    float *rms_ffn; /* (C) */
    float *w1;      /* gate (H, C); w3 (up, (H, C)) follows it directly */
    float *w3;
    float *w2; /* down (C, H) */
    /* MoE layers only (w1, w3, w2 are NULL there): */
    float *router;  /* (E, C) */
    float *sw1;     /* shared experts fused: gate (S*F, C); up (S*F, C) follows; NULL when S = 0 */
    float *sw2;     /* shared down (C, S*F) */
    float *experts; /* this rank's routed experts, expert j at experts + j*3*F*C: gate (F, C),
                      * up (F, C), down (C, F) -- one contiguous offset range per expert */
    float *bqkv;    /* arch.qkv_bias only, else NULL: q|k|v biases fused (QKV), added to the
                      * q/k/v projection before RoPE */
} nl_layer_weights;

typedef struct nl_weights {
    float *embed;             /* (V, C) */
    nl_layer_weights *layers; /* [L] */
    float *rms_final;         /* (C) */
    float *cls;               /* (V, C); == embed when tied */
} nl_weights;

/* ---- the linear layer and its hook -------------------------------------------------------------
 * Every matmul of the model goes through nl_linear_forward/backward. A site names which linear
 * it is, so that a replacement (int8 QuantizedLinear, emulated FP8 GEMM, tensor-parallel shard)
 * can be installed as nl_linear_ops without touching the layer code. */
typedef enum nl_linear_kind { NL_LIN_QKV, NL_LIN_O, NL_LIN_GATE_UP, NL_LIN_DOWN, NL_LIN_CLS } nl_linear_kind;

typedef struct nl_linear_site {
    nl_linear_kind kind;
    int layer;            /* -1 for the classifier */
    size_t weight_offset; /* in floats, into params: the (out, in) weight starts here */
} nl_linear_site;

/* Precision of the matmul inputs (fp32 accumulation always). BF16/FP16 round weights and
 * activations (and output gradients in backward) to the format before the GEMM. */
typedef enum nl_precision { NL_PREC_FP32 = 0, NL_PREC_BF16, NL_PREC_FP16 } nl_precision;

typedef struct nl_linear_ops {
    /* out (N, out_dim) = in (N, in_dim) . w^T, w (out_dim, in_dim). Overwrites out. */
    void (*forward)(void *user, const nl_linear_site *site, float *out, const float *in, const float *w, int64_t n,
                    int64_t in_dim, int64_t out_dim);
    /* din (N, in_dim) = dout . w (overwritten; skipped when din == NULL);
     * dw (out_dim, in_dim) += dout^T . in (accumulated). */
    void (*backward)(void *user, const nl_linear_site *site, float *din, float *dw, const float *dout, const float *in,
                     const float *w, int64_t n, int64_t in_dim, int64_t out_dim);
    void *user;
} nl_linear_ops;

/* Replacement of the causal attention core (context parallelism installs ring attention):
 * out (B, T, NH*hd) from qkv (B, T, QKV) with q, k already rotated; backward writes dqkv
 * (overwritten) from dout. With attn_ops set before nl_model_alloc_acts, no (T, T) probability
 * buffers are allocated. */
typedef struct nl_attn_ops {
    nl_status (*forward)(void *user, int layer, float *out, const float *qkv, int64_t B, int64_t T);
    nl_status (*backward)(void *user, int layer, float *dqkv, const float *dout, const float *qkv, int64_t B,
                          int64_t T);
    void *user;
} nl_attn_ops;

struct nl_model;
/* The linear layer: m->linear_ops when installed, else the default below. */
void nl_linear_forward(const struct nl_model *m, const nl_linear_site *site, float *out, const float *in,
                       const float *w, int64_t n, int64_t in_dim, int64_t out_dim);
void nl_linear_backward(struct nl_model *m, const nl_linear_site *site, float *din, float *dw, const float *dout,
                        const float *in, const float *w, int64_t n, int64_t in_dim, int64_t out_dim);
/* The default linear, whatever hook is installed (a hook that wraps it calls these): inputs
 * rounded per m->precision, then cblas_sgemm in fixed row blocks over the OpenMP threads
 * (bit-identical run to run for a given thread count). Same contract as nl_linear_ops. */
void nl_linear_forward_default(const struct nl_model *m, const nl_linear_site *site, float *out, const float *in,
                               const float *w, int64_t n, int64_t in_dim, int64_t out_dim);
void nl_linear_backward_default(struct nl_model *m, const nl_linear_site *site, float *din, float *dw,
                                const float *dout, const float *in, const float *w, int64_t n, int64_t in_dim,
                                int64_t out_dim);

/* ---- activations (one buffer, sized once for (B, T)) ---------------------------------------- */
typedef struct nl_acts {
    float *resid;    /* (L+1, B, T, C) residual stream entering each layer (+ final) */
    float *ln1;      /* (L, B, T, C) */
    float *ln1_rstd; /* (L, B, T) */
    float *qkv;      /* (L, B, T, (NH+2KVH)*hd) q and k after RoPE */
    float *att;      /* (L, B, NH, T, T) softmax probabilities (causal, upper part unused) */
    float *atty;     /* (L, B, T, NH*hd) attention output before o_proj */
    float *resid2;   /* (L, B, T, C) residual after attention */
    float *ln2;      /* (L, B, T, C) */
    float *ln2_rstd; /* (L, B, T) */
    float *h13;      /* (L, B, T, 2H) gate | up pre-activations */
    float *hact;     /* (L, B, T, H) silu(gate) * up */
    float *lnf;      /* (B, T, C) */
    float *lnf_rstd; /* (B, T) */
    float *logits;   /* (B, T, V); after backward-prep holds dlogits */
    float *losses;   /* (B, T) */
    /* backward scratch, reused by every layer */
    float *dresid; /* (B, T, C) */
    float *dln;    /* (B, T, C) */
    float *dqkv;   /* (B, T, (NH+2KVH)*hd) */
    float *datty;  /* (B, T, NH*hd) */
    float *datt;   /* (B, NH, T, T) d(probabilities), then d(scores) */
    float *dh13;   /* (B, T, 2H) */
    float *dhact;  /* (B, T, H) */
    /* bf16/fp16 only (separate allocation): rounded copies of a matmul's input and dout */
    float *lp_scratch;  /* (B*T*maxdim) */
    float *lp_scratch2; /* (B*T*maxdim) */
} nl_acts;

/* ---- training state -------------------------------------------------------------------------
 * What a forward and backward write besides the output: gradients, activations, the
 * low-precision copies, and the last forward's shape, tokens and loss. A model points to one
 * (m->train) only once something needs it: nl_model_alloc_grads, nl_model_alloc_acts or
 * nl_model_set_precision(bf16/fp16) creates it, nl_model_free frees it. A model loaded to
 * generate or serve (nl_model_step, the serving engine) never gets one: m->train stays NULL and
 * such a model is its weights and shape only.
 *
 * A pointer rather than a struct passed to every forward/backward: the forward, the backward,
 * the linear hooks, MoE and every parallel layout already take the model, so the model keeps
 * that one handle (nl_model_forward(m, ...) is unchanged) while the weights part no longer
 * carries the buffers; the decode state (nanolm/infer.h), which several sequences have over one
 * model, is the one passed separately. The optimizer's moments are the trainer's
 * (nanolm/train.h). */
typedef struct nl_train_state {
    float *grads; /* same layout as params; NULL until nl_model_alloc_grads */
    /* activations (nl_model_alloc_acts) */
    int64_t B, T;   /* what acts is sized for (0 before nl_model_alloc_acts) */
    int64_t maxdim; /* widest matmul operand row: max(C, QKV, 2H, V) */
    float *acts_mem;
    size_t acts_floats;
    nl_acts a;
    /* bf16/fp16 matmuls (nl_model_set_precision) */
    float *params_lp; /* params rounded to the model's precision */
    float *lp_mem;    /* the two lp_scratch buffers (once the activations are sized) */
    size_t lp_floats;
    /* the last forward */
    int64_t B_cur, T_cur;            /* its shape */
    const int32_t *tokens, *targets; /* borrowed; valid until backward */
    float mean_loss;                 /* of the last forward with targets */
    float loss_scale;                /* dlogits are multiplied by this (fp16 loss scaling); 1 */
} nl_train_state;

/* The model: its shape, its weights (one flat allocation, read-only once loaded for inference)
 * and how its matmuls run; training state behind m->train (NULL until needed, above). */
typedef struct nl_model {
    nl_arch arch;
    int64_t C, L, NH, KVH, hd, H, V, QKV; /* QKV = (NH + 2 KVH) * hd */
    /* parameters */
    size_t n_params; /* floats */
    float *params;   /* one allocation */
    nl_weights w;
    nl_param_info *table; /* n_tensors entries, in memory order */
    int n_tensors;
    size_t *layer_offsets;      /* [L+1]: layer l spans [layer_offsets[l], layer_offsets[l+1]) */
    float *rope_cos, *rope_sin; /* (seq_len, hd/2) */
    /* how the matmuls run */
    nl_precision precision;    /* of matmul inputs (bf16/fp16: with the rounded copy in train) */
    nl_linear_ops *linear_ops; /* NULL: default path */
    /* context parallelism: the global position of each of the T columns of a batch (NULL:
     * 0..T-1), used by RoPE; and the attention replacement (NULL: nl_attention_*) */
    const int64_t *positions;
    nl_attn_ops *attn_ops;
    /* mixture of experts (nanolm/moe.h); NULL for a dense model */
    struct nl_moe *moe;
    /* a part of a model (nl_model_init_part): no embedding table (w.embed NULL) / no final norm
     * and classifier (w.rms_final, w.cls NULL); the forward and backward here need neither set */
    int no_embed, no_tail;
    /* NANOLM_STEP_PROFILE: the forward and backward mark their phases here (NULL: no profile) */
    struct nl_step_prof *prof;
    /* gradients, activations, low-precision copies; NULL for a model that only runs inference */
    nl_train_state *train;
} nl_model;

/* Builds a model for `arch` with parameters allocated (zeroed). Returns NL_ERR_INVALID for a bad
 * arch (MoE is not supported by the runtime), NL_ERR_NOMEM on allocation failure. */
nl_status nl_model_init(nl_model *m, const nl_arch *arch);
/* Like nl_model_init, but only the tensors a pipeline stage holds: the embedding table only when
 * with_embed, the final norm and classifier only when with_tail (the layers always). For a stage
 * or tensor-parallel shard, pass an arch whose n_layers / n_heads / n_kv_heads / hidden_dim are
 * the local ones (and head_dim set). Only the table, pointers, RoPE tables and parameters are
 * built; nl_model_forward/backward must not be called on a part without both. Errors as
 * nl_model_init. */
nl_status nl_model_init_part(nl_model *m, const nl_arch *arch, int with_embed, int with_tail);
/* Frees everything nl_model_* allocated; safe on a zeroed struct. */
void nl_model_free(nl_model *m);
/* GPT-2-style random initialisation: linear weights ~ N(0, 0.02), o_proj/down_proj scaled by
 * 1/sqrt(2L), norms = 1. Deterministic for a seed. */
void nl_model_init_random(nl_model *m, uint64_t seed);
/* Allocates (and zeroes) the gradient buffer m->train->grads (creating m->train). */
nl_status nl_model_alloc_grads(nl_model *m);
/* Sizes the activation buffer m->train->a for batches of up to (B, T) tokens, T <= seq_len
 * (creating m->train). Called once. */
nl_status nl_model_alloc_acts(nl_model *m, int64_t B, int64_t T);
/* Bytes of each buffer (exact, as allocated). */
size_t nl_model_param_bytes(const nl_model *m);
size_t nl_model_act_bytes(const nl_model *m); /* activations + bf16/fp16 scratch */
/* Bytes of the low-precision weight copy (bf16/fp16 emulation; 0 in fp32). */
size_t nl_model_lp_weight_bytes(const nl_model *m);

/* Parameter table: returns the number of tensors; *out points at the model's table. */
int nl_model_params_table(const nl_model *m, const nl_param_info **out);
/* Finds a tensor by its HF name; NULL if absent. */
const nl_param_info *nl_model_find_param(const nl_model *m, const char *name);

/* Sets matmul precision (allocates the low-precision weight copy in m->train for bf16/fp16). */
nl_status nl_model_set_precision(nl_model *m, nl_precision p);

/* Forward over tokens (B, T) (B, T <= the sizes of nl_model_alloc_acts) into m->train->a. When
 * targets is not NULL computes per-token cross-entropy and returns the mean in *loss (may be
 * NULL). Tokens outside [0, V) give NL_ERR_INVALID naming the index; a model without activations
 * NL_ERR_INVALID. */
nl_status nl_model_forward(nl_model *m, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T,
                           float *loss);
/* Backward of the last forward (which must have had targets): adds (+=) d(mean loss)/d(param)
 * times m->train->loss_scale into m->train->grads. */
nl_status nl_model_backward(nl_model *m);
/* Zeroes m->train->grads (nothing without them). */
void nl_model_zero_grad(nl_model *m);

/* Decoding one token at a time with a KV cache (nl_decode_state, nl_model_step): nanolm/infer.h. */

/* ---- layer kernels (src/model/layers.c; shapes and argument order as in llm.c) -------------------
 * The operations every NanoLM forward is built from, on plain arrays: nl_model_forward/backward,
 * the decode step (nanolm/infer.h), the pipeline stage (parallel/pipeline.c), the serving runner
 * (serve/runner.c) and the machine probe call these same functions, so each computes the bits
 * the others do. Outputs first; backward accumulates (+=) into parameter gradients. */
/* out (N, C) = x / sqrt(mean(x^2) + eps) * w; rstd (N) saved for backward. */
void nl_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int64_t N, int64_t C, float eps);
/* dx (N, C) += d/dx, dw (C) += d/dw from dout (N, C), the forward input x and its rstd. */
void nl_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                         int64_t N, int64_t C);
/* RoPE on (B, T, nh, hd) rows with row stride `stride` floats, pair (2i, 2i+1) of a head at
 * position t rotated by cos_t/sin_t (T, hd/2); inverse=1 rotates backwards. */
void nl_rope_apply(float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T, int64_t nh, int64_t hd,
                   int64_t stride, int inverse);
/* RoPE on one row of nh heads of size hd at one position (cos_t/sin_t: that position's hd/2
 * entries), on the calling thread: nl_rope_apply's arithmetic without a parallel region. */
void nl_rope_row(float *row, const float *cos_t, const float *sin_t, int64_t nh, int64_t hd, int inverse);
/* Causal grouped-query attention: qkv (B, T, (NH+2KVH)*hd) rows [q | k | v] (q, k rotated),
 * query head h reads kv head h / (NH/KVH); out (B, T, NH*hd), att (B, NH, T, T) the softmax
 * probabilities (row t: columns 0..t). */
void nl_attention_forward(float *out, float *att, const float *qkv, int64_t B, int64_t T, int64_t NH, int64_t KVH,
                          int64_t hd);
/* dqkv (B, T, QKV) = d/dqkv (overwritten) from dout (B, T, NH*hd); datt (B, NH, T, T) scratch. */
void nl_attention_backward(float *dqkv, float *datt, const float *dout, const float *att, const float *qkv, int64_t B,
                           int64_t T, int64_t NH, int64_t KVH, int64_t hd);
/* x (N, D) += bias (D) on every row. */
void nl_add_bias(float *x, const float *bias, int64_t N, int64_t D);
/* h13 (N, 2H) rows [gate | up]; out (N, H) = silu(gate) * up. */
void nl_swiglu_forward(float *out, const float *h13, int64_t N, int64_t H);
/* dh13 (N, 2H) = d/dh13 (overwritten) from dout (N, H). */
void nl_swiglu_backward(float *dh13, const float *dout, const float *h13, int64_t N, int64_t H);

#ifdef __cplusplus
}
#endif
#endif
