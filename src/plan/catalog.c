/* The planner's catalog: GPUs and model shapes, each with its source; JSON overrides. */
#include "nanolm/plan.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Per-collective launch latency and link efficiencies are assumptions shared by all GPUs:
 * ~10 us per NCCL call (the course's figure; nccl-tests show 10-30 us for small messages), and
 * 0.8 of the link rate (nccl-tests bus bandwidth on H100 NVSwitch and 400G InfiniBand is
 * typically 75-90% of the link). Override per GPU with --hw FILE.json or per run. */
#define LAT 10e-6
#define EFF 0.8
/* The last number of each GPU is the fraction of its dense peak a large GEMM reaches inside a
 * training stack (gemm_eff; --gemm-eff overrides it for every GPU). It is an assumption,
 * calibrated on the published runs of tests/validation (docs/planning.md): 0.75 on A100 (large
 * cuBLAS GEMMs reach ~0.8-0.9 of its 312 TFLOP/s), 0.55 on the Hopper parts and newer, whose
 * dense peak is further from what training stacks get (the llm-foundry tables give H100/A100
 * throughput ratios of 2.0-2.3 at a 3.2x peak ratio). */

/* Memory is what the device gives CUDA, as nvidia-smi reports it: the "80 GB" of an A100 or
 * H100 is 80 GiB of HBM stacks (A100 80GB: 81920 MiB; H100 SXM/PCIe: 81559 MiB = 85.5e9 bytes;
 * A100 40GB: 40960 MiB), not 80e9 bytes; reading it as 80e9 rejected 7% of the memory that
 * published runs used. The other parts keep their datasheet figure. */
/* NVLink SHARP (NVLS; NCCL 2.17+ on third-generation NVSwitch systems: HGX/DGX H100, H200,
 * B200) reduces in the switch: each GPU sends its whole array into the switch and receives the
 * whole reduced array, S each way instead of the ring's 2(p-1)/p S, so nccl-tests' busbw is
 * 2(p-1)/p x link x nvls_eff. The efficiency comes from a measurement that is not in the
 * validation set: 8 H200 (NVLink 4, NCCL 2.20.3), peak all-reduce busbw 475 GB/s (nccl-tests
 * issue #272): 475 / (1.75 x 450) = 0.603. NVLink 5 (B200): 8 B300 with NVLS, busbw 845 GB/s
 * (NCCL issue #2140): 845 / (1.75 x 900) = 0.537. H800 SXM boards (HGX H800) carry the same four
 * third-generation NVSwitch chips as HGX H100 with 8 instead of 18 NVLinks per GPU, so NCCL's
 * NVLS runs there too, at the link rate of the H800's 200 GB/s per direction (the reduction
 * efficiency is H200's; no H800 NVLS measurement is in this file). The PCIe parts have no
 * NVSwitch and no NVLS. */
/* The last number of each GPU is its dense TF32 tensor-core peak (datasheets: half the
 * "with sparsity" figure): the rate fp32 GEMMs run at under the fp32 recipe (PyTorch's
 * allow_tf32, on by default in Megatron-LM and cuDNN convolutions; cuBLAS fp32 GEMMs on
 * Ampere and later). The FP8 peak is 0 on parts without FP8 tensor cores (A100, TPU v5p):
 * an FP8 recipe is refused there. */
#define NVLS4    0.603
#define NVLS5    0.537
#define MIB      (1024.0 * 1024.0)
#define H100_MEM (81559 * MIB)

static const nl_hw builtin_hw[] = {
    /* NVIDIA H100 SXM5 datasheet (2023): 989 TFLOP/s dense BF16 (1979 with sparsity), 1979 FP8
     * dense, 80 GB HBM3 at 3.35 TB/s, NVLink 4 900 GB/s bidirectional = 450 GB/s per direction;
     * DGX H100: 8 GPUs, one 400 Gb/s ConnectX-7 per GPU = 50 GB/s. */
    {"h100", 989e12, 1979e12, H100_MEM, 3.35e12, 450e9, 50e9, 8, LAT, EFF, EFF, 2.50,
     "NVIDIA H100 SXM5 datasheet; DGX H100 (8 GPUs, 400 Gb/s IB per GPU)", 0.55, 8, 50e9, NVLS4, 494.7e12},
    /* NVIDIA H200 SXM datasheet (2024): same compute as H100, 141 GB HBM3e at 4.8 TB/s. */
    {"h200", 989e12, 1979e12, 141e9, 4.8e12, 450e9, 50e9, 8, LAT, EFF, EFF, 3.50,
     "NVIDIA H200 SXM datasheet; HGX H200 (8 GPUs, 400 Gb/s IB per GPU)", 0.55, 8, 50e9, NVLS4, 494.7e12},
    /* NVIDIA A100 80GB SXM datasheet (2021): 312 TFLOP/s dense BF16, no FP8, 2.039 TB/s,
     * NVLink 3 600 GB/s bidirectional = 300 per direction; DGX A100: 200 Gb/s HDR per GPU. */
    {"a100", 312e12, 0, 81920 * MIB, 2.039e12, 300e9, 25e9, 8, LAT, EFF, EFF, 1.50,
     "NVIDIA A100 80GB SXM datasheet; DGX A100 (8 GPUs, 200 Gb/s HDR IB per GPU)", 0.75, 8, 25e9, 0, 156e12},
    /* NVIDIA A100 40GB SXM datasheet (2020): as the 80 GB part with 40 GB HBM2 at 1.555 TB/s. */
    {"a100-40", 312e12, 0, 40960 * MIB, 1.555e12, 300e9, 25e9, 8, LAT, EFF, EFF, 1.20,
     "NVIDIA A100 40GB SXM datasheet; DGX A100 (8 GPUs, 200 Gb/s HDR IB per GPU)", 0.75, 8, 25e9, 0, 156e12},
    /* NVIDIA H800 SXM (the H100 for the Chinese market): H100 compute and HBM, NVLink cut to
     * 400 GB/s bidirectional = 200 per direction (DeepSeek-V3 report sec. 3.1: 'NVLink 160 GB/s'
     * achieved, 'IB 50 GB/s'); 400 Gb/s InfiniBand per GPU. */
    {"h800", 989e12, 1979e12, H100_MEM, 3.35e12, 200e9, 50e9, 8, LAT, EFF, EFF, 2.00,
     "H100 SXM datasheet with NVLink at 400 GB/s; DeepSeek-V3 report sec. 3.1", 0.55, 8, 50e9, NVLS4, 494.7e12},
    /* NVIDIA H100 PCIe datasheet (2023): 756 TFLOP/s dense BF16, 1513 FP8, 80 GB HBM2e at
     * 2.0 TB/s; PCIe Gen5 64 GB/s per direction between cards (NVLink bridges pair only two). */
    {"h100-pcie", 756e12, 1513e12, H100_MEM, 2.0e12, 64e9, 50e9, 8, LAT, EFF, EFF, 2.00,
     "NVIDIA H100 PCIe datasheet; PCIe Gen5 x16 between GPUs", 0.55, 8, 50e9, 0, 378e12},
    /* Google Cloud TPU v5p documentation (2023): 459 TFLOP/s BF16 per chip (no FP8; int8 918
     * TOPS), 95 GB HBM2e at 2.765 TB/s, ICI 4,800 Gb/s per chip = 600 GB/s, 3D torus of up to
     * 8,960 chips; priced here with 4 chips per host and the ICI as the scale-up link. */
    {"tpu-v5p", 459e12, 0, 95e9, 2.765e12, 300e9, 100e9, 4, LAT, EFF, EFF, 4.20,
     "Google Cloud TPU v5p documentation (per chip)", 0.55, 0, 0, 0, 0},
    /* NVIDIA DGX B200 datasheet (2024): 72 PF FP8 dense training / 8 GPUs = 4.5 PF FP8 and
     * 2.25 PF BF16 dense per GPU, 1,440 GB and 64 TB/s in 8 GPUs = 180 GB and 8 TB/s each,
     * NVLink 5 1.8 TB/s bidirectional = 900 GB/s per direction, 400 Gb/s ConnectX-7 per GPU. */
    {"b200", 2250e12, 4500e12, 180e9, 8e12, 900e9, 50e9, 8, LAT, EFF, EFF, 5.00,
     "NVIDIA DGX B200 datasheet (per GPU = system / 8)", 0.55, 8, 50e9, NVLS5, 1125e12},
    /* AMD Instinct MI300X datasheet (2023): 1307.4 TFLOP/s dense BF16, 2614.9 FP8, 192 GB HBM3
     * at 5.3 TB/s, Infinity Fabric 7 x 64 GB/s = 448 GB/s per direction to the 7 peers. */
    {"mi300x", 1307.4e12, 2614.9e12, 192e9, 5.3e12, 448e9, 50e9, 8, LAT, EFF, EFF, 2.50,
     "AMD Instinct MI300X datasheet; 8-GPU platform, 400 Gb/s per GPU", 0.55, 8, 50e9, 0, 653.7e12},
};

#define M(...)                                                                                                         \
    { __VA_ARGS__ }
static const nl_model_entry builtin_models[] = {
    /* meta-llama/Llama-2-7b-hf config.json (Touvron et al. 2023). */
    {M(.name = "llama-2-7b", .vocab_size = 32000, .dim = 4096, .n_layers = 32, .n_heads = 32, .n_kv_heads = 32,
       .hidden_dim = 11008, .seq_len = 4096, .rope_theta = 1e4, .norm_eps = 1e-5),
     "meta-llama/Llama-2-7b-hf config.json", ""},
    /* Touvron et al. 2023 (LLaMA), Table 2: 7B: d 4096, 32 heads, 32 layers; context 2048. */
    {M(.name = "llama-7b", .vocab_size = 32000, .dim = 4096, .n_layers = 32, .n_heads = 32, .n_kv_heads = 32,
       .hidden_dim = 11008, .seq_len = 2048, .rope_theta = 1e4, .norm_eps = 1e-6),
     "Touvron et al. 2023 (LLaMA) Table 2; huggyllama/llama-7b config.json", ""},
    /* meta-llama/Llama-2-70b-hf config.json: GQA with 8 KV heads. */
    {M(.name = "llama-2-70b", .vocab_size = 32000, .dim = 8192, .n_layers = 80, .n_heads = 64, .n_kv_heads = 8,
       .hidden_dim = 28672, .seq_len = 4096, .rope_theta = 1e4, .norm_eps = 1e-5),
     "meta-llama/Llama-2-70b-hf config.json", ""},
    /* meta-llama/Meta-Llama-3-8B config.json. */
    {M(.name = "llama-3-8b", .vocab_size = 128256, .dim = 4096, .n_layers = 32, .n_heads = 32, .n_kv_heads = 8,
       .hidden_dim = 14336, .seq_len = 8192, .rope_theta = 5e5, .norm_eps = 1e-5),
     "meta-llama/Meta-Llama-3-8B config.json", ""},
    /* meta-llama/Meta-Llama-3-70B config.json. */
    {M(.name = "llama-3-70b", .vocab_size = 128256, .dim = 8192, .n_layers = 80, .n_heads = 64, .n_kv_heads = 8,
       .hidden_dim = 28672, .seq_len = 8192, .rope_theta = 5e5, .norm_eps = 1e-5),
     "meta-llama/Meta-Llama-3-70B config.json", ""},
    /* meta-llama/Llama-3.1-405B config.json (Llama 3 paper, Table 3: 126 layers, 16384). */
    {M(.name = "llama-3-405b", .vocab_size = 128256, .dim = 16384, .n_layers = 126, .n_heads = 128, .n_kv_heads = 8,
       .hidden_dim = 53248, .seq_len = 8192, .rope_theta = 5e5, .norm_eps = 1e-5),
     "meta-llama/Llama-3.1-405B config.json; Dubey et al. 2024 Table 3", ""},
    /* Brown et al. 2020 Table 2.1: 96 layers, d = 12288, 96 heads, context 2048, tied
     * embeddings, 50257 tokens. Its 4d GeLU MLP (2 matrices) is priced as a SwiGLU with
     * F = 8d/3 = 32768 (3 matrices): same parameters and FLOPs; LayerNorm biases ignored. */
    {M(.name = "gpt-3-175b", .vocab_size = 50257, .dim = 12288, .n_layers = 96, .n_heads = 96, .n_kv_heads = 96,
       .hidden_dim = 32768, .seq_len = 2048, .rope_theta = 1e4, .norm_eps = 1e-5, .tied_embeddings = 1),
     "Brown et al. 2020 Table 2.1 (MLP as SwiGLU with equal parameters)", ""},
    /* bigscience/bloom config.json (Le Scao et al. 2022 Table 3): 70 layers, d = 14336, 112
     * heads, 250880 tokens, ALiBi, LayerNorm, biases, a 4d GeLU MLP, tied embeddings. */
    {M(.name = "bloom-176b", .vocab_size = 250880, .dim = 14336, .n_layers = 70, .n_heads = 112, .n_kv_heads = 112,
       .hidden_dim = 57344, .seq_len = 2048, .rope_theta = 1e4, .norm_eps = 1e-5, .tied_embeddings = 1),
     "bigscience/bloom config.json; Le Scao et al. 2022 Table 3", "bloom"},
    /* Zhang et al. 2022 (OPT) Table 1: 175B: 96 layers, 96 heads, d = 12288; learned positions,
     * ReLU MLP of 4d, LayerNorm, biases, tied embeddings; facebook/opt vocabulary 50272. */
    {M(.name = "opt-175b", .vocab_size = 50272, .dim = 12288, .n_layers = 96, .n_heads = 96, .n_kv_heads = 96,
       .hidden_dim = 49152, .seq_len = 2048, .rope_theta = 1e4, .norm_eps = 1e-5, .tied_embeddings = 1),
     "Zhang et al. 2022 (OPT) Table 1; facebook/opt config.json", "opt"},
    /* mosaicml/mpt-7b and mpt-30b config.json: d_model 4096 / 7168, 32 / 48 layers, 32 / 64
     * heads, expansion ratio 4 (GeLU), ALiBi, LayerNorm without bias, no biases, vocab 50432. */
    {M(.name = "mpt-7b", .vocab_size = 50432, .dim = 4096, .n_layers = 32, .n_heads = 32, .n_kv_heads = 32,
       .hidden_dim = 16384, .seq_len = 2048, .rope_theta = 1e4, .norm_eps = 1e-5, .tied_embeddings = 1),
     "mosaicml/mpt-7b config.json", "mpt"},
    {M(.name = "mpt-30b", .vocab_size = 50432, .dim = 7168, .n_layers = 48, .n_heads = 64, .n_kv_heads = 64,
       .hidden_dim = 28672, .seq_len = 8192, .rope_theta = 1e4, .norm_eps = 1e-5, .tied_embeddings = 1),
     "mosaicml/mpt-30b config.json", "mpt"},
    /* mistralai/Mixtral-8x7B-v0.1 config.json: 8 experts, top-2, expert F = 14336. */
    {M(.name = "mixtral-8x7b", .vocab_size = 32000, .dim = 4096, .n_layers = 32, .n_heads = 32, .n_kv_heads = 8,
       .hidden_dim = 14336, .seq_len = 32768, .rope_theta = 1e6, .norm_eps = 1e-5, .n_experts = 8, .top_k = 2,
       .expert_hidden_dim = 14336),
     "mistralai/Mixtral-8x7B-v0.1 config.json", ""},
    /* deepseek-ai/DeepSeek-V3 config.json: MLA (q_lora 1536, kv_lora 512, nope 128, rope 64,
     * v 128), first 3 layers dense (F = 18432), then 256 routed + 1 shared experts of
     * F = 2048, top-8. The multi-token-prediction module (14B) is not counted. */
    {M(.name = "deepseek-v3", .vocab_size = 129280, .dim = 7168, .n_layers = 61, .n_heads = 128, .n_kv_heads = 128,
       .hidden_dim = 18432, .seq_len = 4096, .rope_theta = 1e4, .norm_eps = 1e-6, .n_experts = 256,
       .n_shared_experts = 1, .top_k = 8, .expert_hidden_dim = 2048, .first_moe_layer = 3, .head_dim = 128,
       .q_lora_rank = 1536, .kv_lora_rank = 512, .qk_rope_head_dim = 64, .v_head_dim = 128),
     "deepseek-ai/DeepSeek-V3 config.json (DeepSeek-AI 2024)", ""},
    /* The course's MoE example (week 14, problem 4): 24 layers, D = 2048, SwiGLU experts with
     * F = 1024, 64 routed + 2 shared, top-6, attention 4*D^2 (no GQA). Embeddings are not
     * counted there; the vocabulary here (32000) only matters for the logits. */
    {M(.name = "course-moe", .vocab_size = 32000, .dim = 2048, .n_layers = 24, .n_heads = 16, .n_kv_heads = 16,
       .hidden_dim = 0, .seq_len = 4096, .rope_theta = 1e4, .norm_eps = 1e-5, .n_experts = 64, .n_shared_experts = 2,
       .top_k = 6, .expert_hidden_dim = 1024),
     "course week 14, problem 4", ""},
};
#undef M

void nl_catalog_init(nl_catalog *c) {
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < sizeof builtin_hw / sizeof builtin_hw[0]; i++) c->hw[c->n_hw++] = builtin_hw[i];
    for (size_t i = 0; i < sizeof builtin_models / sizeof builtin_models[0]; i++)
        c->models[c->n_models++] = builtin_models[i];
    for (const char *const *p = nl_arch_preset_names(); *p; p++) {
        nl_model_entry m;
        memset(&m, 0, sizeof m);
        if (nl_arch_preset(*p, &m.arch) == NL_OK) {
            snprintf(m.source, sizeof m.source, "NanoLM preset (include/nanolm/arch.h)");
            c->models[c->n_models++] = m;
        }
    }
}

