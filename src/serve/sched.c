/* The engine's scheduler: admission, the rows of a step within its token and chunk budgets, and
 * the preemption policy (engine_impl.h). Continuous batching (Orca), chunked prefill
 * (Sarathi-Serve), recompute-on-preemption of the youngest (vLLM). */
#include <stdio.h>
#include <string.h>

#include "serve/engine_impl.h"

int nl_sched_reserve(nl_engine *e, nl_req *r, int64_t upto) { return nl_block_table_reserve(&e->pool, &r->bt, upto); }

/* A waiting request's prompt blocks that the cache holds (at least one token is left to compute:
 * its logits give the next token). Takes them (*take) or only counts them. */
static int64_t cached_prefix(nl_engine *e, nl_req *r, int take, int64_t *n_free_hit) {
    *n_free_hit = 0;
    if (!e->pool.caching || r->bt.n || r->n_cached) return 0;
    const int64_t bs = e->pool.block_size, max_blocks = (r->n_toks - 1) / bs;
    int64_t k = nl_block_pool_match(&e->pool, r->toks, r->n_toks, max_blocks, n_free_hit);
    if (!take || !k) return k;
    k = nl_block_table_take_cached(&e->pool, &r->bt, r->toks, k);
    r->n_cached = k * bs;
    r->n_hashed = k;
    r->last_hash = k ? e->pool.hash[r->bt.ids[k - 1]] : 0;
    return k;
}

/* admission (FCFS): a request joins when the free blocks hold all its tokens, so that a
 * recomputed or long prompt does not push out the decodes (vLLM's admission rule); blocks its
 * prompt finds cached are not needed, unless they sit in the free queue (taking them uses it) */
void nl_sched_admit(nl_engine *e) {
    const int64_t bs = e->pool.block_size;
    int64_t free_blocks_left = e->pool.n_free;
    while (e->n_running < e->o.max_batch && e->n_waiting > 0) {
        nl_req *r = e->waiting[0];
        int64_t free_hit = 0, hit = cached_prefix(e, r, 0, &free_hit);
        int64_t need = (r->n_toks + bs) / bs - r->bt.n - hit + free_hit;
        if (need > free_blocks_left && e->n_running > 0) break;
        free_blocks_left -= need;
        memmove(e->waiting, e->waiting + 1, (size_t)(e->n_waiting - 1) * sizeof(nl_req *));
        e->n_waiting--;
        if (e->pool.caching && !r->bt.n && !r->n_cached) {
            hit = cached_prefix(e, r, 1, &free_hit);
            e->st.prefix_cache_queries += r->n_toks;
            e->st.prefix_cache_hits += hit * bs;
        }
        r->state = REQ_RUNNING;
        r->admit_seq = ++e->admit_counter;
        e->running[e->n_running++] = r;
    }
}

/* Preempts the youngest running request other than `keep` (mutex held): its blocks go back to
 * the pool and it goes to the front of the queue, to be recomputed. Returns 0 if there is none. */
static int preempt_youngest(nl_engine *e, const nl_req *keep) {
    nl_req *y = NULL; /* the running set is in admission order: the youngest is last */
    for (int64_t i = 0; i < e->n_running; i++)
        if (e->running[i] != keep) y = e->running[i];
    if (!y) return 0;
    nl_engine_free_blocks(e, y);
    nl_engine_remove_req(e->running, &e->n_running, y);
    memmove(e->waiting + 1, e->waiting, (size_t)e->n_waiting * sizeof(nl_req *));
    e->waiting[0] = y;
    e->n_waiting++;
    y->state = REQ_WAITING;
    y->preemptions++;
    e->st.preemptions++;
    return 1;
}

/* Adds row (token at position pos of r) to the step. */
static inline void add_row(nl_engine *e, int64_t n, nl_req *r, int64_t pos) {
    e->run.tok[n] = r->toks[pos];
    e->run.pos[n] = pos;
    e->run.table[n] = r->bt.ids;
    e->row_req[n] = r;
}

/* Speculative decoding: drafts up to spec_k tokens for decoding request r (its block for the next
 * position held) into r->toks[n_toks..], at most `room` of them (rows the step has left), within
 * its max_tokens and the context, and within the blocks it holds or can get without preempting.
 * Sets and returns r->n_draft. */
