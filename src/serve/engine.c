/* The serving engine: requests, scheduler (continuous batching, chunked prefill, preemption),
 * the batched forward over a paged KV cache, and output publishing (engine.h). */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nanolm/engine.h"
#include "nanolm/hf.h"
#include "nanolm/kvcache.h"
#include "nanolm/model_load.h"
#include "nanolm/quantize_model.h"

enum { REQ_WAITING = 0, REQ_RUNNING = 1, REQ_FINISHED = 2 };

typedef struct nl_req {
    uint64_t id;
    int state;
    int32_t *toks; /* (cap) prompt then completion tokens */
    int64_t n_toks, cap, n_prompt;
    int64_t n_cached; /* positions whose K/V are in the cache */
    int32_t *table;   /* block table */
    int64_t n_table, table_cap;
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
    int64_t weight_macs; /* multiply-adds of the linears per token */
    nl_mv_weight *w;     /* (L, 4): qkv, o, gate_up, down; then the classifier at [4L] */
    nl_mv_act act;       /* the linears' prepared inputs, reused step after step */
    size_t weight_bytes;
    nl_kvcache kv;
    /* step buffers, sized for max_step_tokens rows */
    int64_t rows_cap;
    float *x, *xb, *qkv, *atty, *h13, *hact, *rstd, *logits, *scratch;
    int64_t scratch_floats; /* per thread: attention of one tile */
    int64_t *tile_row;      /* (rows_cap + 1,) first row of each attention tile, then n */
    int32_t *row_tok, *sample_tok;
    int64_t *row_pos, *out_rows;
    nl_req **row_req, **out_req;
    int64_t n_decode_rows; /* of this step's rows, how many are decodes */
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
    /* NANOLM_STEP_PROFILE=1: wall seconds per phase of the forward, summed over steps and
     * printed to stderr when the engine closes (prof_phase below names them); =cpu: the
     * stepping thread's CPU time instead (meaningful with 1 thread on a loaded machine) */
    int prof;
    double prof_s[16];
    int64_t prof_steps, prof_rows;
};

