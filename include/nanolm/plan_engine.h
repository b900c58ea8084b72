/*
 * nanolm plan_engine: the cost model of nanolm's own serving engine (src/serve/engine.c) on a
 * CPU whose rates `nanolm bench machine` measured. Pure arithmetic (plan/ layer): it predicts
 * what the engine does, step by step, from this engine's actual bytes and FLOPs:
 *
 *   step(rows, contexts) = step_overhead + L x layer_overhead
 *                        + sum over linears (qkv, o, gate_up, down; classifier for the rows that
 *                          sample) of 2 x rows x N x K / rate(M = rows)
 *                        + L x heads x (decodes x attn_row(D) + positions attended x attn_pos(D)),
 *                          D the step's decode rows, K/V where the step finds them
 *                        + L x FLOPs of the prompt chunks' attention / chunk rate (K/V in cache)
 *                        + L x (decodes x rope_kv(D) + chunk tokens x rope_kv_chunk)
 *                        + L x rows x row_layer (norms, residuals, SwiGLU)
 *
 * the linears a roofline per layer (Williams et al., CACM 2009) with the kernel's measured rate
 * at that many rows instead of a datasheet peak. The linear kernel's rate is measured reading
 * the model's own weights (every layer distinct, as the engine reads them), so at small M it is
 * the bandwidth roof of that footprint (caches included); bytes / streaming bandwidth is
 * reported beside it. The terms that grow with a step's decode rows (attention, RoPE + KV
 * store) are measured at D = 1, 8 and 32 decode rows, each its own sequence in a pool of the
 * model's layers, with the weights' footprint read between layers as the linears read it: a
 * batched step finds its K/V further out in the memory hierarchy than one sequence does, and
 * its scattered KV stores miss the cache. Prefill is the chunked schedule the engine runs
 * (chunk and step-token budget); decode at batch B is one step of B rows at the mean context;
 * throughput is the engine's continuous batching of B sequences: B x output tokens over the
 * prefill steps plus output decode steps.
 */
#ifndef NANOLM_PLAN_ENGINE_H
#define NANOLM_PLAN_ENGINE_H

#include <stdint.h>

#include "nanolm/arch.h"
#include "nanolm/base.h"
#include "nanolm/cpu_rates.h" /* nl_cpu_rates: what `nanolm bench machine` measured */

#ifdef __cplusplus
extern "C" {
#endif

/* Writes r as one --hw JSON object (with the catalog fields hbm_bw, flops_bf16, flops_fp8,
 * mem_bytes, gpus_per_node so that other plan commands can use it too) into buf (nl_free). */
nl_status nl_cpu_rates_json(const nl_cpu_rates *r, double mem_bytes, const char *source, char **buf);
/* Reads the entry named name (NULL: the first with "cpu_" fields) of a --hw JSON file.
 * NL_ERR_FORMAT naming the file and field (missing, not a positive number), NL_ERR_INVALID
 * when no entry has measured rates, NL_ERR_IO. */
nl_status nl_cpu_rates_load(const char *path, const char *name, nl_cpu_rates *out);

/* What to predict. */
typedef struct nl_engine_plan_req {
    nl_arch arch;
    int weights;             /* 0 fp32, 1 bf16, 2 int8 (nl_wfmt) */
    int kv;                  /* 0 fp32, 1 int8 */
    int64_t prompt, output;  /* tokens per request */
    int64_t batch;           /* concurrent sequences for the throughput */
    int64_t chunk;           /* engine --chunk (0: whole prompts) */
    int64_t max_step_tokens; /* engine --max-step-tokens */
} nl_engine_plan_req;

#define NL_ENGINE_PLAN_NB 3
typedef struct nl_engine_plan {
    double prefill_s; /* one prompt alone, the engine's chunked schedule */
    int64_t prefill_steps;
    int64_t decode_batch[NL_ENGINE_PLAN_NB]; /* 1, 8, 32 */
    double decode_step_s[NL_ENGINE_PLAN_NB]; /* one decode step of that many sequences at context prompt + output/2 */
    double decode_tokens_per_s[NL_ENGINE_PLAN_NB];
    double throughput_tokens_per_s; /* output tokens/s of `batch` sequences served together */
    /* the parts of a batch-1 decode step */
    double linear_s, attention_s, rows_s, overhead_s;
    double weight_bytes, kv_bytes_per_token;
} nl_engine_plan;

void nl_engine_plan_req_default(nl_engine_plan_req *q);
/* One engine step of `rows` tokens, n_decode of which are decodes (the rest prompt-chunk tokens)
 * and n_out of which sample; its decode tokens attend over ctx_decode positions in all (the sum
 * over them of position + 1), its prompt-chunk tokens over ctx_chunk. */
double nl_plan_engine_step_s(const nl_engine_plan_req *q, const nl_cpu_rates *r, int64_t rows, int64_t n_decode,
                             int64_t n_out, double ctx_decode, double ctx_chunk);
/* One batch-1 decode step (one row that samples) of the engine's default request with shape a at
 * context ctx: what `nanolm bench machine` subtracts from the engine's measured step to find its
 * overheads (nl_machine_opts.predict_step_s). */
double nl_plan_engine_probe_step_s(const nl_arch *a, const nl_cpu_rates *r, double ctx);
/* The predictions. NL_ERR_INVALID naming what is wrong (bad shape, no rates for the format). */
nl_status nl_plan_engine(const nl_engine_plan_req *q, const nl_cpu_rates *r, nl_engine_plan *out);

#ifdef __cplusplus
}
#endif
#endif
