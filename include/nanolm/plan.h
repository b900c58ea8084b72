/*
 * The planner: pure arithmetic that prices training and serving of transformers on real
 * clusters. Catalog of hardware and models, memory budgets (bytes per parameter by recipe and
 * sharding stage, activations), collectives with an alpha-beta model, the search over parallel
 * training layouts, and serving (prefill, decode, KV cache). No model memory, no MPI.
 * Scaling laws live in scaling.h.
 *
 * Units: bytes, FLOPs, seconds, bytes/s, FLOP/s (all double). GB = 1e9 bytes, GiB = 2^30.
 */
#ifndef NANOLM_PLAN_H
#define NANOLM_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include "nanolm/arch.h"
#include "nanolm/base.h"
#include "nanolm/coll.h"

/* ---- hardware ------------------------------------------------------------------------- */
typedef struct nl_hw {
    char name[32];
    double flops_bf16;     /* dense peak, FLOP/s */
    double flops_fp8;      /* dense FP8 tensor-core peak, FLOP/s; 0 = no FP8 units (A100, TPU v5p) */
    double mem_bytes;      /* HBM capacity */
    double hbm_bw;         /* HBM bandwidth, bytes/s */
    double intra_bw;       /* scale-up link (NVLink/xGMI) per GPU, one direction, bytes/s */
    double inter_bw;       /* scale-out network per GPU, one direction, bytes/s */
    int64_t gpus_per_node; /* GPUs on one scale-up domain */
    double latency_s;      /* launch + sync latency of one collective call */
    double intra_eff;      /* achievable fraction of intra_bw for large collectives */
    double inter_eff;      /* achievable fraction of inter_bw for large collectives */
    double price_per_hour; /* $ per GPU-hour (a parameter, not a fact) */
    char source[160];
    double gemm_eff;       /* fraction of peak a large GEMM reaches in a training stack */
    int64_t nics_per_node; /* scale-out NICs in one node (0: not described) */
    double nic_bw;         /* one NIC, one direction, bytes/s; inter_bw = nics x nic_bw / GPUs */
    double nvls_eff;       /* NVLink SHARP all-reduce: fraction of intra_bw at which each GPU sends and
                              receives the whole array through the switch; 0 = no NVLS */
    double flops_tf32;     /* dense TF32 tensor-core peak, FLOP/s: the rate of fp32 GEMMs (0 = none) */
} nl_hw;

/* A model entry: its shape plus where the numbers come from. */
typedef struct nl_model_entry {
    nl_arch arch;
    char source[160];
    char family[16]; /* "" = llama */
} nl_model_entry;

#define NL_CATALOG_MAX 64
typedef struct nl_catalog {
    nl_hw hw[NL_CATALOG_MAX];
    size_t n_hw;
    nl_model_entry models[NL_CATALOG_MAX];
    size_t n_models;
    size_t last_model; /* index of the last entry nl_catalog_load_model added or changed */
} nl_catalog;

/* Fills the catalog with the built-in GPUs and models (NanoLM presets included). */
void nl_catalog_init(nl_catalog *c);
/* Looks a GPU / model up by name (case-insensitive). NL_ERR_INVALID with a message that lists
 * the known names when it is not there. */
nl_status nl_catalog_find_hw(const nl_catalog *c, const char *name, nl_hw *out);
nl_status nl_catalog_find_model(const nl_catalog *c, const char *name, nl_arch *out);
/* Adds or overrides entries from a JSON file: one object or an array of objects. A GPU object
 * names "name" and any of the nl_hw fields (missing fields of a new entry come from "base",
 * default "h100"); a model object names "name" and nl_arch fields ("base" likewise, default
 * none: then vocab_size, dim, n_layers, n_heads, hidden_dim are required) and its "family"
 * (llama, gpt, opt, bloom, mpt; default llama, or the base's). Changing a non-llama catalog
 * entry by its name without "family" or "base" fails: the name never sets the family. Unknown
 * fields and bad values fail with NL_ERR_FORMAT naming the file and the field. */
nl_status nl_catalog_load_hw(nl_catalog *c, const char *path);
nl_status nl_catalog_load_model(nl_catalog *c, const char *path);
struct nl_family;
/* The same, with the model's family (fam may be NULL): the catalog entry's, or the file's
 * "family" field (default llama; with "base", the base's). A name never sets it. */
nl_status nl_catalog_model_arg_fam(nl_catalog *c, const char *arg, nl_arch *out, struct nl_family *fam);
/* Comma-separated names, for error messages. Writes into buf. */
const char *nl_catalog_hw_names(const nl_catalog *c, char *buf, size_t n);
const char *nl_catalog_model_names(const nl_catalog *c, char *buf, size_t n);

