/* Memory budgets: bytes per parameter by recipe and ZeRO stage, activations per layer. */
#include "nanolm/plan.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static const nl_recipe recipes[] = {
    /* Plain fp32 with Adam: weights 4, grads 4, moments m and v 4 + 4. */
    {"fp32", 4, 4, 8, "fp32 weights, grads, Adam m and v (Kingma & Ba 2015)"},
    /* Mixed precision (Micikevicius et al. 2018; ZeRO, Rajbhandari et al. 2020 sec. 3.1):
     * bf16 weights 2 + bf16 grads 2 + fp32 master 4 + m 4 + v 4 = 16 ("K = 12"). */
    {"bf16", 2, 2, 12, "mixed precision, ZeRO paper sec. 3.1: 2 + 2 + 12"},
    /* FP8 GEMMs with Transformer Engine: bf16 weights 2 plus a cached fp8 copy 1, bf16 grads 2,
     * fp32 master and moments 12 (Micikevicius et al. 2022, FP8 Formats; NVIDIA TE docs). */
    {"fp8", 3, 2, 12, "FP8 GEMMs, bf16 weights + fp8 copy, fp32 master/Adam"},
    /* DeepSeek-V3 (2024) sec. 3.3.2: bf16 Adam moments, fp32 master weights and gradient
     * accumulation, bf16 weights: 2 + 4 + (4 + 2 + 2) = 14. */
    {"fp8-ds3", 2, 4, 8, "DeepSeek-V3 sec. 3.3.2: bf16 moments, fp32 master and grads"},
    /* Megatron-LM (docs/source/distrib_optimizer.md): bf16 weights 2, fp32 main gradients 4,
     * fp32 master weights and Adam moments 12 = 18 bytes; its distributed optimizer shards the
     * 12 over the data-parallel ranks (6 + 12/d): select it with ZeRO stage 1. */
    {"megatron-bf16", 2, 4, 12, "Megatron-LM distributed optimizer docs: 18 bytes, 6 + 12/d sharded"},
};

nl_status nl_plan_recipe(const char *name, nl_recipe *out) {
    for (size_t i = 0; i < sizeof recipes / sizeof recipes[0]; i++)
        if (!strcmp(recipes[i].name, name)) {
            *out = recipes[i];
            return NL_OK;
        }
    return nl_fail(NL_ERR_INVALID, "unknown recipe '%s' (known: fp32, bf16, fp8, fp8-ds3, megatron-bf16)", name);
}

/* Families: Llama (Touvron et al. 2023), GPT-3 (Brown et al. 2020; Megatron-LM's GPT: learned
 * positions, LayerNorm and linear biases, dropout 0.1), OPT (Zhang et al. 2022: GPT-3 with
 * ReLU, dropout 0.1), BLOOM (Le Scao et al. 2022: ALiBi, biases, no dropout in the 176B run),
 * MPT (MosaicML 2023: ALiBi, LayerNorm without bias, no biases, no dropout). */
static const nl_family families[] = {
    {"llama", 0, 0, 0, 0, NL_POS_ROPE},  {"gpt", 1, 1, 1, 1, NL_POS_LEARNED}, {"opt", 1, 1, 1, 1, NL_POS_LEARNED},
    {"bloom", 1, 1, 1, 0, NL_POS_ALIBI}, {"mpt", 1, 1, 0, 0, NL_POS_ALIBI},
};

nl_status nl_plan_family(const char *name, nl_family *out) {
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (!strcmp(families[i].name, name)) {
            *out = families[i];
            return NL_OK;
        }
    return nl_fail(NL_ERR_INVALID, "unknown model family '%s' (known: llama, gpt, opt, bloom, mpt)", name);
}

const char *nl_zero_name(nl_zero z) {
    static const char *n[] = {"ddp", "zero1", "zero2", "zero3", "hsdp"};
    return (unsigned)z < 5 ? n[z] : "?";
}

const char *nl_recompute_name(nl_recompute r) {
    static const char *n[] = {"none", "selective", "full"};
    return (unsigned)r < 3 ? n[r] : "?";
}

int nl_zero_parse(const char *s) {
    if (!strcasecmp(s, "0") || !strcasecmp(s, "ddp")) return NL_ZERO_0;
    if (!strcasecmp(s, "1") || !strcasecmp(s, "zero1")) return NL_ZERO_1;
    if (!strcasecmp(s, "2") || !strcasecmp(s, "zero2")) return NL_ZERO_2;
    if (!strcasecmp(s, "3") || !strcasecmp(s, "zero3") || !strcasecmp(s, "fsdp")) return NL_ZERO_3;
    if (!strcasecmp(s, "hsdp")) return NL_ZERO_HSDP;
    return -1;
}

