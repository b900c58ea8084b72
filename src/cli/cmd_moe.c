/* nanolm moe train: NanoLM-MoE with expert or context parallelism under mpirun (nanolm/moe_ep.h),
 * trained by the one training loop (nl_trainer_run) through the layout's hooks (nl_ep_layout):
 * schedule, warmup, validation, checkpoints, log and SIGTERM handling come from there. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/cli_opt.h"
#include "cli/train_opts.h"
#include "nanolm/moe_ep.h"
#include "nanolm/tokenizer.h"

/* SIGTERM / SIGINT during training (src/cli/cmd_train.c): finish the step, save, exit 0. */
extern volatile int nl_train_stop_signal;
void nl_train_catch_stop_signals(int on);

/* What the command line asks for. */
typedef struct moe_args {
    const char *preset;
    int64_t layers, dim, experts, topk, shared, fe;
    double aux, cap;
    int json, mem;
    nl_train_args ta;  /* the training group (train_opts.h), bound to tr */
    nl_layout_args la; /* the layout group: --ep, --cp, --impl */
    nl_train_opts tr;
} moe_args;

/* The option table (also the --help of `moe` and `moe train`). */
static int parse_args(moe_args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    nl_train_opts_default(&a->tr);
    a->preset = "moe-course-tiny", a->shared = -1;
    a->aux = 0.01;
    /* moe train's defaults: 20 steps at a constant learning rate, no validation unless asked */
    a->tr.steps = 20, a->tr.batch = 4, a->tr.seq = 32, a->tr.warmup = 0, a->tr.eval_every = 0;
    a->ta.o = &a->tr;
    a->ta.omit = NL_TRAIN_OMIT_SVG | NL_TRAIN_OMIT_PRECISION | NL_TRAIN_OMIT_GRAD_ACCUM;
    a->ta.lr_min_is_lr = 1, a->ta.eval_when_asked = 1;
    nl_opt train[NL_TRAIN_NOPTS], layout[NL_LAYOUT_NOPTS];
    int ntrain = nl_cli_train_opts(train, &a->ta);
    a->la.offer = NL_LAYOUT_EP_CP;
    int nlayout = nl_cli_layout_opts(layout, &a->la);
    nl_opt model[] = {
        NL_OPT_STR("preset", &a->preset, "NAME",
                   "MoE shape (moe-course-tiny: 64 routed + 2 shared, top-6, D 64, 2 layers)"),
        NL_OPT_INT("layers", &a->layers, 1, 64, "N", "override the preset's layers"),
        NL_OPT_INT("dim", &a->dim, 2, 4096, "D", "override the model width"),
        NL_OPT_INT("experts", &a->experts, 1, 1024, "E", "routed experts per MoE layer"),
        NL_OPT_INT("top-k", &a->topk, 1, 1024, "K", "experts per token"),
        NL_OPT_INT("shared", &a->shared, 0, 64, "S", "shared experts per MoE layer"),
        NL_OPT_INT("expert-hidden", &a->fe, 1, 65536, "F", "hidden width of each expert"),
        NL_OPT_DBL("aux", &a->aux, 0, 1e6, "A", "load-balancing loss coefficient (0.01; 0 = off)"),
        NL_OPT_DBL("capacity", &a->cap, 0, 1e6, "C", "capacity factor (0 = no token dropping)"),
    };
    nl_opt out[] = {
        NL_OPT_FLAG("report-memory", &a->mem,
                    "bytes of parameters, gradients, optimizer state and activations per rank"),
        NL_OPT_FLAG("json", &a->json, "one JSON document with every step and rank"),
    };
    nl_optgroup groups[] = {
        {"model shape", model, NL_NOPTS(model)},
        {"parallel layout", layout, nlayout},
        {"training (the one trainer's options; SIGTERM/SIGINT finish the step, save, exit 0)", train, ntrain},
        {"output", out, NL_NOPTS(out)}};
    nl_cmdspec spec = {"moe train",
                       "[mpirun -np N] nanolm moe train --data FILE [options]",
                       "NanoLM-MoE (routed + shared SwiGLU experts, top-k router, aux loss) with expert parallelism: "
                       "N/ep data-parallel replicas of ep-rank expert groups, or context parallelism.",
                       groups,
                       NL_NOPTS(groups),
                       0};
    if (argc < 0) { /* `moe --help` */
        nl_cli_help(&spec, stdout);
        return NL_CLI_HELP;
    }
    return nl_cli_parse(&spec, argc, argv, NULL, NULL);
}

