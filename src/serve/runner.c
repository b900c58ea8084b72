/* The engine's batched forward over a step's rows (runner.h). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nanolm/paged_attention.h"
#include "nanolm/runner.h"

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

double nl_runner_clock(const nl_runner *r) {
    if (r->prof != 2) return nl_time_s();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Adds the time since *t to phase ph and restarts the clock (only when profiling). */
static inline void prof_mark(nl_runner *r, double *t, int ph) {
    if (!r->prof) return;
    double now = nl_runner_clock(r);
    r->prof_s[ph] += now - *t;
    *t = now;
}

void nl_runner_prof_sampling(nl_runner *r, double seconds) {
    if (r->prof) r->prof_s[PH_SAMPLE] += seconds;
}

static void prof_print(const nl_runner *r) {
    double total = 0;
    for (int i = 0; i < PH_COUNT; i++) total += r->prof_s[i];
    fprintf(stderr, "engine step profile (%s): %lld steps, %lld rows, %.3f s in the forward and sampling\n",
            r->prof == 2 ? "thread CPU time" : "wall time", (long long)r->prof_steps, (long long)r->prof_rows, total);
    for (int i = 0; i < PH_COUNT; i++)
        fprintf(stderr, "  %-14s %9.3f ms/step %6.1f%%\n", prof_phase[i],
                r->prof_steps ? 1e3 * r->prof_s[i] / (double)r->prof_steps : 0.0,
                total > 0 ? 100.0 * r->prof_s[i] / total : 0.0);
}

nl_status nl_runner_init(nl_runner *r, const nl_model *m, int64_t rows_cap, int threads) {
    memset(r, 0, sizeof *r);
    r->m = m;
    r->threads = threads;
    const char *prof = getenv("NANOLM_STEP_PROFILE");
    r->prof = !prof || !*prof || !strcmp(prof, "0") ? 0 : !strcmp(prof, "cpu") ? 2 : 1;
    int64_t R = r->rows_cap = rows_cap;
    int nt = threads > 0 ? threads : omp_get_max_threads();
    size_t floats = (size_t)(R * (m->C * 2 + m->QKV + m->NH * m->hd + 3 * m->H + 1 + m->V));
    r->scratch_floats = nl_paged_attend_scratch(NL_KV_QTILE, m->arch.seq_len, m->hd);
    size_t scratch = (size_t)nt * (size_t)r->scratch_floats;
    r->x = nl_malloc((floats + scratch) * sizeof(float), "engine step buffers");
    r->tok = nl_malloc((size_t)R * sizeof(int32_t), "engine row tokens");
    r->pos = nl_malloc((size_t)R * 2 * sizeof(int64_t), "engine row positions");
    r->table = nl_malloc((size_t)R * sizeof(int32_t *), "engine row block tables");
    r->tile_row = nl_malloc((size_t)(R + 1) * sizeof(int64_t), "engine attention tiles");
    if (!r->x || !r->tok || !r->pos || !r->table || !r->tile_row) {
        nl_runner_free(r);
        return NL_ERR_NOMEM;
    }
    float *p = r->x + R * m->C;
    r->xb = p;
    p += R * m->C;
    r->qkv = p;
    p += R * m->QKV;
    r->atty = p;
    p += R * m->NH * m->hd;
    r->h13 = p;
    p += R * 2 * m->H;
    r->hact = p;
    p += R * m->H;
    r->rstd = p;
    p += R;
    r->logits = p;
    p += R * m->V;
    r->scratch = p;
    r->out_rows = r->pos + R;
    return NL_OK;
}

nl_status nl_runner_build_weights(nl_runner *r, nl_wfmt wfmt) {
    const nl_model *m = r->m;
    int64_t L = m->L;
    r->wfmt = wfmt == NL_WFMT_AUTO ? NL_WFMT_FP32 : wfmt;
    r->w = nl_calloc((size_t)(4 * L + 1), sizeof(nl_mv_weight), "engine weights");
    if (!r->w) return NL_ERR_NOMEM;
    for (int64_t l = 0; l < L; l++) {
        const nl_layer_weights *lw = &m->w.layers[l];
        NL_TRY(nl_mv_weight_init(&r->w[4 * l + 0], r->wfmt, lw->wq, m->QKV, m->C, 0));
        NL_TRY(nl_mv_weight_init(&r->w[4 * l + 1], r->wfmt, lw->wo, m->C, m->NH * m->hd, 0));
        NL_TRY(nl_mv_weight_init(&r->w[4 * l + 2], r->wfmt, lw->w1, 2 * m->H, m->C, 0));
        NL_TRY(nl_mv_weight_init(&r->w[4 * l + 3], r->wfmt, lw->w2, m->C, m->H, 0));
    }
    NL_TRY(nl_mv_weight_init(&r->w[4 * L], r->wfmt, m->w.cls, m->V, m->C, 0));
    r->weight_bytes = 0;
    r->weight_macs = 0;
    for (int64_t i = 0; i <= 4 * L; i++) {
        r->weight_bytes += nl_mv_weight_bytes(&r->w[i]);
        r->weight_macs += r->w[i].rows * r->w[i].cols;
    }
    return NL_OK;
}

