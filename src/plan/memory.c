/* Memory budgets: bytes per parameter by recipe and ZeRO stage, activations per layer. */
#include "nanolm/plan.h"

#include <stdio.h>
#include <string.h>

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
};

nl_status nl_plan_recipe(const char *name, nl_recipe *out) {
    for (size_t i = 0; i < sizeof recipes / sizeof recipes[0]; i++)
        if (!strcmp(recipes[i].name, name)) { *out = recipes[i]; return NL_OK; }
    return nl_fail(NL_ERR_INVALID, "unknown recipe '%s' (known: fp32, bf16, fp8, fp8-ds3)", name);
}

const char *nl_zero_name(nl_zero z) {
    static const char *n[] = {"ddp", "zero1", "zero2", "zero3", "hsdp"};
    return (unsigned)z < 5 ? n[z] : "?";
}

const char *nl_recompute_name(nl_recompute r) {
    static const char *n[] = {"none", "selective", "full"};
    return (unsigned)r < 3 ? n[r] : "?";
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
    case NL_ZERO_2: o->optim /= d; o->grads /= d; break;
    case NL_ZERO_3: o->optim /= d; o->grads /= d; o->weights /= d; break;
    case NL_ZERO_HSDP: o->optim /= s; o->grads /= s; o->weights /= s; break;
    }
    o->total = o->weights + o->grads + o->optim;
}

/* ---- activations ---------------------------------------------------------------------------
 * Korthikanti et al. 2022 sec. 4.1 list, per layer, the tensors a transformer keeps for
 * backward: 34*s*b*h + 5*a*s^2*b bytes for GPT (fp16, dropout, 4h GeLU MLP). The same walk
 * for a Llama layer (RMSNorm, RoPE, GQA, SwiGLU, no dropout), in bf16:
 *   attention: RMSNorm input x (D), its output = input of wq/wk/wv (D), Q and K after RoPE and
 *              V (q_dim + 2 kv_dim, kept by the attention kernel), the attention output = input
 *              of wo (q_dim), and with flash attention the softmax log-sum-exp (fp32, one per
 *              head); without it the softmax probabilities (a*s per token).
 *   MLP:       RMSNorm input (D) and output = input of w1/w3 (D), gate = x W1 (F),
 *              sigmoid(gate) (F) and silu = gate*sigmoid(gate) (F) when SiLU runs as two
 *              element-wise ops, up = x W3 (F), silu*up = input of w2 (F).
 * That is 6D + 2kv + 5F values = 48*D bytes for Llama-3-8B (kv = D/4, F = 3.5D): the course's
 * 384 GiB at 8 x 8192 tokens and 32 layers. With tensor parallelism everything inside the
 * column/row-parallel region divides by tp; the norm regions (4D) stay replicated unless
 * sequence parallelism shards them too (Korthikanti eq. 3 vs eq. 4). */
static void add(nl_act_layer *L, const char *name, double unsharded, double div) {
    if (L->n >= NL_ACT_MAX_TERMS) return;
    nl_act_term *t = &L->terms[L->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->unsharded = unsharded;
    t->bytes = unsharded / div;
}

void nl_plan_act_layer(const nl_arch *a, const nl_act_opts *o, nl_act_layer *L) {
    memset(L, 0, sizeof *L);
    double e = o->bytes_per_elem > 0 ? o->bytes_per_elem : 2.0;
    double t = o->tp > 0 ? (double)o->tp : 1.0;
    double sp = o->sp ? t : 1.0;
    double D = (double)a->dim, hd = (double)nl_arch_head_dim(a);
    double q = (double)a->n_heads * hd, kv = (double)a->n_kv_heads * hd, heads = (double)a->n_heads;
    double kvdiv = t < (double)a->n_kv_heads ? t : (double)a->n_kv_heads;
    if (a->kv_lora_rank > 0) { /* MLA: kept q (nope+rope), latent kv + k_rope, per-head k/v */
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

    add(L, "attn norm input x", e * D, sp);
    add(L, "attn norm output (qkv input)", e * D, sp);
    add(L, "Q after RoPE", e * q, t);
    add(L, "K after RoPE, V", e * 2 * kv, kvdiv);
    if (o->flash) add(L, "softmax log-sum-exp (fp32)", 4.0 * heads, t);
    else if (o->recompute == NL_RECOMPUTE_NONE)
        add(L, "softmax probabilities (a*s)", e * heads * o->seq, t);
    add(L, "attention output (wo input)", e * q, t);
    add(L, "mlp norm input", e * D, sp);
    add(L, "mlp norm output (w1/w3 input)", e * D, sp);
    add(L, "gate = x W1", e * F, t);
    add(L, "up = x W3", e * F, t);
    double keep_sum = 0;
    for (int i = 0; i < L->n; i++) keep_sum += L->terms[i].bytes;
    if (o->recompute == NL_RECOMPUTE_NONE) {
        add(L, "sigmoid(gate)", e * F, t);
        add(L, "silu(gate)", e * F, t);
        add(L, "silu * up (w2 input)", e * F, t);
    }
    if (moe_layers > 0) add(L, "router logits (fp32)", 4.0 * (double)a->n_experts * moe_layers / (double)a->n_layers, 1.0);
    double sum = 0;
    for (int i = 0; i < L->n; i++) sum += L->terms[i].bytes;
    /* Working set of one layer while it is (re)computed: everything, scores only without flash. */
    double work = sum;
    if (o->recompute != NL_RECOMPUTE_NONE) work += 3 * e * F / t + (o->flash ? 0 : e * heads * o->seq / t);
    (void)keep_sum;
    if (o->recompute == NL_RECOMPUTE_FULL) {
        /* Full recomputation (Chen et al. 2016; Korthikanti sec. 4.3) keeps only the layer input. */
        memset(L->terms, 0, sizeof L->terms);
        L->n = 0;
        add(L, "layer input (checkpoint)", e * D, sp);
        sum = L->terms[0].bytes;
    }
    L->bytes_per_token = sum;
    L->working_bytes_per_token = work;
}

double nl_plan_act_korthikanti(const nl_arch *a, double seq, nl_recompute r, int flash) {
    double h = (double)a->dim, heads = (double)a->n_heads;
    if (r == NL_RECOMPUTE_FULL) return 2.0 * h;
    if (r == NL_RECOMPUTE_SELECTIVE || flash) return 34.0 * h;
    return h * (34.0 + 5.0 * heads * seq / h);
}

/* bf16 logits (V per token) and the fp32 copy the cross-entropy works on. */
double nl_plan_logits_bytes(const nl_arch *a, double tokens) {
    return tokens * (double)a->vocab_size * (2.0 + 4.0);
}