const char *nl_finish_name(nl_finish f) {
    switch (f) {
    case NL_FINISH_STOP: return "stop";
    case NL_FINISH_LENGTH: return "length";
    case NL_FINISH_CANCELLED: return "cancelled";
    case NL_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

void nl_engine_opts_default(nl_engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->weights = NL_WFMT_AUTO;
    o->kv = NL_KV_FP32;
    o->block_size = 16;
    o->max_batch = 32;
    o->max_step_tokens = 512;
    o->chunk = 256;
    o->max_waiting = 256;
}

/* ---- setup ----------------------------------------------------------------------------------- */

static nl_status check_opts(const nl_engine_opts *o) {
    if (o->weights != NL_WFMT_AUTO && !nl_wfmt_name(o->weights))
        return nl_fail(NL_ERR_INVALID, "engine: unknown weight format %d", (int)o->weights);
    if (o->kv != NL_KV_FP32 && o->kv != NL_KV_INT8)
        return nl_fail(NL_ERR_INVALID, "engine: unknown KV type %d", (int)o->kv);
    if (o->block_size < 1 || o->block_size > 4096)
        return nl_fail(NL_ERR_INVALID, "engine: block size must be in [1, 4096], got %lld", (long long)o->block_size);
    if (o->kv_blocks < 0 || o->kv_mem_bytes < 0)
        return nl_fail(NL_ERR_INVALID, "engine: --kv-blocks and --kv-mem must be >= 0");
    if (o->max_batch < 1 || o->max_batch > 65536)
        return nl_fail(NL_ERR_INVALID, "engine: max batch must be in [1, 65536], got %d", o->max_batch);
    if (o->max_step_tokens < o->max_batch || o->max_step_tokens > (1 << 20))
        return nl_fail(NL_ERR_INVALID, "engine: max step tokens (%lld) must be in [max batch %d, 2^20]",
                       (long long)o->max_step_tokens, o->max_batch);
    if (o->chunk < 0) return nl_fail(NL_ERR_INVALID, "engine: chunk must be >= 0, got %lld", (long long)o->chunk);
    if (o->max_waiting < 0) return nl_fail(NL_ERR_INVALID, "engine: max waiting must be >= 0, got %d", o->max_waiting);
    return NL_OK;
}

static nl_status alloc_buffers(nl_engine *e) {
    const nl_model *m = e->m;
    int64_t R = e->rows_cap = e->o.max_step_tokens;
    int nt = e->o.threads > 0 ? e->o.threads : omp_get_max_threads();
    size_t floats = (size_t)(R * (m->C * 2 + m->QKV + m->NH * m->hd + 3 * m->H + 1 + m->V));
    e->scratch_floats = nl_kvcache_attend_scratch(NL_KV_QTILE, m->arch.seq_len, m->hd);
    size_t scratch = (size_t)nt * (size_t)e->scratch_floats;
    e->x = nl_malloc((floats + scratch) * sizeof(float), "engine step buffers");
    e->row_tok = nl_malloc((size_t)R * 2 * sizeof(int32_t), "engine row tokens");
    e->row_pos = nl_malloc((size_t)R * 2 * sizeof(int64_t), "engine row positions");
    e->row_req = nl_malloc((size_t)R * 2 * sizeof(nl_req *), "engine row requests");
    e->tile_row = nl_malloc((size_t)(R + 1) * sizeof(int64_t), "engine attention tiles");
    e->sample_rc = nl_malloc((size_t)R * sizeof(nl_status), "engine sample status");
    e->sample_err = nl_malloc((size_t)R * 256, "engine sample errors");
    e->touched = nl_malloc((size_t)(R + 2 * (int64_t)e->o.max_waiting + 2 * e->o.max_batch + 1) * sizeof(nl_req *),
                           "engine touched list");
    if (!e->x || !e->row_tok || !e->row_pos || !e->row_req || !e->tile_row || !e->sample_rc || !e->sample_err ||
        !e->touched)
        return NL_ERR_NOMEM;
    float *p = e->x + R * m->C;
    e->xb = p;
    p += R * m->C;
    e->qkv = p;
    p += R * m->QKV;
    e->atty = p;
    p += R * m->NH * m->hd;
    e->h13 = p;
    p += R * 2 * m->H;
    e->hact = p;
    p += R * m->H;
    e->rstd = p;
    p += R;
    e->logits = p;
    p += R * m->V;
    e->scratch = p;
    e->sample_tok = e->row_tok + R;
    e->out_rows = e->row_pos + R;
    e->out_req = e->row_req + R;
    return NL_OK;
}

static nl_status build_weights(nl_engine *e) {
    const nl_model *m = e->m;
    int64_t L = m->L;
    e->w = nl_calloc((size_t)(4 * L + 1), sizeof(nl_mv_weight), "engine weights");
    if (!e->w) return NL_ERR_NOMEM;
    for (int64_t l = 0; l < L; l++) {
        const nl_layer_weights *lw = &m->w.layers[l];
        NL_TRY(nl_mv_weight_init(&e->w[4 * l + 0], e->wfmt, lw->wq, m->QKV, m->C, 0));
        NL_TRY(nl_mv_weight_init(&e->w[4 * l + 1], e->wfmt, lw->wo, m->C, m->NH * m->hd, 0));
        NL_TRY(nl_mv_weight_init(&e->w[4 * l + 2], e->wfmt, lw->w1, 2 * m->H, m->C, 0));
        NL_TRY(nl_mv_weight_init(&e->w[4 * l + 3], e->wfmt, lw->w2, m->C, m->H, 0));
    }
    NL_TRY(nl_mv_weight_init(&e->w[4 * L], e->wfmt, m->w.cls, m->V, m->C, 0));
    e->weight_bytes = 0;
    e->weight_macs = 0;
    for (int64_t i = 0; i <= 4 * L; i++) {
        e->weight_bytes += nl_mv_weight_bytes(&e->w[i]);
        e->weight_macs += e->w[i].rows * e->w[i].cols;
    }
    return NL_OK;
}

static nl_status engine_init(nl_engine *e) {
    const nl_model *m = e->m;
    if (m->moe)
        return nl_fail(NL_ERR_UNSUPPORTED, "engine: arch %s has mixture-of-experts layers (not served)", m->arch.name);
    if (!m->w.embed || !m->w.cls) return nl_fail(NL_ERR_INVALID, "engine: the model has no embedding or classifier");
    if (e->wfmt == NL_WFMT_AUTO) e->wfmt = NL_WFMT_FP32;
    NL_TRY(build_weights(e));
    int64_t blocks = e->o.kv_blocks;
    size_t bb = nl_kvcache_block_bytes(m->L, m->KVH, m->hd, e->o.kv, e->o.block_size);
    if (!blocks && e->o.kv_mem_bytes) {
        blocks = (int64_t)((size_t)e->o.kv_mem_bytes / bb);
        if (blocks < 1)
            return nl_fail(NL_ERR_INVALID, "engine: --kv-mem %lld bytes holds no block (one block is %zu bytes)",
                           (long long)e->o.kv_mem_bytes, bb);
    }
    if (!blocks) blocks = (int64_t)e->o.max_batch * ((m->arch.seq_len + e->o.block_size - 1) / e->o.block_size);
    NL_TRY(nl_kvcache_init(&e->kv, m->L, m->KVH, m->hd, e->o.kv, e->o.block_size, blocks));
    NL_TRY(alloc_buffers(e));
    e->next_id = 1;
    return NL_OK;
}

static nl_engine *engine_new(const nl_engine_opts *opts) {
    nl_engine *e = nl_calloc(1, sizeof *e, "engine");
    if (!e) return NULL;
    if (opts)
        e->o = *opts;
    else
        nl_engine_opts_default(&e->o);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    const char *prof = getenv("NANOLM_STEP_PROFILE");
    e->prof = !prof || !*prof || !strcmp(prof, "0") ? 0 : !strcmp(prof, "cpu") ? 2 : 1;
    return e;
}

nl_status nl_engine_open_model(nl_engine **out, const nl_model *m, const nl_tokenizer *tok,
                               const nl_engine_opts *opts) {
    *out = NULL;
    if (opts) NL_TRY(check_opts(opts));
    nl_engine *e = engine_new(opts);
    if (!e) return NL_ERR_NOMEM;
    e->m = m;
    e->tok = tok;
    e->wfmt = e->o.weights;
    nl_status rc = engine_init(e);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", nl_last_error());
        nl_engine_close(e);
        return nl_fail(rc, "%s", msg);
    }
    *out = e;
    return NL_OK;
}

/* An engine that loaded its own model reads the linears only through its weights (e->w): where
 * those hold a copy of their own (fp32 panels, bf16, int8, int4), the model's fp32 matrices go
 * back to the system, so that serving in a format costs that format's bytes rather than those
 * plus the fp32 ones (the 85M model through `serve --ckpt`, resident after one request: fp32
 * 722 -> 391 MB, bf16 558 -> 226, int8 435 -> 103). Their pointers in the model are cleared:
 * nothing reads them again. The embedding stays (its rows are the tokens' inputs), and with it a
 * tied classifier. */
static void release_linear(nl_mv_weight *w, float **src) {
    if (!*src || !nl_mv_weight_detach(w)) return;
    nl_release_pages(*src, (size_t)w->rows * (size_t)w->cols * sizeof(float));
    *src = NULL;
}
static void release_model_linears(nl_engine *e) {
    nl_model *m = &e->own_model;
    for (int64_t l = 0; l < m->L; l++) {
        nl_layer_weights *lw = &m->w.layers[l];
        float **src[4] = {&lw->wq, &lw->wo, &lw->w1, &lw->w2}; /* wq: q, k, v; w1: gate, up */
        for (int j = 0; j < 4; j++) release_linear(&e->w[4 * l + j], src[j]);
        if (!lw->wq) lw->wk = lw->wv = NULL;
        if (!lw->w1) lw->w3 = NULL;
    }
    if (m->w.cls != m->w.embed) release_linear(&e->w[4 * m->L], &m->w.cls);
}

nl_status nl_engine_open(nl_engine **out, const char *ckpt, const char *tokenizer, const nl_engine_opts *opts) {
    *out = NULL;
    if (opts) NL_TRY(check_opts(opts));
    nl_engine *e = engine_new(opts);
    if (!e) return NL_ERR_NOMEM;
    e->wfmt = e->o.weights;
    /* the format is decided in model/ (nanolm/model_load.h); int8 per-channel quantized
     * checkpoints run on the int8 kernels (requantizing codes * scale per row by absmax gives
     * back the same codes and scales) */
    nl_model_source src;
    nl_status rc = nl_model_load(ckpt, tokenizer, NL_HF_DEFAULT_MAX_SEQ, &e->own_model, &e->own_tok, &src);
    if (!rc) {
        e->m = &e->own_model;
        e->tok = &e->own_tok;
        if (e->wfmt == NL_WFMT_AUTO && src.format == NL_CKPT_QUANTIZED)
            e->wfmt = src.int8_per_channel ? NL_WFMT_INT8 : NL_WFMT_FP32;
    }
    if (!rc) rc = engine_init(e);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", nl_last_error());
        nl_engine_close(e);
        return nl_fail(rc, "%s", msg);
    }
    release_model_linears(e);
    *out = e;
    return NL_OK;
}

static void req_free(nl_req *r) {
    if (!r) return;
    nl_free(r->toks);
    nl_free(r->table);
    nl_free(r->text);
    nl_free(r);
}

static void prof_print(const nl_engine *e);

void nl_engine_close(nl_engine *e) {
    if (!e) return;
    if (e->prof) prof_print(e);
    for (int64_t i = 0; i < e->n_all; i++) req_free(e->all[i]);
    nl_free(e->all);
    nl_free(e->waiting);
    nl_free(e->running);
    if (e->w)
        for (int64_t i = 0; e->m && i <= 4 * e->m->L; i++) nl_mv_weight_free(&e->w[i]);
    nl_free(e->w);
    nl_mv_act_free(&e->act);
    nl_kvcache_free(&e->kv);
    nl_free(e->x);
    nl_free(e->row_tok);
    nl_free(e->row_pos);
    nl_free(e->row_req);
    nl_free(e->tile_row);
    nl_free(e->sample_rc);
    nl_free(e->sample_err);
    nl_free(e->touched);
    nl_tokenizer_free(&e->own_tok);
    nl_model_free(&e->own_model);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    nl_free(e);
}