static int64_t draft(nl_engine *e, nl_req *r, int64_t room) {
    int64_t k = e->o.spec_k;
    r->n_draft = 0;
    if (k <= 0 || r->keep_kv) return 0;
    const int64_t done = r->n_toks - r->n_prompt, S = e->m->arch.seq_len;
    if (r->s.max_tokens > 0 && k > r->s.max_tokens - done - 1) k = r->s.max_tokens - done - 1;
    if (k > S - r->n_toks) k = S - r->n_toks;
    if (k > room) k = room;
    if (e->draft) { /* the draft model's positions too, and its blocks up to its last draft */
        const int64_t DS = e->draft->m->arch.seq_len;
        if (k > DS - r->n_toks) k = DS - r->n_toks;
        if (k <= 0 || !nl_block_table_reserve(&e->draft->pool, &r->dbt, r->n_toks + k - 1)) return 0;
    } else if (k > 0)
        k = nl_sampler_ngram_draft(r->toks, r->n_toks, e->o.spec_ngram, k, r->toks + r->n_toks);
    if (k <= 0) return 0;
    if (k > 0 && !nl_sched_reserve(e, r, r->n_cached + 1 + k)) {
        const int64_t held = r->bt.n * e->pool.block_size - r->n_cached - 1;
        if (k > held) k = held;
    }
    return r->n_draft = k > 0 ? k : 0;
}

int64_t nl_sched_schedule(nl_engine *e, int64_t *n_out) {
    const int64_t bs = e->pool.block_size;
    int64_t n = 0, no = 0, budget = e->o.max_step_tokens;
    *n_out = 0;
    e->n_decode_rows = 0;
    /* decodes: one token each */
    for (int64_t i = 0; i < e->n_running; i++) {
        nl_req *r = e->running[i];
        if (r->n_toks - r->n_cached != 1) continue;
        /* Everything older than r is scheduled already; the youngest running request goes
         * (r itself, when it is the youngest) until r has its block. */
        int self = 0;
        while (!nl_sched_reserve(e, r, r->n_cached + 1) && e->n_running > 1) {
            nl_req *y = e->running[e->n_running - 1];
            if (y == r) {
                preempt_youngest(e, NULL);
                self = 1;
                break;
            }
            preempt_youngest(e, r);
        }
        if (self) break; /* r was the last of the running set */
        if (r->bt.n * bs < r->n_cached + 1) {
            /* alone and still no room: the pool is smaller than its context */
            nl_engine_free_blocks(e, r);
            nl_engine_remove_req(e->running, &e->n_running, r);
            nl_engine_finish_req(e, r, NL_FINISH_LENGTH);
            i--;
            continue;
        }
        const int64_t k = draft(e, r, budget - 1 - (e->n_running - 1 - i));
        for (int64_t j = 0; j <= k; j++) {
            add_row(e, n, r, r->n_cached + j);
            e->run.out_rows[no] = n;
            e->out_req[no++] = r;
            n++;
        }
        budget -= 1 + k;
        e->n_decode_rows += 1 + k;
    }
    /* prompt chunks, oldest first. With chunking, the prompt tokens of a step are one chunk in
     * all, however many prompts wait (Sarathi-Serve's per-step token budget): a step then never
     * runs longer than its decodes plus one chunk. Without it, several waiting prompts each got a
     * chunk and a step carried up to max_step_tokens prompt tokens, as long as unchunked. */
    if (e->o.chunk > 0 && budget > e->o.chunk) budget = e->o.chunk;
    for (int64_t i = 0; i < e->n_running && budget > 0; i++) {
        nl_req *r = e->running[i];
        int64_t left = r->n_toks - r->n_cached;
        if (left < 2) continue;
        r->n_draft = 0;
        int64_t c = left;
        if (e->o.chunk > 0 && c > e->o.chunk) c = e->o.chunk;
        if (c > budget) {
            /* unchunked: a prompt waits for a step with room for all of it, unless it can never fit */
            if (e->o.chunk == 0 && left <= e->o.max_step_tokens && n > 0) continue;
            c = budget;
        }
        if (!nl_sched_reserve(e, r, r->n_cached + c)) {
            c = r->bt.n * bs - r->n_cached; /* what the blocks it got hold */
            if (c <= 0) continue;
        }
        for (int64_t j = 0; j < c; j++) add_row(e, n++, r, r->n_cached + j);
        budget -= c;
        if (r->n_cached + c == r->n_toks) {
            e->run.out_rows[no] = n - 1;
            e->out_req[no++] = r;
        }
    }
    if (n == 0 && e->n_running > 1) {
        /* every prompt is stuck on blocks: free the youngest for the others */
        preempt_youngest(e, e->running[0]);
        return nl_sched_schedule(e, n_out);
    }
    if (n == 0 && e->n_running == 1) {
        nl_req *r = e->running[0];
        nl_engine_free_blocks(e, r);
        nl_engine_remove_req(e->running, &e->n_running, r);
        snprintf(r->error, sizeof r->error, "the KV cache (%lld blocks of %lld) cannot hold this request",
                 (long long)e->pool.n_blocks, (long long)bs);
        nl_engine_finish_req(e, r, NL_FINISH_ERROR);
    }
    *n_out = no;
    return n;
}
