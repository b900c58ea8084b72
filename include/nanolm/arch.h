/*
 * The shape of a decoder-only transformer (Llama family: RMSNorm, RoPE, GQA, SwiGLU),
 * optionally with mixture-of-experts MLPs. One struct, two users: the runtime (model/) builds
 * NanoLM from it and the planner (plan/) prices it, so a prediction can be checked against a
 * real run.
 */
#ifndef NANOLM_ARCH_H
#define NANOLM_ARCH_H

#include <stddef.h>
#include <stdint.h>
#include "nanolm/base.h"

typedef struct nl_arch {
    char name[64];
    int64_t vocab_size;
    int64_t dim; /* d_model */
    int64_t n_layers;
    int64_t n_heads;
    int64_t n_kv_heads;  /* = n_heads without GQA */
    int64_t hidden_dim;  /* SwiGLU inner size of the dense MLP */
    int64_t seq_len;     /* maximum context */
    double rope_theta;   /* 10000 for Llama-2, 500000 for Llama-3 */
    double norm_eps;     /* RMSNorm epsilon */
    int tied_embeddings; /* 1: the classifier shares the token embedding */
    /* Mixture of experts (n_experts == 0: dense). Layers with index >= first_moe_layer use
     * MoE MLPs; the first ones stay dense (DeepSeek-V3 keeps 3 dense layers). */
    int64_t n_experts;         /* routed experts per MoE layer */
    int64_t n_shared_experts;  /* always-on experts per MoE layer */
    int64_t top_k;             /* routed experts per token */
    int64_t expert_hidden_dim; /* SwiGLU inner size of one expert */
    int64_t first_moe_layer;
    /* Attention variant the planner prices; the runtime implements standard GQA only. */
    int64_t head_dim; /* 0 = dim / n_heads (with MLA: the no-RoPE part of a q/k head) */
    /* Multi-head latent attention (DeepSeek-V2/V3; kv_lora_rank == 0: standard GQA). The
     * runtime does not implement it; the planner prices it (parameters, KV cache). */
    int64_t q_lora_rank;      /* 0 = queries projected directly */
    int64_t kv_lora_rank;     /* compressed KV size cached per token and layer */
    int64_t qk_rope_head_dim; /* RoPE part of a q/k head (shared across heads for k) */
    int64_t v_head_dim;       /* value head size */
    /* Hugging Face families (nanolm/hf.h). qkv_bias: q/k/v projections carry a bias (Qwen2).
     * rope_scaling_factor > 0: Llama 3's RoPE frequency scaling ("rope_type": "llama3"):
     * wavelengths above original_max_pos / low_freq_factor are divided by the factor, those
     * below original_max_pos / high_freq_factor are kept, and the band between is blended
     * (transformers' _compute_llama3_parameters). 0 = plain RoPE. */
    int qkv_bias;
    double rope_scaling_factor;
    double rope_low_freq_factor;
    double rope_high_freq_factor;
    int64_t rope_original_max_pos;
} nl_arch;

/* Head size (dim / n_heads unless head_dim is set). */
int64_t nl_arch_head_dim(const nl_arch *a);
/* Inverse frequency of RoPE pair i (0 <= i < head_dim/2): rope_theta^(-2i/hd), then Llama 3's
 * scaling when rope_scaling_factor > 0. In double, as the runtime builds its tables. */
double nl_arch_rope_inv_freq(const nl_arch *a, int64_t i);
/* Checks the shape is consistent (positive sizes, heads divide, kv heads divide heads, ...).
 * Returns NL_ERR_INVALID with a message naming the field. */
nl_status nl_arch_validate(const nl_arch *a);

/* Parameter counts (exact, as the runtime allocates them). */
typedef struct nl_arch_params {
    int64_t embedding;   /* vocab * dim */
    int64_t classifier;  /* vocab * dim, 0 when tied */
    int64_t attention;   /* all layers: wq, wk, wv, wo */
    int64_t mlp_dense;   /* all dense layers: w1, w2, w3 */
    int64_t mlp_experts; /* all routed experts of all MoE layers */
    int64_t mlp_shared;  /* all shared experts */
    int64_t router;      /* all routers: dim * n_experts per MoE layer */
    int64_t norms;       /* 2 per layer + final, dim each */
    int64_t total;
    int64_t non_embedding; /* total - embedding - classifier (Kaplan/Chinchilla-style N) */
    int64_t active;        /* parameters used per token (top_k + shared experts only) */
} nl_arch_params;
/* Counts are exact up to NL_ARCH_MAX_PARAMS (which nl_arch_validate enforces for the total) and
 * clamped, never overflowed, past it. */
void nl_arch_count_params(const nl_arch *a, nl_arch_params *out);
#define NL_ARCH_MAX_PARAMS ((int64_t)1 << 53)

/* The arch as one-line JSON (every field, MoE included), as checkpoints store it in their
 * metadata. Returns a malloc'd string (free with free()) or NULL when out of memory. */
char *nl_arch_to_json(const nl_arch *a);
/* Parses nl_arch_to_json's output. `what` names the source in messages (a file). Missing
 * optional fields take Llama defaults; sizes must be integers in [0, 2^40]. The result is
 * validated. Errors: NL_ERR_FORMAT naming the file and the field. */
nl_status nl_arch_from_json(const char *what, const char *json, nl_arch *a);

/* Built-in NanoLM presets: "stories260k", "shakespeare-char", "small". */
nl_status nl_arch_preset(const char *name, nl_arch *out);
/* sizeof(nl_arch) and offsetof(nl_arch, rope_original_max_pos): bindings that mirror the struct
 * (python/nanolm) check their copy against these at load time. */
size_t nl_arch_sizeof(void);
size_t nl_arch_last_offset(void);
/* NULL-terminated list of preset names. */
const char *const *nl_arch_preset_names(void);

/* Sizes that replace a shape's own (`--dim`, `--layers`, ... of parallel train and moe train):
 * a field left at 0 (shared_experts: below 0) keeps the shape's. heads sets the KV heads too,
 * unless kv_heads is given. */
typedef struct nl_arch_override {
    int64_t dim, layers, heads, kv_heads, hidden;
    int64_t experts, top_k, shared_experts, expert_hidden;
} nl_arch_override;
void nl_arch_override_apply(const nl_arch_override *o, nl_arch *a);

#endif