const nl_arch *nl_engine_arch(const nl_engine *e) { return &e->m->arch; }
const nl_tokenizer *nl_engine_tokenizer(const nl_engine *e) { return e->tok; }
nl_wfmt nl_engine_weights(const nl_engine *e) { return e->wfmt; }

nl_status nl_engine_encode(const nl_engine *e, const char *text, size_t len, int32_t **tokens, int64_t *n) {
    *tokens = NULL;
    *n = 0;
    if (!e->tok) return nl_fail(NL_ERR_INVALID, "engine: no tokenizer to encode text with");
    int *ids = NULL;
    NL_TRY(nl_tokenizer_encode(e->tok, text, len, 1, 0, &ids, n));
    *tokens = (int32_t *)ids; /* int is int32_t on every platform nanolm builds on */
    return NL_OK;
}

/* ---- requests -------------------------------------------------------------------------------- */

static nl_req *find_req(nl_engine *e, uint64_t id) {
    for (int64_t i = 0; i < e->n_all; i++)
        if (e->all[i]->id == id) return e->all[i];
    return NULL;
}

static int grow(void **p, int64_t *cap, int64_t need, size_t elem, const char *what) {
    if (need <= *cap) return 0;
    int64_t nc = *cap ? *cap : 8;
    while (nc < need) nc *= 2;
    void *q = nl_malloc((size_t)nc * elem, what);
    if (!q) return 1;
    if (*p) memcpy(q, *p, (size_t)*cap * elem);
    nl_free(*p);
    *p = q;
    *cap = nc;
    return 0;
}

/* Allocates the request table, the waiting queue and the running set when they are missing
 * (mutex held). 1 when out of memory. */
static int queues_ready(nl_engine *e) {
    if (grow((void **)&e->all, &e->all_cap, e->n_all + 1, sizeof(nl_req *), "request table")) return 0;
    /* the queue also takes back up to max_batch preempted requests */
    if (!e->waiting &&
        !(e->waiting = nl_malloc((size_t)(e->o.max_waiting + e->o.max_batch + 1) * sizeof(nl_req *), "waiting queue")))
        return 0;
    if (!e->running && !(e->running = nl_malloc((size_t)e->o.max_batch * sizeof(nl_req *), "running set"))) return 0;
    return 1;
}

/* Whether one more request may wait (under e->mu): NL_ERR_BUSY, counted as rejected, when the
 * bounded queue is full; NL_ERR_NOMEM when the queues cannot grow. */
static nl_status admit_locked(nl_engine *e) {
    if (e->n_waiting >= e->o.max_waiting) {
        e->st.requests_rejected++;
        return nl_fail(NL_ERR_BUSY, "the engine's waiting queue is full (%d requests): try again later",
                       e->o.max_waiting);
    }
    return queues_ready(e) ? NL_OK : NL_ERR_NOMEM;
}


static nl_status submit(nl_engine *e, const int32_t *prompt, int64_t n, const nl_sampling *s, int keep_kv,
                        uint64_t *id) {
    *id = 0;
    const nl_model *m = e->m;
    nl_sampling sd;
    if (!s) {
        nl_sampling_default(&sd);
        s = &sd;
    }
    if (n < 1) return nl_fail(NL_ERR_INVALID, "the prompt is empty (at least one token is needed)");
    for (int64_t i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= m->V)
            return nl_fail(NL_ERR_INVALID, "prompt token %d at index %lld is outside the vocabulary [0, %lld)",
                           prompt[i], (long long)i, (long long)m->V);
    if (n > m->arch.seq_len)
        return nl_fail(NL_ERR_RANGE, "the prompt is %lld tokens, longer than the model's context of %lld tokens",
                       (long long)n, (long long)m->arch.seq_len);
    if (n > e->kv.n_blocks * e->kv.block_size)
        return nl_fail(NL_ERR_RANGE, "the prompt is %lld tokens, more than the whole KV cache holds (%lld)",
                       (long long)n, (long long)(e->kv.n_blocks * e->kv.block_size));
    NL_TRY(nl_sampling_check(s));
    nl_req *r = nl_calloc(1, sizeof *r, "request");
    if (!r) return NL_ERR_NOMEM;
    r->s = *s;
    r->keep_kv = keep_kv;
    int64_t want = n + (s->max_tokens > 0 ? s->max_tokens : m->arch.seq_len) + 1;
    if (want > m->arch.seq_len + 1) want = m->arch.seq_len + 1;
    if (grow((void **)&r->toks, &r->cap, want, sizeof(int32_t), "request tokens")) {
        req_free(r);
        return NL_ERR_NOMEM;
    }
    memcpy(r->toks, prompt, (size_t)n * sizeof(int32_t));
    r->n_toks = r->n_prompt = n;
    nl_rng_seed(&r->rng, s->seed);
    r->t_submit = nl_time_s();
    pthread_mutex_lock(&e->mu);
    nl_status rc = admit_locked(e);
    if (rc) {
        pthread_mutex_unlock(&e->mu);
        req_free(r);
        return rc;
    }
    r->id = e->next_id++;
    r->state = REQ_WAITING;
    e->all[e->n_all++] = r;
    e->waiting[e->n_waiting++] = r;
    e->st.requests_submitted++;
    *id = r->id;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return NL_OK;
}

nl_status nl_engine_submit(nl_engine *e, const int32_t *prompt, int64_t n, const nl_sampling *s, uint64_t *id) {
    return submit(e, prompt, n, s, 0, id);
}

nl_status nl_engine_submit_prefill(nl_engine *e, const int32_t *prompt, int64_t n, const nl_sampling *s, uint64_t *id) {
    nl_sampling one;
    if (s)
        one = *s;
    else
        nl_sampling_default(&one);
    one.max_tokens = 1;
    one.n_stop = 0; /* stop strings are the decode side's: it sees the first token again */
    return submit(e, prompt, n, &one, 1, id);
}

/* Marks r finished (mutex held). Its blocks must already be free. */
static void finish_req(nl_engine *e, nl_req *r, nl_finish f) {
    r->state = REQ_FINISHED;
    r->finish = f;
    r->text_final = r->text_len;
    r->t_finish = nl_time_s();
    e->st.requests_finished++;
    e->touched[e->n_touched++] = r;
}

static void remove_ptr(nl_req **arr, int64_t *n, nl_req *r) {
    for (int64_t i = 0; i < *n; i++)
        if (arr[i] == r) {
            memmove(arr + i, arr + i + 1, (size_t)(*n - i - 1) * sizeof(nl_req *));
            (*n)--;
            return;
        }
}

static void free_blocks(nl_engine *e, nl_req *r);