int nl_cmd_moe_train(int argc, char **argv);
int nl_cmd_moe(int argc, char **argv);
int nl_cmd_moe(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        moe_args a;
        if (argc < 2) {
            fprintf(stderr,
                    "usage: [mpirun -np N] nanolm moe train --data FILE [options] (see nanolm moe train --help)\n");
            return NL_EXIT_USAGE;
        }
        parse_args(&a, -1, NULL);
        return NL_EXIT_OK;
    }
    if (strcmp(argv[1], "train")) return nl_cli_usage_error("moe: unknown subcommand '%s' (train)", argv[1]);
    return nl_cmd_moe_train(argc - 1, argv + 1);
}

/* mean over MoE layers of (max expert load / mean expert load) */
static double load_ratio(const int64_t *tok, int64_t layers, int64_t E) {
    double r = 0;
    for (int64_t l = 0; l < layers; l++) {
        double mx = 0, sum = 0;
        for (int64_t e = 0; e < E; e++) {
            sum += (double)tok[l * E + e];
            if (tok[l * E + e] > mx) mx = (double)tok[l * E + e];
        }
        r += sum > 0 ? mx / (sum / (double)E) : 0;
    }
    return r / (double)layers;
}

/* per-rank values gathered to everyone by a sum of one-hot vectors */
static nl_status gather(nl_comm *w, double *v, int n, int rank, double mine) {
    for (int i = 0; i < n; i++) {
        v[i] = i == rank ? mine : 0;
        if (n > 1) NL_TRY(nl_comm_sum_double(w, &v[i]));
    }
    return NL_OK;
}

/* What the per-step callback needs. */
typedef struct moe_run {
    nl_ep_trainer *t;
    nl_comm *w;
    int N, R, json;
    double *v; /* (N) gather buffer */
    cJSON *jsteps, *last;
    nl_status err; /* a failed gather in the callback */
} moe_run;

/* One line (rank 0) or one JSON record per step, from the layout's statistics (t->st). */
static void on_step(void *user, const nl_train_log *r, const nl_train_opts *o) {
    moe_run *x = user;
    const nl_ep_step_stats *st = &x->t->st;
    const nl_moe *e = x->t->model.moe;
    double ratio = load_ratio(st->tokens, e->n_moe_layers, e->E);
    (void)o;
    if (!x->json) {
        if (x->R != 0) return;
        printf("%5lld %9.5f %9.5f %9.3f %9lld %8.4f %14llu", (long long)r->step - 1, r->loss, st->aux_loss, ratio,
               (long long)st->dropped, r->grad_norm, (unsigned long long)st->a2a_sent_bytes);
        if (!isnan(r->val_loss)) printf("  val %.4f", r->val_loss);
        printf("\n");
        fflush(stdout);
        return;
    }
    double mine[6] = {(double)st->a2a_sent_bytes,     (double)st->a2a_count_bytes,  (double)st->payload_sent_bytes,
                      (double)st->payload_self_bytes, (double)st->dispatched_bytes, (double)st->returned_bytes};
    const char *names[6] = {"a2a_sent_bytes",     "a2a_count_bytes",  "payload_sent_bytes",
                            "payload_self_bytes", "dispatched_bytes", "returned_bytes"};
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "step", (double)r->step - 1);
    cJSON_AddNumberToObject(j, "loss", r->loss);
    cJSON_AddNumberToObject(j, "aux_loss", st->aux_loss);
    cJSON_AddNumberToObject(j, "grad_norm", r->grad_norm);
    cJSON_AddNumberToObject(j, "lr", r->lr);
    if (!isnan(r->val_loss)) cJSON_AddNumberToObject(j, "val_loss", r->val_loss);
    cJSON_AddNumberToObject(j, "slots", (double)st->slots);
    cJSON_AddNumberToObject(j, "dropped", (double)st->dropped);
    cJSON_AddNumberToObject(j, "max_mean_load", ratio);
    for (int k = 0; k < 6; k++) {
        nl_status rc = gather(x->w, x->v, x->N, x->R, mine[k]);
        if (rc && !x->err) x->err = rc;
        cJSON_AddItemToObject(j, names[k], cJSON_CreateDoubleArray(x->v, x->N));
    }
    cJSON_AddItemToArray(x->jsteps, j);
    x->last = j;
}

