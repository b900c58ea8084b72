/* IsoFLOP sweeps of NanoLM (see nanolm/sweep.h); their fits are plan/isoflop.c. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nanolm/data.h"
#include "nanolm/sweep.h"
#include "nanolm/tokenizer.h"
#include "nanolm/train.h"

/* The presets: name, budgets, shapes (dims, layers), the window of shapes per budget (count 0:
 * every shape), batch, seq, val_windows, checkpoints; all at peak lr 3e-3. */
static const nl_sweep_grid presets[] = {
    /* 4 budgets over 1.5 decades (1e12, 3e12, 1e13, 3e13) x a window of 5 of 8 shapes (N = 12k ..
     * 779k non-embedding parameters), 20 runs, 2.2e14 FLOPs (6ND). Centred on the reduced grid's
     * measured optimum of 55-100 tokens per parameter (N_opt ~ 40-55k at 1e12, 225-300k at 3e13):
     * every window spans 3-8 tokens per parameter at its largest shape to 490-1200 at its
     * smallest. Measured: 29.6 min wall with two single-threaded workers (--jobs 2) on 2 cores,
     * 31-73 GFLOP/s (6ND) each (docs/scaling.md). */
    {.name = "default",
     .n_budgets = 4,
     .n_shapes = 8,
     .budgets_flops = {1e12, 3e12, 1e13, 3e13},
     .dims = {32, 48, 64, 64, 96, 96, 128, 128},
     .layers = {1, 1, 1, 2, 2, 3, 3, 4},
     .first_shape = {0, 1, 2, 3},
     .budget_shapes = {5, 5, 5, 5},
     .batch = 16,
     .seq = 64,
     .val_windows = 200,
     .checkpoints = 5},
    /* a reduced grid (~4M tokens) for a loaded machine: 3 budgets x 5 shapes, N = 3.4k .. 101k */
    {.name = "small",
     .n_budgets = 3,
     .n_shapes = 5,
     .budgets_flops = {3e9, 1e10, 3e10},
     .dims = {16, 24, 32, 48, 64},
     .layers = {1, 1, 1, 1, 2},
     .batch = 8,
     .seq = 64,
     .val_windows = 200,
     .checkpoints = 5},
    {.name = "tiny",
     .n_budgets = 2,
     .n_shapes = 3,
     .budgets_flops = {1e8, 3e8},
     .dims = {16, 24, 32},
     .layers = {1, 1, 1},
     .batch = 4,
     .seq = 32,
     .val_windows = 16,
     .checkpoints = 4},
};

nl_status nl_sweep_grid_preset(const char *name, nl_sweep_grid *g) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(name, presets[i].name)) {
            *g = presets[i];
            g->lr = 3e-3;
            return NL_OK;
        }
    memset(g, 0, sizeof *g);
    return nl_fail(NL_ERR_INVALID, "unknown sweep grid '%s' (known: default, small, tiny)", name);
}

void nl_sweep_arch(int64_t dim, int64_t layers, int64_t seq, nl_arch *a) {
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "sweep-d%lld-l%lld", (long long)dim, (long long)layers);
    a->vocab_size = 256;
    a->dim = dim;
    a->n_layers = layers;
    a->n_heads = dim / 16 > 0 ? dim / 16 : 1;
    a->n_kv_heads = a->n_heads;
    int64_t h = (int64_t)llround(8.0 * (double)dim / 3.0 / 16.0) * 16;
    a->hidden_dim = h > 0 ? h : 16;
    a->seq_len = seq;
    a->rope_theta = 10000.0;
    a->norm_eps = 1e-5;
    a->tied_embeddings = 0;
}

static const char *CSV_HEADER = "run,budget_flops,dim,layers,N,D,steps,flops_6nd,loss,wall_s\n";