void nl_runner_free(nl_runner *r) {
    if (!r) return;
    if (r->prof) prof_print(r);
    if (r->w)
        for (int64_t i = 0; r->m && i <= 4 * r->m->L; i++) nl_mv_weight_free(&r->w[i]);
    nl_free(r->w);
    nl_mv_act_free(&r->act);
    nl_free(r->x);
    nl_free(r->tok);
    nl_free(r->pos);
    nl_free(r->table);
    nl_free(r->tile_row);
    memset(r, 0, sizeof *r);
}

int64_t nl_runner_tiles(nl_runner *r, int64_t n) {
    int64_t u = 0;
    for (int64_t i = 0; i < n; i++)
        if (i == 0 || r->table[i] != r->table[i - 1] || r->pos[i] != r->pos[i - 1] + 1 ||
            i - r->tile_row[u - 1] == NL_KV_QTILE)
            r->tile_row[u++] = i;
    r->tile_row[u] = n;
    return u;
}

void nl_runner_rope_store(nl_runner *r, nl_kvcache *kv, int64_t l, int64_t n) {
    const nl_model *m = r->m;
    const int64_t NH = m->NH, KVH = m->KVH, hd = m->hd, QKV = m->QKV, half = hd / 2;
    const int nt = r->threads;
    /* RoPE on the rotated heads and the KV store of each row: a few hundred ns per row, so a
     * step of a few rows runs it on this thread rather than waking the team */
#pragma omp parallel for schedule(static)                                                                              \
    num_threads(nt > 0 ? nt : omp_get_max_threads()) if (n >= NL_ENGINE_ROPE_PARALLEL_ROWS)
    for (int64_t i = 0; i < n; i++) {
        float *q = r->qkv + i * QKV;
        nl_rope_row(q, m->rope_cos + r->pos[i] * half, m->rope_sin + r->pos[i] * half, NH + KVH, hd, 0);
        nl_kvcache_store(kv, r->table[i], l, r->pos[i], q + NH * hd, q + (NH + KVH) * hd);
    }
}

/* Attention tiles, the same in every layer: the rows of a prompt chunk in tiles of up to
 * NL_KV_QTILE, each decode row alone. The leading one-row tiles (the decodes: the schedule puts
 * them first) run tile by tile with the heads innermost: a block stores its kv heads' runs one
 * after another (paged_attention.h), so a thread's next unit reads on where the last one stopped,
 * and the query heads of a group share each run. The tiles after them (prompt chunks) run kv head
 * by kv head, and within one, tile by tile with the query heads that share it innermost: a
 * chunk's next tile reads the same prefix again, from cache. */
void nl_runner_attention(nl_runner *r, const nl_kvcache *kv, int64_t l, int64_t n_tiles) {
    const nl_model *m = r->m;
    const int64_t NH = m->NH, KVH = m->KVH, hd = m->hd, QKV = m->QKV, G = NH / KVH, work = n_tiles * NH;
    const int nt = r->threads;
    int64_t n_single = 0;
    /* one unit of work per tile and head */
    while (n_single < n_tiles && r->tile_row[n_single + 1] - r->tile_row[n_single] == 1) n_single++;
#pragma omp parallel num_threads(nt > 0 ? nt : omp_get_max_threads())
    {
        float *scratch = r->scratch + (int64_t)omp_get_thread_num() * r->scratch_floats;
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
            const int64_t i = r->tile_row[u], nq = r->tile_row[u + 1] - i;
            nl_paged_attend_rows(kv, r->table[i], l, r->pos[i], nq, r->qkv + i * QKV, QKV, NH, h,
                                 r->atty + i * NH * hd + h * hd, NH * hd, scratch);
        }
    }
}