static void drop_req(nl_engine *e, nl_req *r) {
    free_blocks(e, r); /* a finished prefill-only request still holds its KV */
    remove_ptr(e->all, &e->n_all, r);
    req_free(r);
}

nl_status nl_engine_cancel(nl_engine *e, uint64_t id) {
    pthread_mutex_lock(&e->mu);
    nl_req *r = find_req(e, id);
    if (!r) {
        pthread_mutex_unlock(&e->mu);
        return nl_fail(NL_ERR_INVALID, "engine: no request with id %llu", (unsigned long long)id);
    }
    /* finished by the driver at its next step (it frees the blocks of a running one) */
    if (r->state != REQ_FINISHED) r->cancel = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return NL_OK;
}

void nl_engine_release(nl_engine *e, uint64_t id) {
    pthread_mutex_lock(&e->mu);
    nl_req *r = find_req(e, id);
    if (r) {
        if (r->state == REQ_FINISHED)
            drop_req(e, r);
        else
            r->cancel = r->release = 1; /* the driver finishes and frees it at its next step */
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
}

/* ---- the batched forward ----------------------------------------------------------------------
 * rows: n tokens row_tok[i] at positions row_pos[i] of sequences row_req[i] (their blocks already
 * allocated); logits (n_out, V) for rows out_rows[0..n_out). Every row is computed alone. */

static nl_status forward_rows(nl_engine *e, int64_t n, int64_t n_out);

/* Below this many multiply-adds a step runs on one thread: waking a second one costs more than
 * it saves, and on a loaded machine a barrier waits for a descheduled thread (measured: the
 * 260K-parameter stories model decodes ~70x slower with 2 threads than with 1 under load). */
#define SERIAL_STEP_MACS 2000000.0

static nl_status forward(nl_engine *e, int64_t n, int64_t n_out) {
    double macs = (double)n * (double)e->weight_macs;
    /* the norm, RoPE and SwiGLU kernels open regions of the default size: make it the engine's
     * thread count (with --threads 1 they started 2-thread teams; on a loaded machine a 1-thread
     * batch-32 step of a dim-256 model then spent ~85% of its CPU time waiting at their barriers) */
    int saved_nt = omp_get_max_threads();
    if (e->o.threads > 0) omp_set_num_threads(e->o.threads);
    nl_status rc;
    if (macs >= SERIAL_STEP_MACS) {
        rc = forward_rows(e, n, n_out);
    } else {
        int saved = omp_get_max_active_levels();
        omp_set_max_active_levels(0); /* every parallel region of this thread runs on one thread */
        rc = forward_rows(e, n, n_out);
        omp_set_max_active_levels(saved);
    }
    omp_set_num_threads(saved_nt);
    return rc;
}

/* Phases of the forward that NANOLM_STEP_PROFILE times. */
enum {
    PH_EMBED,
    PH_NORM,
    PH_QKV,
    PH_ROPE_KV,
    PH_ATTN,
    PH_O,
    PH_RESID,
    PH_GATE_UP,
    PH_SWIGLU,
    PH_DOWN,
    PH_CLS,
    PH_SAMPLE,
    PH_COUNT
};
static const char *const prof_phase[PH_COUNT] = {"embed",     "rmsnorm", "qkv",        "rope+kv store",
                                                 "attention", "o",       "residual",   "gate_up",
                                                 "swiglu",    "down",    "classifier", "sampling"};

static double prof_now(const nl_engine *e) {
    if (e->prof != 2) return nl_time_s();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Adds the time since *t to phase ph and restarts the clock (only when profiling). */
static inline void prof_mark(nl_engine *e, double *t, int ph) {
    if (!e->prof) return;
    double now = prof_now(e);
    e->prof_s[ph] += now - *t;
    *t = now;
}

static void prof_print(const nl_engine *e) {
    double total = 0;
    for (int i = 0; i < PH_COUNT; i++) total += e->prof_s[i];
    fprintf(stderr, "engine step profile (%s): %lld steps, %lld rows, %.3f s in the forward and sampling\n",
            e->prof == 2 ? "thread CPU time" : "wall time", (long long)e->prof_steps, (long long)e->prof_rows, total);
    for (int i = 0; i < PH_COUNT; i++)
        fprintf(stderr, "  %-14s %9.3f ms/step %6.1f%%\n", prof_phase[i],
                e->prof_steps ? 1e3 * e->prof_s[i] / (double)e->prof_steps : 0.0,
                total > 0 ? 100.0 * e->prof_s[i] / total : 0.0);
}

/* Splits the step's n rows into attention tiles: runs of rows of one sequence at consecutive
 * positions (a prompt chunk), at most NL_KV_QTILE each. Tile u is rows tile_row[u] ..
 * tile_row[u + 1] - 1. Returns the number of tiles. */
static int64_t attention_tiles(nl_engine *e, int64_t n) {
    int64_t u = 0;
    for (int64_t i = 0; i < n; i++)
        if (i == 0 || e->row_req[i] != e->row_req[i - 1] || e->row_pos[i] != e->row_pos[i - 1] + 1 ||
            i - e->tile_row[u - 1] == NL_KV_QTILE)
            e->tile_row[u++] = i;
    e->tile_row[u] = n;
    return u;
}

static nl_status forward_rows(nl_engine *e, int64_t n, int64_t n_out) {
    const nl_model *m = e->m;
    const int64_t C = m->C, NH = m->NH, KVH = m->KVH, hd = m->hd, H = m->H, QKV = m->QKV, half = hd / 2;
    const float eps = (float)m->arch.norm_eps;
    const int nt = e->o.threads;
    double t = e->prof ? prof_now(e) : 0;
    if (e->prof) {
        e->prof_steps++;
        e->prof_rows += n;
    }
    for (int64_t i = 0; i < n; i++)
        memcpy(e->x + i * C, m->w.embed + (int64_t)e->row_tok[i] * C, (size_t)C * sizeof(float));
    prof_mark(e, &t, PH_EMBED);
    /* attention tiles, the same in every layer: the rows of a prompt chunk in tiles of up to
     * NL_KV_QTILE, each decode row alone. The leading one-row tiles (the decodes: the schedule
     * puts them first) run tile by tile with the heads innermost: a block stores its kv heads'
     * runs one after another (kvcache.h), so a thread's next unit reads on where the last one
     * stopped, and the query heads of a group share each run. The tiles after them (prompt
     * chunks) run kv head by kv head, and within one, tile by tile with the query heads that
     * share it innermost: a chunk's next tile reads the same prefix again, from cache. */
    const int64_t n_tiles = attention_tiles(e, n), G = NH / KVH, work = n_tiles * NH;
    int64_t n_single = 0;
    while (n_single < n_tiles && e->tile_row[n_single + 1] - e->tile_row[n_single] == 1) n_single++;
    for (int64_t l = 0; l < m->L; l++) {
        const nl_layer_weights *lw = &m->w.layers[l];
        nl_rmsnorm_forward(e->xb, e->rstd, e->x, lw->rms_att, n, C, eps);
        prof_mark(e, &t, PH_NORM);
        NL_TRY(nl_mv_forward_act(&e->w[4 * l + 0], &e->act, e->xb, n, e->qkv, nt));
        if (lw->bqkv) nl_add_bias(e->qkv, lw->bqkv, n, QKV); /* Qwen2's q/k/v biases */
        prof_mark(e, &t, PH_QKV);
        /* RoPE on the rotated heads and the KV store of each row: a few hundred ns per row, so
         * a step of a few rows runs it on this thread rather than waking the team */
#pragma omp parallel for schedule(static)                                                                              \
    num_threads(nt > 0 ? nt : omp_get_max_threads()) if (n >= NL_ENGINE_ROPE_PARALLEL_ROWS)
        for (int64_t i = 0; i < n; i++) {
            float *q = e->qkv + i * QKV;
            nl_rope_row(q, m->rope_cos + e->row_pos[i] * half, m->rope_sin + e->row_pos[i] * half, NH + KVH, hd, 0);
            nl_kvcache_store(&e->kv, e->row_req[i]->table, l, e->row_pos[i], q + NH * hd, q + (NH + KVH) * hd);
        }
        prof_mark(e, &t, PH_ROPE_KV);
        /* attention: one unit of work per tile (below) and head */
#pragma omp parallel num_threads(nt > 0 ? nt : omp_get_max_threads())
        {
            float *scratch = e->scratch + (int64_t)omp_get_thread_num() * e->scratch_floats;
#pragma omp for schedule(dynamic, 1)
            for (int64_t p = 0; p < work; p++) {
                int64_t u, h;
                if (p < n_single * NH) {
                    u = p / NH, h = p % NH;
                } else {
                    const int64_t q = p - n_single * NH, nc = n_tiles - n_single;
                    const int64_t kvh = q / (nc * G), rem = q % (nc * G);
                    u = n_single + rem / G, h = kvh * G + rem % G;
                }
                const int64_t i = e->tile_row[u], nq = e->tile_row[u + 1] - i;
                nl_kvcache_attend_rows(&e->kv, e->row_req[i]->table, l, e->row_pos[i], nq, e->qkv + i * QKV, QKV, NH, h,
                                       e->atty + i * NH * hd + h * hd, NH * hd, scratch);
            }
        }
        prof_mark(e, &t, PH_ATTN);
        NL_TRY(nl_mv_forward_act(&e->w[4 * l + 1], &e->act, e->atty, n, e->xb, nt));
        prof_mark(e, &t, PH_O);
        for (int64_t i = 0; i < n * C; i++) e->x[i] += e->xb[i];
        prof_mark(e, &t, PH_RESID);
        nl_rmsnorm_forward(e->xb, e->rstd, e->x, lw->rms_ffn, n, C, eps);
        prof_mark(e, &t, PH_NORM);
        NL_TRY(nl_mv_forward_act(&e->w[4 * l + 2], &e->act, e->xb, n, e->h13, nt));
        prof_mark(e, &t, PH_GATE_UP);
        nl_swiglu_forward(e->hact, e->h13, n, H);
        prof_mark(e, &t, PH_SWIGLU);
        NL_TRY(nl_mv_forward_act(&e->w[4 * l + 3], &e->act, e->hact, n, e->xb, nt));
        prof_mark(e, &t, PH_DOWN);
        for (int64_t i = 0; i < n * C; i++) e->x[i] += e->xb[i];
        prof_mark(e, &t, PH_RESID);
    }
    /* final norm of the rows that sample, gathered, then the classifier */
    for (int64_t j = 0; j < n_out; j++)
        nl_rmsnorm_forward(e->xb + j * C, e->rstd + j, e->x + e->out_rows[j] * C, m->w.rms_final, 1, C, eps);
    prof_mark(e, &t, PH_NORM);
    if (n_out) NL_TRY(nl_mv_forward_act(&e->w[4 * m->L], &e->act, e->xb, n_out, e->logits, nt));
    prof_mark(e, &t, PH_CLS);
    return NL_OK;
}

/* ---- scheduling ------------------------------------------------------------------------------ */

static void free_blocks(nl_engine *e, nl_req *r) {
    for (int64_t i = 0; i < r->n_table; i++) nl_kvcache_release(&e->kv, r->table[i]);
    r->n_table = 0;
    r->n_cached = 0;
}

/* Preempts the youngest running request other than `keep` (mutex held): its blocks go back to
 * the pool and it goes to the front of the queue, to be recomputed. Returns 0 if there is none. */
static int preempt_youngest(nl_engine *e, const nl_req *keep) {
    nl_req *y = NULL; /* the running set is in admission order: the youngest is last */
    for (int64_t i = 0; i < e->n_running; i++)
        if (e->running[i] != keep) y = e->running[i];
    if (!y) return 0;
    free_blocks(e, y);
    remove_ptr(e->running, &e->n_running, y);
    memmove(e->waiting + 1, e->waiting, (size_t)e->n_waiting * sizeof(nl_req *));
    e->waiting[0] = y;
    e->n_waiting++;
    y->state = REQ_WAITING;
    y->preemptions++;
    e->st.preemptions++;
    return 1;
}

/* Blocks so that r holds positions [0, upto). Returns 0 when the pool ran out (r keeps what it got). */
static int reserve(nl_engine *e, nl_req *r, int64_t upto) {
    int64_t need = (upto + e->kv.block_size - 1) / e->kv.block_size;
    if (grow((void **)&r->table, &r->table_cap, need, sizeof(int32_t), "block table")) return 0;
    while (r->n_table < need) {
        int32_t b = nl_kvcache_alloc(&e->kv);
        if (b < 0) return 0;
        r->table[r->n_table++] = b;
    }
    return 1;
}

/* Picks this step's rows (mutex held). Decodes first (oldest first), preempting the youngest
 * when a decode needs a block the pool does not have; then prompt chunks within the budget. */
static int64_t schedule(nl_engine *e, int64_t *n_out) {
    const int64_t bs = e->kv.block_size;
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
        while (!reserve(e, r, r->n_cached + 1) && e->n_running > 1) {
            nl_req *y = e->running[e->n_running - 1];
            if (y == r) {
                preempt_youngest(e, NULL);
                self = 1;
                break;
            }
            preempt_youngest(e, r);
        }
        if (self) break; /* r was the last of the running set */
        if (r->n_table * bs < r->n_cached + 1) {
            /* alone and still no room: the pool is smaller than its context */
            free_blocks(e, r);
            remove_ptr(e->running, &e->n_running, r);
            finish_req(e, r, NL_FINISH_LENGTH);
            i--;
            continue;
        }
        e->row_tok[n] = r->toks[r->n_cached];
        e->row_pos[n] = r->n_cached;
        e->row_req[n] = r;
        e->out_rows[no] = n;
        e->out_req[no++] = r;
        n++;
        budget--;
        e->n_decode_rows++;
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
        int64_t c = left;
        if (e->o.chunk > 0 && c > e->o.chunk) c = e->o.chunk;
        if (c > budget) {
            /* unchunked: a prompt waits for a step with room for all of it, unless it can never fit */
            if (e->o.chunk == 0 && left <= e->o.max_step_tokens && n > 0) continue;
            c = budget;
        }
        if (!reserve(e, r, r->n_cached + c)) {
            c = r->n_table * bs - r->n_cached; /* what the blocks it got hold */
            if (c <= 0) continue;
        }
        for (int64_t j = 0; j < c; j++) {
            e->row_tok[n] = r->toks[r->n_cached + j];
            e->row_pos[n] = r->n_cached + j;
            e->row_req[n] = r;
            n++;
        }
        budget -= c;
        if (r->n_cached + c == r->n_toks) {
            e->out_rows[no] = n - 1;
            e->out_req[no++] = r;
        }
    }
    if (n == 0 && e->n_running > 1) {
        /* every prompt is stuck on blocks: free the youngest for the others */
        preempt_youngest(e, e->running[0]);
        return schedule(e, n_out);
    }
    if (n == 0 && e->n_running == 1) {
        nl_req *r = e->running[0];
        free_blocks(e, r);
        remove_ptr(e->running, &e->n_running, r);
        snprintf(r->error, sizeof r->error, "the KV cache (%lld blocks of %lld) cannot hold this request",
                 (long long)e->kv.n_blocks, (long long)bs);
        finish_req(e, r, NL_FINISH_ERROR);
    }
    *n_out = no;
    return n;
}

/* Appends one completion token to r and its text, and decides whether r is done (mutex held). */
static nl_finish append_token(nl_engine *e, nl_req *r, int32_t tok) {
    const nl_tokenizer *t = e->tok;
    int64_t prev = r->toks[r->n_toks - 1];
    r->toks[r->n_toks++] = tok;
    if (!r->t_first) r->t_first = nl_time_s();
    e->st.tokens_generated++;
    if (t && t->bos_id >= 0 && tok == t->bos_id && !r->s.ignore_eos) return NL_FINISH_STOP; /* llama2.c's end */
    if (t && t->eos_id >= 0 && tok == t->eos_id && !r->s.ignore_eos) return NL_FINISH_STOP;
    if (t) {
        size_t len = 0;
        const char *piece = nl_tokenizer_piece(t, (int)prev, tok, &len);
        if (piece && nl_tokenizer_piece_printable(piece, len)) {
            if (grow((void **)&r->text, &r->text_cap, (int64_t)(r->text_len + len + 1), 1, "request text") == 0) {
                memcpy(r->text + r->text_len, piece, len);
                r->text_len += len;
                r->text[r->text_len] = 0;
            }
        }
        size_t hold = 0;
        int64_t at = nl_sampler_find_stop(&r->s, r->text ? r->text : "", r->text_len, r->stop_checked, &hold);
        r->stop_checked = r->text_len;
        if (at >= 0) {
            r->text_len = (size_t)at;
            if (r->text) r->text[at] = 0;
            return NL_FINISH_STOP;
        }
        if (r->text_len - hold > r->text_final) r->text_final = r->text_len - hold;
    }
    int64_t done = r->n_toks - r->n_prompt;
    if (r->s.max_tokens > 0 && done >= r->s.max_tokens) return NL_FINISH_LENGTH;
    if (r->n_toks >= e->m->arch.seq_len + 1) return NL_FINISH_LENGTH;
    return NL_FINISH_NONE;
}

typedef struct ev_item {
    uint64_t id;
    int32_t *toks;
    int64_t n;
    char *text;
    size_t len;
    nl_finish finish;
} ev_item;

nl_status nl_engine_step(nl_engine *e, int64_t *n_tokens) {
    if (n_tokens) *n_tokens = 0;
    pthread_mutex_lock(&e->mu);
    e->n_touched = 0;
    /* cancelled (and released) requests leave first; a waiting one holds no blocks */
    for (int64_t i = 0; i < e->n_running; i++) {
        nl_req *r = e->running[i];
        if (!r->cancel) continue;
        free_blocks(e, r);
        remove_ptr(e->running, &e->n_running, r);
        finish_req(e, r, NL_FINISH_CANCELLED);
        i--;
    }
    for (int64_t i = 0; i < e->n_waiting; i++) {
        nl_req *r = e->waiting[i];
        if (!r->cancel) continue;
        free_blocks(e, r); /* an imported request waits holding its prompt's blocks */
        remove_ptr(e->waiting, &e->n_waiting, r);
        finish_req(e, r, NL_FINISH_CANCELLED);
        i--;
    }
    /* admission (FCFS): a request joins when the free blocks hold all its tokens, so that a
     * recomputed or long prompt does not push out the decodes (vLLM's admission rule) */
    int64_t free_blocks_left = e->kv.n_free;
    while (e->n_running < e->o.max_batch && e->n_waiting > 0) {
        nl_req *r = e->waiting[0];
        int64_t need = (r->n_toks + e->kv.block_size) / e->kv.block_size - r->n_table;
        if (need > free_blocks_left && e->n_running > 0) break;
        free_blocks_left -= need;
        memmove(e->waiting, e->waiting + 1, (size_t)(e->n_waiting - 1) * sizeof(nl_req *));
        e->n_waiting--;
        r->state = REQ_RUNNING;
        r->admit_seq = ++e->admit_counter;
        e->running[e->n_running++] = r;
    }
    int64_t n_out = 0, n = schedule(e, &n_out);
    pthread_mutex_unlock(&e->mu);
    nl_status rc = n ? forward(e, n, n_out) : NL_OK;
    if (rc) n = n_out = 0; /* the rows run again next step (their blocks stay reserved) */
    for (int64_t i = 0; i < n; i++) {
        nl_req *r = e->row_req[i];
        if (e->row_pos[i] + 1 > r->n_cached) r->n_cached = e->row_pos[i] + 1;
    }
    /* sampling outside the mutex: only this thread touches the generators */
    double t_sample = e->prof ? prof_now(e) : 0;
    for (int64_t j = 0; j < n_out; j++) {
        nl_req *r = e->out_req[j];
        e->sample_rc[j] = nl_sampler_next(&r->s, &r->rng, e->logits + j * e->m->V, e->m->V, NULL, &e->sample_tok[j]);
        if (e->sample_rc[j]) snprintf(e->sample_err[j], 256, "%s", nl_last_error());
    }
    prof_mark(e, &t_sample, PH_SAMPLE);
    ev_item *ev = NULL;
    int64_t n_ev = 0;
    pthread_mutex_lock(&e->mu);
    e->st.steps++;
    e->st.prompt_tokens_computed += n - e->n_decode_rows;
    for (int64_t j = 0; j < n_out; j++) {
        nl_req *r = e->out_req[j];
        e->touched[e->n_touched++] = r;
        nl_finish f;
        if (e->sample_rc[j]) {
            snprintf(r->error, sizeof r->error, "position %lld: %s", (long long)r->n_toks, e->sample_err[j]);
            f = NL_FINISH_ERROR;
        } else {
            f = append_token(e, r, e->sample_tok[j]);
        }
        if (f != NL_FINISH_NONE) {
            if (!r->keep_kv || f == NL_FINISH_ERROR) free_blocks(e, r);
            remove_ptr(e->running, &e->n_running, r);
            finish_req(e, r, f);
        }
    }
    if (e->o.on_event) {
        ev = nl_calloc((size_t)e->n_touched + 1, sizeof(ev_item), "engine events");
        for (int64_t j = 0; ev && j < e->n_touched; j++) {
            nl_req *r = e->touched[j];
            if (r->state == REQ_FINISHED && r->ev_tokens < 0) continue; /* its final event went out */
            ev_item *it = &ev[n_ev];
            it->id = r->id;
            it->finish = r->finish;
            int64_t done = r->n_toks - r->n_prompt;
            it->n = done - r->ev_tokens;
            it->len = r->text_final > r->ev_text ? r->text_final - r->ev_text : 0;
            it->toks = it->n > 0 ? nl_malloc((size_t)it->n * sizeof(int32_t), "event tokens") : NULL;
            it->text = it->len > 0 ? nl_malloc(it->len, "event text") : NULL;
            if ((it->n > 0 && !it->toks) || (it->len > 0 && !it->text)) {
                nl_free(it->toks);
                nl_free(it->text);
                continue;
            }
            if (it->n > 0) memcpy(it->toks, r->toks + r->n_prompt + r->ev_tokens, (size_t)it->n * sizeof(int32_t));
            if (it->len > 0) memcpy(it->text, r->text + r->ev_text, it->len);
            r->ev_tokens = r->state == REQ_FINISHED ? -1 : done;
            r->ev_text += it->len;
            n_ev++;
        }
    }
    /* released requests that finished are forgotten now */
    for (int64_t j = 0; j < e->n_touched; j++) {
        nl_req *r = e->touched[j];
        int live = 0; /* a request may be listed twice: compare pointers before looking inside */
        for (int64_t k = 0; k < e->n_all && !live; k++) live = e->all[k] == r;
        if (live && r->release && r->state == REQ_FINISHED) drop_req(e, r);
    }
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    for (int64_t k = 0; k < n_ev; k++) {
        e->o.on_event(e->o.event_user, ev[k].id, ev[k].toks, ev[k].n, ev[k].text, ev[k].len, ev[k].finish);
        nl_free(ev[k].toks);
        nl_free(ev[k].text);
    }
    nl_free(ev);
    if (n_tokens) *n_tokens = n;
    return rc;
}

int nl_engine_busy(nl_engine *e) {
    pthread_mutex_lock(&e->mu);
    int b = e->n_running > 0 || e->n_waiting > 0;
    pthread_mutex_unlock(&e->mu);
    return b;
}

static void deadline_in(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

int nl_engine_wait_work(nl_engine *e, int timeout_ms) {
    pthread_mutex_lock(&e->mu);
    if (timeout_ms > 0 && e->n_running == 0 && e->n_waiting == 0) {
        struct timespec ts;
        deadline_in(&ts, timeout_ms);
        while (e->n_running == 0 && e->n_waiting == 0)
            if (pthread_cond_timedwait(&e->cv, &e->mu, &ts)) break;
    }
    int b = e->n_running > 0 || e->n_waiting > 0;
    pthread_mutex_unlock(&e->mu);
    return b;
}

/* ---- reading --------------------------------------------------------------------------------- */

static int has_unread(const nl_req *r) {
    return r->state == REQ_FINISHED || r->n_toks - r->n_prompt > r->read_tokens || r->text_final > r->read_text;
}

int nl_engine_wait(nl_engine *e, uint64_t id, int timeout_ms) {
    pthread_mutex_lock(&e->mu);
    nl_req *r = find_req(e, id);
    if (!r) {
        pthread_mutex_unlock(&e->mu);
        return -1;
    }
    if (timeout_ms > 0 && !has_unread(r)) {
        struct timespec ts;
        deadline_in(&ts, timeout_ms);
        while ((r = find_req(e, id)) && !has_unread(r))
            if (pthread_cond_timedwait(&e->cv, &e->mu, &ts)) break;
    }
    r = find_req(e, id);
    int res = !r ? -1 : has_unread(r);
    pthread_mutex_unlock(&e->mu);
    return res;
}

nl_status nl_engine_read(nl_engine *e, uint64_t id, int from_start, nl_engine_output *out) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&e->mu);
    nl_req *r = find_req(e, id);
    if (!r) {
        pthread_mutex_unlock(&e->mu);
        return nl_fail(NL_ERR_INVALID, "engine: no request with id %llu", (unsigned long long)id);
    }
    int64_t done = r->n_toks - r->n_prompt;
    int64_t t0 = from_start ? 0 : r->read_tokens;
    size_t x0 = from_start ? 0 : r->read_text;
    if (x0 > r->text_final) x0 = r->text_final;
    out->n_tokens = done - t0;
    out->text_len = r->text_final - x0;
    out->tokens = nl_malloc((size_t)(out->n_tokens + 1) * sizeof(int32_t), "output tokens");
    out->text = nl_malloc(out->text_len + 1, "output text");
    if (!out->tokens || !out->text) {
        pthread_mutex_unlock(&e->mu);
        nl_engine_output_free(out);
        return NL_ERR_NOMEM;
    }
    if (out->n_tokens > 0) memcpy(out->tokens, r->toks + r->n_prompt + t0, (size_t)out->n_tokens * sizeof(int32_t));
    if (out->text_len > 0) memcpy(out->text, r->text + x0, out->text_len);
    out->text[out->text_len] = 0;
    out->finish = r->state == REQ_FINISHED ? r->finish : NL_FINISH_NONE;
    out->prompt_tokens = r->n_prompt;
    out->completion_tokens = done;
    out->preemptions = r->preemptions;
    out->t_submit_s = r->t_submit;
    out->t_first_token_s = r->t_first;
    out->t_finish_s = r->t_finish;
    snprintf(out->error, sizeof out->error, "%s", r->error);
    if (!from_start) {
        r->read_tokens = done;
        r->read_text = r->text_final;
    }
    pthread_mutex_unlock(&e->mu);
    return NL_OK;
}