nl_status nl_sweep_read_csv(const char *path, nl_sweep_row **rows, int *n) {
    *rows = NULL;
    *n = 0;
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT) return NL_OK; /* a new sweep */
    FILE *f;
    NL_TRY(nl_file_open_read_stdio(path, &f));
    char line[1024];
    int cap = 0, line_no = 0;
    nl_status rc = NL_OK;
    while (fgets(line, sizeof line, f)) {
        line_no++;
        if (line_no == 1 || line[0] == '\n') continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 32;
            nl_sweep_row *r = realloc(*rows, (size_t)cap * sizeof **rows);
            if (!r) {
                rc = nl_fail(NL_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            *rows = r;
        }
        nl_sweep_row *r = &(*rows)[*n];
        long long dim, layers, steps;
        if (sscanf(line, "%31[^,],%lf,%lld,%lld,%lf,%lf,%lld,%lf,%lf,%lf", r->run, &r->budget_flops, &dim, &layers,
                   &r->n_params, &r->n_tokens, &steps, &r->flops, &r->val_loss, &r->wall_s) != 10) {
            rc = nl_fail(NL_ERR_FORMAT, "%s:%d: expected %d columns (%s)", path, line_no, 10, "run,budget_flops,...");
            break;
        }
        r->dim = dim;
        r->layers = layers;
        r->steps = steps;
        (*n)++;
    }
    fclose(f);
    if (rc) {
        free(*rows);
        *rows = NULL;
        *n = 0;
        return rc;
    }
    /* hand back an nl_malloc'd copy so callers free with nl_free */
    nl_sweep_row *out = nl_malloc((size_t)(*n > 0 ? *n : 1) * sizeof *out, "sweep rows");
    if (!out) {
        free(*rows);
        *rows = NULL;
        *n = 0;
        return NL_ERR_NOMEM;
    }
    if (*n) memcpy(out, *rows, (size_t)*n * sizeof *out);
    free(*rows);
    *rows = out;
    return NL_OK;
}

static nl_status write_csv(const char *path, const nl_sweep_row *rows, int n) {
    size_t cap = 256 + (size_t)n * 256, len = 0;
    char *buf = nl_malloc(cap, "sweep csv");
    if (!buf) return NL_ERR_NOMEM;
    len += (size_t)snprintf(buf + len, cap - len, "%s", CSV_HEADER);
    for (int i = 0; i < n; i++) {
        const nl_sweep_row *r = &rows[i];
        len += (size_t)snprintf(buf + len, cap - len, "%s,%.6g,%lld,%lld,%.0f,%.0f,%lld,%.6g,%.6f,%.2f\n", r->run,
                                r->budget_flops, (long long)r->dim, (long long)r->layers, r->n_params, r->n_tokens,
                                (long long)r->steps, r->flops, r->val_loss, r->wall_s);
    }
    nl_status rc = nl_write_file_atomic(path, buf, len);
    nl_free(buf);
    return rc;
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

typedef struct wall_ctx {
    const char *wall_path;
    double prior_s;
    nl_trainer *t;
} wall_ctx;

/* After each checkpoint, record the wall time so far next to it (a resumed run adds to it). */
static void on_step(void *user, const nl_train_log *rec, const nl_train_opts *o) {
    (void)o;
    wall_ctx *w = user;
    if (isnan(rec->val_loss)) return;
    char buf[64];
    int len = snprintf(buf, sizeof buf, "%.3f\n", w->prior_s + w->t->wall_s);
    (void)nl_write_file_atomic(w->wall_path, buf, (size_t)len);
}

/* Takes an exclusive flock on `path` (blocking or not). Returns the fd, -1 when another
 * process holds it (non-blocking), -2 on an error (message set). */
static int lock_file(const char *path, int block) {
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0) {
        nl_fail(NL_ERR_IO, "%s: %s", path, strerror(errno));
        return -2;
    }
    while (flock(fd, LOCK_EX | (block ? 0 : LOCK_NB))) {
        if (errno == EINTR) continue;
        int busy = errno == EWOULDBLOCK;
        if (!busy) nl_fail(NL_ERR_IO, "%s: flock: %s", path, strerror(errno));
        close(fd);
        return busy ? -1 : -2;
    }
    return fd;
}

static void unlock_file(int fd) {
    if (fd < 0) return;
    (void)flock(fd, LOCK_UN);
    close(fd);
}

static int row_cmp(const void *a, const void *b) {
    const nl_sweep_row *x = a, *y = b;
    if (x->budget_flops != y->budget_flops) return x->budget_flops < y->budget_flops ? -1 : 1;
    if (x->n_params != y->n_params) return x->n_params < y->n_params ? -1 : 1;
    return strcmp(x->run, y->run);
}

/* Is `run` a row of the CSV now? -1 on a read error. */
static int csv_has(const char *csv, const char *run) {
    nl_sweep_row *rows;
    int n;
    if (nl_sweep_read_csv(csv, &rows, &n)) return -1;
    int done = 0;
    for (int k = 0; k < n; k++) done |= !strcmp(rows[k].run, run);
    nl_free(rows);
    return done;
}

