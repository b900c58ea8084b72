/* Serving plans: prefill is compute bound, decode reads the weights and the KV cache each step
 * (roofline, Williams et al. 2009); tensor parallelism splits both and adds two all-reduces per
 * layer (Shoeybi et al. 2019); chunked prefill (Agrawal et al. 2024, Sarathi-Serve) and
 * disaggregated prefill/decode pools (Zhong et al. 2024, DistServe; Patel et al. 2024, Splitwise). */
#include "nanolm/plan.h"

#include <math.h>
#include <string.h>

void nl_serve_req_default(nl_serve_req *q) {
    memset(q, 0, sizeof *q);
    q->tp = 1;
    q->prompt = 2000;
    q->output = 500;
    q->batch = 32;
    q->prefill_mfu = 0; /* 0: the GPU's GEMM efficiency (catalog gemm_eff); the course says 0.5 */
    q->kernel_s = 5e-6; /* per kernel launch, as plan train */
    q->kernels_per_layer = 20;
    q->hbm_eff = 0.8;
    q->weight_bytes = 2;
    q->kv_bytes = 2;
    q->chunk = 256;
}

/* The share of the large-GEMM rate a forward pass over M tokens reaches: the layer's GEMMs
 * (qkv, wo, the MLP) each at f(M) f(N) f(K) (nl_plan_gemm_shape_eff), weighted by their FLOPs.
 * A 128-token prompt fills half a 128-row tile wave per GEMM edge: short prefills are far from
 * the large-GEMM rate, which is why first-token latency at 128 tokens is not weight-read bound
 * (TensorRT-LLM's low-latency table: 16 ms for Llama 7B on A100, twice the weight read). */
static double forward_shape_eff(const nl_arch *a, double tp, double M, int fp8) {
    double D = (double)a->dim, hd = (double)nl_arch_head_dim(a);
    double qd = (double)a->n_heads * hd, kvd = (double)a->n_kv_heads * hd, F = (double)a->hidden_dim;
    double g[4][3] = {{M, (qd + 2 * kvd) / tp, D}, {M, D, qd / tp}, {M, 2 * F / tp, D}, {M, D, F / tp}};
    double flops = 0, t = 0;
    for (int i = 0; i < 4; i++) {
        double f = g[i][0] * g[i][1] * g[i][2];
        flops += f;
        double eff =
            nl_plan_gemm_shape_eff(g[i][0]) * nl_plan_gemm_shape_eff(g[i][1]) * nl_plan_gemm_shape_eff(g[i][2]);
        if (fp8) eff *= nl_plan_gemm_fp8_k_eff(g[i][2]); /* FP8's fixed cost per tile, in K */
        t += f / eff;
    }
    return t > 0 ? flops / t : 1.0;
}

