/*
 * nanolm cpu_rates: what `nanolm bench machine` measures on a CPU, as one description that two
 * layers share (as arch.h describes a model's shape): tools/machine.c fills it, the serving
 * engine's cost model in plan/ (plan_engine.h) reads it. Data only.
 */
#ifndef NANOLM_CPU_RATES_H
#define NANOLM_CPU_RATES_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NL_CPU_NM 6 /* rows per kernel call measured */
#define NL_CPU_NB 3 /* decode rows per step measured: the first NL_CPU_NB of nl_cpu_m (1, 8, 32) */
/* M = 1, 8, 32, 128, 256, 512: the decode batches and prefill chunks of the engine. */
extern const int64_t nl_cpu_m[NL_CPU_NM];

/* What `nanolm bench machine` measured. In a --hw JSON entry these are flat optional fields
 * named "cpu_" + the field ("cpu_read_bw_1t", "cpu_gemm_fp32_m8", "cpu_gemm_int8_m512",
 * "cpu_attn_pos_s_kvint8_d32", ...)
 * beside the catalog's own fields; the catalog ignores them, plan_engine reads them. */
typedef struct nl_cpu_rates {
    char name[32];
    int threads;               /* OpenMP threads of the measurements */
    double read_bw_1t;         /* streaming read, 1 thread, bytes/s */
    double read_bw_nt;         /* streaming read, `threads` threads, bytes/s */
    double gemm[3][NL_CPU_NM]; /* the engine's linear kernel (nl_mv_forward), FLOP/s, for fp32 / bf16 / int8
                                  weights at each M of nl_cpu_m, over the measured model's linear shapes */
    /* decode rows: RoPE + KV store and attention (nl_paged_attend_rows, one token) of
     * D = nl_cpu_m[i] (i < NL_CPU_NB) decode rows per step, each its own sequence, for a KV
     * pool of fp32 [0] or int8 [1] (all 0: not measured) */
    double attn_row_s[2][NL_CPU_NB]; /* attention per (token, head), fixed part */
    double attn_pos_s[2][NL_CPU_NB]; /* attention per (token, head, position attended) */
    double rope_kv_s[2][NL_CPU_NB];  /* RoPE + KV store per token and layer */
    double attn_flops_chunk;         /* attention of the tokens of one prompt chunk (K/V shared, in cache), FLOP/s,
                                fp32 pool */
    double rope_kv_chunk_s;          /* RoPE + KV store per token of a prompt chunk and layer, fp32 pool */
    double row_layer_s;              /* per token and layer: norms, residuals, SwiGLU */
    double step_overhead_s;          /* per engine step: scheduling, embedding, sampling */
    double layer_overhead_s;         /* per layer of a step: starting the thread teams of its kernels */
} nl_cpu_rates;

#ifdef __cplusplus
}
#endif
#endif