void nl_catalog_family(const nl_catalog *c, const char *model, nl_family *out) {
    nl_plan_family("llama", out);
    for (size_t i = 0; i < c->n_models; i++)
        if (!strcasecmp(c->models[i].arch.name, model) && c->models[i].family[0])
            nl_plan_family(c->models[i].family, out);
}

const char *nl_catalog_hw_names(const nl_catalog *c, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < c->n_hw && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? ", " : "", c->hw[i].name);
    return buf;
}

const char *nl_catalog_model_names(const nl_catalog *c, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < c->n_models && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? ", " : "", c->models[i].arch.name);
    return buf;
}

nl_status nl_catalog_find_hw(const nl_catalog *c, const char *name, nl_hw *out) {
    for (size_t i = 0; i < c->n_hw; i++)
        if (!strcasecmp(c->hw[i].name, name)) {
            *out = c->hw[i];
            return NL_OK;
        }
    char names[1024];
    return nl_fail(NL_ERR_INVALID, "unknown GPU '%s' (known: %s)", name, nl_catalog_hw_names(c, names, sizeof names));
}

nl_status nl_catalog_find_model(const nl_catalog *c, const char *name, nl_arch *out) {
    for (size_t i = 0; i < c->n_models; i++)
        if (!strcasecmp(c->models[i].arch.name, name)) {
            *out = c->models[i].arch;
            return NL_OK;
        }
    char names[2048];
    return nl_fail(NL_ERR_INVALID, "unknown model '%s' (known: %s)", name,
                   nl_catalog_model_names(c, names, sizeof names));
}