/* ---- model families ------------------------------------------------------------------------ */
/* What the shape (nl_arch) does not say: the block's flavour. Llama (the default, all zero):
 * RMSNorm, RoPE, SwiGLU MLP of 3 matrices of width hidden_dim, no biases, no dropout. GPT-3,
 * OPT, BLOOM and MPT: LayerNorm, a GeLU (OPT: ReLU) MLP of 2 matrices of width hidden_dim
 * (usually 4 d), learned or ALiBi positions, biases (not MPT), dropout (GPT-3, OPT). */
typedef enum nl_pos { NL_POS_ROPE = 0, NL_POS_LEARNED = 1, NL_POS_ALIBI = 2 } nl_pos;
typedef struct nl_family {
    char name[16];
    int gelu_mlp;  /* 2-matrix MLP with one element-wise activation */
    int layernorm; /* LayerNorm (mean and variance) instead of RMSNorm */
    int bias;      /* biases on every linear layer and norm */
    int dropout;   /* dropout after attention softmax, attention output and MLP (masks kept) */
    nl_pos pos;
} nl_family;
/* "llama", "gpt" (GPT-2/3, Megatron GPT), "opt", "bloom", "mpt". NL_ERR_INVALID otherwise. */
nl_status nl_plan_family(const char *name, nl_family *out);
/* The family of a catalog model (llama when the entry names none). */
void nl_catalog_family(const nl_catalog *c, const char *model, nl_family *out);

/* ---- counts from the shape -------------------------------------------------------------- */
/* Parameters that do matmul work per token: active parameters minus the embedding lookup
 * (the classifier matmul counts, tied or not) minus the norms. */
double nl_plan_matmul_params(const nl_arch *a);
/* Parameters of `a` built as family `f` (NULL = llama, then exactly nl_arch_count_params): a
 * GeLU MLP has 2 matrices of width hidden_dim instead of SwiGLU's 3; biases add q+2kv+D on
 * attention, F+D on the MLP and D per norm; learned positions add seq_len x D to the
 * embedding. */
void nl_plan_count_params(const nl_arch *a, const nl_family *f, nl_arch_params *out);
/* nl_plan_matmul_params for family `f`. */
double nl_plan_matmul_params_fam(const nl_arch *a, const nl_family *f);
/* Forward attention-score FLOPs per token averaged over a causal sequence of length `seq`
 * (QK^T and PV: 2 * 2 * q_dim * seq/2 per layer). */
double nl_plan_attn_flops_per_token(const nl_arch *a, double seq);
/* KV-cache bytes per token (all layers) at `bytes_per_elem`; MLA caches kv_lora_rank +
 * qk_rope_head_dim per layer. */
double nl_plan_kv_bytes_per_token(const nl_arch *a, double bytes_per_elem);

/* ---- memory: model state ---------------------------------------------------------------- */
typedef struct nl_recipe {
    const char *name;
    double weight_bytes; /* per parameter, the copy used in forward/backward */
    double grad_bytes;
    double optim_bytes; /* master weights + optimizer moments */
    const char *source;
} nl_recipe;
/* "fp32", "bf16" (mixed, the default), "fp8" (Transformer Engine style), "fp8-ds3"
 * (DeepSeek-V3). NL_ERR_INVALID listing the known ones otherwise. */
nl_status nl_plan_recipe(const char *name, nl_recipe *out);

typedef enum nl_zero { NL_ZERO_0 = 0, NL_ZERO_1 = 1, NL_ZERO_2 = 2, NL_ZERO_3 = 3, NL_ZERO_HSDP = 4 } nl_zero;
const char *nl_zero_name(nl_zero z);
/* A ZeRO stage by name: 0 or ddp, 1 or zero1, 2 or zero2, 3, zero3 or fsdp, hsdp (any case); -1
 * for anything else. */
int nl_zero_parse(const char *name);

/* Bytes per parameter of model state on one GPU under a ZeRO stage sharded over `dp` ranks
 * (HSDP: shard over `shard` ranks, replicate across dp/shard). */
typedef struct nl_state_bytes {
    double weights, grads, optim, total; /* per parameter held by this model-parallel rank */
} nl_state_bytes;
void nl_plan_state_bytes(const nl_recipe *r, nl_zero z, int64_t dp, int64_t shard, nl_state_bytes *out);

/* ---- memory: activations ---------------------------------------------------------------- */
typedef enum nl_recompute { NL_RECOMPUTE_NONE = 0, NL_RECOMPUTE_SELECTIVE = 1, NL_RECOMPUTE_FULL = 2 } nl_recompute;
const char *nl_recompute_name(nl_recompute r);
/* none, selective or full (any case) -> the recomputation; -1 for anything else. */
int nl_recompute_parse(const char *name);

/* One tensor kept for backward: bytes per token per layer, and whether tensor parallelism
 * shards it (without sequence parallelism the norm regions stay replicated). */
typedef struct nl_act_term {
    char name[48];
    double bytes;     /* per token per layer on one GPU, after TP/SP sharding */
    double unsharded; /* per token per layer at tp = 1 */
} nl_act_term;