nl_status nl_plan_serve(const nl_serve_req *q, nl_serve_plan *o) {
    memset(o, 0, sizeof *o);
    const nl_arch *a = &q->arch;
    const nl_hw *hw = &q->hw;
    if (q->tp < 1 || q->batch < 1 || !(q->prompt >= 1) || !(q->output >= 1) || !(q->prefill_mfu >= 0) ||
        q->prefill_mfu > 1 || !(q->kernel_s >= 0) || !(q->kernels_per_layer >= 0) || !(q->hbm_eff > 0) ||
        q->hbm_eff > 1 || !(q->weight_bytes > 0) || !(q->kv_bytes > 0) || q->chunk < 0 || q->fsdp < 0)
        return nl_fail(NL_ERR_INVALID, "serve: tp, batch, prompt, output must be >= 1, prefill MFU in (0, 1]");
    if (a->n_heads % q->tp)
        return nl_fail(NL_ERR_INVALID, "serve: tp %lld does not divide %lld heads", (long long)q->tp,
                       (long long)a->n_heads);
    if (q->fp8 && !(hw->flops_fp8 > 0))
        return nl_fail(NL_ERR_INVALID,
                       "serve: FP8 weights and GEMMs need FP8 tensor cores, but %s has none (catalog flops_fp8 = 0); "
                       "use --precision bf16 or int8 (weight-only), or a GPU with FP8 (h100, h200, h800, b200, mi300x)",
                       hw->name);
    nl_arch_params p;
    nl_plan_count_params(a, &q->fam, &p);
    /* FP8 serving runs its GEMMs at the fp8 peak (TensorRT-LLM's FP8 engines). */
    double tp = (double)q->tp, P = q->fp8 ? hw->flops_fp8 : hw->flops_bf16, B = (double)q->batch;
    double mfu = q->prefill_mfu > 0 ? q->prefill_mfu : hw->gemm_eff > 0 ? hw->gemm_eff : 0.6;
    /* Each forward pass launches kernels_per_layer kernels per layer (norms, projections,
     * attention, activation, residual adds): a fixed cost a decode step cannot hide. */
    double launch = (double)a->n_layers * q->kernels_per_layer * q->kernel_s;
    o->params = (double)p.total;
    o->matmul_params = nl_plan_matmul_params_fam(a, &q->fam);
    int span = (double)q->tp > (double)hw->gpus_per_node;
    double D = (double)a->dim, nlay = (double)a->n_layers;

    /* Prefill: 2 N FLOPs per token for the matmuls (the embedding lookup computes nothing) plus
     * the causal attention scores; at prefill_mfu of peak on tp GPUs. */
    o->prefill_flops = 2 * o->matmul_params * q->prompt + q->prompt * nl_plan_attn_flops_per_token(a, q->prompt);
    double prefill_comm =
        q->tp > 1 ? 2 * nlay * nl_plan_coll_time(hw, NL_ALL_REDUCE, q->tp, q->prompt * D * 2, span) : 0;
    double wread = o->params * q->weight_bytes / (tp * hw->hbm_bw * q->hbm_eff);
    /* FSDP / ZeRO-3 weights (the course: decoding this way is "several times slower than
     * reading from HBM"): every forward all-gathers each layer's shards over the fsdp group
     * (NVLink inside a node, the network beyond), prefetching the next layer while one runs;
     * the slower of the gathers and the HBM reads bounds the weight stream. */
    if (q->fsdp > 1) {
        /* The FSDP group: fsdp ranks tp apart; across nodes, its members per node (plan_comm.c). */
        int fspan = tp * (double)q->fsdp > (double)hw->gpus_per_node
                        ? (int)fmax(1, fmin((double)q->fsdp, floor((double)hw->gpus_per_node / tp)))
                        : 0;
        double layer_bytes = o->params * q->weight_bytes / (tp * (double)a->n_layers);
        o->fsdp_gather_s = (double)a->n_layers * nl_plan_coll_time(hw, NL_ALL_GATHER, q->fsdp, layer_bytes, fspan);
    }
    wread = fmax(wread, o->fsdp_gather_s);
    /* A given --prefill-mfu is the whole forward's MFU (the course's napkin); the default prices
     * the GEMM shapes of the prompt (one prompt, or the whole batch's tokens together). */
    double mfu1 = q->prefill_mfu > 0 ? mfu : mfu * forward_shape_eff(a, tp, q->prompt, q->fp8);
    double mfuB = q->prefill_mfu > 0 ? mfu : mfu * forward_shape_eff(a, tp, B * q->prompt, q->fp8);
    o->prefill_compute_s = o->prefill_flops / (tp * P * mfu1);
    o->prefill_weight_s = wread;
    o->prefill_comm_s = prefill_comm;
    o->launch_s = launch;
    o->prefill_eff = mfu1;
    o->prefill_peak = P;
    o->prefill_s = fmax(o->prefill_compute_s, wread) + prefill_comm + launch;
    /* The whole batch's prompts in one forward (TensorRT-LLM's packed context phase, vLLM's
     * prefill step): each layer's two all-reduces carry the B x prompt tokens together, so the
     * per-call latency is paid 2 x layers times, not once per prompt. */
    o->batch_prefill_comm_s =
        q->tp > 1 ? 2 * nlay * nl_plan_coll_time(hw, NL_ALL_REDUCE, q->tp, B * q->prompt * D * 2, span) : 0;
    o->batch_prefill_s = fmax(B * o->prefill_flops / (tp * P * mfuB), wread) + o->batch_prefill_comm_s + launch;

    o->kv_bytes_per_token = nl_plan_kv_bytes_per_token(a, q->kv_bytes);
    /* With more GPUs than KV heads, each KV head lives on tp / kv_heads GPUs: the cache is
     * replicated, not split further (Pope et al. 2022 sec. 3.3; vLLM replicates KV heads). */
    double kv_tp = a->kv_lora_rank > 0 ? 1.0 : fmin(tp, (double)a->n_kv_heads);
    o->kv_replication = tp / kv_tp;
    o->prompt_kv_bytes = q->prompt * o->kv_bytes_per_token;

    /* Decode step: every weight is read once (the course counts all of them, embedding table
     * included), plus each sequence's KV cache; compute at peak; the step is the larger. */
    double ctx = q->context > 0 ? q->context : q->prompt + q->output / 2;
    /* HBM streams reach hbm_eff of the datasheet bandwidth (STREAM-like reads on A100/H100
     * measure 80-90%; an assumption shared by every GPU). */
    double bw = hw->hbm_bw * q->hbm_eff;
    o->weight_read_s = o->params * q->weight_bytes / (tp * bw);
    /* A per-query-head decode kernel (NL_DECODE_ATTN_PER_HEAD) streams the cache of each KV head
     * once for every query head of its group: each GPU reads B x ctx tokens for its tp-th of the
     * query heads, n_heads / n_kv_heads times what the grouped read of its KV heads takes. */
    if (q->decode_attn != NL_DECODE_ATTN_GROUPED && q->decode_attn != NL_DECODE_ATTN_PER_HEAD)
        return nl_fail(NL_ERR_INVALID, "serve: decode attention must be grouped or per-head");
    o->kv_reads_per_head = 1;
    double kv_div = kv_tp;
    if (q->decode_attn == NL_DECODE_ATTN_PER_HEAD && a->kv_lora_rank == 0) {
        o->kv_reads_per_head = (double)a->n_heads / (double)a->n_kv_heads;
        kv_div = tp / o->kv_reads_per_head;
    }
    o->kv_read_s = B * ctx * o->kv_bytes_per_token / (kv_div * bw);
    o->decode_mem_s = o->weight_read_s + o->kv_read_s;
    double gemm_c = 2 * o->matmul_params * B / (tp * P * mfu),
           attn_c = B * 2 * nl_plan_attn_flops_per_token(a, ctx) / (tp * P * mfu);
    o->decode_compute_s = gemm_c + attn_c;
    /* A roofline per kernel, not per step (as Vidur and LLM-Viewer price operators): the weight
     * GEMMs and the attention over the KV cache run one after the other, each bound by its own
     * resource, so a step whose GEMMs are compute bound at a large batch still pays the KV read
     * in full. The course's single max(memory, compute) is the same for small batches. */
    o->decode_weight_s = fmax(fmax(o->weight_read_s, o->fsdp_gather_s), gemm_c);
    o->decode_kv_s = fmax(o->kv_read_s, attn_c);
    o->decode_step_s = o->decode_weight_s + o->decode_kv_s;
    /* Two all-reduces per layer (after attention, after the MLP) of B x D activations. */
    if (q->tp > 1) {
        o->tp_allreduces = 2 * nlay;
        o->tp_allreduce_bytes = B * D * 2;
        o->tp_comm_s = o->tp_allreduces * nl_plan_coll_time(hw, NL_ALL_REDUCE, q->tp, o->tp_allreduce_bytes, span);
        o->tp_comm_latency_s = o->tp_allreduces * hw->latency_s;
    }
    o->decode_step_total_s = o->decode_step_s + o->tp_comm_s + launch;
    o->ttft_s = o->prefill_s;
    o->tpot_s = o->decode_step_total_s;
    o->stall_steps = o->prefill_s / o->decode_step_total_s;

    /* Chunked prefill: a chunk of prompt tokens rides in a decode step; its matmuls cost
     * 2 N (chunk + B) / P, free while that stays under the step's memory time. */
    o->chunk_compute_s = 2 * o->matmul_params * (q->chunk + B) / (tp * P);
    o->chunk_free_tokens = fmax(0, o->decode_mem_s * tp * P / (2 * o->matmul_params) - B);

    /* Disaggregation: a prefill group serves 1/prefill_s requests/s, a decode group B requests
     * every output * step seconds. */
    o->prefill_rps = 1 / o->prefill_s;
    o->decode_rps = B / (q->output * o->decode_step_total_s);
    o->decode_per_prefill = o->prefill_rps / o->decode_rps;

    o->mem_weights = o->params * q->weight_bytes / tp;
    /* Sharded: 1/fsdp of the weights plus the gathered layer in use and the one prefetched. */
    if (q->fsdp > 1) o->mem_weights = o->mem_weights / (double)q->fsdp + 2 * o->mem_weights / (double)a->n_layers;
    o->mem_kv = B * (q->prompt + q->output) * o->kv_bytes_per_token / kv_tp;
    o->mem_total = o->mem_weights + o->mem_kv;
    o->fits = o->mem_total <= hw->mem_bytes;
    return NL_OK;
}