/* ---- JSON ---------------------------------------------------------------------------------- */
typedef struct field {
    const char *name;
    size_t off;
    int kind;
    double min;
} field; /* kind 0 double, 1 int64, 2 int */

static const field hw_fields[] = {
    {"flops_bf16", offsetof(nl_hw, flops_bf16), 0, 1},  {"flops_fp8", offsetof(nl_hw, flops_fp8), 0, 0},
    {"flops_tf32", offsetof(nl_hw, flops_tf32), 0, 0},  {"mem_bytes", offsetof(nl_hw, mem_bytes), 0, 1},
    {"hbm_bw", offsetof(nl_hw, hbm_bw), 0, 1},          {"intra_bw", offsetof(nl_hw, intra_bw), 0, 1},
    {"inter_bw", offsetof(nl_hw, inter_bw), 0, 1},      {"gpus_per_node", offsetof(nl_hw, gpus_per_node), 1, 1},
    {"latency_s", offsetof(nl_hw, latency_s), 0, 0},    {"intra_eff", offsetof(nl_hw, intra_eff), 0, 1e-3},
    {"inter_eff", offsetof(nl_hw, inter_eff), 0, 1e-3}, {"price_per_hour", offsetof(nl_hw, price_per_hour), 0, 0},
    {"gemm_eff", offsetof(nl_hw, gemm_eff), 0, 1e-3},   {"nics_per_node", offsetof(nl_hw, nics_per_node), 1, 0},
    {"nic_bw", offsetof(nl_hw, nic_bw), 0, 0},          {"nvls_eff", offsetof(nl_hw, nvls_eff), 0, 0},
};