#define NL_ACT_MAX_TERMS 20
/* What an FP8 recipe keeps in FP8 for backward: nothing (bf16, fp32), Transformer Engine's
 * per-tensor recipe (each linear's input), DeepSeek-V3's (FP8 linear inputs, recomputed norms and
 * MLA up-projections, with selective recomputation). */
enum { NL_FP8_CACHE_NONE = 0, NL_FP8_CACHE_DS3 = 1, NL_FP8_CACHE_TE = 2 };

typedef struct nl_act_opts {
    int64_t tp; /* tensor-parallel degree (>= 1) */
    int sp;     /* sequence parallelism (shards the norm regions by tp) */
    int flash;  /* flash attention (no s x s scores kept) */
    nl_recompute recompute;
    double seq;            /* sequence length (scores without flash) */
    double bytes_per_elem; /* 2 for bf16 */
    nl_family fam;         /* zero = llama */
    int fp8_cache;         /* NL_FP8_CACHE_*: which tensors an FP8 recipe keeps in FP8 (memory.c) */
    int distribute_saved;  /* full recomputation: the checkpoint split over the tp ranks */
} nl_act_opts;

typedef struct nl_act_layer {
    nl_act_term terms[NL_ACT_MAX_TERMS];
    int n;
    double bytes_per_token;         /* sum over terms, one layer, what stays until backward */
    double working_bytes_per_token; /* one layer's full set, live while it is recomputed */
} nl_act_layer;
/* Activations of one (average) transformer layer, per token, as Korthikanti et al. 2022
 * ("Reducing Activation Recomputation in Large Transformer Models", sec. 4) count them: for the
 * GPT family exactly their 34 + 5as/h (dropout masks included); for Llama the same walk with
 * RMSNorm, GQA, a fused SwiGLU and no dropout (terms named in memory.c). */
void nl_plan_act_layer(const nl_arch *a, const nl_act_opts *o, nl_act_layer *out);
/* Korthikanti et al. 2022 Table 2 as published for GPT (4h GeLU MLP, dropout, fp16), bytes per
 * token per layer: h (34 + 5as/h) at tp = 1; h (10 + 24/t + 5as/(ht)) with tensor parallelism;
 * h/t (34 + 5as/h) with sequence parallelism; the 5as/h term dropped by selective
 * recomputation or flash attention; 2h with full recomputation. */
double nl_plan_act_korthikanti(const nl_arch *a, double seq, nl_recompute r, int flash, int64_t tp, int sp);
/* Bytes of the logits and the fp32 loss working copy for `tokens` tokens. */
double nl_plan_logits_bytes(const nl_arch *a, double tokens);

/* ---- collectives (alpha-beta) ------------------------------------------------------------ */
/* The planner's names for the one list of collective operations (nanolm/coll.h). */
typedef nl_comm_op nl_coll;
#define NL_ALL_REDUCE     NL_COMM_OP_ALL_REDUCE
#define NL_REDUCE_SCATTER NL_COMM_OP_REDUCE_SCATTER
#define NL_ALL_GATHER     NL_COMM_OP_ALL_GATHER
#define NL_ALL_TO_ALL     NL_COMM_OP_ALL_TO_ALL
#define NL_P2P            NL_COMM_OP_SEND_RECV
#define nl_coll_name      nl_comm_op_name
/* Bytes that leave each GPU for a collective over p ranks on an array of `bytes`:
 * (p-1)/p * bytes for reduce-scatter, all-gather, all-to-all; twice that for all-reduce;
 * `bytes` for a point-to-point send. */
double nl_plan_coll_bytes(nl_coll c, int64_t p, double bytes);
/* Time: latency + wire bytes / (bandwidth * efficiency) with the bandwidth of the slowest link
 * the group spans. `spans_nodes`: 0 for a group inside one node (NVLink; all-reduces may use
 * NVLink SHARP), else the number of the group's members in each node (>= 1): rings then use
 * that many NICs' share of the node's network (plan_comm.c). */
double nl_plan_coll_time(const nl_hw *hw, nl_coll c, int64_t p, double bytes, int spans_nodes);