/* The JSON header: the run's shape and layout. */
static cJSON *json_header(const nl_arch *a, const nl_moe *e, const moe_args *g, int N) {
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "model", a->name);
    cJSON_AddNumberToObject(doc, "ranks", N);
    cJSON_AddNumberToObject(doc, "ep", (double)g->la.ep);
    cJSON_AddNumberToObject(doc, "cp", (double)g->la.cp);
    cJSON_AddNumberToObject(doc, "dim", (double)a->dim);
    cJSON_AddNumberToObject(doc, "moe_layers", (double)e->n_moe_layers);
    cJSON_AddNumberToObject(doc, "top_k", (double)a->top_k);
    cJSON_AddNumberToObject(doc, "experts", (double)a->n_experts);
    cJSON_AddNumberToObject(doc, "tokens_per_rank", (double)(g->tr.batch * g->tr.seq / g->la.cp));
    cJSON *ja = cJSON_AddObjectToObject(doc, "arch");
    struct {
        const char *n;
        double v;
    } f[] = {{"vocab_size", (double)a->vocab_size},
             {"dim", (double)a->dim},
             {"n_layers", (double)a->n_layers},
             {"n_heads", (double)a->n_heads},
             {"n_kv_heads", (double)a->n_kv_heads},
             {"hidden_dim", (double)a->hidden_dim},
             {"seq_len", (double)a->seq_len},
             {"tied_embeddings", a->tied_embeddings},
             {"n_experts", (double)a->n_experts},
             {"n_shared_experts", (double)a->n_shared_experts},
             {"top_k", (double)a->top_k},
             {"expert_hidden_dim", (double)a->expert_hidden_dim},
             {"first_moe_layer", (double)a->first_moe_layer}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) cJSON_AddNumberToObject(ja, f[i].n, f[i].v);
    return doc;
}

/* The shape from the preset and the overrides; the layout and option checks that name flags. */
static int build_arch(moe_args *g, nl_arch *a, int N) {
    int rc = nl_cli_train_finish(&g->ta, "moe train");
    if (rc) return rc;
    int64_t ep = g->la.ep, cp = g->la.cp;
    if (nl_moe_preset(g->preset, a)) return nl_cli_usage_error("moe train: --preset: %s", nl_last_error());
    if (g->layers) a->n_layers = g->layers;
    if (g->dim) a->dim = g->dim;
    if (g->experts) a->n_experts = g->experts;
    if (g->topk) a->top_k = g->topk;
    if (g->shared >= 0) a->n_shared_experts = g->shared;
    if (g->fe) a->expert_hidden_dim = g->fe;
    if (g->tr.seq > a->seq_len) a->seq_len = g->tr.seq;
    if (nl_arch_validate(a)) return nl_cli_usage_error("moe train: %s", nl_last_error());
    if (N % ep || N % cp)
        return nl_cli_usage_error("moe train: --%s %lld must divide the %d ranks", N % ep ? "ep" : "cp",
                                  (long long)(N % ep ? ep : cp), N);
    if (cp > 1 && (ep > 1 || g->aux != 0 || g->cap != 0))
        return nl_cli_usage_error("moe train: --cp %lld needs --aux 0 and --capacity 0 and no --ep", (long long)cp);
    if (cp > 1 && g->tr.seq % (2 * cp))
        return nl_cli_usage_error("moe train: --seq %lld must be a multiple of 2 x --cp %lld", (long long)g->tr.seq,
                                  (long long)cp);
    if (cp > 1 && (g->ta.eval_given || g->ta.windows_given))
        return nl_cli_usage_error("moe train: --cp has no validation (--eval-every, --eval-windows)");
    if (ep > 1 && (g->tr.out || g->tr.resume))
        return nl_cli_usage_error("moe train: --out/--resume need --ep 1 (checkpoints hold whole models)");
    return 0;
}

