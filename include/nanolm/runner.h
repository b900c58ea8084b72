/*
 * nanolm runner: the serving engine's batched forward. One step runs the tokens of all the
 * step's rows (each a token at a position of a sequence, given by its block table) through every
 * layer: each linear one kernel call over all rows (each weight read once per step), RoPE and the
 * KV store per row, paged attention per (tile, head), and the classifier on the rows that sample.
 * Every row is computed by the same operations whatever else shares the step (batch invariance).
 * The runner knows nothing of requests: the scheduler fills its row arrays.
 */
#ifndef NANOLM_RUNNER_H
#define NANOLM_RUNNER_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/kvcache.h"
#include "nanolm/matvec.h"
#include "nanolm/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A step of fewer rows than this runs RoPE and the KV store on the calling thread (a few
 * hundred ns per row: less than waking the team); bench machine's probes run the same code. */
#define NL_ENGINE_ROPE_PARALLEL_ROWS 8

typedef struct nl_runner {
    const nl_model *m;
    nl_wfmt wfmt;
    int threads;         /* OpenMP threads of a step (<= 0: the OpenMP default) */
    int64_t weight_macs; /* multiply-adds of the linears per token */
    nl_mv_weight *w;     /* (L, 4): qkv, o, gate_up, down; then the classifier at [4L] (NULL: none) */
    nl_mv_act act;       /* the linears' prepared inputs, reused step after step */
    size_t weight_bytes;
    /* the step's rows, filled by the caller: token, position and block table of each, and the
     * rows whose logits are wanted (in logits order) */
    int64_t rows_cap;
    int32_t *tok;
    int64_t *pos;
    const int32_t **table;
    int64_t *out_rows;
    /* buffers, sized for rows_cap rows */
    float *x, *xb, *qkv, *atty, *h13, *hact, *rstd, *logits, *scratch;
    int64_t scratch_floats; /* per thread: attention of one tile */
    int64_t *tile_row;      /* (rows_cap + 1,) first row of each attention tile, then n */
    /* NANOLM_STEP_PROFILE=1: wall seconds per phase of the forward, summed over steps and
     * printed to stderr by nl_runner_free; =cpu: the stepping thread's CPU time instead */
    int prof;
    double prof_s[16];
    int64_t prof_steps, prof_rows;
} nl_runner;

/* Buffers for steps of up to rows_cap rows of model m (no weights yet). Errors: NL_ERR_NOMEM. */
nl_status nl_runner_init(nl_runner *r, const nl_model *m, int64_t rows_cap, int threads);
/* Builds the linears' weights in format wfmt (NL_WFMT_AUTO: fp32) from m's matrices. */
nl_status nl_runner_build_weights(nl_runner *r, nl_wfmt wfmt);
/* Frees everything (prints the profile when one was taken); safe on a zeroed struct. */
void nl_runner_free(nl_runner *r);

/* One step over rows 0..n-1 (their blocks in kv allocated up to their positions): logits
 * (n_out, V) of rows out_rows[0..n_out). Errors: NL_ERR_NOMEM. */
nl_status nl_runner_forward(nl_runner *r, nl_kvcache *kv, int64_t n, int64_t n_out);

/* The pieces of a layer the forward runs besides its linears and norms (bench machine times
 * them): RoPE on the q and k heads of rows 0..n-1 of qkv and their K/V stored at their positions
 * in layer l; and the attention of those rows in layer l into atty, tile by tile
 * (nl_runner_tiles first). */
void nl_runner_rope_store(nl_runner *r, nl_kvcache *kv, int64_t l, int64_t n);
/* Splits rows 0..n-1 into attention tiles (runs of rows of one table at consecutive positions,
 * at most NL_KV_QTILE each); returns how many. */
int64_t nl_runner_tiles(nl_runner *r, int64_t n);
void nl_runner_attention(nl_runner *r, const nl_kvcache *kv, int64_t l, int64_t n_tiles);

/* Profiling hooks of the engine's step (no-ops unless NANOLM_STEP_PROFILE is set): the profile's
 * clock, and seconds spent sampling. */
double nl_runner_clock(const nl_runner *r);
void nl_runner_prof_sampling(nl_runner *r, double seconds);

#ifdef __cplusplus
}
#endif
#endif