/* ---- efficiency assumptions of the time model -------------------------------------------- */
typedef struct nl_eff {
    double gemm;              /* fraction of peak a large GEMM reaches; 0 = the GPU's gemm_eff */
    double attn;              /* fraction of peak flash attention reaches; 0 = nl_plan_attn_eff */
    double kernel_s;          /* fixed cost per kernel launch */
    double kernels_per_layer; /* kernels per layer forward (backward: twice) */
    double dp_overlap;        /* fraction of backward that can hide data-parallel comm */
    double usable_mem;        /* fraction of HBM the allocator can use */
    double reserved_bytes;    /* CUDA context, NCCL buffers, workspace */
    double fixed_mfu;         /* > 0: napkin mode: time = model FLOPs / (peak * fixed_mfu) */
    int fp8_gemm;             /* GEMMs at the fp8 peak: 0, NL_FP8_PER_TENSOR or NL_FP8_BLOCK (set from
                                 the recipe by the search) */
    int fp32_gemm;            /* GEMMs at the TF32 peak with 4-byte operands (set from the fp32 recipe) */
    double tp_overlap;        /* fraction of tensor-parallel communication hidden behind GEMMs */
    double ep_overlap;        /* fraction of expert all-to-all hidden (1F1B; DualPipe hides it all) */
} nl_eff;
/* How an FP8 recipe scales its GEMM operands: one scale per tensor (Transformer Engine's
 * delayed scaling) or per 1x128 tile and 128x128 block (DeepSeek-V3). */
#define NL_FP8_PER_TENSOR 1
#define NL_FP8_BLOCK      2
/* HBM bytes that an FP8 recipe's casts move for one transformer layer and T tokens on one GPU
 * (tensor-parallel degree tp, sequence parallelism sp): *fwd_bytes in the forward (every FP8
 * GEMM's input cast to fp8 with its transposed copy), *bwd_bytes in the backward (every GEMM's
 * output gradient, the same). scaling is NL_FP8_PER_TENSOR (4 bytes per element: read bf16 2,
 * write fp8 1 + transposed 1) or NL_FP8_BLOCK (5 + 8/128); moe: the layer's MLP is routed
 * experts. The weights' casts are per step or per microbatch and are priced apart. */
void nl_plan_fp8_cast_bytes(const nl_arch *a, const nl_family *fam, int64_t tp, int sp, int scaling, double T, int moe,
                            double *fwd_bytes, double *bwd_bytes);
/* The share of HBM bandwidth Transformer Engine's cast-transpose kernel reaches on H100: a
 * 4096 x 4096 fp16 -> fp8 cast with its transpose (read 2, write 1 + 1 bytes per element, 67 MB,
 * more than the L2 holds) in 51.5 us (TE pull request #101, March 2023, H100 SXM) is 1.30 TB/s
 * of 3.35. Priced on the per-tensor recipe's casts; the block-scaled recipe's own kernels are
 * not measured and stay at the full rate. */
#define NL_FP8_CAST_TRANSPOSE_BW_SHARE 0.39
/* Transformer Engine's per-tensor FP8 recipe runs its data- and weight-gradient GEMMs with
 * cuBLAS's split accumulator (use_split_accumulator = _2X_ACC_DGRAD = _2X_ACC_WGRAD = True; the
 * forward keeps fast accumulation): partial sums are "periodically promoted to a higher
 * precision" (cuBLAS docs, CUBLASLT_MATMUL_DESC_FAST_ACCUM), which costs time that the measured
 * FP8 GEMM rate (nl_plan_gemm_fp8_k_eff's sweep, WGMMA accumulators without promotion) does not
 * include. pytorch/ao issue #2377 measures fast accumulation 1.1-1.2x faster on H100; the low
 * end of that range. */
#define NL_FP8_SPLIT_ACC_SLOWDOWN 1.1
/* The defaults, each with its source in plan/plan_train.c. */
void nl_eff_default(nl_eff *e);
/* The share of the GPU's bf16 peak flash attention reaches on the causal attention core of
 * training, forward (*fwd_eff) and backward (*bwd_eff), at sequence length `seq` and head
 * dimension `head_dim`, from published kernel rates interpolated in log(seq) (flat beyond
 * 512..16k; head dim clamped to 64..128): each generation's FlashAttention (FlashAttention-2 on
 * Ampere from its paper's A100 figure, FlashAttention-3 on Hopper from its paper's H100
 * figures), or with `triton` the Triton kernel (FlashAttention-2's rate on that GPU over
 * nl_plan_attn_triton_slowdown). The tables and how they combine: plan/plan_train.c. Returns
 * the generation whose table priced it (1 Ampere: a100*, 2 Hopper: h100*, h800, h200), or 0
 * with both shares at NL_ATTN_EFF_FALLBACK (over the Triton slowdown) for a GPU without a
 * table. --attn-eff (nl_eff.attn > 0) replaces both with one share. */
int nl_plan_attn_eff(const nl_hw *hw, double seq, double head_dim, int triton, double *fwd_eff, double *bwd_eff);
#define NL_ATTN_EFF_FALLBACK 0.4
/* How much slower the Triton FlashAttention kernel (flash_attn_triton, the one with ALiBi
 * biases that llm-foundry's MPT benchmarks ran: MPT's ALiBi needs attn_impl torch or triton,
 * and its benchmark script defaults to triton) is than FlashAttention-2 at sequence `seq`. Its
 * author's note (flash-attention's flash_attn/flash_attn_triton.py): "Overall Triton forward +
 * backward is slightly slower than CUDA forward + backward", the CUDA kernel being
 * FlashAttention (v1); so it runs at FlashAttention's rate, and the ratio is FlashAttention-2's
 * to FlashAttention's forward + backward rate in Dao 2023 Fig. 4(c) (A100, causal, head dim
 * 64): 1.52 at 512, 1.82 at 2k, 1.76 at 16k. */
