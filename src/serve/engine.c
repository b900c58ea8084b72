/* The serving engine's requests and driver: submit / cancel / read / release, the step that
 * admits and schedules (sched.c), runs the forward (runner.c), samples and publishes, and the KV
 * export and import of disaggregated serving (engine.h). The KV bookkeeping is block_pool.c's. */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nanolm/engine.h"
#include "nanolm/gguf_model.h"
#include "nanolm/hf.h"
#include "nanolm/model_load.h"
#include "nanolm/quantize_model.h"
#include "serve/engine_impl.h"

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
    o->prefix_cache = 1;
    o->spec_ngram = 3;
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
    if (o->spec_k < 0 || o->spec_k > NL_KV_QTILE - 1)
        return nl_fail(NL_ERR_INVALID, "engine: speculative tokens per step must be in [0, %d], got %d",
                       NL_KV_QTILE - 1, o->spec_k);
    if (o->spec_k > 0 && (o->spec_ngram < 1 || o->spec_ngram > 64))
        return nl_fail(NL_ERR_INVALID, "engine: the prompt-lookup n-gram must be in [1, 64], got %d", o->spec_ngram);
    return NL_OK;
}

static nl_status alloc_buffers(nl_engine *e) {
    int64_t R = e->o.max_step_tokens;
    NL_TRY(nl_runner_init(&e->run, e->m, R, e->o.threads));
    e->sample_tok = nl_malloc((size_t)R * sizeof(int32_t), "engine sampled tokens");
    e->spec_n = nl_malloc((size_t)R * sizeof(int64_t), "engine verified tokens");
    e->spec_probs = nl_malloc((size_t)e->m->V * sizeof(float), "engine verification scratch");
    e->row_req = nl_malloc((size_t)R * 2 * sizeof(nl_req *), "engine row requests");
    e->sample_rc = nl_malloc((size_t)R * sizeof(nl_status), "engine sample status");
    e->sample_err = nl_malloc((size_t)R * 256, "engine sample errors");
    e->touched = nl_malloc((size_t)(R + 2 * (int64_t)e->o.max_waiting + 2 * e->o.max_batch + 1) * sizeof(nl_req *),
                           "engine touched list");
    if (!e->sample_tok || !e->spec_n || !e->spec_probs || !e->row_req || !e->sample_rc || !e->sample_err || !e->touched)
        return NL_ERR_NOMEM;
    e->out_req = e->row_req + R;
    return NL_OK;
}

/* Draft model mode: an engine of the draft model, never stepped, whose runner and pool run the
 * drafts (a pool for max_batch full contexts: drafting never preempts). */
static nl_status open_draft(nl_engine *e) {
    if (!e->o.spec_k || (!e->o.draft_model && !e->o.draft_ckpt)) return NL_OK;
    nl_engine_opts d;
    nl_engine_opts_default(&d);
    d.block_size = e->o.block_size;
    d.max_batch = e->o.max_batch;
    d.max_step_tokens = e->o.max_step_tokens;
    d.chunk = e->o.chunk;
    d.threads = e->o.threads;
    d.prefix_cache = 0;
    nl_status rc = e->o.draft_model ? nl_engine_open_model(&e->draft, e->o.draft_model, NULL, &d)
                                    : nl_engine_open(&e->draft, e->o.draft_ckpt, e->tok_path, &d);
    if (rc) return nl_fail(rc, "engine: draft model: %s", nl_last_error());
    if (e->draft->m->V != e->m->V)
        return nl_fail(NL_ERR_INVALID, "engine: the draft model's vocabulary has %lld tokens, the target's %lld",
                       (long long)e->draft->m->V, (long long)e->m->V);
    e->spec_q = nl_malloc((size_t)e->o.max_step_tokens * (size_t)e->m->V * sizeof(float), "engine draft distributions");
    e->draft_work = nl_malloc((size_t)e->o.max_step_tokens * 3 * sizeof(int64_t), "engine draft rounds");
    return e->spec_q && e->draft_work ? NL_OK : NL_ERR_NOMEM;
}