static nl_status forward_rows(nl_runner *r, nl_kvcache *kv, int64_t n, int64_t n_out) {
    const nl_model *m = r->m;
    const int64_t C = m->C, H = m->H, QKV = m->QKV;
    const float eps = (float)m->arch.norm_eps;
    const int nt = r->threads;
    double t = r->prof ? nl_runner_clock(r) : 0;
    if (r->prof) {
        r->prof_steps++;
        r->prof_rows += n;
    }
    for (int64_t i = 0; i < n; i++)
        memcpy(r->x + i * C, m->w.embed + (int64_t)r->tok[i] * C, (size_t)C * sizeof(float));
    prof_mark(r, &t, PH_EMBED);
    const int64_t n_tiles = nl_runner_tiles(r, n);
    for (int64_t l = 0; l < m->L; l++) {
        const nl_layer_weights *lw = &m->w.layers[l];
        nl_rmsnorm_forward(r->xb, r->rstd, r->x, lw->rms_att, n, C, eps);
        prof_mark(r, &t, PH_NORM);
        NL_TRY(nl_mv_forward_act(&r->w[4 * l + 0], &r->act, r->xb, n, r->qkv, nt));
        if (lw->bqkv) nl_add_bias(r->qkv, lw->bqkv, n, QKV); /* Qwen2's q/k/v biases */
        prof_mark(r, &t, PH_QKV);
        nl_runner_rope_store(r, kv, l, n);
        prof_mark(r, &t, PH_ROPE_KV);
        nl_runner_attention(r, kv, l, n_tiles);
        prof_mark(r, &t, PH_ATTN);
        NL_TRY(nl_mv_forward_act(&r->w[4 * l + 1], &r->act, r->atty, n, r->xb, nt));
        prof_mark(r, &t, PH_O);
        for (int64_t i = 0; i < n * C; i++) r->x[i] += r->xb[i];
        prof_mark(r, &t, PH_RESID);
        nl_rmsnorm_forward(r->xb, r->rstd, r->x, lw->rms_ffn, n, C, eps);
        prof_mark(r, &t, PH_NORM);
        NL_TRY(nl_mv_forward_act(&r->w[4 * l + 2], &r->act, r->xb, n, r->h13, nt));
        prof_mark(r, &t, PH_GATE_UP);
        nl_swiglu_forward(r->hact, r->h13, n, H);
        prof_mark(r, &t, PH_SWIGLU);
        NL_TRY(nl_mv_forward_act(&r->w[4 * l + 3], &r->act, r->hact, n, r->xb, nt));
        prof_mark(r, &t, PH_DOWN);
        for (int64_t i = 0; i < n * C; i++) r->x[i] += r->xb[i];
        prof_mark(r, &t, PH_RESID);
    }
    /* final norm of the rows that sample, gathered, then the classifier */
    for (int64_t j = 0; j < n_out; j++)
        nl_rmsnorm_forward(r->xb + j * C, r->rstd + j, r->x + r->out_rows[j] * C, m->w.rms_final, 1, C, eps);
    prof_mark(r, &t, PH_NORM);
    if (n_out) NL_TRY(nl_mv_forward_act(&r->w[4 * m->L], &r->act, r->xb, n_out, r->logits, nt));
    prof_mark(r, &t, PH_CLS);
    return NL_OK;
}

/* Below this many multiply-adds a step runs on one thread: waking a second one costs more than
 * it saves, and on a loaded machine a barrier waits for a descheduled thread (measured: the
 * 260K-parameter stories model decodes ~70x slower with 2 threads than with 1 under load). */
#define SERIAL_STEP_MACS 2000000.0

nl_status nl_runner_forward(nl_runner *r, nl_kvcache *kv, int64_t n, int64_t n_out) {
    double macs = (double)n * (double)r->weight_macs;
    /* the norm, RoPE and SwiGLU kernels open regions of the default size: make it the engine's
     * thread count (with --threads 1 they started 2-thread teams; on a loaded machine a 1-thread
     * batch-32 step of a dim-256 model then spent ~85% of its CPU time waiting at their barriers) */
    int saved_nt = omp_get_max_threads();
    if (r->threads > 0) omp_set_num_threads(r->threads);
    nl_status rc;
    if (macs >= SERIAL_STEP_MACS) {
        rc = forward_rows(r, kv, n, n_out);
    } else {
        int saved = omp_get_max_active_levels();
        omp_set_max_active_levels(0); /* every parallel region of this thread runs on one thread */
        rc = forward_rows(r, kv, n, n_out);
        omp_set_max_active_levels(saved);
    }
    omp_set_num_threads(saved_nt);
    return rc;
}