double nl_plan_attn_triton_slowdown(double seq);

/* HBM bytes a NCCL collective moves per byte it receives: staged into device memory, read back,
 * and the user buffers read or written ("at least 2x ... it can be 3x", NCCL's maintainer in
 * NVIDIA/nccl issue #1428). Compute that a collective overlaps loses that HBM time. */
#define NL_COLL_HBM_PER_BYTE 3.0

/* How much of the large-GEMM rate a GEMM dimension of size x fills: x / (x + 128) (128: the
 * tile edge of cuBLAS/CUTLASS kernels on A100/H100). A GEMM M x N x K runs at
 * gemm_eff * f(M) f(N) f(K) of peak; training and prefill share it. */
double nl_plan_gemm_shape_eff(double x);

/* The extra cost of a short reduction loop in an FP8 GEMM, relative to the same GEMM in BF16:
 * (K + 260) / (K + 460) for a reduction dimension K. Each output tile pays a fixed time (pipeline
 * fill, the epilogue's scale and write) besides K x the main-loop step, and FP8 halves the step,
 * so the fixed time is worth about twice as many K. Fitted to a measured H800 SXM sweep (tilelang
 * benchmark/matmul and benchmark/matmul_fp8 READMEs, M = N = 8192, K = 256..16384): rate = E K /
 * (K + k0) with FP16 k0 = 260, E = 0.79 of the dense peak, FP8 k0 = 460, E = 0.82 (within 2% at
 * every K); the large-K fractions agree, so only the K term differs. 1 for K -> infinity. */
double nl_plan_gemm_fp8_k_eff(double K);

/* ---- training plans ---------------------------------------------------------------------- */
typedef struct nl_layout {
    int64_t dp, tp, pp, cp, ep;
    nl_zero zero;
    int64_t micro_batch; /* sequences per microbatch (per data-parallel rank) */
    int64_t n_micro;     /* microbatches per step (gradient accumulation) */
    int64_t vpp;         /* interleaved virtual stages (1 = plain 1F1B) */
    nl_recompute recompute;
    int sp; /* sequence parallel with tp > 1 */
} nl_layout;

/* Pipeline schedule: 1F1B (interleaved when vpp > 1), DeepSeek-V3's DualPipe, or the zero-bubble
 * ZB-H1 of Qi et al. 2024 (backward split into input and weight gradients; 1F1B's memory). */
typedef enum nl_sched { NL_SCHED_1F1B = 0, NL_SCHED_DUALPIPE = 1, NL_SCHED_ZB_H1 = 2 } nl_sched;
/* "1f1b", "dualpipe", "zb-h1" -> the schedule; -1 for anything else. */
int nl_plan_schedule(const char *name);
const char *nl_schedule_name(nl_sched s);

typedef struct nl_train_req {
    nl_arch arch;
    nl_family fam; /* zero = llama */
    nl_sched schedule;
    int attn_materialized; /* the run materialises the s x s scores (no flash attention) */
    int attn_triton;       /* flash attention by the Triton kernel: nl_plan_attn_triton_slowdown */
    /* Layouts with full recomputation and tp > 1 without sp keep 1/tp of each checkpointed layer
     * input per rank and all-gather it before recomputing (Megatron-LM's
     * --distribute-saved-activations, metaseq's --distribute-checkpointed-activations). */
    int distribute_saved;
    /* Node-limited MoE routing: a token's experts lie on at most this many nodes (DeepSeek-V3:
     * 4, sec. 3.2.2), so at most that many copies cross the network; 0 = top_k copies. */
    int64_t moe_node_limit;
    /* ZeRO-3 / FSDP parameter collectives, as the stack issues them (plan_train.c):
     * zero3_calls_per_layer: gathers per layer and pass (0 = 1: FSDP's one flat parameter per
     * wrapped layer; DeepSpeed ZeRO-3 gathers each parameter tensor of the module it fetches);
     * zero3_prefetch: parameters gathered ahead of the compute per call (0 = the whole next
     * layer, FSDP's prefetch; DeepSpeed: stage3_prefetch_bucket_size, 5e7 by default);
     * zero3_nic_spread: across nodes, spread each ring over the NICs of its members in a node
     * as one large nccl-tests collective does (1); the default (0) prices each GPU's shard
     * traffic at its own NIC's share of the node's network (plan_train.c says why). */
    int64_t zero3_calls_per_layer;
    double zero3_prefetch;
    int zero3_nic_spread;
    nl_hw hw;
    nl_recipe recipe;
    nl_eff eff;
    int64_t gpus;
    double tokens;          /* training tokens */
    int64_t seq;            /* sequence length */
    int64_t global_batch;   /* sequences per step */
    double params_override; /* > 0: use this N for state bytes and 6N (course "7B") */
    /* Search restrictions; 0 = free. A degree > 0 fixes it; zero_plus1 = nl_zero + 1 and
     * recompute_plus1 = nl_recompute + 1 fix those. A fixed pp may leave uneven stages. */
    struct {
        int64_t dp, tp, pp, cp, ep, micro_batch;
        int zero_plus1, recompute_plus1;
        int64_t vpp;
        int sp_plus1; /* interleave degree; sequence parallelism 1 = off, 2 = on */
        /* Uneven pipeline ends (Megatron-LM's --decoder-first-pipeline-num-layers and
         * --decoder-last-pipeline-num-layers): layers on the first and the last stage of every
         * layout with a pipeline, the rest split evenly over the pp - 2 middle stages; 0 = every
         * stage ceil(layers / pp). Llama 3 405B (Dubey et al. 2024 sec. 3.3.2): 126 layers on 16
         * stages = 7 + 14 x 8 + 7. */
        int64_t first_layers, last_layers;
    } fix;
} nl_train_req;