static const field model_fields[] = {
    {"vocab_size", offsetof(nl_arch, vocab_size), 1, 1},
    {"dim", offsetof(nl_arch, dim), 1, 1},
    {"n_layers", offsetof(nl_arch, n_layers), 1, 1},
    {"n_heads", offsetof(nl_arch, n_heads), 1, 1},
    {"n_kv_heads", offsetof(nl_arch, n_kv_heads), 1, 1},
    {"hidden_dim", offsetof(nl_arch, hidden_dim), 1, 0},
    {"seq_len", offsetof(nl_arch, seq_len), 1, 1},
    {"rope_theta", offsetof(nl_arch, rope_theta), 0, 0},
    {"norm_eps", offsetof(nl_arch, norm_eps), 0, 0},
    {"tied_embeddings", offsetof(nl_arch, tied_embeddings), 2, 0},
    {"n_experts", offsetof(nl_arch, n_experts), 1, 0},
    {"n_shared_experts", offsetof(nl_arch, n_shared_experts), 1, 0},
    {"top_k", offsetof(nl_arch, top_k), 1, 0},
    {"expert_hidden_dim", offsetof(nl_arch, expert_hidden_dim), 1, 0},
    {"first_moe_layer", offsetof(nl_arch, first_moe_layer), 1, 0},
    {"head_dim", offsetof(nl_arch, head_dim), 1, 0},
    {"q_lora_rank", offsetof(nl_arch, q_lora_rank), 1, 0},
    {"kv_lora_rank", offsetof(nl_arch, kv_lora_rank), 1, 0},
    {"qk_rope_head_dim", offsetof(nl_arch, qk_rope_head_dim), 1, 0},
    {"v_head_dim", offsetof(nl_arch, v_head_dim), 1, 0},
};