void nl_engine_output_free(nl_engine_output *out) {
    if (!out) return;
    nl_free(out->tokens);
    nl_free(out->text);
    out->tokens = NULL;
    out->text = NULL;
}

void nl_engine_stats_get(nl_engine *e, nl_engine_stats *st) {
    pthread_mutex_lock(&e->mu);
    *st = e->st;
    st->running = e->n_running;
    st->waiting = e->n_waiting;
    st->kv_blocks_total = e->kv.n_blocks;
    st->kv_blocks_free = e->kv.n_free;
    st->kv_blocks_used = nl_kvcache_used(&e->kv);
    st->block_size = e->kv.block_size;
    st->kv_block_bytes = e->kv.block_bytes;
    st->weight_bytes = e->weight_bytes;
    pthread_mutex_unlock(&e->mu);
}

/* ---- prefill/decode disaggregation: KV export and import --------------------------------------- */

nl_kv_dtype nl_engine_kv_dtype(const nl_engine *e) { return e->kv.dtype; }

void nl_engine_kv_free(nl_engine_kv *kv) {
    if (!kv) return;
    nl_free(kv->tokens);
    nl_free(kv->data);
    kv->tokens = NULL;
    kv->data = NULL;
}

nl_status nl_engine_export_kv(nl_engine *e, uint64_t id, nl_engine_kv *out) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&e->mu);
    nl_req *r = find_req(e, id);
    nl_status rc = NL_OK;
    if (!r)
        rc = nl_fail(NL_ERR_INVALID, "engine: no request with id %llu", (unsigned long long)id);
    else if (!r->keep_kv)
        rc = nl_fail(NL_ERR_INVALID, "engine: request %llu is not a prefill-only request", (unsigned long long)id);
    else if (r->state != REQ_FINISHED)
        rc = nl_fail(NL_ERR_INVALID, "engine: request %llu has not finished its prefill", (unsigned long long)id);
    else if (r->n_cached < r->n_prompt || r->n_toks != r->n_prompt + 1)
        rc = nl_fail(NL_ERR_INVALID, "engine: request %llu ended %s without its prompt's KV%s%s",
                     (unsigned long long)id, nl_finish_name(r->finish), r->error[0] ? ": " : "", r->error);
    if (!rc) {
        out->n_layers = e->kv.L;
        out->kv_heads = e->kv.KVH;
        out->head_dim = e->kv.hd;
        out->dtype = e->kv.dtype;
        out->n_tokens = r->n_prompt;
        out->first_token = r->toks[r->n_prompt];
        out->rng = r->rng;
        out->data_bytes = nl_kvcache_seq_bytes(e->kv.L, e->kv.KVH, e->kv.hd, e->kv.dtype, r->n_prompt);
        out->tokens = nl_malloc((size_t)r->n_prompt * sizeof(int32_t), "exported prompt tokens");
        out->data = nl_malloc(out->data_bytes, "exported KV");
        if (!out->tokens || !out->data) rc = NL_ERR_NOMEM;
    }
    if (!rc) {
        memcpy(out->tokens, r->toks, (size_t)r->n_prompt * sizeof(int32_t));
        nl_kvcache_gather(&e->kv, r->table, r->n_prompt, out->data);
    }
    pthread_mutex_unlock(&e->mu);
    if (rc) nl_engine_kv_free(out);
    return rc;
}

