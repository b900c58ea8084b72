/*
 * nanolm engine: the serving engine. Continuous batching (Orca's iteration-level scheduling)
 * over a paged KV cache (vLLM) with chunked prefill (Sarathi-Serve), on NanoLM / llama2.c
 * checkpoints, fp32 / bf16 / int8 weights (nanolm/matvec.h), fp32 / int8 KV (nanolm/kvcache.h).
 *
 * Every nl_engine_step runs ONE forward over the tokens of all running sequences: one token
 * for each decoding sequence and chunks of prompt, within a token budget (max_step_tokens;
 * with chunking, at most `chunk` prompt tokens per step in all, Sarathi-Serve's budget). Each linear
 * layer is one kernel call over all those rows, reading each weight once per step. Sequences
 * join (FCFS from a bounded waiting queue) and leave between steps. When a decoding sequence
 * needs a KV block and the pool is empty, the youngest running sequence is preempted: its
 * blocks are freed and it goes back to the front of the queue with its tokens, to be
 * recomputed (prefilled again) later; nothing it generated is lost, and since prefill and
 * decode compute each position the same way, it continues with the same tokens.
 *
 * Batch invariance: every row of every kernel (linear, norm, attention) is computed by the same
 * operations in the same order whatever else shares the step, so a request's greedy tokens are
 * the same alone, batched with 31 others, chunked or not, preempted or not.
 *
 * Thread-safety contract:
 *   - One thread (the "driver") calls nl_engine_step (and nl_engine_close, after every other
 *     thread is done with the engine). Only the driver runs the model; OpenMP threads inside a
 *     step are the engine's own.
 *   - Any thread may call nl_engine_submit, nl_engine_cancel, nl_engine_read, nl_engine_wait,
 *     nl_engine_release, nl_engine_stats, nl_engine_wait_work and the read-only accessors
 *     (nl_engine_tokenizer, nl_engine_arch, nl_engine_encode) at any time, also during a step:
 *     they take the engine's mutex for a short time and never wait for a step to finish
 *     (except nl_engine_wait / nl_engine_wait_work, which sleep on a condition variable).
 *   - The event callback (opts.on_event) runs on the driver thread, without the engine's mutex
 *     held; it must not call nl_engine_step.
 * Request life cycle: submit -> (waiting -> running [-> preempted -> waiting ...]) -> finished
 * (stop | length | cancelled | error) -> released. A finished request keeps its output until
 * nl_engine_release (or nl_engine_close); its KV blocks are already back in the pool.
 */
#ifndef NANOLM_ENGINE_H
#define NANOLM_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/arch.h"
#include "nanolm/base.h"
#include "nanolm/infer.h"
#include "nanolm/matvec.h"
#include "nanolm/model.h"
#include "nanolm/sampler.h"
#include "nanolm/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_engine nl_engine;

/* Why a request ended. */
typedef enum nl_finish {
    NL_FINISH_NONE = 0,  /* still running or waiting */
    NL_FINISH_STOP,      /* a stop string, or EOS or BOS (unless ignore_eos) */
    NL_FINISH_LENGTH,    /* max_tokens reached, or the context (seq_len) is full */
    NL_FINISH_CANCELLED, /* nl_engine_cancel (a client went away) or nl_engine_close */
    NL_FINISH_ERROR      /* the model produced NaN/inf logits (message in the output) */
} nl_finish;
/* "stop", "length", "cancelled", "error" (NULL for NONE). */
const char *nl_finish_name(nl_finish f);

/* Event callback: called on the driver thread after each step for each request that got new
 * tokens or finished. new_text (new_text_len bytes, not NUL-terminated) is the text that became
 * final this step (text that could still turn out to be a stop string is held back). */
typedef void (*nl_engine_event_fn)(void *user, uint64_t id, const int32_t *new_tokens, int64_t n_new,
                                   const char *new_text, size_t new_text_len, nl_finish finish);

typedef struct nl_engine_opts {
    nl_wfmt weights;             /* NL_WFMT_AUTO (default): fp32; int8 for an int8 quantized checkpoint or a Q8_0
                                    GGUF; int4 for a Q4_0 GGUF (on its own blocks) */
    nl_kv_dtype kv;              /* NL_KV_FP32 (default) or NL_KV_INT8 */
    int64_t block_size;          /* tokens per KV block (default 16) */
    int64_t kv_blocks;           /* pool size in blocks; 0: from kv_mem_bytes */
    int64_t kv_mem_bytes;        /* pool size in bytes when kv_blocks == 0; both 0: room for
                                 max_batch sequences of seq_len tokens */
    int max_batch;               /* running sequences at most (default 32) */
    int64_t max_step_tokens;     /* tokens per step at most (default 512; >= max_batch) */
    int64_t chunk;               /* prompt tokens per step at most, over all prompts (default 256;
                                 0: no chunking, a whole prompt in one step if the budget allows) */
    int max_waiting;             /* bounded waiting queue (default 256): submit beyond -> NL_ERR_BUSY */
    int threads;                 /* OpenMP threads of a step (<= 0: the OpenMP default) */
    int prefix_cache;            /* 1 (default): full KV blocks are shared by the prompts that start
                                    with the same tokens (automatic prefix caching, block_pool.h) */
    int spec_k;                  /* speculative decoding: tokens drafted per decode step (0, the
                                    default: off), verified in the same step (nl_sampler_verify) */
    int spec_ngram;              /* prompt-lookup drafting: longest n-gram matched (default 3) */
    const char *draft_ckpt;      /* with spec_k: draft with this model instead (same tokenizer: the
                                    same vocabulary size; loaded as the target is, by nl_engine_open) */
    const nl_model *draft_model; /* or this one, borrowed (nl_engine_open_model; tests) */
    nl_engine_event_fn on_event; /* optional */
    void *event_user;
} nl_engine_opts;