static nl_status engine_init(nl_engine *e) {
    const nl_model *m = e->m;
    if (m->moe)
        return nl_fail(NL_ERR_UNSUPPORTED, "engine: arch %s has mixture-of-experts layers (not served)", m->arch.name);
    if (!m->w.embed || !m->w.cls) return nl_fail(NL_ERR_INVALID, "engine: the model has no embedding or classifier");
    if (e->wfmt == NL_WFMT_AUTO) e->wfmt = NL_WFMT_FP32;
    NL_TRY(alloc_buffers(e));
    NL_TRY(nl_runner_build_weights(&e->run, e->wfmt));
    int64_t blocks = e->o.kv_blocks;
    size_t bb = nl_kvcache_block_bytes(m->L, m->KVH, m->hd, e->o.kv, e->o.block_size);
    if (!blocks && e->o.kv_mem_bytes) {
        blocks = (int64_t)((size_t)e->o.kv_mem_bytes / bb);
        if (blocks < 1)
            return nl_fail(NL_ERR_INVALID, "engine: --kv-mem %lld bytes holds no block (one block is %zu bytes)",
                           (long long)e->o.kv_mem_bytes, bb);
    }
    if (!blocks) blocks = (int64_t)e->o.max_batch * ((m->arch.seq_len + e->o.block_size - 1) / e->o.block_size);
    NL_TRY(nl_block_pool_init(&e->pool, m->L, m->KVH, m->hd, e->o.kv, e->o.block_size, blocks, e->o.prefix_cache));
    e->next_id = 1;
    return open_draft(e);
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

/* An engine that loaded its own model reads the linears only through its weights (e->run.w): where
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
        for (int j = 0; j < 4; j++) release_linear(&e->run.w[4 * l + j], src[j]);
        if (!lw->wq) lw->wk = lw->wv = NULL;
        if (!lw->w1) lw->w3 = NULL;
    }
    if (m->w.cls != m->w.embed) release_linear(&e->run.w[4 * m->L], &m->w.cls);
}

nl_status nl_engine_open(nl_engine **out, const char *ckpt, const char *tokenizer, const nl_engine_opts *opts) {
    *out = NULL;
    if (opts) NL_TRY(check_opts(opts));
    nl_engine *e = engine_new(opts);
    if (!e) return NL_ERR_NOMEM;
    e->wfmt = e->o.weights;
    e->tok_path = tokenizer;
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
        if (e->wfmt == NL_WFMT_AUTO && src.format == NL_CKPT_GGUF) /* the kernels of the file's type */
            e->wfmt = src.gguf_type == NL_GGML_Q4_0   ? NL_WFMT_INT4
                      : src.gguf_type == NL_GGML_Q8_0 ? NL_WFMT_INT8
                                                      : NL_WFMT_FP32;
    }
    if (!rc) rc = engine_init(e);
    /* int4 from a Q4_0 GGUF: the file's own blocks (the same layout), not a requantization */
    if (!rc && src.format == NL_CKPT_GGUF && e->wfmt == NL_WFMT_INT4)
        rc = nl_gguf_int4_weights(ckpt, e->m, e->run.w, NULL);
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
    nl_block_table_free(&r->bt);
    nl_block_table_free(&r->dbt);
    nl_free(r->text);
    nl_free(r);
}