int nl_recompute_parse(const char *s) {
    if (!strcasecmp(s, "none")) return NL_RECOMPUTE_NONE;
    if (!strcasecmp(s, "selective")) return NL_RECOMPUTE_SELECTIVE;
    if (!strcasecmp(s, "full")) return NL_RECOMPUTE_FULL;
    return -1;
}

/* ZeRO (Rajbhandari et al. 2020, Figure 1): stage 1 shards the optimizer states, stage 2 also
 * the gradients, stage 3 also the weights (PyTorch FSDP FULL_SHARD). HSDP = stage 3 inside a
 * shard group, replicated across groups (FSDP HYBRID_SHARD). */
void nl_plan_state_bytes(const nl_recipe *r, nl_zero z, int64_t dp, int64_t shard, nl_state_bytes *o) {
    double d = dp > 0 ? (double)dp : 1.0;
    double s = shard > 0 ? (double)shard : d;
    o->weights = r->weight_bytes;
    o->grads = r->grad_bytes;
    o->optim = r->optim_bytes;
    switch (z) {
    case NL_ZERO_0: break;
    case NL_ZERO_1: o->optim /= d; break;
    case NL_ZERO_2:
        o->optim /= d;
        o->grads /= d;
        break;
    case NL_ZERO_3:
        o->optim /= d;
        o->grads /= d;
        o->weights /= d;
        break;
    case NL_ZERO_HSDP:
        o->optim /= s;
        o->grads /= s;
        o->weights /= s;
        break;
    }
    o->total = o->weights + o->grads + o->optim;
}

/* ---- activations ---------------------------------------------------------------------------
 * Korthikanti et al. 2022 sec. 4.1 list, per layer, the tensors a transformer keeps for
 * backward (fp16/bf16, 2 bytes; masks 1 byte), in units of s*b*h:
 *   attention 11 sbh + 5 a s^2 b: QKV input 2, Q and K 4, softmax output 2 a s/h, its dropout
 *             mask a s/h, dropout output 2 a s/h (input of the product with V), V 2, input of
 *             the output projection 2, the attention dropout mask 1;
 *   MLP 19 sbh: input of the first linear 2, GeLU input 8, GeLU output 8, dropout mask 1;
 *   LayerNorm 4 sbh: each of the two keeps its input 2.
 * = sbh (34 + 5 a s / h). With tensor parallelism (no SP) the LayerNorm inputs, the QKV and fc1
 * inputs and both dropout masks stay replicated: sbh (10 + 24/t + 5as/(ht)) (their eq. 2); with
 * sequence parallelism everything divides by t (eq. 4); selective recomputation drops the
 * 5as/h terms (eq. 6); full recomputation keeps the layer input, 2 sbh (2 sbh/t with SP).
 * The same walk for a Llama layer (RMSNorm, RoPE, GQA, SwiGLU, no dropout): the two norm
 * inputs (2D each) and the QKV and w1/w3 inputs (2D each, the norm outputs), Q and K after RoPE
 * and V (2(q + 2 kv)), the softmax output without flash attention (2 a s) or its fp32
 * log-sum-exp with it (4 a), the wo input (2q), the gate and up outputs (2 x 2F: the fused SwiGLU
 * keeps its inputs and recomputes sigmoid and SiLU in backward, as Megatron-LM's bias_swiglu
 * does) and the w2 input (2F). For Llama-3-8B (q = D, kv = D/4, F = 3.5 D) that is 2 x 17 D =
 * 34 D bytes per token: 139 KB per layer. The GPT walk takes the same tensors with the GeLU MLP
 * (GeLU input and output, 2F each) and the dropout masks when the family has dropout. */