/* --report-memory: bytes per rank (every rank takes part in the gathers). */
static nl_status report_memory(moe_run *x, cJSON *doc) {
    nl_ep_trainer *t = x->t;
    int N = x->N;
    double mine[4] = {(double)nl_model_param_bytes(&t->model), (double)nl_model_param_bytes(&t->model),
                      (double)nl_adamw_bytes(&t->opt), (double)nl_ep_act_bytes(t)};
    const char *names[4] = {"params", "grads", "optimizer", "activations"};
    double *v = calloc((size_t)N * 4, sizeof(double));
    if (!v) return nl_fail(NL_ERR_NOMEM, "out of memory (memory report)");
    cJSON *jm = doc ? cJSON_AddObjectToObject(doc, "memory") : NULL;
    for (int k = 0; k < 4; k++) {
        nl_status rc = gather(x->w, v + k * N, N, x->R, mine[k]);
        if (rc) {
            free(v);
            return rc;
        }
        if (jm) cJSON_AddItemToObject(jm, names[k], cJSON_CreateDoubleArray(v + k * N, N));
    }
    if (!doc && x->R == 0)
        for (int r = 0; r < N; r++)
            printf("rank %d: params %.0f B, grads %.0f B, optimizer %.0f B, activations %.0f B\n", r, v[r], v[N + r],
                   v[2 * N + r], v[3 * N + r]);
    free(v);
    return NL_OK;
}

/* Trains through nl_trainer_run and prints the per-step table or JSON, memory and throughput. */
static int train_and_report(moe_args *g, const nl_arch *a, nl_ep_trainer *t, const nl_data *d, moe_run *x) {
    nl_train_layout L;
    nl_ep_layout(t, &L);
    if (!g->ta.eval_given && !g->ta.windows_given) L.eval = NULL; /* validation only when asked for */
    nl_trainer tn;
    if (nl_trainer_init_layout(&tn, &g->tr, &L)) return nl_cli_fail(g->tr.resume ? "moe train: --resume" : "moe train");
    const nl_moe *e = t->model.moe;
    int rc = NL_EXIT_OK;
    cJSON *doc = NULL;
    if (g->json) {
        doc = json_header(a, e, g, x->N);
        x->jsteps = cJSON_AddArrayToObject(doc, "steps");
    } else if (x->R == 0) {
        printf("NanoLM-MoE %s: %lld layers, D %lld, %lld routed + %lld shared experts (F %lld), top-%lld; %d ranks, "
               "ep %lld; %lld tokens per rank and step\n",
               a->name, (long long)a->n_layers, (long long)a->dim, (long long)a->n_experts,
               (long long)a->n_shared_experts, (long long)a->expert_hidden_dim, (long long)a->top_k, x->N,
               (long long)g->la.ep, (long long)(g->tr.batch * g->tr.seq / g->la.cp));
        if (g->tr.resume) printf("resumed from %s after step %lld\n", g->tr.resume, (long long)tn.step);
        printf("%5s %9s %9s %9s %9s %8s %14s\n", "step", "loss", "aux", "max/mean", "dropped", "|grad|", "a2a B/rank0");
    }
    int64_t first = tn.step;
    double t0 = nl_time_s();
    nl_train_catch_stop_signals(1);
    g->tr.stop = &nl_train_stop_signal;
    nl_status trc = nl_trainer_run(&tn, &g->tr, d, on_step, x);
    nl_train_catch_stop_signals(0);
    double el = nl_time_s() - t0;
    if (trc || x->err) {
        if (x->err && !trc) nl_fail(x->err, "%s", nl_last_error());
        rc = nl_cli_fail("moe train");
        goto out;
    }
    if (x->R == 0 && g->ta.log_csv && nl_train_log_write_csv(&tn, g->ta.log_csv)) {
        rc = nl_cli_fail("moe train: --log");
        goto out;
    }
    if (x->last) {
        cJSON *tk = cJSON_AddArrayToObject(x->last, "tokens_per_expert");
        for (int64_t i = 0; i < e->n_moe_layers * e->E; i++)
            cJSON_AddItemToArray(tk, cJSON_CreateNumber((double)t->st.tokens[i]));
    }
    if (tn.stopped && x->R == 0 && !g->json)
        printf("stopped by %s after step %lld of %lld%s%s\n", tn.stopped == SIGINT ? "SIGINT" : "SIGTERM",
               (long long)tn.step, (long long)g->tr.steps,
               g->tr.out ? "; resume with --resume " : " (no --out: nothing saved)", g->tr.out ? g->tr.out : "");
    if (x->R == 0 && !g->json && g->tr.out) printf("saved %s after step %lld\n", g->tr.out, (long long)tn.step);
    nl_comm_max_double(x->w, &el);
    if (g->mem && report_memory(x, doc)) {
        rc = nl_cli_fail("moe train: memory");
        goto out;
    }
    double tps = (double)((tn.step - first) * g->tr.batch * g->tr.seq * (x->N / g->la.cp)) / el;
    if (doc) {
        cJSON_AddNumberToObject(doc, "seconds", el);
        cJSON_AddNumberToObject(doc, "tokens_per_s", tps);
    } else if (x->R == 0) {
        printf("%.2f s, %.0f tokens/s\n", el, tps);
    }
out:
    if (doc) {
        if (x->R == 0 && rc == NL_EXIT_OK)
            nl_cli_print_json(doc);
        else
            cJSON_Delete(doc);
    }
    nl_trainer_free(&tn);
    return rc;
}