/* Appends r to the CSV under DIR/sweep.lock (re-read, sorted by budget and N, rewritten atomically). */
static nl_status csv_append(const char *csv, const char *lock_path, const nl_sweep_row *r) {
    int fd = lock_file(lock_path, 1);
    if (fd < 0) return NL_ERR_IO;
    nl_sweep_row *rows;
    int n;
    nl_status rc = nl_sweep_read_csv(csv, &rows, &n);
    if (!rc) {
        nl_sweep_row *all = nl_malloc((size_t)(n + 1) * sizeof *all, "sweep rows");
        if (!all)
            rc = NL_ERR_NOMEM;
        else {
            int m = 0;
            for (int k = 0; k < n; k++)
                if (strcmp(rows[k].run, r->run)) all[m++] = rows[k];
            all[m++] = *r;
            qsort(all, (size_t)m, sizeof *all, row_cmp);
            rc = write_csv(csv, all, m);
            nl_free(all);
        }
        nl_free(rows);
    }
    unlock_file(fd);
    return rc;
}

int nl_sweep_plan(const nl_sweep_grid *g, nl_sweep_plan_row *rows) {
    int n = 0;
    for (int b = 0; b < g->n_budgets; b++)
        for (int s0, ns = nl_sweep_budget_shapes(g, b, &s0), s = s0; s < s0 + ns; s++) {
            nl_arch a;
            nl_sweep_arch(g->dims[s], g->layers[s], g->seq, &a);
            nl_arch_params ap;
            nl_arch_count_params(&a, &ap);
            nl_sweep_plan_row *r = &rows[n++];
            r->budget_flops = g->budgets_flops[b];
            r->dim = g->dims[s], r->layers = g->layers[s];
            r->n = (double)ap.non_embedding;
            r->d = g->budgets_flops[b] / (6 * r->n);
            r->steps = r->d / (double)(g->batch * g->seq);
            snprintf(r->run, sizeof r->run, "c%d_n%d", b, s);
        }
    return n;
}

int nl_sweep_budget_shapes(const nl_sweep_grid *g, int b, int *first) {
    int f = g->budget_shapes[b] > 0 ? g->first_shape[b] : 0;
    int n = g->budget_shapes[b] > 0 ? g->budget_shapes[b] : g->n_shapes;
    if (f < 0) f = 0;
    if (f + n > g->n_shapes) n = g->n_shapes - f;
    *first = f;
    return n > 0 ? n : 0;
}

nl_status nl_sweep_run(const nl_sweep_grid *g, const char *data_path, const char *dir, const nl_sweep_progress *p) {
    return nl_sweep_run_worker(g, data_path, dir, p, 0);
}