void nl_engine_close(nl_engine *e) {
    if (!e) return;
    for (int64_t i = 0; i < e->n_all; i++) req_free(e->all[i]);
    nl_free(e->all);
    nl_free(e->waiting);
    nl_free(e->running);
    nl_runner_free(&e->run);
    nl_block_pool_free(&e->pool);
    nl_free(e->sample_tok);
    nl_free(e->spec_n);
    nl_free(e->spec_probs);
    nl_free(e->spec_q);
    nl_free(e->draft_work);
    nl_engine_close(e->draft);
    nl_free(e->row_req);
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
    if (n > e->pool.n_blocks * e->pool.block_size)
        return nl_fail(NL_ERR_RANGE, "the prompt is %lld tokens, more than the whole KV cache holds (%lld)",
                       (long long)n, (long long)(e->pool.n_blocks * e->pool.block_size));
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

void nl_engine_finish_req(nl_engine *e, nl_req *r, nl_finish f) {
    r->state = REQ_FINISHED;
    r->finish = f;
    r->text_final = r->text_len;
    r->t_finish = nl_time_s();
    e->st.requests_finished++;
    e->touched[e->n_touched++] = r;
}

void nl_engine_remove_req(nl_req **arr, int64_t *n, nl_req *r) {
    for (int64_t i = 0; i < *n; i++)
        if (arr[i] == r) {
            memmove(arr + i, arr + i + 1, (size_t)(*n - i - 1) * sizeof(nl_req *));
            (*n)--;
            return;
        }
}

static void drop_req(nl_engine *e, nl_req *r) {
    nl_engine_free_blocks(e, r); /* a finished prefill-only request still holds its KV */
    nl_engine_remove_req(e->all, &e->n_all, r);
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

void nl_engine_free_blocks(nl_engine *e, nl_req *r) {
    nl_block_table_clear(&e->pool, &r->bt);
    if (e->draft) nl_block_table_clear(&e->draft->pool, &r->dbt);
    r->d_cached = 0;
    r->n_cached = 0;
    r->n_hashed = 0;
    r->last_hash = 0;
}

/* Records the full blocks of r's computed positions in the prefix cache (mutex held). */
static void register_blocks(nl_engine *e, nl_req *r) {
    const int64_t bs = e->pool.block_size;
    if (!e->pool.caching) return;
    while ((r->n_hashed + 1) * bs <= r->n_cached && r->n_hashed < r->bt.n) {
        const int32_t *t = r->toks + r->n_hashed * bs;
        int32_t id = r->bt.ids[r->n_hashed];
        uint64_t h = nl_block_hash(r->last_hash, t, bs);
        if (!e->pool.hashed[id]) nl_block_pool_register(&e->pool, id, r->last_hash, t);
        r->last_hash = h;
        r->n_hashed++;
    }
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

/* Draft model mode (driver thread, outside the mutex): each request of the step that drafts
 * (n_draft > 0, its target rows and draft blocks reserved) gets its n_draft tokens from the draft
 * model, written at r->toks[n_toks..], their distributions at spec_q (rows of its logits group).
 * The draft model first catches up on the positions it has not seen (a prompt, or what the
 * target accepted), then runs one position per request and round, batched. */
static nl_status draft_tokens(nl_engine *e, int64_t n_out) {
    nl_runner *dr = &e->draft->run;
    nl_req **reqs = e->draft->row_req; /* the draft engine's own scratch (it never steps) */
    const int64_t R = e->o.max_step_tokens;
    int64_t *group = e->draft_work, *done = group + R, *take = done + R, n_r = 0;
    for (int64_t j = 0; j < n_out; j += 1 + e->out_req[j]->n_draft)
        if (e->out_req[j]->n_draft > 0) {
            reqs[n_r] = e->out_req[j];
            group[n_r] = j;
            done[n_r++] = 0;
        }
    const int64_t V = e->m->V, cap = dr->rows_cap;
    for (;;) {
        int64_t rows = 0, outs = 0;
        for (int64_t q = 0; q < n_r; q++) {
            nl_req *r = reqs[q];
            take[q] = 0;
            if (done[q] >= r->n_draft) continue;
            const int64_t end = r->n_toks + done[q]; /* positions [d_cached, end) to run */
            int64_t t = end - r->d_cached;
            if (t > cap - rows) t = cap - rows;
            if (t <= 0) continue;
            for (int64_t i = 0; i < t; i++) {
                dr->tok[rows] = r->toks[r->d_cached + i];
                dr->pos[rows] = r->d_cached + i;
                dr->table[rows] = r->dbt.ids;
                rows++;
            }
            take[q] = t;
            if (r->d_cached + t == end) dr->out_rows[outs++] = rows - 1;
        }
        if (!rows) return NL_OK;
        NL_TRY(nl_runner_forward(dr, &e->draft->pool.kv, rows, outs));
        int64_t o = 0; /* logits rows, in request order */
        for (int64_t q = 0; q < n_r; q++) {
            nl_req *r = reqs[q];
            if (!take[q]) continue;
            r->d_cached += take[q];
            if (r->d_cached != r->n_toks + done[q]) continue;
            float *qd = e->spec_q + (group[q] + done[q]) * V;
            NL_TRY(nl_sampler_probs(&r->s, dr->logits + o * V, V, qd));
            o++;
            int32_t d = 0; /* greedy: the argmax (q one-hot); sampled: a draw from q */
            double u = r->s.temperature > 0 ? nl_rng_double(&r->rng) : 0, acc = 0;
            for (int64_t v = 0; v < V; v++)
                if (qd[v] > 0) {
                    d = (int32_t)v;
                    if (u < (acc += qd[v])) break;
                }
            r->toks[r->n_toks + done[q]++] = d;
        }
    }
}

/* How much r drafts next, from how its k drafts fared (Hugging Face's assisted generation: two
 * more after all were accepted, one fewer otherwise), and after drafts that all missed, a wait of
 * 1, 3, 7, 15 decode steps without drafting before it tries again: a text that does not repeat
 * costs few wasted rows. Greedy tokens do not depend on it. */
static void adapt_drafts(nl_engine *e, nl_req *r, int64_t k, int64_t accepted) {
    if (!r->spec_len) r->spec_len = e->o.spec_k;
    if (accepted == k)
        r->spec_len = r->spec_len + 2 < e->o.spec_k ? r->spec_len + 2 : e->o.spec_k;
    else if (r->spec_len > 1)
        r->spec_len--;
    if (accepted == 0) {
        r->spec_backoff = r->spec_backoff < 15 ? 2 * r->spec_backoff + 1 : 15;
        r->spec_skip = r->spec_backoff;
    } else
        r->spec_backoff = 0;
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
        nl_engine_free_blocks(e, r);
        nl_engine_remove_req(e->running, &e->n_running, r);
        nl_engine_finish_req(e, r, NL_FINISH_CANCELLED);
        i--;
    }
    for (int64_t i = 0; i < e->n_waiting; i++) {
        nl_req *r = e->waiting[i];
        if (!r->cancel) continue;
        nl_engine_free_blocks(e, r); /* an imported request waits holding its prompt's blocks */
        nl_engine_remove_req(e->waiting, &e->n_waiting, r);
        nl_engine_finish_req(e, r, NL_FINISH_CANCELLED);
        i--;
    }
    nl_sched_admit(e);
    int64_t n_out = 0, n = nl_sched_schedule(e, &n_out);
    pthread_mutex_unlock(&e->mu);
    nl_status rc = NL_OK;
    if (n && e->draft) {
        rc = draft_tokens(e, n_out);
        for (int64_t i = 0; i < n; i++) e->run.tok[i] = e->row_req[i]->toks[e->run.pos[i]];
    }
    if (!rc && n) rc = nl_runner_forward(&e->run, &e->pool.kv, n, n_out);
    if (rc) n = n_out = 0; /* the rows run again next step (their blocks stay reserved) */
    for (int64_t i = 0; i < n; i++) {
        nl_req *r = e->row_req[i];
        if (e->run.pos[i] + 1 > r->n_cached) r->n_cached = e->run.pos[i] + 1;
    }
    /* sampling outside the mutex: only this thread touches the generators */
    double t_sample = e->run.prof ? nl_runner_clock(&e->run) : 0;
    for (int64_t j = 0; j < n_out;) {
        nl_req *r = e->out_req[j];
        float *logits = e->run.logits + j * e->m->V;
        e->spec_n[j] = 1;
        if (r->n_draft > 0) { /* the last token and its drafts (at r->toks[n_toks..]): verified */
            e->sample_rc[j] = nl_sampler_verify(&r->s, &r->rng, logits, e->m->V, r->toks + r->n_toks,
                                                e->draft ? e->spec_q + j * e->m->V : NULL, r->n_draft, e->spec_probs,
                                                &e->sample_tok[j], &e->spec_n[j]);
            /* the K/V of the last token and of the accepted drafts hold; the rest is written over */
            if (!e->sample_rc[j]) r->n_cached = r->n_toks - 1 + e->spec_n[j];
            if (r->d_cached > r->n_cached) r->d_cached = r->n_cached; /* the draft model's too */
        } else
            e->sample_rc[j] = nl_sampler_next(&r->s, &r->rng, logits, e->m->V, NULL, &e->sample_tok[j]);
        if (e->sample_rc[j]) snprintf(e->sample_err[j], 256, "%s", nl_last_error());
        j += 1 + r->n_draft;
    }
    if (e->run.prof) nl_runner_prof_sampling(&e->run, nl_runner_clock(&e->run) - t_sample);
    ev_item *ev = NULL;
    int64_t n_ev = 0;
    pthread_mutex_lock(&e->mu);
    e->st.steps++;
    e->st.prompt_tokens_computed += n - e->n_decode_rows;
    for (int64_t i = 0; i < n; i++) register_blocks(e, e->row_req[i]);
    for (int64_t j = 0; j < n_out;) {
        nl_req *r = e->out_req[j];
        const int64_t k = r->n_draft, jj = j;
        j += 1 + k;
        r->n_draft = 0;
        e->touched[e->n_touched++] = r;
        nl_finish f = NL_FINISH_NONE;
        if (e->sample_rc[jj]) {
            snprintf(r->error, sizeof r->error, "position %lld: %s", (long long)r->n_toks, e->sample_err[jj]);
            f = NL_FINISH_ERROR;
        } else {
            for (int64_t t = 0; t < e->spec_n[jj] && f == NL_FINISH_NONE; t++)
                f = append_token(e, r, e->sample_tok[jj + t]);
            e->st.spec_drafted += k;
            e->st.spec_accepted += e->spec_n[jj] - 1;
            if (k > 0) adapt_drafts(e, r, k, e->spec_n[jj] - 1);
        }
        if (f != NL_FINISH_NONE) {
            if (!r->keep_kv || f == NL_FINISH_ERROR) nl_engine_free_blocks(e, r);
            nl_engine_remove_req(e->running, &e->n_running, r);
            nl_engine_finish_req(e, r, f);
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
    st->kv_blocks_total = e->pool.n_blocks;
    st->kv_blocks_free = e->pool.n_free;
    st->kv_blocks_used = nl_block_pool_used(&e->pool);
    st->kv_blocks_cached = e->pool.n_cached;
    st->prefix_cache_evictions = e->pool.evictions;
    st->block_size = e->pool.block_size;
    st->kv_block_bytes = e->pool.kv.block_bytes;
    st->weight_bytes = e->run.weight_bytes;
    pthread_mutex_unlock(&e->mu);
}

/* ---- prefill/decode disaggregation: KV export and import --------------------------------------- */

nl_kv_dtype nl_engine_kv_dtype(const nl_engine *e) { return e->pool.kv.dtype; }

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
        out->n_layers = e->pool.kv.L;
        out->kv_heads = e->pool.kv.KVH;
        out->head_dim = e->pool.kv.hd;
        out->dtype = e->pool.kv.dtype;
        out->n_tokens = r->n_prompt;
        out->first_token = r->toks[r->n_prompt];
        out->rng = r->rng;
        out->data_bytes =
            nl_kvcache_seq_bytes(e->pool.kv.L, e->pool.kv.KVH, e->pool.kv.hd, e->pool.kv.dtype, r->n_prompt);
        out->tokens = nl_malloc((size_t)r->n_prompt * sizeof(int32_t), "exported prompt tokens");
        out->data = nl_malloc(out->data_bytes, "exported KV");
        if (!out->tokens || !out->data) rc = NL_ERR_NOMEM;
    }
    if (!rc) {
        memcpy(out->tokens, r->toks, (size_t)r->n_prompt * sizeof(int32_t));
        nl_kvcache_gather(&e->pool.kv, r->bt.ids, r->n_prompt, out->data);
    }
    pthread_mutex_unlock(&e->mu);
    if (rc) nl_engine_kv_free(out);
    return rc;
}

/* Checks an imported kv against the engine's model and pool. */
static nl_status check_import(const nl_engine *e, const nl_engine_kv *kv) {
    const nl_model *m = e->m;
    if (kv->n_layers != e->pool.kv.L || kv->kv_heads != e->pool.kv.KVH || kv->head_dim != e->pool.kv.hd)
        return nl_fail(NL_ERR_INVALID,
                       "KV import: shape %lld layers x %lld kv heads x %lld head dim, the engine's model has "
                       "%lld x %lld x %lld",
                       (long long)kv->n_layers, (long long)kv->kv_heads, (long long)kv->head_dim,
                       (long long)e->pool.kv.L, (long long)e->pool.kv.KVH, (long long)e->pool.kv.hd);
    if ((int)kv->dtype != e->pool.kv.dtype)
        return nl_fail(NL_ERR_INVALID, "KV import: the KV is %s, the engine's cache is %s",
                       kv->dtype == NL_KV_INT8 ? "int8" : "fp32", e->pool.kv.dtype == NL_KV_INT8 ? "int8" : "fp32");
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
    if (!rc && !nl_sched_reserve(e, r, n)) {
        nl_engine_free_blocks(e, r);
        rc = nl_fail(NL_ERR_BUSY, "KV import: the pool has %lld free blocks, %lld tokens need %lld",
                     (long long)e->pool.n_free, (long long)n,
                     (long long)((n + e->pool.block_size - 1) / e->pool.block_size));
    }
    if (rc) {
        pthread_mutex_unlock(&e->mu);
        req_free(r);
        return rc;
    }
    nl_kvcache_scatter(&e->pool.kv, r->bt.ids, n, kv->data);
    r->n_cached = n;
    r->id = e->next_id++;
    e->all[e->n_all++] = r;
    e->st.requests_submitted++;
    nl_finish f = append_token(e, r, kv->first_token);
    if (f != NL_FINISH_NONE) { /* done with its first token: finished here (no event: read it) */
        nl_engine_free_blocks(e, r);
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