int nl_cmd_moe_train(int argc, char **argv) {
    moe_args g;
    int prc = parse_args(&g, argc, argv);
    if (prc) return prc == NL_CLI_HELP ? NL_EXIT_OK : prc;
    if (nl_comm_init(NULL, NULL)) return nl_cli_fail("moe train: MPI");
    nl_comm *w = nl_comm_world();
    int N = nl_comm_size(w), R = nl_comm_rank(w), rc;
    nl_arch a;
    nl_tokenizer tok;
    nl_data d;
    nl_ep_trainer t;
    memset(&tok, 0, sizeof tok);
    memset(&d, 0, sizeof d);
    memset(&t, 0, sizeof t);
    moe_run x = {.t = &t, .w = w, .N = N, .R = R, .json = g.json, .v = calloc((size_t)N, sizeof(double))};
    if ((rc = build_arch(&g, &a, N))) goto out;
    if (!x.v) {
        rc = nl_cli_fail("moe train: out of memory");
        goto out;
    }
    if (nl_tokenizer_init_byte(&tok) || nl_data_open(&d, g.ta.data, &tok) || nl_data_check_window(&d, (int)g.tr.seq)) {
        rc = nl_cli_fail("moe train: --data");
        goto out;
    }
    nl_ep_opts o;
    nl_ep_opts_default(&o);
    o.train = g.tr;
    o.ep = (int)g.la.ep, o.cp = (int)g.la.cp, o.impl = g.la.impl ? NL_COMM_NATIVE : NL_COMM_OURS;
    o.aux_coef = (float)g.aux, o.capacity_factor = (float)g.cap;
    if (nl_ep_init(&t, &a, &o, w)) {
        rc = nl_cli_fail("moe train: init");
        goto out;
    }
    rc = train_and_report(&g, &a, &t, &d, &x);
out:
    free(x.v);
    nl_ep_free(&t);
    nl_data_free(&d);
    nl_tokenizer_free(&tok);
    nl_comm_finalize();
    return rc;
}