static nl_status set_fields(const char *path, const char *name, cJSON *obj, void *dst, const field *fs, size_t nf) {
    for (cJSON *it = obj->child; it; it = it->next) {
        if (!strcmp(it->string, "name") || !strcmp(it->string, "base") || !strcmp(it->string, "source")) continue;
        if (fs == model_fields && !strcmp(it->string, "family")) continue; /* nl_catalog_load_model */
        /* a CPU's measured rates (`nanolm bench machine`), read by plan_engine.c */
        if (fs == hw_fields && !strncmp(it->string, "cpu_", 4)) continue;
        const field *f = NULL;
        for (size_t i = 0; i < nf; i++)
            if (!strcmp(fs[i].name, it->string)) f = &fs[i];
        if (!f) return nl_fail(NL_ERR_FORMAT, "%s: entry '%s': unknown field '%s'", path, name, it->string);
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < f->min)
            return nl_fail(NL_ERR_FORMAT, "%s: entry '%s': field '%s' must be a number >= %g", path, name, it->string,
                           f->min);
        double v = it->valuedouble;
        char *p = (char *)dst + f->off;
        if (f->kind == 0)
            *(double *)p = v;
        else {
            if (v != floor(v) || v > 9e15)
                return nl_fail(NL_ERR_FORMAT, "%s: entry '%s': field '%s' must be an integer", path, name, it->string);
            if (f->kind == 1)
                *(int64_t *)p = (int64_t)v;
            else
                *(int *)p = (int)v;
        }
    }
    return NL_OK;
}