typedef struct nl_train_eval {
    nl_layout L;
    int fits;
    char reason[160]; /* why it does not fit / is invalid */
    /* memory per GPU, bytes */
    double mem_weights, mem_grads, mem_optim, mem_act, mem_logits, mem_temp, mem_total, mem_usable;
    /* time per step, seconds */
    double t_compute; /* all microbatches on one GPU incl. recompute, no bubble */
    double t_bubble;
    double t_tp, t_cp, t_ep, t_pp, t_dp; /* communication, total per step */
    double t_exposed;                    /* communication not hidden behind compute */
    double t_overlap_hbm;                /* HBM time hidden data-parallel collectives take from compute */
    double t_optim;                      /* optimizer step: Adam reads and writes its shard (memory bound) */
    double t_step;
    double tokens_per_s, mfu, model_flops_per_step;
    double total_s, gpu_hours, cost;
} nl_train_eval;

/* Evaluates one layout (memory, then time). Returns NL_ERR_INVALID if the layout is not a valid
 * decomposition (e.g. dp*tp*pp*cp != gpus); a valid layout that does not fit returns NL_OK
 * with fits = 0 and a reason. */
nl_status nl_plan_train_eval(const nl_train_req *q, const nl_layout *L, nl_train_eval *out);

typedef struct nl_train_result {
    nl_train_eval *evals; /* all valid layouts, fitting ones first, ranked by step time */
    size_t n, n_fit;
    double search_s;        /* wall time of the search */
    double min_mem;         /* smallest memory need over all layouts, bytes */
    nl_train_eval smallest; /* the layout with that need */
} nl_train_result;
/* Enumerates every layout (DP x TP x PP x CP x EP, ZeRO stage or HSDP, micro-batch,
 * recomputation) and ranks those that fit. Fails with NL_ERR_INVALID when no layout can use
 * the GPU count (message says why) or when nothing fits (message gives the smallest need and
 * its layout). Free with nl_plan_train_free. */
nl_status nl_plan_train_search(const nl_train_req *q, nl_train_result *out);
void nl_plan_train_free(nl_train_result *r);
/* Writes a short explanation of why `best` wins (memory first, then sharding, activations,
 * communication, time) into buf. */
void nl_plan_train_explain(const nl_train_req *q, const nl_train_result *r, char *buf, size_t n);
/* "dp8 tp1 pp1 cp1 ep1 zero3 mb1x16 none" */
const char *nl_layout_str(const nl_layout *L, char *buf, size_t n);

/* ---- collectives of one layer under a layout ----------------------------------------------- */
typedef struct nl_layer_coll {
    char what[64]; /* "attention output", "FSDP weight all-gather", ... */
    char when[16]; /* "forward", "backward", "step" */
    nl_coll coll;
    char group[8]; /* "tp", "dp", "pp", "ep", "dp-inter" */
    int64_t p;
    double bytes;      /* array size */
    double wire_bytes; /* bytes through each GPU */
    double time_s;
    double count; /* how many per step */
} nl_layer_coll;

#define NL_LAYER_COLL_MAX 24
typedef struct nl_layer_plan {
    nl_layer_coll c[NL_LAYER_COLL_MAX];
    int n;
    double per_layer_fwd_s, per_layer_bwd_s, per_step_s; /* communication sums */
    double compute_step_s;                               /* compute for the step at the request's efficiency */
    double ddp_step_s; /* the same model under plain DDP (a ring all-reduce), for comparison */
} nl_layer_plan;
/* Lists every collective one transformer layer issues under `L` (with tokens_per_gpu tokens per
 * GPU per step in one microbatch) and the data-parallel/ZeRO collectives per step. */