/* The defaults above. */
void nl_engine_opts_default(nl_engine_opts *o);

/* Loads a checkpoint and its tokenizer (nl_model_load of nanolm/model_load.h) and builds the
 * engine. ckpt: a Hugging Face folder, a GGUF file, a NanoLM safetensors checkpoint, a quantized
 * checkpoint written by `nanolm quant model --out`, or a llama2.c .bin (then tokenizer, a
 * llama2.c tokenizer.bin, is required; otherwise it may be NULL for a byte tokenizer checkpoint). opts NULL: defaults. Errors (the message names the file or option):
 * NL_ERR_IO, NL_ERR_FORMAT, NL_ERR_INVALID (bad option, MoE arch), NL_ERR_NOMEM. */
nl_status nl_engine_open(nl_engine **e, const char *ckpt, const char *tokenizer, const nl_engine_opts *opts);
/* The same on a model already built (weights copied or borrowed as the format needs; the
 * model must outlive the engine and not change). tok may be NULL (text functions then fail and
 * stop strings are not matched). Used by tests and benchmarks. */
nl_status nl_engine_open_model(nl_engine **e, const nl_model *m, const nl_tokenizer *tok, const nl_engine_opts *opts);
/* Cancels what is left, frees everything; safe on NULL. */
void nl_engine_close(nl_engine *e);

/* The model's shape, the tokenizer (NULL if none), and what the engine resolved. */
const nl_arch *nl_engine_arch(const nl_engine *e);
const nl_tokenizer *nl_engine_tokenizer(const nl_engine *e);
nl_wfmt nl_engine_weights(const nl_engine *e);
/* Text -> prompt tokens (BOS first when the tokenizer has one), in a new array (nl_free). */
nl_status nl_engine_encode(const nl_engine *e, const char *text, size_t len, int32_t **tokens, int64_t *n);

/* Queues a request. prompt (n tokens, copied), s (copied; NULL: defaults). *id receives its id
 * (never 0). Errors: NL_ERR_INVALID (empty prompt, a token outside the vocabulary, bad
 * sampling fields: message names it), NL_ERR_RANGE (prompt longer than the context seq_len, or
 * than the whole KV pool: HTTP 400), NL_ERR_BUSY (the waiting queue is full: HTTP 429). */
nl_status nl_engine_submit(nl_engine *e, const int32_t *prompt, int64_t n, const nl_sampling *s, uint64_t *id);
/* Cancels a request (waiting or running): it finishes "cancelled" and its KV blocks are freed
 * at the start of the next step. NL_ERR_INVALID for an unknown id; a finished one is left as is. */
nl_status nl_engine_cancel(nl_engine *e, uint64_t id);

/* One iteration: admit, schedule, one forward, sample, publish. *n_tokens (may be NULL)
 * receives the tokens the forward processed (0: there was nothing to do). Errors: NL_ERR_NOMEM
 * (the step is not run; requests stay queued). */
nl_status nl_engine_step(nl_engine *e, int64_t *n_tokens);
/* 1 if a request is waiting or running. */
int nl_engine_busy(nl_engine *e);
/* Driver helper: sleeps until there is work or timeout_ms passes (<= 0: returns at once).
 * Returns nl_engine_busy. */
int nl_engine_wait_work(nl_engine *e, int timeout_ms);

/* What a request produced since the last read (or everything, with from_start). */
typedef struct nl_engine_output {
    int32_t *tokens; /* new completion tokens (nl_free) */
    int64_t n_tokens;
    char *text; /* new final text, NUL-terminated (nl_free) */
    size_t text_len;
    nl_finish finish; /* NONE while running */
    int64_t prompt_tokens, completion_tokens;
    int64_t preemptions;                            /* times this request was preempted and recomputed */
    double t_submit_s, t_first_token_s, t_finish_s; /* nl_time_s() clock; 0 when not yet */
    char error[256];                                /* NL_FINISH_ERROR: what went wrong */
} nl_engine_output;
/* Copies out (and marks read) what request id produced since the last read; from_start: all
 * of it (nothing is marked). NL_ERR_INVALID for an unknown (or released) id, NL_ERR_NOMEM. */