static nl_status load_json(const char *path, cJSON **root) {
    char *text = NULL;
    size_t bytes = 0;
    NL_TRY(nl_read_file(path, &text, &bytes));
    *root = cJSON_Parse(text);
    nl_free(text);
    if (!*root) return nl_fail(NL_ERR_FORMAT, "%s: not valid JSON", path);
    if (!cJSON_IsObject(*root) && !cJSON_IsArray(*root)) {
        cJSON_Delete(*root);
        return nl_fail(NL_ERR_FORMAT, "%s: expected an object or an array of objects", path);
    }
    return NL_OK;
}

static nl_status entry_name(const char *path, cJSON *o, const char **name, const char **base) {
    if (!cJSON_IsObject(o)) return nl_fail(NL_ERR_FORMAT, "%s: every entry must be an object", path);
    cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "name");
    if (!cJSON_IsString(n) || !n->valuestring[0] || strlen(n->valuestring) >= 32)
        return nl_fail(NL_ERR_FORMAT, "%s: every entry needs a \"name\" string (1..31 chars)", path);
    *name = n->valuestring;
    cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "base");
    *base = NULL;
    if (b) {
        if (!cJSON_IsString(b)) return nl_fail(NL_ERR_FORMAT, "%s: entry '%s': \"base\" must be a string", path, *name);
        *base = b->valuestring;
    }
    return NL_OK;
}

static void set_source(char *dst, size_t n, const char *path, cJSON *o) {
    cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "source");
    snprintf(dst, n, "%s", cJSON_IsString(s) ? s->valuestring : path);
}