/* Checks an imported kv against the engine's model and pool. */
static nl_status check_import(const nl_engine *e, const nl_engine_kv *kv) {
    const nl_model *m = e->m;
    if (kv->n_layers != e->kv.L || kv->kv_heads != e->kv.KVH || kv->head_dim != e->kv.hd)
        return nl_fail(NL_ERR_INVALID,
                       "KV import: shape %lld layers x %lld kv heads x %lld head dim, the engine's model has "
                       "%lld x %lld x %lld",
                       (long long)kv->n_layers, (long long)kv->kv_heads, (long long)kv->head_dim, (long long)e->kv.L,
                       (long long)e->kv.KVH, (long long)e->kv.hd);
    if (kv->dtype != e->kv.dtype)
        return nl_fail(NL_ERR_INVALID, "KV import: the KV is %s, the engine's cache is %s",
                       kv->dtype == NL_KV_INT8 ? "int8" : "fp32", e->kv.dtype == NL_KV_INT8 ? "int8" : "fp32");
    if (kv->n_tokens < 1 || kv->n_tokens >= m->arch.seq_len)
        return nl_fail(NL_ERR_RANGE, "KV import: %lld prompt tokens, outside [1, context %lld)",
                       (long long)kv->n_tokens, (long long)m->arch.seq_len);
    if (kv->data_bytes != nl_kvcache_seq_bytes(kv->n_layers, kv->kv_heads, kv->head_dim, kv->dtype, kv->n_tokens) ||
        !kv->data)
        return nl_fail(NL_ERR_INVALID, "KV import: %zu bytes of KV for %lld tokens, expected %zu", kv->data_bytes,
                       (long long)kv->n_tokens,
                       nl_kvcache_seq_bytes(kv->n_layers, kv->kv_heads, kv->head_dim, kv->dtype, kv->n_tokens));
    for (int64_t i = 0; i <= kv->n_tokens; i++) {
        int32_t t = i < kv->n_tokens ? kv->tokens[i] : kv->first_token;
        if (t < 0 || t >= m->V)
            return nl_fail(NL_ERR_INVALID, "KV import: token %d at index %lld is outside the vocabulary [0, %lld)", t,
                           (long long)i, (long long)m->V);
    }
    return NL_OK;
}

