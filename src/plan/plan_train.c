/* Parallel training plans: evaluate one layout (memory, then time), search all of them, explain
 * the winner, and list the collectives of one layer. Rank order inside a layout follows
 * Megatron-LM (tp innermost, then cp, ep inside dp, dp, pp outermost), so a group spans nodes
 * when (its stride * its size) exceeds the GPUs of one node. */
#include "nanolm/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The efficiency assumptions, each overridable from the CLI (--gemm-eff, ...):
 *  gemm 0.6: what a whole training stack gets out of GEMMs (kernel peaks are higher: ~0.75
 *     for large cuBLAS GEMMs). Chosen against published runs (docs/planning.md, "Against
 *     published runs"); the catalog's gemm_eff per GPU replaces it.
 *  attn 0 = the published FlashAttention kernel rates by GPU, sequence length and head dim
 *     (nl_plan_attn_eff below: FlashAttention-2 on A100, Dao 2023; FlashAttention-3 on H100,
 *     Shah et al. 2024), forward and backward apart; NL_ATTN_EFF_FALLBACK 0.4 for GPUs without
 *     a table. --attn-eff sets one flat share instead.
 *  kernel_s 5 us x 20 kernels per layer forward (norms, projections, RoPE, attention, residual
 *     adds, activation): launch and tail cost that small microbatches cannot hide (assumption).
 *  dp_overlap 0.8: bucketed gradient reduction overlaps the backward pass except the tail
 *     (Li et al. 2020, PyTorch Distributed, sec. 3.2.3; assumption on the fraction).
 *  tp_overlap 0: tensor-parallel collectives are exposed (Megatron-LM's default); splitting GEMMs
 *     to overlap them (Wang et al. 2022, "Overlap communication with dependent computation via
 *     decomposition"; Megatron's --tp-comm-overlap) hides a fraction, set with --tp-overlap.
 *  usable_mem 0.95 and reserved 2 GB: allocator fragmentation, CUDA context, NCCL buffers and
 *     GEMM workspaces (assumption; 0.9 rejected runs that were published, e.g. Llama 3 405B's
 *     layout without recomputation and MPT-30B on 8 GPUs). */
void nl_eff_default(nl_eff *e) {
    e->gemm = 0; /* the GPU's gemm_eff (catalog) */
    e->attn = 0; /* nl_plan_attn_eff's published rates */
    e->kernel_s = 5e-6;
    e->kernels_per_layer = 20;
    e->dp_overlap = 0.8;
    e->usable_mem = 0.95;
    e->reserved_bytes = 2e9;
    e->fixed_mfu = 0;
    e->fp8_gemm = 0;
    e->tp_overlap = 0;
    e->ep_overlap = 0;
}

const char *nl_layout_str(const nl_layout *L, char *buf, size_t n) {
    char v[32] = "";
    if (L->vpp > 1) snprintf(v, sizeof v, " v%lld", (long long)L->vpp);
    snprintf(buf, n, "dp%lld tp%lld%s pp%lld%s cp%lld ep%lld %s mb%lldx%lld %s", (long long)L->dp, (long long)L->tp,
             (L->sp && L->tp > 1) ? "+sp" : "", (long long)L->pp, v, (long long)L->cp, (long long)L->ep,
             nl_zero_name(L->zero), (long long)L->micro_batch, (long long)L->n_micro, nl_recompute_name(L->recompute));
    return buf;
}

/* Shared parameter bookkeeping of a layout. */
typedef struct parts {
    double scale;               /* params_override / counted total, or 1 */
    double total;               /* parameters (after scale) */
    double dense_layers_params; /* attention + dense MLP + shared experts + router + norms */
    double expert_params;       /* routed experts, all layers */
    double emb, cls;
    double layer_params_max; /* largest layer, non-expert part */
    double moe_layers, dense_layers;
} parts;

static void get_parts(const nl_train_req *q, parts *p) {
    nl_arch_params c;
    nl_plan_count_params(&q->arch, &q->fam, &c);
    p->scale = q->params_override > 0 ? q->params_override / (double)c.total : 1.0;
    p->total = (double)c.total * p->scale;
    p->emb = (double)c.embedding * p->scale;
    p->cls = (double)c.classifier * p->scale;
    p->expert_params = (double)c.mlp_experts * p->scale;
    p->dense_layers_params = ((double)(c.attention + c.mlp_dense + c.mlp_shared + c.router + c.norms)) * p->scale;
    p->moe_layers = q->arch.n_experts > 0 ? (double)(q->arch.n_layers - q->arch.first_moe_layer) : 0;
    p->dense_layers = (double)q->arch.n_layers - p->moe_layers;
    p->layer_params_max = p->dense_layers_params / (double)q->arch.n_layers;
}

/* Roofline of one GEMM (M x K) * (K x N): bf16 operands, or fp8 operands at the fp8 peak when
 * the recipe runs its GEMMs in FP8 (e->fp8_gemm; Micikevicius et al. 2022). */
/* Shape: a GEMM reaches `gemm` of peak only when every dimension fills the tiles and waves of
 * the GPU; each dimension x contributes x / (x + 128) (128: the tile edge of cuBLAS/CUTLASS
 * kernels on A100/H100; a 4096-wide dimension loses 3%, a 1024-wide one 11%). */
double nl_plan_gemm_shape_eff(double x) { return x / (x + 128.0); }

double nl_plan_gemm_fp8_k_eff(double K) { return K > 0 ? (K + 260.0) / (K + 460.0) : 1.0; }

/* ---- the attention core's rate (one home: every flash-attention case is priced here) ------- *
 * Published FlashAttention kernel rates in TFLOP/s at sequence 512, 1k, 2k, 4k, 8k and 16k, each
 * benchmark at 16k tokens per batch (batch = 16k / seq) and hidden size 2048 (32 heads of 64 or
 * 16 of 128): 128 x heads query tiles, so every point fills the GPU and the curve is what the
 * kernel does with sequence length itself (causal masking's partly filled diagonal tiles and
 * the shorter loops of short rows). FLOPs counted as the papers count them: 4 s^2 d h per
 * forward, halved under a causal mask, backward 2.5x the forward. */
static const double attn_seq_pts[6] = {512, 1024, 2048, 4096, 8192, 16384};
/* Dao 2023, "FlashAttention-2", Fig. 4(c): A100 80GB SXM4, causal, head dim 64, forward +
 * backward. FlashAttention-2 and FlashAttention (the CUDA kernel of Dao et al. 2022) series. */
static const double a100_fa2_fb_causal_hd64[6] = {88, 119, 140, 156, 165, 171};
static const double a100_fa1_fb_causal_hd64[6] = {58, 70, 77, 87, 92, 97};
#define NL_A100_PEAK_TFLOPS 312.0
/* Shah et al. 2024, "FlashAttention-3", Fig. 5 (forward) and 6 (backward): H100 80GB SXM5, FP16.
 * Forward causal and non-causal and backward non-causal at head dim 128, forward non-causal
 * at head dim 64; the FlashAttention-2 series (the Ampere kernel run on Hopper) and the
 * FlashAttention-3 series (the Hopper kernel: WGMMA, TMA, warp specialisation). At 512 the
 * non-causal forward's FA3 bar is read as 467 (two readings of the figure give 467 and 497 to
 * FA3 and cuDNN; FA3 trails at 512 in the other panels). */
static const double h100_fa2_fwd_causal_hd128[6] = {191, 260, 298, 319, 333, 335};
static const double h100_fa2_fwd_hd128[6] = {309, 350, 362, 368, 370, 370};
static const double h100_fa2_bwd_hd128[6] = {214, 260, 291, 310, 318, 322};
static const double h100_fa2_fwd_hd64[6] = {282, 306, 318, 321, 322, 324};
static const double h100_fa3_fwd_causal_hd128[6] = {292, 423, 521, 579, 602, 616};
static const double h100_fa3_fwd_hd128[6] = {467, 565, 625, 638, 646, 648};
static const double h100_fa3_bwd_hd128[6] = {316, 424, 501, 542, 559, 561};
static const double h100_fa3_fwd_hd64[6] = {333, 392, 460, 476, 496, 497};
#define NL_H100_PEAK_TFLOPS 989.0

/* A curve at `seq`, linear in log2(seq) between the points, flat outside 512..16k (the
 * measured curves have flattened by 16k: within 1-3% from 8k to 16k). */
static double attn_curve(const double *v, double seq) {
    double x = log2(fmax(seq, attn_seq_pts[0]) / attn_seq_pts[0]);
    if (x >= 5) return v[5];
    int i = (int)x;
    return v[i] + (x - i) * (v[i + 1] - v[i]);
}

/* The GPU generations with a table: 1 Ampere (A100), 2 Hopper (H100, H800, H200); 0 none. */
static int attn_generation(const nl_hw *hw) {
    if (!strncasecmp(hw->name, "a100", 4)) return 1;
    if (!strncasecmp(hw->name, "h100", 4) || !strncasecmp(hw->name, "h800", 4) || !strncasecmp(hw->name, "h200", 4))
        return 2;
    return 0;
}

double nl_plan_attn_triton_slowdown(double seq) {
    return attn_curve(a100_fa2_fb_causal_hd64, seq) / attn_curve(a100_fa1_fb_causal_hd64, seq);
}

/* One kernel's H100 curves -> causal forward and backward TFLOP/s at (seq, head dim in
 * 64..128). Head dim: the forward non-causal rate at 64 against 128, linear in between, on
 * both passes. The causal backward loses against the non-causal one what the causal forward
 * loses (the figures show no causal backward). */
static void hopper_rates(const double *fwd_c, const double *fwd, const double *bwd, const double *fwd64, double seq,
                         double hd, double *f, double *b) {
    double r64 = attn_curve(fwd64, seq) / attn_curve(fwd, seq), w = (hd - 64) / 64;
    double hd_f = r64 + w * (1 - r64);
    *f = attn_curve(fwd_c, seq) * hd_f;
    *b = attn_curve(bwd, seq) * attn_curve(fwd_c, seq) / attn_curve(fwd, seq) * hd_f;
}

int nl_plan_attn_eff(const nl_hw *hw, double seq, double head_dim, int triton, double *fwd_eff, double *bwd_eff) {
    int gen = attn_generation(hw);
    double slow = triton ? nl_plan_attn_triton_slowdown(seq) : 1.0;
    *fwd_eff = *bwd_eff = NL_ATTN_EFF_FALLBACK / slow;
    if (!gen) return 0;
    double hd = fmin(fmax(head_dim, 64), 128), f, b;
    if (gen == 2 && !triton) {
        /* Hopper's FlashAttention: FlashAttention-3. */
        hopper_rates(h100_fa3_fwd_causal_hd128, h100_fa3_fwd_hd128, h100_fa3_bwd_hd128, h100_fa3_fwd_hd64, seq, hd, &f,
                     &b);
    } else if (gen == 2) {
        /* The Triton kernel has no Hopper instructions: FlashAttention-2's rate on H100, slowed. */
        hopper_rates(h100_fa2_fwd_causal_hd128, h100_fa2_fwd_hd128, h100_fa2_bwd_hd128, h100_fa2_fwd_hd64, seq, hd, &f,
                     &b);
    } else {
        /* Ampere: FlashAttention-2's forward + backward rate R at head dim 64 (the paper's A100
         * figure), head dim and the forward/backward split as FlashAttention-2 shows them on
         * H100: b = (b/f) f and 3.5 / R = 1 / f + 2.5 / b. */
        double f2, b2;
        hopper_rates(h100_fa2_fwd_causal_hd128, h100_fa2_fwd_hd128, h100_fa2_bwd_hd128, h100_fa2_fwd_hd64, seq, 128,
                     &f2, &b2);
        double r64 = attn_curve(h100_fa2_fwd_hd64, seq) / attn_curve(h100_fa2_fwd_hd128, seq);
        double R = attn_curve(a100_fa2_fb_causal_hd64, seq) * (1 + (hd - 64) / 64 * (1 / r64 - 1));
        f = R * (1 + 2.5 * f2 / b2) / 3.5;
        b = f * b2 / f2;
        *fwd_eff = f / NL_A100_PEAK_TFLOPS / slow;
        *bwd_eff = b / NL_A100_PEAK_TFLOPS / slow;
        return gen;
    }
    *fwd_eff = f / NL_H100_PEAK_TFLOPS / slow;
    *bwd_eff = b / NL_H100_PEAK_TFLOPS / slow;
    return gen;
}

static double gemm_s(const nl_hw *hw, const nl_eff *e, double M, double N, double K) {
    if (M <= 0 || N <= 0 || K <= 0) return 0;
    double peak = e->fp8_gemm    ? hw->flops_fp8
                  : e->fp32_gemm ? hw->flops_tf32
                                 : hw->flops_bf16,
           bytes = e->fp8_gemm    ? 1
                   : e->fp32_gemm ? 4
                                  : 2;
    double base = e->gemm > 0 ? e->gemm : hw->gemm_eff > 0 ? hw->gemm_eff : 0.6;
    double eff = base * nl_plan_gemm_shape_eff(M) * nl_plan_gemm_shape_eff(N);
    if (e->fp8_gemm) {
        /* FP8's fixed cost per output tile, in K (nl_plan_gemm_fp8_k_eff). The forward reduces
         * over K, the backward's data gradient over N and its weight gradient over M; a layer
         * prices the three passes as 3 x this GEMM, so they share the mean cost. */
        eff *= 3 / (1 / nl_plan_gemm_fp8_k_eff(K) + 1 / nl_plan_gemm_fp8_k_eff(N) + 1 / nl_plan_gemm_fp8_k_eff(M));
    }
    double t_c = 2 * M * N * K / (peak * eff);
    double t_m = bytes * (M * K + K * N) / hw->hbm_bw + 2 * M * N / hw->hbm_bw;
    return t_c > t_m ? t_c : t_m;
}

/* The casts of an FP8 recipe for one layer and T tokens per GPU (nanolm/plan.h), priced by
 * layer_compute as HBM traffic (memory-bound kernels at HBM bandwidth, like the bf16
 * element-wise term). The GEMMs are the ones layer_compute prices; the non-GEMM ops stay bf16
 * and are not counted here.
 *  Per-tensor (Transformer Engine's delayed scaling, scaling == NL_FP8_PER_TENSOR): Hopper's
 *  FP8 GEMM takes both operands K-major, so every FP8 operand is needed twice, as is and
 *  transposed. TE's te.Linear forward runs fp8_cast_transpose_fused on its input (read bf16 2
 *  bytes, write the fp8 copy 1 and its transpose 1, amax in the same pass) and on its weight
 *  (the same 4 bytes per parameter: fp8_weight_cast_s); its backward casts and transposes the
 *  output gradient (fp8_cast_transpose_bgrad_fused, 4 bytes per element) for the data- and
 *  weight-gradient GEMMs. The amax history and scale update is a few bytes per tensor (not
 *  counted).
 *  Block-scaled (DeepSeek-V3 sec. 3.3.2, NL_FP8_BLOCK): activations and gradients are cast in
 *  1x128 tiles (read 2, write 1, one fp32 scale per 128), and the backward's transposed operand
 *  is made again from the stored fp8 copy: "read out, dequantized, transposed, re-quantized
 *  into 128x1 tiles, and stored in HBM" (sec. 3.5.2): read 1, write 1, a second scale, so 5
 *  bytes + 8/128 per element. Routed experts get their input cast once per token before the
 *  dispatch (sec. 3.3.3) and transposed per expert copy. */
void nl_plan_fp8_cast_bytes(const nl_arch *a, const nl_family *fam, int64_t tp, int sp, int scaling, double T, int moe,
                            double *fwd_bytes, double *bwd_bytes) {
    int block = scaling == NL_FP8_BLOCK;
    double t = (double)tp, spd = sp ? t : 1.0, D = (double)a->dim, hd = (double)nl_arch_head_dim(a);
    double qd = (double)a->n_heads * hd, kvd = (double)a->n_kv_heads * hd;
    if (a->kv_lora_rank > 0) {
        qd = (double)a->n_heads * (hd + (double)a->qk_rope_head_dim);
        kvd = qd;
    }
    /* bytes per element of a tensor cast to fp8 with its transposed copy, and of the cast alone */
    double ct = block ? 5.0 + 8.0 / 128 : 4.0, c1 = block ? 3.0 + 4.0 / 128 : 3.0, tr = ct - c1;
    double nmat = fam->gelu_mlp ? 1 : 2; /* fc1 (GeLU) or w1 and w3 (SwiGLU) */
    /* Per token: forward GEMM inputs (elements) and backward output gradients, attention first. */
    double in_el = D / spd + qd / t, gout_el = (qd + 2 * kvd) / t + D / spd;
    double in_bytes = 0;
    if (!moe) {
        double F = (double)a->hidden_dim;
        in_el += D / spd + F / t;
        gout_el += nmat * F / t + D / spd;
    } else {
        double F = (double)a->expert_hidden_dim, k = (double)a->top_k, Fs = F * (double)a->n_shared_experts;
        /* routed experts: the token's input cast once (before the dispatch when block-scaled,
         * after it per copy otherwise) and transposed per copy; their SwiGLU inputs per copy */
        in_bytes += block ? (c1 * D + tr * k * D) : ct * k * D;
        in_el += k * F / t;
        gout_el += k * (2 * F / t + D);
        if (Fs > 0) {
            in_el += D / spd + Fs / t;
            gout_el += 2 * Fs / t + D / spd;
        }
    }
    *fwd_bytes = T * (ct * in_el + in_bytes);
    *bwd_bytes = T * ct * gout_el;
}

typedef struct layer_time {
    double fwd, bwd, recompute; /* compute of one layer for one microbatch */
    double attn_fwd;            /* attention-core share of fwd */
} layer_time;

/* One layer's compute for T tokens per GPU (dense or MoE MLP). */
static void layer_compute(const nl_train_req *q, const nl_layout *L, double T, int moe, layer_time *lt) {
    const nl_arch *a = &q->arch;
    const nl_hw *hw = &q->hw;
    const nl_eff *e = &q->eff;
    double t = (double)L->tp, D = (double)a->dim, hd = (double)nl_arch_head_dim(a);
    double qd = (double)a->n_heads * hd, kvd = (double)a->n_kv_heads * hd;
    if (a->kv_lora_rank > 0) {
        qd = (double)a->n_heads * (hd + (double)a->qk_rope_head_dim);
        kvd = qd;
    }
    double g = gemm_s(hw, e, T, (qd + 2 * kvd) / t, D) + gemm_s(hw, e, T, D, qd / t);
    double F = moe ? (double)a->expert_hidden_dim : (double)a->hidden_dim;
    if (!moe) {
        /* SwiGLU: w1 and w3 then w2; a GeLU MLP: fc1 then fc2. */
        g += (q->fam.gelu_mlp ? 1 : 2) * gemm_s(hw, e, T, F / t, D) + gemm_s(hw, e, T, D, F / t);
    } else {
        double E = (double)a->n_experts, ep = (double)L->ep;
        double local = E / ep;                    /* experts on this GPU */
        double m = T * ep * (double)a->top_k / E; /* tokens per local expert */
        g += local * (2 * gemm_s(hw, e, m, F / t, D) + gemm_s(hw, e, m, D, F / t));
        if (a->n_shared_experts > 0) {
            double Fs = F * (double)a->n_shared_experts;
            g += 2 * gemm_s(hw, e, T, Fs / t, D) + gemm_s(hw, e, T, D, Fs / t);
        }
        g += gemm_s(hw, e, T, E, D); /* router */
    }
    /* Attention core on T local queries against the whole (causal) sequence. */
    double seq = (double)q->seq;
    double attn_flops = T * (double)a->n_heads / t * 2.0 * (qd / (double)a->n_heads + hd) * seq / 2.0;
    double f_eff, b_eff;
    if (e->attn > 0) /* --attn-eff: one flat share of peak for FlashAttention */
        f_eff = b_eff = e->attn / (q->attn_triton ? nl_plan_attn_triton_slowdown(seq) : 1.0);
    else
        nl_plan_attn_eff(hw, seq, hd, q->attn_triton, &f_eff, &b_eff);
    /* fp32 runs compute the attention core on the TF32 tensor cores (FlashAttention has no fp32
     * kernel: PyTorch's math path), priced at the kernel shares on the TF32 peak. */
    double attn_peak = e->fp32_gemm ? hw->flops_tf32 : hw->flops_bf16;
    double at = attn_flops / (attn_peak * f_eff);
    double at_bwd = 2.5 * attn_flops / (attn_peak * b_eff);
    if (q->attn_materialized) {
        /* Older runs (Megatron-LM 2021, BLOOM, OPT) materialise the scores: QK^T and PV as
         * batched GEMMs on the full s x s square (no causal skip: twice the FLOPs) at GEMM
         * efficiency, plus softmax (and dropout) passes over the a s^2 scores in HBM. */
        double sc = T * (double)a->n_heads / t * seq;
        at = gemm_s(hw, e, T * (double)a->n_heads / t, seq, hd) * 2 + sc * 2 * (q->fam.dropout ? 4 : 2) / hw->hbm_bw;
        at_bwd = 2.5 * at;
    }
    /* Element-wise traffic (norms, residual adds, RoPE, activation), bf16 read + write. */
    double sp = L->sp ? t : 1.0;
    double Fl = moe ? F * (double)(a->top_k + a->n_shared_experts) : F;
    double ew_bytes = T * 2.0 * (10 * D / sp + 2 * (qd + kvd) / t + 3 * Fl / t);
    if (q->fam.layernorm) ew_bytes += T * 2.0 * 4 * D / sp;       /* mean pass of LayerNorm */
    if (q->fam.bias) ew_bytes += T * 2.0 * 2 * (D / sp + Fl / t); /* bias adds */
    if (q->fam.dropout) ew_bytes += T * 3.0 * 2 * D / sp;         /* dropout: mask and output */
    double ew = ew_bytes * (e->fp32_gemm ? 2 : 1) / hw->hbm_bw;   /* fp32 activations: 4 bytes, not 2 */
    double k = e->kernels_per_layer * e->kernel_s;
    double cast_fwd = 0, cast_bwd = 0;
    if (e->fp8_gemm) {
        nl_plan_fp8_cast_bytes(a, &q->fam, L->tp, L->sp, e->fp8_gemm, T, moe, &cast_fwd, &cast_bwd);
        double bw = hw->hbm_bw * (e->fp8_gemm == NL_FP8_PER_TENSOR ? NL_FP8_CAST_TRANSPOSE_BW_SHARE : 1.0);
        cast_fwd /= bw;
        cast_bwd /= bw;
    }
    lt->attn_fwd = at;
    lt->fwd = g + at + ew + k + cast_fwd;
    /* Transformer Engine runs the backward's FP8 GEMMs with the split accumulator
     * (NL_FP8_SPLIT_ACC_SLOWDOWN); DeepSeek-V3's promotion overlaps the next WGMMA (sec. 3.3.2). */
    double bwd_g = 2 * g * (e->fp8_gemm == NL_FP8_PER_TENSOR ? NL_FP8_SPLIT_ACC_SLOWDOWN : 1.0);
    lt->bwd = bwd_g + at_bwd + 2 * ew + 2 * k + cast_bwd;
    lt->recompute = 0;
    /* Selective recomputation (Korthikanti et al. 2022 sec. 5) recomputes the attention core
     * (QK^T, softmax, dropout, attention over V) and keeps the rest: with flash attention that
     * core is recomputed inside the kernel's backward anyway (priced in at_bwd); with the scores
     * materialised it is one more forward of the core. Plus the activation function. */
    if (L->recompute == NL_RECOMPUTE_SELECTIVE) lt->recompute = 0.3 * ew + 0.25 * k + (q->attn_materialized ? at : 0);
    if (L->recompute == NL_RECOMPUTE_FULL) lt->recompute = lt->fwd;
}

/* Where a group of `size` ranks `stride` apart lies: 0 inside one node, else how many of its
 * members share a node (>= 1), which nl_plan_coll_time needs to spread a ring over their NICs. */
static int spans(const nl_hw *hw, double stride, double size) {
    double gpn = (double)hw->gpus_per_node;
    if (stride * size <= gpn) return 0;
    double k = floor(gpn / stride);
    return k < 1 ? 1 : (int)fmin(k, size);
}

/* Bytes per parameter that data-parallel collectives move for the weights. The fp8 recipe's
 * weight bytes count the bf16 weights and their cached fp8 copy, but collectives move the bf16
 * weights only: each GPU casts what it holds or gathered (fp8_weight_cast_s). */
static double coll_weight_bytes(const nl_recipe *r) { return !strcmp(r->name, "fp8") ? 2.0 : r->weight_bytes; }

/* Whether the layout's checkpoints are split over its tp ranks (q->distribute_saved applies to
 * full recomputation with tp > 1 and no sequence parallelism, which already splits them). */
static int dist_saved(const nl_train_req *q, const nl_layout *L) {
    return q->distribute_saved && L->recompute == NL_RECOMPUTE_FULL && L->tp > 1 && !L->sp;
}

/* Derived quantities of one layout that memory, compute and communication share. */
typedef struct layout_ctx {
    parts P;
    double t, pp, dpz;                                            /* tp, pp and dp x cp as doubles */
    double lps;                                                   /* layers on the busiest stage */
    double lps_first;                                             /* layers on the first stage */
    double shard;                                                 /* data-parallel ranks a ZeRO-3/HSDP shard spans */
    double dense_local;                                           /* non-expert parameters on this GPU */
    double expert_local;                                          /* routed-expert parameters on this GPU */
    double T;                                                     /* tokens per microbatch per GPU */
    double m;                                                     /* microbatches per step */
    double moe_frac;                                              /* share of the layers that are MoE */
    double per_layer_fwd, per_layer_bwd, per_layer_rec, attn_fwd; /* one layer, one microbatch */
    double t_mb_fwd, t_mb; /* one microbatch on the busiest stage: forward, all */
    double cls;            /* classifier and loss of one microbatch */
    double t_fp8_weights;  /* FP8 recipes: the step's weight casts (fp8_weight_cast_s) */
} layout_ctx;

/* Layers per pipeline stage: the busiest stage's and the first stage's (which holds the most
 * microbatches in flight). Even: ceil(layers / pp) on every stage, one less on the first when
 * that leaves the stages uneven. Uneven ends: first_layers and last_layers, the middle stages
 * (layers - first - last) / (pp - 2) each. */
static void stage_layers(const nl_train_req *q, const nl_layout *L, double *busiest, double *first) {
    double n = (double)q->arch.n_layers, pp = (double)L->pp;
    if (L->pp > 1 && (q->fix.first_layers > 0 || q->fix.last_layers > 0)) {
        double f = (double)q->fix.first_layers, l = (double)q->fix.last_layers;
        double mid = L->pp > 2 ? (n - f - l) / (pp - 2) : 0;
        *busiest = fmax(fmax(f, l), mid);
        *first = f;
        return;
    }
    *busiest = ceil(n / pp);
    *first = (L->pp > 1 && pp * *busiest > n) ? *busiest - 1 : *busiest;
}

/* Whether the stages of a layout can be cut as it says: NL_OK, or NL_ERR_INVALID naming the
 * constraint. Even stages: pp x interleave chunks over the layers (one chunk may hold only the
 * embedding and one only the output layer: up to layers + 2 chunks, Llama 3 sec. 3.3.2), each
 * stage's layers a multiple of the interleave. Uneven ends: both given, the middle stages
 * even, each end's layers (with the embedding or the output layer) filling its chunks. */
static nl_status check_stages(const nl_train_req *q, const nl_layout *L) {
    long long n = (long long)q->arch.n_layers, pp = (long long)L->pp, v = (long long)(L->vpp > 1 ? L->vpp : 1);
    long long f = (long long)q->fix.first_layers, l = (long long)q->fix.last_layers;
    if (f > 0 || l > 0) {
        if (pp < 2) return nl_fail(NL_ERR_INVALID, "layout: first/last stage layers need pp >= 2");
        if (f < 1 || l < 1)
            return nl_fail(NL_ERR_INVALID, "layout: give both the first and the last stage's layers (>= 1 each)");
        if (f + l > n || (pp == 2 && f + l != n))
            return nl_fail(NL_ERR_INVALID,
                           "layout: first %lld + last %lld stage layers do not fit %lld layers on %lld stages", f, l, n,
                           pp);
        if (pp > 2 && (n - f - l) % (pp - 2))
            return nl_fail(NL_ERR_INVALID,
                           "layout: the %lld layers between the first (%lld) and last (%lld) stage do not split evenly "
                           "over the %lld middle stages",
                           n - f - l, f, l, pp - 2);
        if (v > 1 && ((pp > 2 && ((n - f - l) / (pp - 2)) % v) || (f % v && (f + 1) % v) || (l % v && (l + 1) % v)))
            return nl_fail(NL_ERR_INVALID,
                           "layout: interleave %lld needs each stage's layers in whole chunks of equal size (the end "
                           "stages may count the embedding or the output layer as one chunk); stages %lld, %lld x "
                           "%lld, %lld",
                           v, f, pp - 2, pp > 2 ? (n - f - l) / (pp - 2) : 0, l);
        return NL_OK;
    }
    if (pp * v > n + (v > 1 ? 2 : 0))
        return nl_fail(NL_ERR_INVALID, "layout: pp %lld x interleave %lld = %lld chunks exceed %lld layers", pp, v,
                       pp * v, n);
    if (v > 1 && n % (pp * v) && pp * v != n + 2)
        return nl_fail(NL_ERR_INVALID,
                       "layout: interleave %lld: %lld layers do not split into %lld stages x %lld chunks; give the "
                       "first and last stage's layers for uneven ends (Llama 3 405B: 126 layers on 16 x 8 = "
                       "--first-stage-layers 7 --last-stage-layers 7)",
                       v, n, pp, v);
    return NL_OK;
}

/* A schedule's own constraints. DualPipe (deepseek-ai/DualPipe, dualpipe.py, DualPipe.step):
 * `assert num_ranks % 2 == 0` and `num_chunks % 2 == 0 and num_chunks >= num_ranks * 2`: an
 * even number of stages, an even number of microbatches, at least twice the stages. Interleaved
 * 1F1B (Megatron-LM's schedules.py): the microbatches a multiple of pp. */
static nl_status check_schedule(const nl_train_req *q, const nl_layout *L) {
    long long pp = (long long)L->pp, m = (long long)L->n_micro;
    if (q->schedule == NL_SCHED_DUALPIPE) {
        if (pp < 2 || pp % 2)
            return nl_fail(NL_ERR_INVALID,
                           "layout: DualPipe runs its two directions over an even number of pipeline "
                           "stages (pp >= 2, even), got pp %lld",
                           pp);
        if (m % 2 || m < 2 * pp)
            return nl_fail(NL_ERR_INVALID,
                           "layout: DualPipe needs an even number of microbatches, at least 2 x pp = %lld; the batch "
                           "gives %lld",
                           2 * pp, m);
    } else if (L->pp > 1 && m < pp) {
        return nl_fail(NL_ERR_INVALID,
                       "layout: a pipeline of %lld stages needs at least %lld microbatches per step, "
                       "the batch gives %lld",
                       pp, pp, m);
    }
    if (L->vpp > 1 && m % pp)
        return nl_fail(NL_ERR_INVALID,
                       "layout: the interleaved schedule needs the microbatches (%lld) to be a multiple of pp %lld", m,
                       pp);
    return NL_OK;
}

/* Context parallelism splits attention inside a fused kernel (ring attention over KV blocks);
 * Megatron-Core's unfused DotProductAttention, which materialises the scores, refuses it
 * ("Context parallelism is only supported by TEDotProductAttention!",
 * megatron/core/transformer/dot_product_attention.py), so materialised attention runs at cp 1. */
#define CP_NEEDS_FUSED                                                                                                 \
    "layout: context parallelism needs a fused attention kernel (Megatron-Core's unfused attention, which "            \
    "materialises the scores, supports only cp 1): use --cp 1 or --attention flash"

/* The layout's own consistency: degrees, divisibility, what the model allows. */
static nl_status check_layout(const nl_train_req *q, nl_layout *L) {
    const nl_arch *a = &q->arch;
    if (L->dp < 1 || L->tp < 1 || L->pp < 1 || L->cp < 1 || L->ep < 1 || L->micro_batch < 1 || L->n_micro < 1)
        return nl_fail(NL_ERR_INVALID, "layout: every degree must be >= 1");
    if (L->vpp < 1) L->vpp = 1;
    if (L->tp == 1) L->sp = 0;
    if (L->dp * L->tp * L->pp * L->cp != q->gpus)
        return nl_fail(NL_ERR_INVALID, "layout: dp*tp*pp*cp = %lld, not the %lld GPUs",
                       (long long)(L->dp * L->tp * L->pp * L->cp), (long long)q->gpus);
    if (a->n_heads % L->tp)
        return nl_fail(NL_ERR_INVALID, "layout: tp %lld does not divide %lld heads", (long long)L->tp,
                       (long long)a->n_heads);
    /* Uneven stages are priced by the busiest one; the search keeps to pp | layers unless the
     * ends are given. */
    NL_TRY(check_stages(q, L));
    NL_TRY(check_schedule(q, L));
    if (q->seq % L->cp)
        return nl_fail(NL_ERR_INVALID, "layout: cp %lld does not divide the sequence %lld", (long long)L->cp,
                       (long long)q->seq);
    if (L->cp > 1 && q->attn_materialized) return nl_fail(NL_ERR_INVALID, "%s", CP_NEEDS_FUSED);
    if (L->ep > 1 && (a->n_experts == 0 || a->n_experts % L->ep || (L->dp * L->cp) % L->ep))
        return nl_fail(NL_ERR_INVALID, "layout: ep %lld must divide the experts and dp*cp", (long long)L->ep);
    if (L->zero == NL_ZERO_HSDP && L->dp <= 1) return nl_fail(NL_ERR_INVALID, "layout: hsdp needs dp > 1");
    return NL_OK;
}

/* Fills the shared quantities of a checked layout (no compute yet). */
static void ctx_init(const nl_train_req *q, const nl_layout *L, layout_ctx *c) {
    const nl_arch *a = &q->arch;
    memset(c, 0, sizeof *c);
    get_parts(q, &c->P);
    c->t = (double)L->tp;
    c->pp = (double)L->pp;
    c->dpz = (double)(L->dp * L->cp);
    stage_layers(q, L, &c->lps, &c->lps_first);
    /* Data-parallel ranks inside one node: the HSDP shard group. */
    double in_node = floor((double)q->hw.gpus_per_node / (c->t * (double)L->cp));
    if (in_node < 1) in_node = 1;
    c->shard = L->zero == NL_ZERO_HSDP ? fmin(in_node, c->dpz) : c->dpz;
    c->dense_local = (c->P.dense_layers_params * c->lps / (double)a->n_layers +
                      (L->pp > 1 ? fmax(c->P.emb, c->P.cls) : c->P.emb + c->P.cls)) /
                     c->t;
    c->expert_local = c->P.expert_params * c->lps / (double)a->n_layers / ((double)L->ep * c->t);
    c->T = (double)L->micro_batch * (double)q->seq / (double)L->cp;
    c->m = (double)L->n_micro;
    c->moe_frac = c->P.moe_layers / (double)a->n_layers;
}

/* Memory per GPU (the first or the last stage, whichever needs more), and whether it fits. */
static void eval_memory(const nl_train_req *q, const nl_layout *L, const layout_ctx *c, nl_train_eval *o) {
    const nl_arch *a = &q->arch;
    const nl_eff *e = &q->eff;
    nl_state_bytes sd, se;
    nl_plan_state_bytes(&q->recipe, L->zero, (int64_t)c->dpz, (int64_t)c->shard, &sd);
    double edp = c->dpz / (double)L->ep;
    nl_plan_state_bytes(&q->recipe, L->zero, (int64_t)edp, (int64_t)fmin(c->shard, edp), &se);
    o->mem_weights = c->dense_local * sd.weights + c->expert_local * se.weights;
    o->mem_grads = c->dense_local * sd.grads + c->expert_local * se.grads;
    o->mem_optim = c->dense_local * sd.optim + c->expert_local * se.optim;

    nl_act_opts ao = {.tp = L->tp,
                      .sp = L->sp,
                      .flash = !q->attn_materialized,
                      .recompute = L->recompute,
                      .seq = (double)q->seq,
                      .bytes_per_elem = q->eff.fp32_gemm ? 4 : 2,
                      .fam = q->fam,
                      .fp8_cache = !strcmp(q->recipe.name, "fp8-ds3") ? NL_FP8_CACHE_DS3
                                   : !strcmp(q->recipe.name, "fp8")   ? NL_FP8_CACHE_TE
                                                                      : NL_FP8_CACHE_NONE,
                      .distribute_saved = dist_saved(q, L)};
    nl_act_layer al;
    nl_plan_act_layer(a, &ao, &al);
    /* 1F1B: the first stage holds min(p, m) microbatches (Narayanan et al. 2021 sec. 2.2);
     * interleaved adds (p-1)/(p v) (Korthikanti et al. 2022 sec. 4.2.3); DualPipe holds p + 1
     * (DeepSeek-V3 Table 2) and keeps two copies of its stage's weights. The last stage holds
     * one microbatch but the logits: the busier of the two is the need. */
    double inflight = L->pp > 1 ? fmin(c->pp, c->m) : 1.0;
    if (L->vpp > 1) inflight *= 1.0 + (c->pp - 1) / (c->pp * (double)L->vpp);
    if (q->schedule == NL_SCHED_DUALPIPE && L->pp > 1) {
        inflight = fmin(c->pp + 1, c->m);
        o->mem_weights *= 2;
    }
    /* The first stage's layers (stage_layers: given, or one less when the stages cannot be even,
     * as Llama 3 sec. 3.3.2 removes one layer from the first and the last stage). */
    double lps_first = c->lps_first;
    double act_one = c->T * lps_first * al.bytes_per_token,
           act_work = c->T * (al.working_bytes_per_token - al.bytes_per_token);
    double logits = nl_plan_logits_bytes(a, c->T) / c->t;
    if (L->pp > 1 && (act_one * (inflight - 1) > logits)) {
        o->mem_act = act_one * inflight + act_work; /* first stage */
        o->mem_logits = 0;
    } else {
        o->mem_act = act_one + act_work; /* last stage (or no pipeline) */
        o->mem_logits = logits;
        if (L->pp == 1) o->mem_act = act_one * inflight + act_work;
    }
    o->mem_temp = e->reserved_bytes;
    if (L->zero == NL_ZERO_3 || L->zero == NL_ZERO_HSDP) {
        /* Gathered weights of the layer in use and the prefetched next one, and the gradient
         * bucket being reduced, bounded as DeepSpeed bounds them: stage3_max_live_parameters 1e9
         * and reduce_bucket_size 5e8 elements (DeepSpeed ZeRO-3 config defaults). */
        double layer = c->P.layer_params_max / c->t;
        o->mem_temp += fmin(2 * layer, 1e9) * q->recipe.weight_bytes + fmin(layer, 5e8) * fmin(q->recipe.grad_bytes, 4);
    }
    o->mem_total = o->mem_weights + o->mem_grads + o->mem_optim + o->mem_act + o->mem_logits + o->mem_temp;
    o->mem_usable = q->hw.mem_bytes * e->usable_mem;
    o->fits = o->mem_total <= o->mem_usable;
    if (!o->fits)
        snprintf(o->reason, sizeof o->reason,
                 "needs %.1f GB > %.1f GB usable (state %.1f, activations %.1f, logits %.1f)", o->mem_total / 1e9,
                 o->mem_usable / 1e9, (o->mem_weights + o->mem_grads + o->mem_optim) / 1e9, o->mem_act / 1e9,
                 o->mem_logits / 1e9);
}

/* The weight casts of an FP8 recipe in one step, at HBM bandwidth: the transformer layers'
 * weights on this GPU cast to fp8 with their transposed copy (Transformer Engine's
 * fp8_cast_transpose_fused on the weight: read bf16 2, write 1 + 1 bytes per parameter;
 * block-scaled, 128x128 blocks: the cast, then the transposed copy read and written again, 5).
 * How often: te.Linear re-casts on every forward unless told the microbatch is not the first
 * (`update_fp8_weights = is_first_microbatch is None or is_first_microbatch`). With weights
 * resident (ZeRO 0-2) the fp8 copy is kept across the step's microbatches, as the recipe's
 * memory counts it (plan/memory.c: bf16 weights + a cached fp8 copy), so once per step; under
 * ZeRO-3/HSDP every microbatch gathers the bf16 weights again and casts what it gathered. */
static double fp8_weight_cast_s(const nl_train_req *q, const nl_layout *L, const layout_ctx *c) {
    double w = c->P.dense_layers_params * c->lps / (double)q->arch.n_layers / c->t + c->expert_local;
    double casts = (L->zero == NL_ZERO_3 || L->zero == NL_ZERO_HSDP) ? c->m : 1;
    double bytes = q->eff.fp8_gemm == NL_FP8_BLOCK ? 5.0 : 4.0;
    double share = q->eff.fp8_gemm == NL_FP8_PER_TENSOR ? NL_FP8_CAST_TRANSPOSE_BW_SHARE : 1.0;
    return casts * bytes * w / (q->hw.hbm_bw * share);
}

/* Compute of one microbatch on the busiest stage: its layers (dense and MoE in proportion)
 * forward, backward and recomputed, and the classifier. */
static void eval_compute(const nl_train_req *q, const nl_layout *L, layout_ctx *c) {
    layer_time ld, lm = {0, 0, 0, 0};
    layer_compute(q, L, c->T, 0, &ld);
    if (c->P.moe_layers > 0) layer_compute(q, L, c->T, 1, &lm);
    double f = c->moe_frac;
    c->per_layer_fwd = (1 - f) * ld.fwd + f * lm.fwd;
    c->per_layer_bwd = (1 - f) * ld.bwd + f * lm.bwd;
    c->per_layer_rec = (1 - f) * ld.recompute + f * lm.recompute;
    c->attn_fwd = (1 - f) * ld.attn_fwd + f * lm.attn_fwd;
    c->cls = 3 * gemm_s(&q->hw, &q->eff, c->T, (double)q->arch.vocab_size / c->t, (double)q->arch.dim) +
             3 * c->T * (double)q->arch.vocab_size / c->t * 6 / q->hw.hbm_bw;
    c->t_mb_fwd = c->lps * c->per_layer_fwd;
    c->t_mb = c->t_mb_fwd + c->lps * (c->per_layer_bwd + c->per_layer_rec) + c->cls;
    c->t_fp8_weights = q->eff.fp8_gemm ? fp8_weight_cast_s(q, L, c) : 0;
}

/* Tensor, context, expert and pipeline communication of one microbatch: o->t_tp, t_cp, t_ep,
 * t_pp (per step, all of it) and the context-parallel part attention cannot hide. */
static void eval_model_parallel_comm(const nl_train_req *q, const nl_layout *L, const layout_ctx *c, nl_train_eval *o,
                                     double *cp_exposed_mb) {
    const nl_arch *a = &q->arch;
    const nl_hw *hw = &q->hw;
    double t = c->t, D = (double)a->dim, layer_act = c->T * D * (q->eff.fp32_gemm ? 4 : 2);
    int tp_span = spans(hw, 1, t), cp_span = spans(hw, t, (double)L->cp), ep_span = spans(hw, t, (double)L->ep),
        pp_span = spans(hw, t * c->dpz, c->pp);
    /* Tensor parallel: 2 all-reduces per layer forward, 2 backward (Shoeybi et al. 2019 fig. 4);
     * with SP each is a reduce-scatter + all-gather, the same bytes (Korthikanti sec. 4.2.2). */
    double t_tp_mb = 0;
    if (L->tp > 1) {
        double one = L->sp ? nl_plan_coll_time(hw, NL_REDUCE_SCATTER, L->tp, layer_act, tp_span) +
                                 nl_plan_coll_time(hw, NL_ALL_GATHER, L->tp, layer_act, tp_span)
                           : nl_plan_coll_time(hw, NL_ALL_REDUCE, L->tp, layer_act, tp_span);
        t_tp_mb = c->lps * 4 * one * (L->recompute == NL_RECOMPUTE_FULL ? 1.5 : 1.0);
        /* Distributed checkpoints: each layer's recomputation first all-gathers its input over
         * the tp ranks (Megatron-LM's CheckpointFunction gathers it before the recompute). */
        if (dist_saved(q, L)) t_tp_mb += c->lps * nl_plan_coll_time(hw, NL_ALL_GATHER, L->tp, layer_act, tp_span);
    }
    /* Context parallel (ring attention, Liu et al. 2023): all-gather K,V forward, again in
     * backward plus a reduce-scatter of dK,dV; overlapped with the attention core. */
    double t_cp_mb = 0;
    *cp_exposed_mb = 0;
    if (L->cp > 1) {
        double hd = (double)nl_arch_head_dim(a);
        double kv = a->kv_lora_rank > 0 ? (double)(a->kv_lora_rank + a->qk_rope_head_dim)
                                        : 2 * (double)a->n_kv_heads * hd / fmin(t, (double)a->n_kv_heads);
        double kv_arr = c->T * (double)L->cp * kv * 2;
        double one = nl_plan_coll_time(hw, NL_ALL_GATHER, L->cp, kv_arr, cp_span);
        double rs = nl_plan_coll_time(hw, NL_REDUCE_SCATTER, L->cp, kv_arr, cp_span);
        t_cp_mb = c->lps * (2 * one + rs);
        *cp_exposed_mb = c->lps * (fmax(0, one - c->attn_fwd) + fmax(0, one + rs - 2.5 * c->attn_fwd));
    }
    /* Expert parallel: all-to-all dispatch and combine forward, their twins backward. */
    /* Node-limited routing (DeepSeek-V3 sec. 3.2.2: each token goes to at most M = 4 nodes; its
     * copy crosses the network once per node and is forwarded to the node's experts over NVLink)
     * caps the copies that cross nodes at min(top_k, M) when the group spans nodes. DeepSeek-V3's
     * FP8 recipe dispatches in FP8 (sec. 3.3.3, "Low-Precision Communication": 1 byte plus a
     * scale per 128) and combines in BF16. */
    double t_ep_mb = 0;
    if (L->ep > 1 && c->P.moe_layers > 0) {
        double copies = (double)a->top_k;
        if (ep_span && q->moe_node_limit > 0) copies = fmin(copies, (double)q->moe_node_limit);
        double disp_b = !strcmp(q->recipe.name, "fp8-ds3") ? 1.0 + 4.0 / 128 : 2.0;
        double arr = c->T * copies * D;
        t_ep_mb = c->lps * c->moe_frac *
                  (nl_plan_coll_time(hw, NL_ALL_TO_ALL, L->ep, arr * disp_b, ep_span) +
                   3 * nl_plan_coll_time(hw, NL_ALL_TO_ALL, L->ep, arr * 2, ep_span));
    }
    /* Pipeline: one activation forward and one gradient backward per microbatch and boundary,
     * v times as often when interleaved (Narayanan et al. 2021 sec. 2.2). Each of the t
     * tensor-parallel ranks sends 1/t of the activation over its own NIC (with sequence
     * parallelism it only holds 1/t; without, Megatron-LM's scatter/gather optimization,
     * Narayanan et al. 2021 sec. 4.1, splits the replicated tensor, sends the pieces in parallel
     * and all-gathers them over NVLink on the receiving stage). */
    double t_pp_mb = 0;
    if (L->pp > 1) t_pp_mb = 2 * (double)L->vpp * nl_plan_coll_time(hw, NL_P2P, 2, layer_act / t, pp_span);
    o->t_tp = c->m * t_tp_mb;
    o->t_cp = c->m * t_cp_mb;
    o->t_ep = c->m * t_ep_mb;
    o->t_pp = c->m * t_pp_mb;
}

/* The latency of one ring all-gather or reduce-scatter over p ranks, NCCL's own cost model
 * (src/graph/tuning.cc of NCCL 2.8-2.9, the Simple protocol these large collectives use): a base
 * of 8.4 us plus 3.4 us per NVLink step and 9.6 us per network step, p - 1 steps of which
 * nodes - 1 cross the network. Within one node it is the GPU's flat latency_s. */
static double zero3_ring_latency(const nl_hw *hw, int64_t p, int span) {
    if (!span || p < 2) return hw->latency_s;
    double per_node = (double)span, nodes = ceil((double)p / per_node), steps = (double)p - 1;
    return 8.4e-6 + (steps - (nodes - 1)) * 3.4e-6 + (nodes - 1) * 9.6e-6;
}

/* Data-parallel / ZeRO communication per step (o->t_dp) and the part of it that backward (or
 * forward, for gathers) cannot hide. Gradients reduce in the recipe's gradient precision,
 * weights gather in the weight precision. */
static double eval_dp_comm(const nl_train_req *q, const nl_layout *L, const layout_ctx *c, nl_train_eval *o) {
    const nl_hw *hw = &q->hw;
    const nl_eff *e = &q->eff;
    double gbytes = (c->dense_local + c->expert_local) * fmin(q->recipe.grad_bytes, 4);
    double wbytes = (c->dense_local + c->expert_local) * coll_weight_bytes(&q->recipe);
    double bwd_last = c->lps * c->per_layer_bwd, fwd_first = c->lps * c->per_layer_fwd;
    int dp_span = spans(hw, c->t, c->dpz);
    int64_t dz = (int64_t)c->dpz;
    double t_dp = 0, exposed = 0;
    double recv_bytes = 0; /* bytes each GPU receives over the step's data-parallel collectives */
    double ring = dz > 1 ? (dz - 1.0) / (double)dz : 0;
    switch (L->zero) {
    case NL_ZERO_0:
        t_dp = nl_plan_coll_time(hw, NL_ALL_REDUCE, dz, gbytes, dp_span);
        exposed = fmax(0, t_dp - e->dp_overlap * bwd_last);
        recv_bytes = 2 * ring * gbytes;
        break;
    case NL_ZERO_1:
    case NL_ZERO_2: {
        double rs = nl_plan_coll_time(hw, NL_REDUCE_SCATTER, dz, gbytes, dp_span);
        double ag = nl_plan_coll_time(hw, NL_ALL_GATHER, dz, wbytes, dp_span);
        t_dp = rs + ag;
        exposed = fmax(0, rs - e->dp_overlap * bwd_last) + fmax(0, ag - e->dp_overlap * fwd_first);
        recv_bytes = ring * (gbytes + wbytes);
        break;
    }
    case NL_ZERO_3:
    case NL_ZERO_HSDP: {
        int64_t s = (int64_t)c->shard;
        int sspan = L->zero == NL_ZERO_HSDP ? spans(hw, c->t * (double)L->cp, (double)s) : dp_span;
        /* Layer by layer: calls_per_layer gathers (and reduce-scatters) per layer, each a ring
         * whose latency grows with its ranks (zero3_ring_latency); the bytes as one collective.
         * NIC sharing: across nodes every GPU of a node is a member and runs the same gathers at
         * the same time, and each GPU's shard traffic is priced at its own NIC's share of the
         * node's network, not spread over all the node's NICs as one large nccl-tests ring is
         * (NCCL issue #1221). The published DeepSpeed ZeRO-3 runs of Narayanan et al. 2021
         * (Table 2: 175B and 530B on 384-2,240 A100s, one 200 Gb/s NIC per GPU) take as long per
         * step at 1,536 GPUs as at 768 (and at 2,240 as at 1,120): ~1 TB of parameter traffic
         * per GPU per step at ~20 GB/s, one NIC at inter_eff; with the spread they would run 2-4x
         * faster than published. zero3_nic_spread restores the spread. */
        double calls = c->lps * (q->zero3_calls_per_layer > 0 ? (double)q->zero3_calls_per_layer : 1.0);
        int nic_span = sspan && !q->zero3_nic_spread ? 1 : sspan;
        double lat = zero3_ring_latency(hw, s, sspan);
        double ag = nl_plan_coll_time(hw, NL_ALL_GATHER, s, wbytes, nic_span) - hw->latency_s + calls * lat;
        double rs = nl_plan_coll_time(hw, NL_REDUCE_SCATTER, s, gbytes, nic_span) - hw->latency_s + calls * lat;
        /* What a gather can hide behind: the compute of the module before it, but only as much of
         * it as the prefetch reaches ahead: prefetch parameters per call out of the layer's
         * (DeepSpeed's stage3_prefetch_bucket_size; FSDP prefetches the next whole layer). */
        double layer_params = (c->dense_local + c->expert_local) / c->lps;
        double reach = q->zero3_prefetch > 0 && layer_params > 0
                           ? fmin(1, q->zero3_prefetch * (calls / c->lps) / layer_params)
                           : 1.0;
        /* Backward gathers the layer again (recomputation reuses that gather). */
        t_dp = c->m * (2 * ag + rs);
        exposed = c->m * (ag - fmin(e->dp_overlap * fwd_first, reach * ag) + (ag + rs) -
                          fmin(e->dp_overlap * bwd_last, reach * (ag + rs)));
        recv_bytes = c->m * (s > 1 ? (s - 1.0) / (double)s : 0) * (2 * wbytes + gbytes);
        if (L->zero == NL_ZERO_HSDP && c->dpz > c->shard) {
            double ar = nl_plan_coll_time(hw, NL_ALL_REDUCE, (int64_t)(c->dpz / c->shard), gbytes / c->shard, 1);
            double r = c->dpz / c->shard;
            t_dp += ar;
            exposed += fmax(0, ar - e->dp_overlap * bwd_last * 0.5);
            recv_bytes += 2 * (r - 1) / r * gbytes / c->shard;
        }
        break;
    }
    }
    o->t_dp = t_dp;
    /* A collective hidden behind compute still costs the compute HBM time: NCCL stages what it
     * receives in device memory and reads it back, and reads or writes the user buffers, about
     * 3x the bytes it receives (NCCL's maintainer, NVIDIA/nccl issue #1428: link traffic "needs to
     * be multiplied by at least 2x for memory bandwidth ... it can be 3x"; the same issue measures
     * A100 GEMMs 1.76x and attention 1.8x slower while an all-gather overlaps them). The hidden
     * share of the step's data-parallel collectives is charged at that much HBM traffic. */
    double hidden = t_dp > 0 ? fmax(0, t_dp - exposed) / t_dp : 0;
    /* (The napkin, --mfu, keeps the course's compute + exposed communication.) */
    o->t_overlap_hbm = e->fixed_mfu > 0 ? 0 : NL_COLL_HBM_PER_BYTE * hidden * recv_bytes / hw->hbm_bw;
    return exposed;
}

/* Compute and pipeline bubble of the step: napkin (a fixed MFU) or the kernel model with the
 * schedule's bubble. */
static void eval_compute_and_bubble(const nl_train_req *q, const nl_layout *L, const layout_ctx *c, double tokens_step,
                                    nl_train_eval *o) {
    double pp = c->pp;
    if (q->eff.fixed_mfu > 0) {
        /* Napkin mode (the course's): compute = 6 * N * tokens at a fixed MFU, N = all parameters;
         * no kernel model. */
        double peak = q->eff.fp32_gemm ? q->hw.flops_tf32 : q->hw.flops_bf16;
        o->t_compute = 6 * c->P.total * tokens_step / (double)q->gpus / (peak * q->eff.fixed_mfu);
        o->t_bubble = L->pp > 1 ? o->t_compute * (pp - 1) / (c->m * (double)L->vpp) : 0;
        return;
    }
    o->t_compute = c->m * c->t_mb + c->t_fp8_weights;
    /* Bubble: (p-1)/v microbatch slots (GPipe and 1F1B alike; Narayanan et al. 2021 sec. 2.2). */
    o->t_bubble = L->pp > 1 ? (pp - 1) / (double)L->vpp * c->t_mb : 0;
    /* DualPipe (DeepSeek-V3 Table 2): (p/2 - 1)(F&B + B - 3W), about (p/2 - 1) forward
     * chunks; it overlaps the forward of one microbatch with the backward of another. */
    if (q->schedule == NL_SCHED_DUALPIPE && L->pp > 1) o->t_bubble = fmax(0, pp / 2 - 1) * c->t_mb_fwd;
    /* ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", sec. 3.1): the backward
     * splits into B (input gradients) and W (weight gradients), and W fills the cool-down;
     * with 1F1B's memory the bubble is (p-1)(T_F + T_B - T_W), T_B = T_W = half the backward:
     * (p - 1) forward chunks, a third of 1F1B's (p-1)(T_F + T_B + T_W) when T_B = T_F. */
    if (q->schedule == NL_SCHED_ZB_H1 && L->pp > 1)
        o->t_bubble = (pp - 1) / (double)L->vpp * (c->t_mb_fwd + c->cls / 3);
}

/* The tensor cores a recipe's GEMMs run on: FP8 recipes on the FP8 units (per-tensor scaling,
 * Transformer Engine, or DeepSeek-V3's block scaling), fp32 on the TF32 units; a GPU without
 * them refuses the recipe (an A100 has no FP8 units: Transformer Engine's FP8 needs Hopper or
 * Ada, compute capability 8.9+). */
static nl_status recipe_units(const nl_train_req *q, nl_eff *e) {
    e->fp8_gemm = !strcmp(q->recipe.name, "fp8-ds3")   ? NL_FP8_BLOCK
                  : !strncmp(q->recipe.name, "fp8", 3) ? NL_FP8_PER_TENSOR
                                                       : 0;
    e->fp32_gemm = !strcmp(q->recipe.name, "fp32");
    if (e->fp8_gemm && !(q->hw.flops_fp8 > 0))
        return nl_fail(NL_ERR_INVALID,
                       "recipe %s runs its GEMMs in FP8, but %s has no FP8 tensor cores (catalog flops_fp8 = 0); "
                       "use --recipe bf16, or a GPU with FP8 (h100, h200, h800, b200, mi300x)",
                       q->recipe.name, q->hw.name);
    if (e->fp32_gemm && !(q->hw.flops_tf32 > 0))
        return nl_fail(NL_ERR_INVALID,
                       "recipe fp32 runs its GEMMs at the TF32 rate, but %s has none in the catalog "
                       "(flops_tf32 = 0); give it with --hw FILE.json",
                       q->hw.name);
    return NL_OK;
}

/* Prices one layout: memory first, then the step (compute, bubble, exposed communication,
 * optimizer) and what follows from it (tokens/s, MFU, days, GPU-hours, cost). A layout that
 * does not fit is priced too, with o->fits = 0 and its reason. Returns NL_ERR_INVALID for an
 * inconsistent layout. */
nl_status nl_plan_train_eval(const nl_train_req *q0, const nl_layout *L0, nl_train_eval *o) {
    memset(o, 0, sizeof *o);
    nl_train_req qq = *q0;
    const nl_train_req *q = &qq;
    /* FP8 recipes run their GEMMs in FP8: per-tensor scaling (Transformer Engine) or DeepSeek-V3's
     * block scaling. */
    NL_TRY(recipe_units(q0, &qq.eff));
    o->L = *L0;
    nl_layout *L = &o->L;
    NL_TRY(check_layout(q, L));
    layout_ctx c;
    ctx_init(q, L, &c);
    eval_memory(q, L, &c, o);

    double tokens_step = (double)q->global_batch * (double)q->seq;
    double nmm = nl_plan_matmul_params_fam(&q->arch, &q->fam) * c.P.scale;
    o->model_flops_per_step = tokens_step * (6 * nmm + 3 * nl_plan_attn_flops_per_token(&q->arch, (double)q->seq));
    eval_compute(q, L, &c);
    double cp_exposed_mb;
    eval_model_parallel_comm(q, L, &c, o, &cp_exposed_mb);
    double dp_exposed = eval_dp_comm(q, L, &c, o);
    eval_compute_and_bubble(q, L, &c, tokens_step, o);
    /* Expert all-to-alls: DualPipe hides them behind the other direction's compute (DeepSeek-V3
     * sec. 3.2.1, "nearly zero all-to-all communication overhead"); otherwise they are exposed
     * but the share ep_overlap that token dispatch overlaps with the shared expert. */
    /* DualPipe pairs a forward chunk of one microbatch with a backward chunk of another and runs
     * each one's all-to-all during the other's computation (DeepSeek-V3 sec. 3.2.1, Fig. 4): the
     * communication hides behind at most the layers' compute of the step; what exceeds it shows. */
    double dualpipe_cap = c.m * c.lps * (c.per_layer_fwd + c.per_layer_bwd + c.per_layer_rec);
    double ep_exposed =
        q->schedule == NL_SCHED_DUALPIPE ? fmax(0, o->t_ep - dualpipe_cap) : o->t_ep * (1 - q->eff.ep_overlap);
    o->t_exposed = o->t_tp * (1 - q->eff.tp_overlap) + c.m * cp_exposed_mb + ep_exposed + o->t_pp + dp_exposed;
    /* Adam reads grads, master weights, m, v and writes master, m, v and the bf16 weights: the
     * optimizer bytes twice plus gradient and weight bytes, per parameter of this rank's shard. */
    o->t_optim = (o->mem_optim * 2 + o->mem_grads +
                  (o->mem_optim > 0 ? o->mem_optim / q->recipe.optim_bytes : 0) * q->recipe.weight_bytes) /
                 q->hw.hbm_bw;
    o->t_step = o->t_compute + o->t_bubble + o->t_exposed + o->t_overlap_hbm + o->t_optim;
    o->tokens_per_s = tokens_step / o->t_step;
    o->mfu = o->model_flops_per_step / (o->t_step * (double)q->gpus * q->hw.flops_bf16);
    o->total_s = q->tokens / o->tokens_per_s;
    o->gpu_hours = o->total_s * (double)q->gpus / 3600.0;
    o->cost = o->gpu_hours * q->hw.price_per_hour;
    return NL_OK;
}

int nl_plan_schedule(const char *name) {
    if (!strcmp(name, "1f1b")) return NL_SCHED_1F1B;
    if (!strcmp(name, "dualpipe")) return NL_SCHED_DUALPIPE;
    if (!strcmp(name, "zb-h1")) return NL_SCHED_ZB_H1;
    return -1;
}

const char *nl_schedule_name(nl_sched s) {
    static const char *n[] = {"1f1b", "dualpipe", "zb-h1"};
    return (unsigned)s < 3 ? n[s] : "?";
}

/* ---- search --------------------------------------------------------------------------------- */
static int cmp_eval(const void *x, const void *y) {
    const nl_train_eval *a = x, *b = y;
    if (a->fits != b->fits) return b->fits - a->fits;
    if (a->fits) {
        if (fabs(a->t_step - b->t_step) > 1e-9 * a->t_step) return a->t_step < b->t_step ? -1 : 1;
        /* Equal time: the simpler layout (fewer model-parallel dimensions), then less memory. */
        int64_t ca = a->L.tp * a->L.pp * a->L.cp * a->L.ep * a->L.vpp,
                cb = b->L.tp * b->L.pp * b->L.cp * b->L.ep * b->L.vpp;
        if (ca != cb) return ca < cb ? -1 : 1;
        return a->mem_total < b->mem_total ? -1 : a->mem_total > b->mem_total;
    }
    return a->mem_total < b->mem_total ? -1 : a->mem_total > b->mem_total;
}

/* The search's running state: the request, the growing result and what it saw on the way
 * (to explain an empty search). */
typedef struct search_state {
    const nl_train_req *q;
    nl_train_result *r;
    size_t cap;
    int saw_decomp, saw_zero_dp1, saw_mb, saw_mb_ok;
    char why[320]; /* the last constraint that turned a layout away (check_stages, check_schedule) */
} search_state;

/* Whether a layout keeps every degree the user fixed. */
static int keeps_fixed(const nl_train_req *q, const nl_layout *L) {
    return !((q->fix.dp > 0 && L->dp != q->fix.dp) || (q->fix.tp > 0 && L->tp != q->fix.tp) ||
             (q->fix.pp > 0 && L->pp != q->fix.pp) || (q->fix.cp > 0 && L->cp != q->fix.cp) ||
             (q->fix.ep > 0 && L->ep != q->fix.ep) ||
             (q->fix.micro_batch > 0 && L->micro_batch != q->fix.micro_batch) ||
             (q->fix.zero_plus1 > 0 && (int)L->zero + 1 != q->fix.zero_plus1) ||
             (q->fix.recompute_plus1 > 0 && (int)L->recompute + 1 != q->fix.recompute_plus1));
}

/* Prices a layout and appends it (an inconsistent one is skipped). NL_ERR_NOMEM when the
 * result cannot grow. */
static nl_status push_eval(search_state *st, const nl_layout *L) {
    nl_train_result *r = st->r;
    if (r->n == st->cap) {
        nl_train_eval *ne = realloc(r->evals, 2 * st->cap * sizeof *ne);
        if (!ne) return nl_fail(NL_ERR_NOMEM, "training layouts: out of memory");
        r->evals = ne;
        st->cap *= 2;
    }
    if (nl_plan_train_eval(st->q, L, &r->evals[r->n]) == NL_OK) r->n++;
    return NL_OK;
}

/* Every micro-batch, interleave degree and recomputation of one (dp, tp, pp, cp, ep, zero). */
static nl_status search_micro(search_state *st, nl_layout base) {
    const nl_train_req *q = st->q;
    const nl_arch *a = &q->arch;
    /* Micro-batches tried: a fixed one (any size), else these. */
    int64_t mbs[7] = {1, 2, 3, 4, 6, 8, 16};
    size_t n_mbs = 7;
    if (q->fix.micro_batch > 0) {
        mbs[0] = q->fix.micro_batch;
        n_mbs = 1;
    }
    int64_t dp = base.dp, pp = base.pp;
    (void)a;
    for (size_t mi = 0; mi < n_mbs; mi++) {
        int64_t mb = mbs[mi];
        if (q->global_batch % (dp * mb)) {
            st->saw_mb = 1;
            continue;
        }
        st->saw_mb_ok = 1;
        int64_t nm = q->global_batch / (dp * mb);
        int64_t vmax = pp > 1 ? (q->fix.vpp > 8 ? q->fix.vpp : 8) : 1;
        for (int64_t v = 1; v <= vmax; v++) {
            /* Free: 1, 2, 4, 8; fixed: that degree only. */
            if (q->fix.vpp > 0 ? v != q->fix.vpp : (v & (v - 1)) != 0) continue;
            /* Interleaving (Narayanan et al. 2021 sec. 2.2): v chunks per GPU; the stages and
             * the schedule's own constraints (check_stages, check_schedule). */
            nl_layout S = base;
            S.micro_batch = mb;
            S.n_micro = nm;
            S.vpp = v;
            S.recompute = q->fix.recompute_plus1 > 0 ? (nl_recompute)(q->fix.recompute_plus1 - 1) : NL_RECOMPUTE_NONE;
            if (!keeps_fixed(q, &S)) continue;
            if (check_stages(q, &S) || check_schedule(q, &S)) {
                /* the reason to report: the plain schedule's, or the fixed interleave's */
                if ((q->fix.vpp > 0 || v == 1) && !st->why[0]) snprintf(st->why, sizeof st->why, "%s", nl_last_error());
                continue;
            }
            st->saw_decomp = 1;
            for (int rc = 0; rc <= 2; rc++) {
                nl_layout L = S;
                L.recompute = (nl_recompute)rc;
                if (!keeps_fixed(q, &L)) continue;
                NL_TRY(push_eval(st, &L));
            }
        }
    }
    return NL_OK;
}

/* The grid of parallel degrees: any tp that divides the heads and the GPUs inside one node,
 * pp dividing the layers (or the fixed one), cp a power of two leaving >= 512 tokens, ep a
 * power of two dividing the experts, every ZeRO stage. */
static nl_status search_grid(search_state *st) {
    const nl_train_req *q = st->q;
    const nl_arch *a = &q->arch;
    int64_t gpn = q->hw.gpus_per_node;
    if (q->fix.cp > 1 && q->attn_materialized) return nl_fail(NL_ERR_INVALID, "%s", CP_NEEDS_FUSED);
    for (int64_t tp = 1; tp <= q->gpus && tp <= gpn; tp++) {
        if (q->gpus % tp || a->n_heads % tp) continue;
        for (int64_t pp = 1; pp <= a->n_layers && tp * pp <= q->gpus; pp++) {
            if ((q->gpus / tp) % pp || (a->n_layers % pp && pp != q->fix.pp)) continue;
            if (q->fix.first_layers > 0 && pp == 1) continue; /* uneven ends need a pipeline */
            for (int64_t cp = 1; cp <= (q->attn_materialized ? 1 : 16) && tp * pp * cp <= q->gpus; cp *= 2) {
                if ((q->gpus / (tp * pp)) % cp || q->seq % cp || q->seq / cp < 512) continue;
                int64_t dp = q->gpus / (tp * pp * cp);
                for (int64_t ep = 1; ep <= dp * cp; ep *= 2) {
                    if (ep > 1 && (a->n_experts == 0 || a->n_experts % ep || (dp * cp) % ep)) continue;
                    for (int z = 0; z <= 4; z++) {
                        if (dp * cp == 1 && z > 0) {
                            st->saw_zero_dp1 = 1;
                            continue;
                        }
                        if (z == NL_ZERO_HSDP && (dp <= 1 || tp * cp * dp <= gpn)) continue;
                        nl_layout base = {.dp = dp,
                                          .tp = tp,
                                          .pp = pp,
                                          .cp = cp,
                                          .ep = ep,
                                          .zero = (nl_zero)z,
                                          .sp = tp > 1 && q->fix.sp_plus1 != 1};
                        NL_TRY(search_micro(st, base));
                    }
                }
            }
        }
    }
    return NL_OK;
}

/* Why the search produced no layout at all (the most specific reason first). */
static nl_status no_layout_error(const search_state *st) {
    const nl_train_req *q = st->q;
    const nl_arch *a = &q->arch;
    if (q->fix.zero_plus1 > 1 && st->saw_zero_dp1)
        return nl_fail(NL_ERR_INVALID,
                       "ZeRO stage %s shards over data-parallel ranks, but the fixed layout leaves "
                       "dp = 1 on %lld GPUs: use --zero 0 or more GPUs",
                       nl_zero_name((nl_zero)(q->fix.zero_plus1 - 1)), (long long)q->gpus);
    if (q->fix.micro_batch > 0 && st->saw_mb && !st->saw_mb_ok)
        return nl_fail(NL_ERR_INVALID,
                       "micro-batch %lld x the data-parallel degree divides the global batch of %lld sequences on no "
                       "layout of %lld GPUs",
                       (long long)q->fix.micro_batch, (long long)q->global_batch, (long long)q->gpus);
    if (!st->saw_decomp && st->why[0])
        return nl_fail(NL_ERR_INVALID, "no layout of %lld GPUs with a global batch of %lld sequences: %s",
                       (long long)q->gpus, (long long)q->global_batch, st->why);
    if (!st->saw_decomp)
        return nl_fail(
            NL_ERR_INVALID,
            "no layout can use %lld GPUs: the global batch of %lld sequences is not a multiple of any "
            "data-parallel degree left after tp (<= %lld, dividing %lld heads), pp (dividing %lld layers) and cp",
            (long long)q->gpus, (long long)q->global_batch, (long long)q->hw.gpus_per_node, (long long)a->n_heads,
            (long long)a->n_layers);
    return nl_fail(NL_ERR_INVALID,
                   "no layout can use %lld GPUs with a global batch of %lld sequences "
                   "(pipelines need at least as many microbatches as stages)",
                   (long long)q->gpus, (long long)q->global_batch);
}

/* Sorts the layouts (fitting and fastest first) and notes how many fit and the smallest. */
static void rank_layouts(nl_train_result *r) {
    qsort(r->evals, r->n, sizeof *r->evals, cmp_eval);
    r->n_fit = 0;
    r->min_mem = INFINITY;
    for (size_t i = 0; i < r->n; i++) {
        if (r->evals[i].fits) r->n_fit++;
        if (r->evals[i].mem_total < r->min_mem) {
            r->min_mem = r->evals[i].mem_total;
            r->smallest = r->evals[i];
        }
    }
}

/* Prices every layout of q->gpus GPUs that keeps the fixed degrees, best first. On error
 * (bad request, no layout, none fits, out of memory) r holds nothing and nl_last_error() says
 * why. */
nl_status nl_plan_train_search(const nl_train_req *q, nl_train_result *r) {
    memset(r, 0, sizeof *r);
    double t0 = nl_time_s();
    if (q->gpus < 1) return nl_fail(NL_ERR_INVALID, "gpus must be >= 1, got %lld", (long long)q->gpus);
    if (q->seq < 1 || q->global_batch < 1) return nl_fail(NL_ERR_INVALID, "seq and global batch must be >= 1");
    nl_eff units;
    NL_TRY(recipe_units(q, &units)); /* a recipe the GPU cannot run: say so, not "no layout" */
    search_state st = {.q = q, .r = r, .cap = 4096};
    r->evals = malloc(st.cap * sizeof *r->evals); /* grown with realloc, freed with free */
    if (!r->evals) return nl_fail(NL_ERR_NOMEM, "training layouts: out of memory");
    nl_status rc = search_grid(&st);
    if (rc == NL_OK && r->n == 0) rc = no_layout_error(&st);
    if (rc != NL_OK) {
        nl_plan_train_free(r);
        return rc;
    }
    rank_layouts(r);
    r->search_s = nl_time_s() - t0;
    if (r->n_fit == 0) {
        char lb[128];
        nl_layout_str(&r->smallest.L, lb, sizeof lb);
        double need = r->min_mem, usable = r->smallest.mem_usable;
        nl_plan_train_free(r);
        return nl_fail(
            NL_ERR_INVALID,
            "%s fits on no layout of %lld x %s: the smallest need is %.1f GB per GPU (%s) against %.1f GB usable",
            q->arch.name, (long long)q->gpus, q->hw.name, need / 1e9, lb, usable / 1e9);
    }
    return NL_OK;
}

void nl_plan_train_free(nl_train_result *r) {
    free(r->evals);
    r->evals = NULL;
    r->n = r->n_fit = 0;
}

void nl_plan_train_explain(const nl_train_req *q, const nl_train_result *r, char *buf, size_t n) {
    const nl_train_eval *b = &r->evals[0];
    parts P;
    get_parts(q, &P);
    double bpp = q->recipe.weight_bytes + q->recipe.grad_bytes + q->recipe.optim_bytes;
    double usable = b->mem_usable;
    size_t len = 0;
#define OUT(...)                                                                                                       \
    do {                                                                                                               \
        if (len < n) len += (size_t)snprintf(buf + len, n - len, __VA_ARGS__);                                         \
    } while (0)
    char lb[128];
    OUT("Memory first: %.2fB parameters x %.0f bytes (%s) = %.0f GB of training state; ", P.total / 1e9, bpp,
        q->recipe.name, P.total * bpp / 1e9);
    if (P.total * bpp > usable)
        OUT("one GPU has %.0f GB usable, so plain DDP cannot hold it and the state must be sharded. ", usable / 1e9);
    else
        OUT("it fits one GPU's %.0f GB usable, so replication is possible. ", usable / 1e9);
    OUT("Sharding: the winner (%s) keeps %.1f GB of state per GPU (weights %.1f, grads %.1f, optimizer %.1f) ",
        nl_layout_str(&b->L, lb, sizeof lb), (b->mem_weights + b->mem_grads + b->mem_optim) / 1e9, b->mem_weights / 1e9,
        b->mem_grads / 1e9, b->mem_optim / 1e9);
    OUT("with tp %lld%s, pp %lld, cp %lld, ep %lld. ", (long long)b->L.tp, b->L.tp > 1 ? " inside a node" : "",
        (long long)b->L.pp, (long long)b->L.cp, (long long)b->L.ep);
    OUT("Activations: micro-batch %lld x %lld tokens, recomputation %s: %.1f GB, logits %.1f GB; total %.1f of %.1f "
        "GB. ",
        (long long)b->L.micro_batch, (long long)q->seq, nl_recompute_name(b->L.recompute), b->mem_act / 1e9,
        b->mem_logits / 1e9, b->mem_total / 1e9, usable / 1e9);
    OUT("Communication: %.0f ms per step (dp %.0f, tp %.0f, pp %.0f, cp %.0f, ep %.0f), %.0f ms of it exposed, "
        "%.0f ms of HBM traffic that the hidden part takes from compute; pipeline bubble %.0f ms. ",
        (b->t_dp + b->t_tp + b->t_pp + b->t_cp + b->t_ep) * 1e3, b->t_dp * 1e3, b->t_tp * 1e3, b->t_pp * 1e3,
        b->t_cp * 1e3, b->t_ep * 1e3, b->t_exposed * 1e3, b->t_overlap_hbm * 1e3, b->t_bubble * 1e3);
    OUT("Time: step %.2f s for %lld x %lld tokens, %.0f tokens/s, MFU %.1f%%, %.1f days (%.1f hours), %.0f GPU-hours, "
        "$%.0f. ",
        b->t_step, (long long)q->global_batch, (long long)q->seq, b->tokens_per_s, 100 * b->mfu, b->total_s / 86400,
        b->total_s / 3600, b->gpu_hours, b->cost);
    if (b->L.n_micro == 1 && b->L.pp == 1)
        OUT("The global batch is the limit: %lld sequences over %lld data-parallel ranks leave %lld per GPU in one "
            "microbatch, so more GPUs need a larger batch or more model parallelism. ",
            (long long)q->global_batch, (long long)b->L.dp, (long long)b->L.micro_batch);
    if (r->n_fit > 1) {
        const nl_train_eval *c = &r->evals[1];
        double d = 100 * (c->t_step / b->t_step - 1);
        if (d < 0.05)
            OUT("Runner-up %s is as fast (the simpler layout wins the tie).", nl_layout_str(&c->L, lb, sizeof lb));
        else
            OUT("Runner-up %s is %.1f%% slower.", nl_layout_str(&c->L, lb, sizeof lb), d);
    }
#undef OUT
}

/* ---- one layer's collectives ------------------------------------------------------------------ */
static void push(nl_layer_plan *lp, const nl_hw *hw, const char *what, const char *when, nl_coll c, const char *group,
                 int64_t p, double bytes, int span, double count) {
    if (lp->n >= NL_LAYER_COLL_MAX || (c != NL_P2P && p <= 1)) return;
    nl_layer_coll *x = &lp->c[lp->n++];
    snprintf(x->what, sizeof x->what, "%s", what);
    snprintf(x->when, sizeof x->when, "%s", when);
    snprintf(x->group, sizeof x->group, "%s", group);
    x->coll = c;
    x->p = p;
    x->bytes = bytes;
    x->wire_bytes = nl_plan_coll_bytes(c, p, bytes);
    x->time_s = nl_plan_coll_time(hw, c, p, bytes, span);
    x->count = count;
}

nl_status nl_plan_layer(const nl_train_req *q, const nl_layout *L, double tokens_per_gpu, nl_layer_plan *lp) {
    memset(lp, 0, sizeof *lp);
    const nl_arch *a = &q->arch;
    const nl_hw *hw = &q->hw;
    nl_train_eval ev;
    NL_TRY(nl_plan_train_eval(q, L, &ev));
    parts P;
    get_parts(q, &P);
    double t = (double)L->tp, D = (double)a->dim, T = tokens_per_gpu;
    double nl = (double)a->n_layers, lps = ceil(nl / (double)L->pp), m = (double)L->n_micro;
    double dpz = (double)(L->dp * L->cp);
    int tp_span = spans(hw, 1, t), dp_span = spans(hw, t, dpz);
    double act = T * D * 2;
    if (L->tp > 1) {
        if (!L->sp) {
            push(lp, hw, "after attention (row-parallel wo)", "forward", NL_ALL_REDUCE, "tp", L->tp, act, tp_span,
                 lps * m);
            push(lp, hw, "after MLP (row-parallel w2)", "forward", NL_ALL_REDUCE, "tp", L->tp, act, tp_span, lps * m);
            push(lp, hw, "grad of attention input (column-parallel qkv)", "backward", NL_ALL_REDUCE, "tp", L->tp, act,
                 tp_span, lps * m);
            push(lp, hw, "grad of MLP input (column-parallel w1/w3)", "backward", NL_ALL_REDUCE, "tp", L->tp, act,
                 tp_span, lps * m);
            if (dist_saved(q, L))
                push(lp, hw, "gather the distributed checkpoint (recompute)", "backward", NL_ALL_GATHER, "tp", L->tp,
                     act, tp_span, lps * m);
        } else {
            push(lp, hw, "gather sequence before qkv", "forward", NL_ALL_GATHER, "tp", L->tp, act, tp_span, lps * m);
            push(lp, hw, "scatter after wo", "forward", NL_REDUCE_SCATTER, "tp", L->tp, act, tp_span, lps * m);
            push(lp, hw, "gather sequence before w1/w3", "forward", NL_ALL_GATHER, "tp", L->tp, act, tp_span, lps * m);
            push(lp, hw, "scatter after w2", "forward", NL_REDUCE_SCATTER, "tp", L->tp, act, tp_span, lps * m);
            push(lp, hw, "grad: gather before w2 backward", "backward", NL_ALL_GATHER, "tp", L->tp, act, tp_span,
                 lps * m);
            push(lp, hw, "grad: scatter after w1/w3 backward", "backward", NL_REDUCE_SCATTER, "tp", L->tp, act, tp_span,
                 lps * m);
            push(lp, hw, "grad: gather before wo backward", "backward", NL_ALL_GATHER, "tp", L->tp, act, tp_span,
                 lps * m);
            push(lp, hw, "grad: scatter after qkv backward", "backward", NL_REDUCE_SCATTER, "tp", L->tp, act, tp_span,
                 lps * m);
        }
    }
    if (L->ep > 1 && P.moe_layers > 0) {
        int ep_span = spans(hw, t, (double)L->ep);
        double arr = T * (double)a->top_k * D * 2;
        double c = P.moe_layers / nl * lps * m;
        push(lp, hw, "dispatch tokens to experts", "forward", NL_ALL_TO_ALL, "ep", L->ep, arr, ep_span, c);
        push(lp, hw, "combine expert outputs", "forward", NL_ALL_TO_ALL, "ep", L->ep, arr, ep_span, c);
        push(lp, hw, "grad of combine", "backward", NL_ALL_TO_ALL, "ep", L->ep, arr, ep_span, c);
        push(lp, hw, "grad of dispatch", "backward", NL_ALL_TO_ALL, "ep", L->ep, arr, ep_span, c);
    }
    if (L->pp > 1) {
        int pp_span = spans(hw, t * dpz, (double)L->pp);
        push(lp, hw, "activation to next stage", "forward", NL_P2P, "pp", 2, act / t, pp_span, m);
        push(lp, hw, "gradient to previous stage", "backward", NL_P2P, "pp", 2, act / t, pp_span, m);
    }
    double local = (P.dense_layers_params * lps / nl + (L->pp > 1 ? fmax(P.emb, P.cls) : P.emb + P.cls)) / t +
                   P.expert_params * lps / nl / ((double)L->ep * t);
    double wb = local * coll_weight_bytes(&q->recipe), gb = local * fmin(q->recipe.grad_bytes, 4);
    int64_t dz = (int64_t)dpz;
    switch (L->zero) {
    case NL_ZERO_0: push(lp, hw, "gradient all-reduce (DDP)", "step", NL_ALL_REDUCE, "dp", dz, gb, dp_span, 1); break;
    case NL_ZERO_1:
    case NL_ZERO_2:
        push(lp, hw, "gradient reduce-scatter", "step", NL_REDUCE_SCATTER, "dp", dz, gb, dp_span, 1);
        push(lp, hw, "updated weights all-gather", "step", NL_ALL_GATHER, "dp", dz, wb, dp_span, 1);
        break;
    case NL_ZERO_3: {
        int z3span = dp_span && !q->zero3_nic_spread ? 1 : dp_span; /* each GPU's own NIC (eval_dp_comm) */
        push(lp, hw, "weights all-gather (forward, layer by layer)", "step", NL_ALL_GATHER, "dp", dz, wb, z3span, m);
        push(lp, hw, "weights all-gather (backward, layer by layer)", "step", NL_ALL_GATHER, "dp", dz, wb, z3span, m);
        push(lp, hw, "gradient reduce-scatter (layer by layer)", "step", NL_REDUCE_SCATTER, "dp", dz, gb, z3span, m);
        break;
    }
    case NL_ZERO_HSDP: {
        double in_node = fmax(1, floor((double)hw->gpus_per_node / (t * (double)L->cp)));
        int64_t s = (int64_t)fmin(in_node, dpz);
        int sspan = spans(hw, t * (double)L->cp, (double)s);
        push(lp, hw, "weights all-gather in node (forward)", "step", NL_ALL_GATHER, "dp", s, wb, sspan, m);
        push(lp, hw, "weights all-gather in node (backward)", "step", NL_ALL_GATHER, "dp", s, wb, sspan, m);
        push(lp, hw, "gradient reduce-scatter in node", "step", NL_REDUCE_SCATTER, "dp", s, gb, sspan, m);
        push(lp, hw, "all-reduce of the 1/s gradient shard across nodes", "step", NL_ALL_REDUCE, "dp-x", dz / s,
             gb / (double)s, 1, 1);
        break;
    }
    }
    for (int i = 0; i < lp->n; i++) {
        nl_layer_coll *x = &lp->c[i];
        lp->per_step_s += x->time_s * x->count;
        if (!strcmp(x->when, "forward")) lp->per_layer_fwd_s += x->time_s;
        if (!strcmp(x->when, "backward")) lp->per_layer_bwd_s += x->time_s;
    }
    /* DDP's all-reduce as a ring: the comparison is of the traffic each layout moves (an
     * all-reduce is a reduce-scatter plus an all-gather), which NVLink SHARP would hide. */
    nl_hw ring = *hw;
    ring.nvls_eff = 0;
    lp->ddp_step_s = nl_plan_coll_time(&ring, NL_ALL_REDUCE, dz, gb, dp_span);
    lp->compute_step_s = ev.t_compute + ev.t_bubble;
    return NL_OK;
}