nl_status nl_catalog_load_hw(nl_catalog *c, const char *path) {
    cJSON *root;
    NL_TRY(load_json(path, &root));
    nl_status rc = NL_OK;
    int arr = cJSON_IsArray(root);
    for (cJSON *o = arr ? root->child : root; o && rc == NL_OK; o = arr ? o->next : NULL) {
        const char *name, *base;
        if ((rc = entry_name(path, o, &name, &base))) break;
        nl_hw hw;
        size_t slot = c->n_hw;
        for (size_t i = 0; i < c->n_hw; i++)
            if (!strcasecmp(c->hw[i].name, name)) slot = i;
        if (slot < c->n_hw && !base)
            hw = c->hw[slot];
        else if ((rc = nl_catalog_find_hw(c, base ? base : "h100", &hw)))
            break;
        snprintf(hw.name, sizeof hw.name, "%s", name);
        set_source(hw.source, sizeof hw.source, path, o);
        if ((rc = set_fields(path, name, o, &hw, hw_fields, sizeof hw_fields / sizeof hw_fields[0]))) break;
        if (hw.intra_eff > 1 || hw.inter_eff > 1 || hw.nvls_eff > 1) {
            rc = nl_fail(NL_ERR_FORMAT, "%s: entry '%s': link efficiencies must be <= 1", path, name);
            break;
        }
        /* A node described by its NICs: the network bandwidth per GPU follows unless given. */
        int nics = cJSON_HasObjectItem(o, "nics_per_node") || cJSON_HasObjectItem(o, "nic_bw");
        if (nics && !cJSON_HasObjectItem(o, "inter_bw")) {
            if (hw.nics_per_node < 1 || !(hw.nic_bw > 0)) {
                rc = nl_fail(NL_ERR_FORMAT, "%s: entry '%s': a node's NICs need nics_per_node >= 1 and nic_bw > 0",
                             path, name);
                break;
            }
            hw.inter_bw = (double)hw.nics_per_node * hw.nic_bw / (double)hw.gpus_per_node;
        }
        if (slot == c->n_hw) {
            if (c->n_hw == NL_CATALOG_MAX) {
                rc = nl_fail(NL_ERR_RANGE, "%s: too many GPUs (max %d)", path, NL_CATALOG_MAX);
                break;
            }
            c->n_hw++;
        }
        c->hw[slot] = hw;
    }
    cJSON_Delete(root);
    return rc;
}

nl_status nl_catalog_load_model(nl_catalog *c, const char *path) {
    cJSON *root;
    NL_TRY(load_json(path, &root));
    nl_status rc = NL_OK;
    int arr = cJSON_IsArray(root);
    for (cJSON *o = arr ? root->child : root; o && rc == NL_OK; o = arr ? o->next : NULL) {
        const char *name, *base;
        if ((rc = entry_name(path, o, &name, &base))) break;
        nl_model_entry m;
        memset(&m, 0, sizeof m);
        size_t slot = c->n_models;
        for (size_t i = 0; i < c->n_models; i++)
            if (!strcasecmp(c->models[i].arch.name, name)) slot = i;
        if (base) {
            if ((rc = nl_catalog_find_model(c, base, &m.arch))) break;
            for (size_t i = 0; i < c->n_models; i++) /* the base's family, unless "family" says */
                if (!strcasecmp(c->models[i].arch.name, base))
                    snprintf(m.family, sizeof m.family, "%s", c->models[i].family);
        } else if (slot < c->n_models) {
            m = c->models[slot];
        } else {
            static const char *req[] = {"vocab_size", "dim", "n_layers", "n_heads", "hidden_dim"};
            for (size_t i = 0; i < 5 && rc == NL_OK; i++)
                if (!cJSON_GetObjectItemCaseSensitive(o, req[i]))
                    rc = nl_fail(NL_ERR_FORMAT, "%s: new model '%s' needs field '%s' (or a \"base\")", path, name,
                                 req[i]);
            if (rc) break;
            m.arch.seq_len = 4096;
            m.arch.rope_theta = 1e4;
            m.arch.norm_eps = 1e-5;
        }
        /* The family is a field of the entry ("family": llama, gpt, opt, bloom, mpt), never its
         * name: a file that reuses a catalog name without "base" is a new model (llama unless it
         * says), and one that only changes some fields of a non-llama entry must name it. */
        cJSON *jf = cJSON_GetObjectItemCaseSensitive(o, "family");
        if (jf) {
            nl_family f;
            if (!cJSON_IsString(jf) || nl_plan_family(jf->valuestring, &f)) {
                rc = nl_fail(NL_ERR_FORMAT, "%s: entry '%s': \"family\" must be one of llama, gpt, opt, bloom, mpt",
                             path, name);
                break;
            }
            snprintf(m.family, sizeof m.family, "%s", f.name);
        } else if (!base && slot < c->n_models && c->models[slot].family[0] &&
                   strcmp(c->models[slot].family, "llama")) {
            rc = nl_fail(NL_ERR_FORMAT,
                         "%s: entry '%s' changes the catalog's %s model of that name: say \"family\": \"%s\" (or "
                         "another) or \"base\", the name alone does not set it",
                         path, name, c->models[slot].family, c->models[slot].family);
            break;
        }
        snprintf(m.arch.name, sizeof m.arch.name, "%s", name);
        set_source(m.source, sizeof m.source, path, o);
        if ((rc = set_fields(path, name, o, &m.arch, model_fields, sizeof model_fields / sizeof model_fields[0])))
            break;
        if (!cJSON_GetObjectItemCaseSensitive(o, "n_kv_heads") && !base && slot == c->n_models)
            m.arch.n_kv_heads = m.arch.n_heads;
        if (nl_arch_validate(&m.arch)) {
            rc = nl_fail(NL_ERR_FORMAT, "%s: %s", path, nl_last_error());
            break;
        }
        if (slot == c->n_models) {
            if (c->n_models == NL_CATALOG_MAX) {
                rc = nl_fail(NL_ERR_RANGE, "%s: too many models (max %d)", path, NL_CATALOG_MAX);
                break;
            }
            c->n_models++;
        }
        c->models[slot] = m;
        c->last_model = slot;
    }
    cJSON_Delete(root);
    return rc;
}