nl_status nl_engine_import_kv(nl_engine *e, const nl_engine_kv *kv, const nl_sampling *s, uint64_t *id) {
    *id = 0;
    NL_TRY(check_import(e, kv));
    nl_sampling sd;
    if (!s) {
        nl_sampling_default(&sd);
        s = &sd;
    }
    NL_TRY(nl_sampling_check(s));
    const int64_t n = kv->n_tokens, S = e->m->arch.seq_len;
    nl_req *r = nl_calloc(1, sizeof *r, "request");
    if (!r) return NL_ERR_NOMEM;
    r->s = *s;
    int64_t want = n + (s->max_tokens > 0 ? s->max_tokens : S) + 1;
    if (want > S + 1) want = S + 1;
    if (grow((void **)&r->toks, &r->cap, want, sizeof(int32_t), "request tokens")) {
        req_free(r);
        return NL_ERR_NOMEM;
    }
    memcpy(r->toks, kv->tokens, (size_t)n * sizeof(int32_t));
    r->n_toks = r->n_prompt = n;
    r->rng = kv->rng;
    r->t_submit = nl_time_s();
    pthread_mutex_lock(&e->mu);
    nl_status rc = admit_locked(e);
    if (!rc && !reserve(e, r, n)) {
        free_blocks(e, r);
        rc = nl_fail(NL_ERR_BUSY, "KV import: the pool has %lld free blocks, %lld tokens need %lld",
                     (long long)e->kv.n_free, (long long)n, (long long)((n + e->kv.block_size - 1) / e->kv.block_size));
    }
    if (rc) {
        pthread_mutex_unlock(&e->mu);
        req_free(r);
        return rc;
    }
    nl_kvcache_scatter(&e->kv, r->table, n, kv->data);
    r->n_cached = n;
    r->id = e->next_id++;
    e->all[e->n_all++] = r;
    e->st.requests_submitted++;
    nl_finish f = append_token(e, r, kv->first_token);
    if (f != NL_FINISH_NONE) { /* done with its first token: finished here (no event: read it) */
        free_blocks(e, r);
        r->state = REQ_FINISHED;
        r->finish = f;
        r->text_final = r->text_len;
        r->t_finish = nl_time_s();
        e->st.requests_finished++;
    } else {
        r->state = REQ_WAITING; /* holding its prompt's blocks; admission counts only what it lacks */
        e->waiting[e->n_waiting++] = r;
    }
    *id = r->id;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return NL_OK;
}
