/* Transformer shapes: validation, exact parameter counts, NanoLM presets. */
#include "nanolm/arch.h"

#include <string.h>

int64_t nl_arch_head_dim(const nl_arch *a) {
    return a->head_dim > 0 ? a->head_dim : (a->n_heads > 0 ? a->dim / a->n_heads : 0);
}

nl_status nl_arch_validate(const nl_arch *a) {
#define POS(f) if (a->f <= 0) return nl_fail(NL_ERR_INVALID, "arch %s: " #f " must be positive, got %lld", a->name, (long long)a->f)
    POS(vocab_size); POS(dim); POS(n_layers); POS(n_heads); POS(n_kv_heads); POS(seq_len);
#undef POS
    if (a->head_dim <= 0 && a->dim % a->n_heads)
        return nl_fail(NL_ERR_INVALID, "arch %s: dim %lld is not a multiple of n_heads %lld", a->name,
                       (long long)a->dim, (long long)a->n_heads);
    if (a->n_heads % a->n_kv_heads)
        return nl_fail(NL_ERR_INVALID, "arch %s: n_heads %lld is not a multiple of n_kv_heads %lld",
                       a->name, (long long)a->n_heads, (long long)a->n_kv_heads);
    if (nl_arch_head_dim(a) % 2)
        return nl_fail(NL_ERR_INVALID, "arch %s: head size %lld must be even for RoPE", a->name,
                       (long long)nl_arch_head_dim(a));
    if (a->n_experts < 0 || a->n_shared_experts < 0 || a->top_k < 0)
        return nl_fail(NL_ERR_INVALID, "arch %s: negative expert counts", a->name);
    if (a->n_experts > 0 && (a->top_k < 1 || a->top_k > a->n_experts || a->expert_hidden_dim <= 0))
        return nl_fail(NL_ERR_INVALID, "arch %s: MoE needs 1 <= top_k <= n_experts and expert_hidden_dim > 0",
                       a->name);
    if (a->hidden_dim <= 0 && (a->n_experts == 0 || a->first_moe_layer > 0))
        return nl_fail(NL_ERR_INVALID, "arch %s: hidden_dim must be positive for dense layers", a->name);
    return NL_OK;
}

void nl_arch_count_params(const nl_arch *a, nl_arch_params *p) {
    memset(p, 0, sizeof *p);
    int64_t hd = nl_arch_head_dim(a);
    int64_t q = a->n_heads * hd, kv = a->n_kv_heads * hd;
    int64_t moe_layers = 0;
    if (a->n_experts > 0) {
        moe_layers = a->n_layers - a->first_moe_layer;
        if (moe_layers < 0) moe_layers = 0;
    }
    int64_t dense_layers = a->n_layers - moe_layers;
    p->embedding = a->vocab_size * a->dim;
    p->classifier = a->tied_embeddings ? 0 : a->vocab_size * a->dim;
    if (a->kv_lora_rank > 0) {
        /* MLA (DeepSeek-V2 sec. 2.1): q = W_qb·norm(W_qa x) (or W_q x), [c_kv, k_rope] = W_kva x,
         * [k_nope, v] = W_kvb·norm(c_kv), out = W_o v; the two low-rank norms count here. */
        int64_t qk = hd + a->qk_rope_head_dim;
        int64_t wq = a->q_lora_rank > 0
                         ? a->dim * a->q_lora_rank + a->q_lora_rank + a->q_lora_rank * a->n_heads * qk
                         : a->dim * a->n_heads * qk;
        int64_t wkv = a->dim * (a->kv_lora_rank + a->qk_rope_head_dim) + a->kv_lora_rank +
                      a->kv_lora_rank * a->n_heads * (hd + a->v_head_dim);
        p->attention = a->n_layers * (wq + wkv + a->n_heads * a->v_head_dim * a->dim);
    } else {
        p->attention = a->n_layers * (a->dim * q + 2 * a->dim * kv + q * a->dim);
    }
    p->mlp_dense = dense_layers * 3 * a->dim * a->hidden_dim;
    int64_t expert = 3 * a->dim * a->expert_hidden_dim;
    p->mlp_experts = moe_layers * a->n_experts * expert;
    p->mlp_shared = moe_layers * a->n_shared_experts * expert;
    p->router = moe_layers * a->dim * a->n_experts;
    p->norms = (2 * a->n_layers + 1) * a->dim;
    p->total = p->embedding + p->classifier + p->attention + p->mlp_dense + p->mlp_experts +
               p->mlp_shared + p->router + p->norms;
    p->non_embedding = p->total - p->embedding - p->classifier;
    p->active = p->total - p->mlp_experts + moe_layers * a->top_k * expert;
}

static const nl_arch presets[] = {
    /* llama2.c's stories260K (tinyllamas): the shape of ../shared/data/stories260K. */
    {.name = "stories260k", .vocab_size = 512, .dim = 64, .n_layers = 5, .n_heads = 8,
     .n_kv_heads = 4, .hidden_dim = 172, .seq_len = 512, .rope_theta = 10000.0,
     .norm_eps = 1e-5, .tied_embeddings = 1},
    /* nanoGPT's CPU example size, byte-level vocabulary. */
    {.name = "shakespeare-char", .vocab_size = 256, .dim = 128, .n_layers = 4, .n_heads = 4,
     .n_kv_heads = 4, .hidden_dim = 352, .seq_len = 64, .rope_theta = 10000.0,
     .norm_eps = 1e-5, .tied_embeddings = 0},
    {.name = "small", .vocab_size = 256, .dim = 384, .n_layers = 6, .n_heads = 6,
     .n_kv_heads = 6, .hidden_dim = 1024, .seq_len = 256, .rope_theta = 10000.0,
     .norm_eps = 1e-5, .tied_embeddings = 0},
};

static const char *const preset_names[] = {"stories260k", "shakespeare-char", "small", NULL};

const char *const *nl_arch_preset_names(void) { return preset_names; }

nl_status nl_arch_preset(const char *name, nl_arch *out) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0) { *out = presets[i]; return NL_OK; }
    return nl_fail(NL_ERR_INVALID, "unknown preset '%s' (known: stories260k, shakespeare-char, small)", name);
}