nl_status nl_plan_layer(const nl_train_req *q, const nl_layout *L, double tokens_per_gpu, nl_layer_plan *out);

/* ---- serving ----------------------------------------------------------------------------- */
typedef struct nl_serve_req {
    nl_arch arch;
    nl_family fam; /* zero = llama */
    int fp8;       /* GEMMs at the fp8 peak (FP8 weights and activations) */
    nl_hw hw;
    int64_t tp;
    double prompt, output;    /* tokens */
    int64_t batch;            /* concurrent decode sequences */
    double context;           /* decode context; 0 = prompt + output/2 */
    double prefill_mfu;       /* fraction of peak in prefill; 0 = the GPU's gemm_eff */
    double kernel_s;          /* per kernel launch (5 us) */
    double kernels_per_layer; /* kernels per layer per forward pass (20) */
    double hbm_eff;           /* achieved fraction of HBM bandwidth (0.8) */
    double weight_bytes;      /* bytes per weight (2 = bf16) */
    double kv_bytes;          /* bytes per KV element (2) */
    double chunk;             /* chunked-prefill tokens per step (256) */
    int64_t fsdp;             /* weights sharded ZeRO-3/FSDP-style over this many GPUs (0/1: none) */
    int decode_attn;          /* NL_DECODE_ATTN_*: how the decode attention kernel reads a GQA cache */
} nl_serve_req;

/* The decode attention kernel's reads of a grouped-query (GQA/MQA) KV cache. GROUPED (the
 * default): each KV head's cache is read once per step for its whole group of query heads
 * (TensorRT-LLM's XQA kernel from v0.8, FlashInfer, FlashAttention-3's packed GQA). PER_HEAD: one
 * thread block per query head, each streaming its KV head's cache, n_heads / n_kv_heads times the
 * bytes: TensorRT-LLM's masked multi-head attention kernel before XQA
 * (decoderMaskedMultiheadAttentionTemplate.h: blockIdx.x is the query head, hi_kv = hi /
 * qhead_per_kv), which its XQA note credits with 2.4x Llama-70B throughput for "reducing data
 * loading" (docs/source/blogs/XQA-kernel.md). Priced without L2 reuse between the group's
 * blocks: a bound, not a measurement of the re-read L2 absorbs. */
enum { NL_DECODE_ATTN_GROUPED = 0, NL_DECODE_ATTN_PER_HEAD = 1 };

typedef struct nl_serve_plan {
    double params, matmul_params;
    double prefill_flops, prefill_s; /* one prompt, on tp GPUs */
    double batch_prefill_s;          /* the whole batch's prompts in one prefill */
    double batch_prefill_comm_s;     /* its TP all-reduces: 2 per layer of B x prompt x D x 2 bytes */
    double kv_bytes_per_token, prompt_kv_bytes;
    double kv_replication; /* copies of each KV head when tp > KV heads */
    double weight_read_s, kv_read_s, decode_compute_s, decode_mem_s, decode_step_s; /* tp applied */
    double kv_reads_per_head; /* times a step streams each KV head's cache (1; n_heads/n_kv_heads per-head) */
    double tp_allreduces, tp_allreduce_bytes, tp_comm_s, tp_comm_latency_s;
    double decode_step_total_s; /* step + TP communication */
    double ttft_s, tpot_s;
    double stall_steps;                                 /* decode steps one prefill stalls */
    double chunk_compute_s, chunk_free_tokens;          /* chunked prefill */
    double prefill_rps, decode_rps, decode_per_prefill; /* disaggregation, per GPU group */
    double mem_weights, mem_kv, mem_total;              /* per GPU */
    double fsdp_gather_s;                               /* all-gathers of every layer's weight shards per forward */
    /* The terms of prefill_s = max(prefill_compute_s, prefill_weight_s) + prefill_comm_s + launch_s:
     * its FLOPs at prefill_eff of the peak prefill_peak (fp8 or bf16) on tp GPUs, the weight
     * stream (HBM reads, or FSDP gathers when slower), the TP all-reduces and the launches. */
    double prefill_compute_s, prefill_weight_s, prefill_comm_s, launch_s, prefill_eff, prefill_peak;
    /* decode_step_s = decode_weight_s (the weight stream or the GEMMs, the slower) + decode_kv_s
     * (the KV reads or the attention compute, the slower) */
    double decode_weight_s, decode_kv_s;
    int fits;
} nl_serve_plan;
/* Prices serving `arch` on `tp` GPUs of `hw`. NL_ERR_INVALID on bad sizes. */
nl_status nl_plan_serve(const nl_serve_req *q, nl_serve_plan *out);
void nl_serve_req_default(nl_serve_req *q);