nl_status nl_sweep_run_worker(const nl_sweep_grid *g, const char *data_path, const char *dir,
                              const nl_sweep_progress *p, int largest_first) {
    char csv[1024], runs[1024], csv_lock[1100];
    snprintf(csv, sizeof csv, "%s/sweep.csv", dir);
    snprintf(csv_lock, sizeof csv_lock, "%s/sweep.lock", dir);
    snprintf(runs, sizeof runs, "%s/runs", dir);
    if (mkdir(dir, 0755) && errno != EEXIST) return nl_fail(NL_ERR_IO, "%s: %s", dir, strerror(errno));
    if (mkdir(runs, 0755) && errno != EEXIST) return nl_fail(NL_ERR_IO, "%s: %s", runs, strerror(errno));
    NL_TRY(nl_check_writable(csv, "the sweep's results")); /* before any run trains */
    {
        nl_sweep_row *rows; /* fail early on an unreadable CSV */
        int n_rows;
        NL_TRY(nl_sweep_read_csv(csv, &rows, &n_rows));
        nl_free(rows);
    }
    /* the (budget, shape) order of the work */
    int order_b[NL_SWEEP_MAX_BUDGETS * NL_SWEEP_MAX_SHAPES], order_s[NL_SWEEP_MAX_BUDGETS * NL_SWEEP_MAX_SHAPES],
        n_work = 0;
    for (int k = 0; k < g->n_budgets; k++) {
        int bi = largest_first ? g->n_budgets - 1 - k : k, first;
        int ns = nl_sweep_budget_shapes(g, bi, &first);
        for (int j = 0; j < ns; j++) {
            order_b[n_work] = bi;
            order_s[n_work] = first + j;
            n_work++;
        }
    }
    nl_tokenizer tok;
    nl_data data;
    memset(&data, 0, sizeof data);
    nl_status rc = nl_tokenizer_init_byte(&tok);
    if (!rc) rc = nl_data_open(&data, data_path, &tok);
    for (int wi = 0; !rc && wi < n_work; wi++) {
        int bi = order_b[wi], si = order_s[wi];
        char run[32];
        snprintf(run, sizeof run, "c%d_n%d", bi, si);
        int done = csv_has(csv, run);
        if (done < 0) {
            rc = NL_ERR_IO;
            break;
        }
        if (done) {
            if (p && p->on_run) p->on_run(p->user, run, "done already (in the CSV): skipped", NULL);
            continue;
        }
        char lock_path[1100];
        snprintf(lock_path, sizeof lock_path, "%s/%s.lock", runs, run);
        int run_fd = lock_file(lock_path, 0);
        if (run_fd == -2) {
            rc = NL_ERR_IO;
            break;
        }
        if (run_fd == -1) {
            if (p && p->on_run) p->on_run(p->user, run, "being trained by another worker: skipped", NULL);
            continue;
        }
        if ((done = csv_has(csv, run)) != 0) { /* finished by another worker meanwhile */
            unlock_file(run_fd);
            if (done < 0) {
                rc = NL_ERR_IO;
                break;
            }
            if (p && p->on_run) p->on_run(p->user, run, "done already (in the CSV): skipped", NULL);
            continue;
        }
        nl_arch arch;
        nl_sweep_arch(g->dims[si], g->layers[si], g->seq, &arch);
        nl_arch_params ap;
        nl_arch_count_params(&arch, &ap);
        double N = (double)ap.non_embedding, C = g->budgets_flops[bi];
        double D = C / (6.0 * N);
        int64_t tps = g->batch * g->seq;
        int64_t steps = (int64_t)llround(D / (double)tps);
        if (steps < 4) steps = 4;
        char ckpt[1100], wall_path[1100];
        snprintf(ckpt, sizeof ckpt, "%s/%s.safetensors", runs, run);
        snprintf(wall_path, sizeof wall_path, "%s/%s.wall", runs, run);
        nl_train_opts o;
        nl_train_opts_default(&o);
        o.steps = steps;
        o.batch = g->batch;
        o.seq = g->seq;
        o.lr = (float)g->lr;
        o.lr_min = (float)g->lr / 10;
        o.warmup = steps / 20 > 1 ? steps / 20 : 1;
        o.eval_every = g->checkpoints > 0 && steps / g->checkpoints > 0 ? steps / g->checkpoints : steps;
        o.eval_windows = 4; /* quick validations at checkpoints; the final one is below */
        o.out = ckpt;
        o.seed = 1000 + (uint64_t)si;
        int resumed = file_exists(ckpt);
        o.resume = resumed ? ckpt : NULL;
        wall_ctx w = {wall_path, 0, NULL};
        if (resumed) {
            char *txt = NULL;
            size_t txt_bytes = 0;
            if (nl_read_file(wall_path, &txt, &txt_bytes) == NL_OK) {
                w.prior_s = atof(txt);
                nl_free(txt);
            }
        }
        nl_trainer t;
        if ((rc = nl_trainer_init(&t, &arch, &o))) {
            nl_fail(rc, "sweep run %s: %s", run, nl_last_error());
            unlock_file(run_fd);
            break;
        }
        w.t = &t;
        if (p && p->on_run) {
            char what[160];
            snprintf(what, sizeof what, "%s: N %.0f, D %.0f tokens, %lld steps%s", resumed ? "resuming" : "training", N,
                     (double)steps * (double)tps, (long long)steps, resumed ? " (from its checkpoint)" : "");
            p->on_run(p->user, run, what, NULL);
        }
        rc = nl_trainer_run(&t, &o, &data, on_step, &w);
        double vl = NAN;
        if (!rc) rc = nl_eval_loss(&t.model, &data, NL_DATA_VAL, g->batch, g->seq, g->val_windows, &vl, NULL);
        double wall = w.prior_s + t.wall_s;
        nl_trainer_free(&t);
        if (rc) {
            nl_fail(rc, "sweep run %s: %s", run, nl_last_error());
            unlock_file(run_fd);
            break;
        }
        nl_sweep_row r;
        memset(&r, 0, sizeof r);
        snprintf(r.run, sizeof r.run, "%s", run);
        r.budget_flops = C;
        r.dim = g->dims[si];
        r.layers = g->layers[si];
        r.n_params = N;
        r.steps = steps;
        r.n_tokens = (double)steps * (double)tps;
        r.flops = 6.0 * N * r.n_tokens;
        r.val_loss = vl;
        r.wall_s = wall;
        rc = csv_append(csv, csv_lock, &r);
        unlock_file(run_fd);
        if (rc) break;
        if (p && p->on_run) p->on_run(p->user, run, "finished", &r);
    }
    nl_data_free(&data);
    nl_tokenizer_free(&tok);
    return rc;
}