nl_status nl_catalog_model_arg_fam(nl_catalog *c, const char *arg, nl_arch *out, nl_family *fam) {
    size_t n = strlen(arg), slot = c->n_models;
    if (n > 5 && !strcasecmp(arg + n - 5, ".json")) {
        NL_TRY(nl_catalog_load_model(c, arg));
        slot = c->last_model;
    } else {
        for (size_t i = 0; i < c->n_models && slot == c->n_models; i++)
            if (!strcasecmp(c->models[i].arch.name, arg)) slot = i;
        if (slot == c->n_models) return nl_catalog_find_model(c, arg, out); /* the error listing the names */
    }
    *out = c->models[slot].arch;
    if (fam) NL_TRY(nl_plan_family(c->models[slot].family[0] ? c->models[slot].family : "llama", fam));
    return NL_OK;
}

/* ---- counts -------------------------------------------------------------------------------- */
double nl_plan_matmul_params(const nl_arch *a) {
    nl_arch_params p;
    nl_arch_count_params(a, &p);
    return (double)(p.active - p.embedding - p.classifier + a->vocab_size * a->dim - p.norms);
}

void nl_plan_count_params(const nl_arch *a, const nl_family *f, nl_arch_params *p) {
    nl_arch_count_params(a, p);
    if (!f) return;
    double D = (double)a->dim, L = (double)a->n_layers, hd = (double)nl_arch_head_dim(a);
    double q = (double)a->n_heads * hd, kv = (double)a->n_kv_heads * hd;
    double dense = a->n_experts > 0 ? (double)a->first_moe_layer : L;
    if (f->gelu_mlp) p->mlp_dense = p->mlp_dense / 3 * 2;
    if (f->bias) {
        p->attention += (int64_t)(L * (q + 2 * kv + D));
        p->mlp_dense += (int64_t)(dense * ((double)a->hidden_dim + D));
    }
    if (f->layernorm && f->bias) p->norms *= 2;
    if (f->pos == NL_POS_LEARNED) p->embedding += a->seq_len * a->dim;
    int64_t delta = p->attention + p->mlp_dense + p->mlp_experts + p->mlp_shared + p->router + p->norms;
    p->total = p->embedding + p->classifier + delta;
    p->non_embedding = delta;
    p->active = p->total - p->mlp_experts + (a->n_experts > 0 ? p->mlp_experts / a->n_experts * a->top_k : 0);
}

double nl_plan_matmul_params_fam(const nl_arch *a, const nl_family *f) {
    nl_arch_params p;
    nl_plan_count_params(a, f, &p);
    /* The embedding (token and learned position lookups) computes nothing; the classifier does. */
    return (double)(p.active - p.embedding - p.classifier + a->vocab_size * a->dim - p.norms);
}

double nl_plan_attn_flops_per_token(const nl_arch *a, double seq) {
    int64_t hd = nl_arch_head_dim(a);
    double qk = a->kv_lora_rank > 0 ? (double)(hd + a->qk_rope_head_dim) : (double)hd;
    double v = a->kv_lora_rank > 0 ? (double)a->v_head_dim : (double)hd;
    /* QK^T: 2*qk per (query, key) pair per head; PV: 2*v; causal: seq/2 keys on average. */
    return (double)a->n_layers * (double)a->n_heads * 2.0 * (qk + v) * seq / 2.0;
}

double nl_plan_kv_bytes_per_token(const nl_arch *a, double bytes_per_elem) {
    if (a->kv_lora_rank > 0)
        return (double)a->n_layers * (double)(a->kv_lora_rank + a->qk_rope_head_dim) * bytes_per_elem;
    return 2.0 * (double)a->n_layers * (double)(a->n_kv_heads * nl_arch_head_dim(a)) * bytes_per_elem;
}