static void add(nl_act_layer *L, const char *name, double unsharded, double div) {
    if (L->n >= NL_ACT_MAX_TERMS) return;
    nl_act_term *t = &L->terms[L->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->unsharded = unsharded;
    t->bytes = unsharded / div;
}

/* DeepSeek-V3's selective recipe (DeepSeek-AI 2024, sec. 3.3.2 "Recomputation of RMSNorm and
 * MLA Up-Projection" and sec. 3.3.3 "Low-Precision Storage"): the RMSNorm outputs and the MLA
 * up-projections (per-head Q, K, V) are recomputed in backward, so a layer keeps the norm
 * inputs (bf16), the q and kv latents (inputs of the up-projections, cached in FP8), the
 * attention output (input of the output projection, in their E5M6: 1.5 bytes), the inputs of
 * the expert linears (FP8, one copy per routed expert the token visits) and the SwiGLU inputs
 * (FP8; its output is recomputed). F is the layer-average MLP width per token. */
static void act_ds3(const nl_arch *a, const nl_act_opts *o, double F, double moe_frac, nl_act_layer *L) {
    double t = o->tp > 0 ? (double)o->tp : 1.0, sp = o->sp ? t : 1.0;
    double D = (double)a->dim, heads = (double)a->n_heads, hd = (double)nl_arch_head_dim(a);
    add(L, "attn norm input (bf16)", 2.0 * D, sp);
    if (a->kv_lora_rank > 0) {
        add(L, "q, kv latents (fp8; up-proj recomputed)",
            (double)(a->q_lora_rank + a->kv_lora_rank + a->qk_rope_head_dim), 1.0);
        add(L, "attention output (wo input, E5M6)", 1.5 * heads * (double)a->v_head_dim, t);
    } else {
        add(L, "Q, K, V (fp8)", heads * hd + 2.0 * (double)a->n_kv_heads * hd, t);
        add(L, "attention output (wo input, E5M6)", 1.5 * heads * hd, t);
    }
    add(L, "softmax log-sum-exp (fp32)", 4.0 * heads, t);
    add(L, "mlp norm input (bf16)", 2.0 * D, sp);
    double copies = moe_frac * (double)(a->top_k + a->n_shared_experts) + (1 - moe_frac);
    add(L, "expert inputs (fp8, one per expert)", copies * D, 1.0);
    add(L, "SwiGLU inputs (fp8)", 2.0 * F, t);
    if (moe_frac > 0) add(L, "router logits (fp32)", 4.0 * (double)a->n_experts * moe_frac, 1.0);
}

void nl_plan_act_layer(const nl_arch *a, const nl_act_opts *o, nl_act_layer *L) {
    memset(L, 0, sizeof *L);
    double e = o->bytes_per_elem > 0 ? o->bytes_per_elem : 2.0;
    double t = o->tp > 0 ? (double)o->tp : 1.0;
    double sp = o->sp ? t : 1.0;
    const nl_family *f = &o->fam;
    double D = (double)a->dim, hd = (double)nl_arch_head_dim(a);
    double q = (double)a->n_heads * hd, kv = (double)a->n_kv_heads * hd, heads = (double)a->n_heads;
    /* K and V heads shard by tp up to the number of KV heads, then replicate. */
    double kvdiv = t < (double)a->n_kv_heads ? t : (double)a->n_kv_heads;
    if (a->kv_lora_rank > 0) { /* MLA: kept q (nope+rope), per-head k (nope+rope) and v */
        q = heads * (hd + (double)a->qk_rope_head_dim);
        kv = heads * (hd + (double)a->qk_rope_head_dim + (double)a->v_head_dim) / 2.0;
        kvdiv = t;
    }
    /* MLP width per token: dense layers use hidden_dim, MoE layers (top_k + shared) experts;
     * average over the layers. */
    double moe_layers = a->n_experts > 0 ? (double)(a->n_layers - a->first_moe_layer) : 0.0;
    double dense_layers = (double)a->n_layers - moe_layers;
    double F = (dense_layers * (double)a->hidden_dim +
                moe_layers * (double)(a->top_k + a->n_shared_experts) * (double)a->expert_hidden_dim) /
               (double)a->n_layers;
    if (o->fp8_cache == NL_FP8_CACHE_DS3 && o->recompute == NL_RECOMPUTE_SELECTIVE) {
        act_ds3(a, o, F, moe_layers / (double)a->n_layers, L);
        for (int i = 0; i < L->n; i++) L->bytes_per_token += L->terms[i].bytes;
        /* While a layer is recomputed its full bf16 set is live, as without the recipe. */
        nl_act_opts full = *o;
        full.fp8_cache = 0;
        nl_act_layer W;
        nl_plan_act_layer(a, &full, &W);
        L->working_bytes_per_token = W.working_bytes_per_token;
        return;
    }
    double mask = f->dropout ? 1.0 : 0.0; /* bytes per element of a dropout mask */
    /* Transformer Engine's FP8 linears keep the FP8 cast of their input for the weight-gradient
     * GEMM, not the bf16 tensor (transformer_engine/pytorch/module/linear.py, _Linear.forward:
     * "if fp8 ...: saved_inputmat = inputmat", the quantized input; LayerNormLinear saves its
     * FP8 norm output likewise): the qkv, fc1 and fc2 inputs take 1 byte. The attention output
     * stays in bf16 for the attention kernel's own backward (FlashAttention keeps O), so the
     * output projection adds its 1-byte copy to it. */
    double g = o->fp8_cache == NL_FP8_CACHE_TE ? 1.0 : e; /* a GEMM input as the linear keeps it */
    double wo = o->fp8_cache == NL_FP8_CACHE_TE ? e + 1.0 : e;
    int keep_scores = o->recompute == NL_RECOMPUTE_NONE && !o->flash;

    add(L, "attn norm input", e * D, sp);
    add(L, "qkv input (norm output)", g * D, sp);
    add(L, "Q and K (after RoPE)", e * q + e * kv, 1.0);
    L->terms[L->n - 1].bytes = e * q / t + e * kv / kvdiv;
    add(L, "V", e * kv, kvdiv);
    if (keep_scores) {
        add(L, "softmax output (a*s)", e * heads * o->seq, t);
        if (mask > 0) {
            add(L, "softmax dropout mask (a*s)", mask * heads * o->seq, t);
            add(L, "softmax dropout output (a*s)", e * heads * o->seq, t);
        }
    } else if (o->flash && o->recompute != NL_RECOMPUTE_FULL) {
        add(L, "softmax log-sum-exp (fp32)", 4.0 * heads, t);
    }
    add(L, "wo input (attention output)", wo * q, t);
    if (mask > 0) add(L, "attention dropout mask", mask * D, sp);
    add(L, "mlp norm input", e * D, sp);
    add(L, "fc1 input (norm output)", g * D, sp);
    if (f->gelu_mlp) {
        add(L, "GeLU input (fc1 output)", e * F, t);
        add(L, "GeLU output (fc2 input)", g * F, t);
    } else {
        add(L, "gate and up (w1, w3 outputs)", e * 2 * F, t);
        add(L, "SwiGLU output (w2 input)", g * F, t);
    }
    if (mask > 0) add(L, "mlp dropout mask", mask * D, sp);
    if (moe_layers > 0)
        add(L, "router logits (fp32)", 4.0 * (double)a->n_experts * moe_layers / (double)a->n_layers, 1.0);
    double sum = 0;
    for (int i = 0; i < L->n; i++) sum += L->terms[i].bytes;
    /* Working set of one layer while it is (re)computed: everything, and the scores (without
     * flash attention) that selective recomputation rebuilds. */
    double work = sum;
    if (!keep_scores && !o->flash) work += (e * 2 + mask) * heads * o->seq / t;
    if (o->recompute == NL_RECOMPUTE_FULL) {
        /* Full recomputation (Chen et al. 2016; Korthikanti sec. 4.3) keeps only the layer input,
         * 1/t of it per rank when the checkpoints are distributed over the tp ranks
         * (Megatron-LM's --distribute-saved-activations). */
        memset(L->terms, 0, sizeof L->terms);
        L->n = 0;
        add(L, "layer input (checkpoint)", e * D, o->distribute_saved ? t : sp);
        sum = L->terms[0].bytes;
    }
    L->bytes_per_token = sum;
    L->working_bytes_per_token = work;
}

double nl_plan_act_korthikanti(const nl_arch *a, double seq, nl_recompute r, int flash, int64_t tp, int sp) {
    double h = (double)a->dim, heads = (double)a->n_heads, t = tp > 1 ? (double)tp : 1.0;
    double scores = (r == NL_RECOMPUTE_SELECTIVE || flash) ? 0.0 : 5.0 * heads * seq / h;
    if (r == NL_RECOMPUTE_FULL) return 2.0 * h; /* Table 2: 2sbh */
    if (sp) return h / t * (34.0 + scores);     /* eq. 4 (and 6) */
    return h * (10.0 + 24.0 / t + scores / t);  /* eq. 2 (t = 1: eq. 1) */
}

/* bf16 logits (V per token) and the fp32 copy the cross-entropy works on. */
double nl_plan_logits_bytes(const nl_arch *a, double tokens) { return tokens * (double)a->vocab_size * (2.0 + 4.0); }