nl_status nl_engine_read(nl_engine *e, uint64_t id, int from_start, nl_engine_output *out);
/* Frees the arrays of an output (safe on a zeroed one). */
void nl_engine_output_free(nl_engine_output *out);
/* Sleeps until request id has unread output or has finished, or timeout_ms passes. Returns 1
 * if there is something to read, 0 on timeout, -1 for an unknown id. */
int nl_engine_wait(nl_engine *e, uint64_t id, int timeout_ms);
/* Forgets a finished request (cancels it first if it is still running). */
void nl_engine_release(nl_engine *e, uint64_t id);

/* ---- prefill/decode disaggregation (kv_transfer.h moves this between processes) ----------- */

/* The KV of one prefilled prompt, independent of the block size: data is nl_kvcache_seq_bytes
 * (n_layers, kv_heads, head_dim, dtype, n_tokens) bytes in nl_kvcache_gather's layout
 * (fp32 (L, 2, n_tokens, KVH*hd); int8 codes then fp16 scales). */
typedef struct nl_engine_kv {
    int64_t n_layers, kv_heads, head_dim;
    nl_kv_dtype dtype;
    int64_t n_tokens;    /* prompt tokens whose K/V are held */
    int32_t *tokens;     /* (n_tokens) the prompt (nl_free) */
    int32_t first_token; /* sampled from the logits of the last prompt position */
    nl_rng rng;          /* the request's generator after that draw */
    uint8_t *data;       /* (data_bytes) K/V (nl_free) */
    size_t data_bytes;
} nl_engine_kv;
/* Frees the arrays of a kv (safe on a zeroed one). */
void nl_engine_kv_free(nl_engine_kv *kv);
/* The KV format of the engine's pool. */
nl_kv_dtype nl_engine_kv_dtype(const nl_engine *e);

/* Queues a prefill-only request: the prompt is computed (chunked and batched like any other),
 * one token is sampled with s's temperature / top-p / top-k / seed, and the request finishes
 * ("length", or "stop" for EOS) KEEPING its KV blocks until nl_engine_release, so that
 * nl_engine_export_kv can copy them out. Errors as nl_engine_submit. */
nl_status nl_engine_submit_prefill(nl_engine *e, const int32_t *prompt, int64_t n, const nl_sampling *s, uint64_t *id);
/* Copies out the prompt KV, the first token and the generator of a finished prefill-only
 * request (out: nl_engine_kv_free). NL_ERR_INVALID for an unknown id, a request that was not
 * submitted with nl_engine_submit_prefill, or one not finished (or cancelled / failed: the
 * message says so); NL_ERR_NOMEM. */
nl_status nl_engine_export_kv(nl_engine *e, uint64_t id, nl_engine_kv *out);
/* Queues a request that continues from an exported prefill: blocks for the prompt are taken
 * from the pool and filled with kv->data, the first token is appended (text, stop strings and
 * max_tokens of s apply to it as if sampled here), and the request waits to be decoded from
 * position n_tokens on with kv->rng. Greedy tokens are then those of colocated serving.
 * Errors: NL_ERR_INVALID (a shape or KV format other than the engine's, a token outside the
 * vocabulary, a data size that does not match: the message names it), NL_ERR_RANGE (longer
 * than the context), NL_ERR_BUSY (waiting queue full, or the pool has not the blocks now). */
nl_status nl_engine_import_kv(nl_engine *e, const nl_engine_kv *kv, const nl_sampling *s, uint64_t *id);

typedef struct nl_engine_stats {
    int64_t running, waiting; /* sequences now */
    int64_t kv_blocks_total, kv_blocks_used, kv_blocks_free;
    int64_t block_size;
    size_t kv_block_bytes;          /* bytes of one block */
    size_t weight_bytes;            /* bytes of the weights the kernels read per step */
    int64_t steps;                  /* forwards run */
    int64_t tokens_generated;       /* completion tokens sampled, all requests */
    int64_t prompt_tokens_computed; /* prefill rows run (recomputed ones included) */
    int64_t preemptions;
    int64_t requests_submitted, requests_finished, requests_rejected;
    int64_t kv_blocks_cached;       /* blocks findable by their prefix hash (free or held) */
    int64_t prefix_cache_queries;   /* prompt tokens looked up at admission */
    int64_t prefix_cache_hits;      /* of those, tokens found cached (not computed) */
    int64_t prefix_cache_evictions; /* cached blocks taken for other tokens */
    int64_t spec_drafted;           /* speculative tokens drafted and verified */
    int64_t spec_accepted;          /* of those, accepted by the target */
} nl_engine_stats;
/* A consistent snapshot. */
void nl_engine_stats_get(nl_engine *e, nl_engine_stats *st);

#ifdef __cplusplus
}
#endif
#endif
