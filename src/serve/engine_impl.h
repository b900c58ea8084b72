/* What the engine's files share (private to src/serve): a request, the engine, and the
 * scheduler's interface. engine.c owns the request life cycle and the driver's step, sched.c
 * decides what a step runs, block_pool.c keeps the KV bookkeeping, runner.c runs the forward. */
#ifndef NANOLM_SERVE_ENGINE_IMPL_H
#define NANOLM_SERVE_ENGINE_IMPL_H

#include <pthread.h>

#include "nanolm/block_pool.h"
#include "nanolm/engine.h"
#include "nanolm/runner.h"

enum { REQ_WAITING = 0, REQ_RUNNING = 1, REQ_FINISHED = 2 };

typedef struct nl_req {
    uint64_t id;
    int state;
    int32_t *toks; /* (cap) prompt then completion tokens */
    int64_t n_toks, cap, n_prompt;
    int64_t n_cached;                /* positions whose K/V are in the cache */
    nl_block_table bt;               /* its blocks */
    int64_t n_hashed;                /* leading full blocks whose chain hash is known (registered or shared) */
    uint64_t last_hash;              /* the chain hash of block n_hashed - 1 (0: none) */
    int64_t n_draft;                 /* speculative tokens drafted for this step (rows after the first) */
    nl_block_table dbt;              /* draft model: its blocks in the draft engine's pool */
    int64_t d_cached;                /* draft model: positions whose draft K/V are held */
    int64_t spec_len;                /* drafts to ask for next (adapts to what is accepted; 0: spec_k) */
    int64_t spec_skip, spec_backoff; /* decode steps left without drafting after a miss, and the next such wait */
    nl_sampling s;
    nl_rng rng;
    nl_finish finish;
    char error[256];
    int cancel, release; /* asked by another thread */
    int keep_kv;         /* prefill-only: keeps its blocks when it finishes, for nl_engine_export_kv */
    uint64_t admit_seq;  /* admission order: the largest is the youngest */
    int64_t preemptions;
    /* output: completion text and what was read / sent */
    char *text;
    size_t text_len, text_final, stop_checked;
    int64_t text_cap;
    int64_t read_tokens, ev_tokens; /* completion tokens already read / sent to the callback */
    size_t read_text, ev_text;
    double t_submit, t_first, t_finish;
} nl_req;

struct nl_engine {
    nl_engine_opts o;
    nl_model own_model; /* when opened from a file */
    const nl_model *m;
    nl_tokenizer own_tok;
    const nl_tokenizer *tok;
    nl_wfmt wfmt;
    nl_runner run;      /* the forward and its buffers */
    nl_block_pool pool; /* the KV cache and its bookkeeping */
    /* this step: the request of each row (the runner holds tokens, positions, tables), and the
     * request of each logits row */
    nl_req **row_req, **out_req;
    int32_t *sample_tok;   /* tokens sampled per logits row (a speculative group: its tokens from its first) */
    int64_t *spec_n;       /* tokens a logits row's group gives (1, or 1 + accepted drafts) */
    float *spec_probs;     /* (V) verification scratch */
    nl_engine *draft;      /* draft model mode: an engine whose runner and pool the drafts use */
    float *spec_q;         /* draft model mode: (rows_cap, V) the drafter's distribution per draft */
    int64_t *draft_work;   /* draft model mode: (3, rows_cap) per drafting request, a round's state */
    const char *tok_path;  /* the tokenizer nl_engine_open was given (for the draft checkpoint) */
    int64_t n_decode_rows; /* of this step's rows, how many are decodes (speculative rows included) */
    nl_req **touched;      /* requests with news this step (events, releases) */
    int64_t n_touched;
    nl_status *sample_rc;
    char (*sample_err)[256];
    /* requests */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* broadcast after every step and every submit */
    nl_req **all;      /* every request not released */
    int64_t n_all, all_cap;
    nl_req **waiting; /* FIFO */
    int64_t n_waiting;
    nl_req **running; /* admission order */
    int64_t n_running;
    uint64_t next_id, admit_counter;
    nl_engine_stats st;
};

/* ---- engine.c, for the scheduler ---------------------------------------------------------------- */

/* Marks r finished (mutex held). Its blocks must already be free. */
void nl_engine_finish_req(nl_engine *e, nl_req *r, nl_finish f);
/* Removes r from an array of n requests. */
void nl_engine_remove_req(nl_req **arr, int64_t *n, nl_req *r);
/* Releases r's blocks (mutex held). */
void nl_engine_free_blocks(nl_engine *e, nl_req *r);

/* ---- sched.c: admission, the step's rows, preemption -------------------------------------------- */

/* Moves waiting requests into the running set (FCFS) while the pool holds their tokens and the
 * batch has room; a prompt's cached prefix blocks are taken on admission (mutex held). */
void nl_sched_admit(nl_engine *e);
/* Fills the runner's rows for this step: decodes first (oldest first, preempting the youngest
 * when a decode needs a block the pool does not have; a decode may carry drafted tokens), then
 * prompt chunks within the chunk budget. Returns the rows; *n_out the rows that sample (mutex
 * held). */
int64_t nl_sched_schedule(nl_engine *e, int64_t *n_out);
/* Blocks so that r holds positions [0, upto). 0 when the pool ran out (r keeps what it got). */
int nl_sched_reserve(nl_engine *e, nl_req *r, int64_t upto);

#endif