/* ---- validation against published runs ------------------------------------------------- */
/* Every training, serving and memory case of tests/validation is a command line a user runs
 * ("plan train ...", "plan serve ...", "budget ..."); validation runs it with --json through a
 * runner the CLI supplies and reads the figure from its output, so nothing here prices a case
 * in a way the commands cannot. The runner returns the command's standard output (malloc'd; the
 * caller frees it) and its exit status, or NULL when it could not run it. Collectives (nccl-tests
 * bus bandwidth) have no command and are priced with nl_plan_coll_time. */
typedef char *(*nl_valid_runner)(const char *command, int *exit_status, void *ctx);

/* One published figure and what the planner predicts for it: in sample (the constants as the
 * catalog sets them) and, with holdout, leave-one-source-out (the calibrated constants refit on
 * every case but those of the case's own source). */
typedef struct nl_valid_case {
    char id[64];
    char group[16];  /* "train", "memory", "serve", "collective" */
    char metric[32]; /* "tflops_per_gpu", "mfu", "tokens_per_s_per_gpu", "state_gb", ... */
    char unit[96];
    char source[320];
    char source_id[48]; /* the paper or repository: the unit left out together */
    char command[640];  /* the user command ("" for collectives) */
    char gpu[32];       /* --gpu of the command ("" when none) */
    double published, predicted;
    double err;                            /* signed relative error: predicted / published - 1 */
    int fits;                              /* training cases: the published layout fits in memory; -1 elsewhere */
    int formula;                           /* the published figure is the source's own formula (memory accounting) */
    double predicted_holdout, err_holdout; /* leave-one-source-out (= in sample for uncalibrated groups) */
    double gemm_eff_holdout;               /* the GEMM efficiency fit without this case's source (0: none) */
} nl_valid_case;

typedef struct nl_valid_group {
    char group[16];
    int n;
    double median_abs, worst_abs; /* |err| */
    char worst_id[64];
    int n_formula; /* cases whose accounting the source spells out */
    double worst_formula_abs;
} nl_valid_group;

/* A calibrated constant: the GEMM efficiency of a GPU generation, its catalog value, and what
 * a fit on all the cases gives. */
typedef struct nl_valid_const {
    char name[48];     /* "gemm_eff a100" */
    char gpus[64];     /* the catalog GPUs it applies to */
    double catalog;    /* the value the catalog sets (in sample) */
    double fit_all;    /* fit on every case */
    int n_cases;       /* cases it is fit on */
    char sources[256]; /* their source ids */
} nl_valid_const;

#define NL_VALID_CONSTS 2
typedef struct nl_valid_result {
    nl_valid_case *cases;
    size_t n;
    nl_valid_group groups[4];  /* train, memory, serve, collective (n = 0 when none): in sample */
    nl_valid_group holdout[4]; /* the same, leave-one-source-out (holdout runs only) */
    int has_holdout;
    nl_valid_const consts[NL_VALID_CONSTS];
    int n_nofit; /* training cases whose published layout the planner rejects */
} nl_valid_result;
/* Loads the validation set at `path` (a JSON array, one object per published figure: id, group,
 * source, source_id, command or the collective's fields, metric, published; see
 * tests/validation/README.md), runs every command through `run` and compares. With holdout,
 * also refits the GEMM efficiency of each GPU generation (A100: a100, a100-40; Hopper: h100,
 * h200, h800) on the training and serving cases, leaving out one source at a time
 * (median |error|, grid 0.40..0.90 in steps of 0.01), and prices each case with the constant fit
 * without its source. NL_ERR_IO / NL_ERR_FORMAT naming the file and the entry on bad input, a
 * command that fails for another reason than its layout not fitting included. Free with
 * nl_plan_validate_free. */
nl_status nl_plan_validate(const nl_catalog *cat, const char *path, nl_valid_runner run, void *ctx, int holdout,
                           nl_valid_result *out);
void nl_plan_validate_free(nl_valid_result *r);
/* Where the published set is when none is given: tests/validation/published.json in the working
 * directory (the repository root, as `make run` and the tests use it), else under the source tree
 * $NANOLM_SRC (written into buf[n]); NULL when neither applies. */
const char *nl_plan_validate_default_file(char *buf, size_t n);
/* Signed errors per case as horizontal bars, grouped. */
nl_status nl_plan_svg_validate(const char *path, const nl_valid_result *r);

/* ---- pictures ------------------------------------------------------------------------------ */
/* GPipe and 1F1B timelines for p stages and m microbatches (bubble visible). */
nl_status nl_plan_svg_pipeline(const char *path, int64_t p, int64_t m);
/* Memory bars (weights, grads, optimizer, activations, logits, temp) per evaluated layout. */
nl_status nl_plan_svg_memory(const char *path, const nl_train_eval *e, size_t n, double capacity);
/* The memory bars of a search (`plan train --svg`): its first 8 layouts that fit and first 4 that do
 * not, against the GPU's capacity. */
nl_status nl_plan_svg_search(const char *path, const nl_train_result *res, double capacity);

#endif
